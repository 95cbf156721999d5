"""Typed payloads: a handler's payload type, checked and encoded at enqueue, decoded in the
worker.

A handler whose first parameter is annotated with a TypedDict, a dataclass or a pydantic v2
model gets a `Codec` when it is registered (`codec_for`, called by
`pgpool.registry.handler`). The annotation is resolved once, with `typing.get_type_hints`
(``from __future__ import annotations`` works), into a tree of converters, one per type in
it. `Codec.encode` checks a value against the type and turns it into JSON data;
`Codec.decode` turns the stored JSON back into the type. A value that does not fit raises a
one-line `PayloadError` naming the field. A type no converter handles is refused at
registration with `HandlerError` naming it.

Handlers annotated ``dict`` (or anything else that is not one of those three, or nothing)
get no codec: they receive the JSON as today, and pay nothing. Workers import this module
only when a handler module registers a typed handler; uuid and pydantic are looked up in
`sys.modules` rather than imported (an annotation can only name them once its module
imported them).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
import typing
from collections.abc import Callable, Mapping
from datetime import date, datetime
from typing import Any, Final, NoReturn

import orjson

from .errors import HandlerError, PayloadDecodeError, PayloadError

#: What a field may be, for the message that refuses another type.
SUPPORTED: Final = ("str, int, float, bool, None, X | None, a Union, Literal, list[X], "
                    "dict[str, X], an Enum, datetime, date, UUID, Any, a TypedDict, a "
                    "dataclass or a pydantic model")


class Codec:
    """The payload type of one handler, compiled: `encode` for the producer, `decode` for
    the worker."""

    def __init__(self, kind: str, payload_type: type, root: _Type) -> None:
        self.kind = kind
        #: The handler's payload annotation: a TypedDict, a dataclass or a pydantic model.
        self.type = payload_type
        self._root = root

    def encode(self, value: object) -> tuple[dict[str, Any], Any]:
        """(JSON data to store, the payload as the handler's type) for ``value``: an instance
        of the type, or a dict that fits it. Raises `PayloadError` naming the first field
        that does not fit; a dataclass or model given as a dict is built once, so that its
        own checks (``__post_init__``, validators) run here rather than in the worker."""
        try:
            data = self._root.dump(value)
            return data, value if self._root.holds(value) else self._root.load(data)
        except _Mismatch as exc:
            raise PayloadError(exc.message(self.kind)) from None

    def decode(self, data: object) -> Any:
        """The stored JSON ``data`` as the handler's type; `PayloadDecodeError` naming the
        type and the first field that does not fit (a row written by hand, or by another
        version), never its value."""
        try:
            return self._root.load(data)
        except _Mismatch as exc:
            field = f"field {exc.where()!r}: " if exc.path else ""
            raise PayloadDecodeError(
                f"payload decode failure: the stored payload does not fit "
                f"{self.type.__name__}, the payload type of handler {self.kind!r}: "
                f"{field}{exc.problem}. It would not on a retry either: enqueue with the "
                "handler's .enqueue, which checks the payload (pgpool_enqueue and an INSERT "
                "do not)") from None


def codec_for(kind: str, fn: Callable[..., Any]) -> Codec | None:
    """The `Codec` of ``fn``'s first parameter's annotation, or None when that is not a
    TypedDict, a dataclass or a pydantic model (``dict``, ``Any``, no annotation...). Raises
    `HandlerError` naming the annotation that cannot be resolved, or the field whose type
    is not supported."""
    code = fn.__code__
    if not code.co_argcount:
        return None
    name = code.co_varnames[0]
    try:
        hint = _hints(fn).get(name)
    except _Unsupported as exc:
        raise HandlerError(f"handler {kind!r}: the annotation of {name!r} {exc.problem}"
                           ) from None
    tp = _unwrap(hint)
    if not (_is_typeddict(tp) or _is_dataclass(tp) or _is_model(tp)):
        return None  # not a payload type: untyped, as before
    assert isinstance(tp, type)
    try:
        root = _compile(tp, {})
    except _Unsupported as exc:
        field = f"field {exc.where()!r}: " if exc.path else ""
        raise HandlerError(f"handler {kind!r}: payload type {tp.__name__}: {field}"
                           f"{exc.problem}") from None
    return Codec(kind, tp, root)


# --- mismatches ------------------------------------------------------------------------------


class _Mismatch(Exception):
    """A value that does not fit; each container it passes through adds its place to
    ``path`` (innermost first), so the success path builds no strings."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.path: list[str] = []

    def at(self, place: str) -> _Mismatch:
        self.path.append(place)
        return self

    def where(self) -> str:
        """The path, outermost first: ``owner.tags[2]``."""
        where = ""
        for place in reversed(self.path):
            where += place if place.startswith("[") or not where else "." + place
        return where

    def message(self, kind: str) -> str:
        field = f"field {self.where()!r}: " if self.path else ""
        return f"payload for {kind!r}: {field}{self.problem}"


def _expected(what: str, value: object) -> NoReturn:
    raise _Mismatch(f"expected {what}, got {_type_name(type(value))}")


class _Unsupported(_Mismatch):
    """A type no converter handles, found while compiling; its path names the field."""


# --- converters ------------------------------------------------------------------------------


class _Type:
    """The converter of one type: `dump` checks a Python value and returns JSON data,
    `load` checks JSON data and returns the Python value; both raise `_Mismatch`."""

    name = "?"
    # Attributes rather than methods here: scalars check both ways alike (``load = dump``).
    dump: Callable[[Any], Any]
    load: Callable[[Any], Any]

    def holds(self, value: object) -> bool:
        """Whether ``value`` is already of this type as the handler receives it (then the
        producer's callables get it as it is)."""
        return True


class _Any(_Type):
    name = "Any"

    def dump(self, value: Any) -> Any:
        return value  # orjson encodes it, or refuses it, with the rest

    def load(self, data: Any) -> Any:
        return data


class _Str(_Type):
    name = "str"

    def dump(self, value: Any) -> Any:
        if not isinstance(value, str):
            _expected("str", value)
        return value

    load = dump


class _Int(_Type):
    name = "int"

    def dump(self, value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            _expected("int", value)
        return value

    load = dump


class _Float(_Type):
    name = "float"

    def dump(self, value: Any) -> Any:
        if not isinstance(value, int | float) or isinstance(value, bool):
            _expected("float", value)
        return value  # an int is stored as it is, and arrives as a float

    def load(self, data: Any) -> Any:
        try:
            return float(self.dump(data))
        except OverflowError:
            raise _Mismatch("expected float, got an int too large for one") from None


class _Bool(_Type):
    name = "bool"

    def dump(self, value: Any) -> Any:
        if value is not True and value is not False:
            _expected("bool", value)
        return value

    load = dump


class _None(_Type):
    name = "None"

    def dump(self, value: Any) -> Any:
        if value is not None:
            _expected("None", value)
        return None

    load = dump


class _Parsed(_Type):
    """datetime, date and UUID: stored as their ISO 8601 (or canonical) strings."""

    def __init__(self, cls: type, parse: Callable[[str], Any],
                 text: Callable[[Any], str]) -> None:
        self.cls = cls
        self.name = cls.__name__
        self._parse = parse
        self._text = text

    def dump(self, value: Any) -> Any:
        # A datetime is a date too, but a date field stores and gets back a date.
        if not isinstance(value, self.cls) or (self.cls is date and isinstance(value, datetime)):
            _expected(self.name, value)
        return self._text(value)

    def load(self, data: Any) -> Any:
        if not isinstance(data, str):
            _expected(f"{self.name} (as a string)", data)
        try:
            return self._parse(data)
        except ValueError:
            raise _Mismatch(f"expected {self.name}, got a str that does not parse as one"
                            ) from None


class _Enum(_Type):
    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls = cls
        self.name = cls.__name__

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.cls):
            _expected(f"{self.name} (a member)", value)
        return value.value

    def load(self, data: Any) -> Any:
        try:
            return self.cls(data)
        except ValueError:
            raise _Mismatch(f"expected one of {self.name}'s values, got another "
                            f"{_type_name(type(data))}") from None


class _Literal(_Type):
    def __init__(self, values: tuple[Any, ...]) -> None:
        self.allowed = {(type(v), v) for v in values}  # 1 == True: the type must match too
        self.name = " or ".join(map(repr, values))

    def dump(self, value: Any) -> Any:
        try:
            if (type(value), value) in self.allowed:
                return value
        except TypeError:  # unhashable: not one of them
            pass
        raise _Mismatch(f"expected {self.name}, got another {_type_name(type(value))}")

    load = dump


class _List(_Type):
    def __init__(self, item: _Type) -> None:
        self.item = item
        self.name = f"list[{item.name}]"

    def dump(self, value: Any) -> Any:
        if not isinstance(value, list):
            _expected(self.name, value)
        return self._each(value, self.item.dump)

    def load(self, data: Any) -> Any:
        if not isinstance(data, list):
            _expected(self.name, data)
        return self._each(data, self.item.load)

    @staticmethod
    def _each(items: list[Any], convert: Callable[[Any], Any]) -> list[Any]:
        out = []
        for i, item in enumerate(items):
            try:
                out.append(convert(item))
            except _Mismatch as exc:
                raise exc.at(f"[{i}]") from None
        return out


class _Dict(_Type):
    def __init__(self, value: _Type) -> None:
        self.value = value
        self.name = f"dict[str, {value.name}]"

    def dump(self, value: Any) -> Any:
        if not isinstance(value, dict):
            _expected(self.name, value)
        return self._each(value, self.value.dump)

    def load(self, data: Any) -> Any:
        if not isinstance(data, dict):
            _expected(self.name, data)
        return self._each(data, self.value.load)

    def _each(self, items: dict[Any, Any], convert: Callable[[Any], Any]) -> dict[str, Any]:
        out = {}
        for key, item in items.items():
            if not isinstance(key, str):
                raise _Mismatch(f"expected str keys, got {_type_name(type(key))}")
            try:
                out[key] = convert(item)
            except _Mismatch as exc:
                raise exc.at(f"[{key!r:.40}]") from None
        return out


class _Optional(_Type):
    """``X | None``: the common union, whose mismatches keep X's own field and reason."""

    def __init__(self, inner: _Type) -> None:
        self.inner = inner
        self.name = f"{inner.name} | None"

    def dump(self, value: Any) -> Any:
        return None if value is None else self.inner.dump(value)

    def load(self, data: Any) -> Any:
        return None if data is None else self.inner.load(data)


class _Union(_Type):
    """Any other union: its members are tried in their order, the first that fits wins."""

    def __init__(self, members: list[_Type]) -> None:
        self.members = members
        self.name = " | ".join(m.name for m in members)

    def dump(self, value: Any) -> Any:
        return self._first(value, dumping=True)

    def load(self, data: Any) -> Any:
        return self._first(data, dumping=False)

    def _first(self, value: Any, *, dumping: bool) -> Any:
        for member in self.members:
            try:
                return member.dump(value) if dumping else member.load(value)
            except _Mismatch:
                pass
        _expected(self.name, value)


class _Fields(_Type):
    """A TypedDict's or a dataclass's fields. Filled (`add`) after the converter is made, so
    that a type may contain itself."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.names: set[str] = set()
        # (name, the converter's dump or load, required): bound once, used per job.
        self._dumps: list[tuple[str, Callable[[Any], Any], bool]] = []
        self._loads: list[tuple[str, Callable[[Any], Any], bool]] = []

    def add(self, name: str, conv: _Type, required: bool) -> None:
        self.names.add(name)
        self._dumps.append((name, conv.dump, required))
        self._loads.append((name, conv.load, required))

    def _dump_mapping(self, value: Mapping[Any, Any]) -> dict[str, Any]:
        """A dict given for the type: unknown keys are refused (a typo is caught where it is
        made), missing required ones too."""
        for key in value:
            if key not in self.names:
                raise _Mismatch(f"not a field of {self.name}").at(str(key))
        return self._convert(value, self._dumps)

    def _load_mapping(self, data: Any) -> dict[str, Any]:
        """Stored data: keys the type does not have are ignored, so that a producer of a
        newer version may add a field with a default before the workers have it."""
        if not isinstance(data, dict):
            _expected(f"{self.name} (a JSON object)", data)
        return self._convert(data, self._loads)

    def _convert(self, source: Mapping[Any, Any],
                 converts: list[tuple[str, Callable[[Any], Any], bool]]) -> dict[str, Any]:
        out = {}
        for name, convert, required in converts:
            if name in source:
                try:
                    out[name] = convert(source[name])
                except _Mismatch as exc:
                    raise exc.at(name) from None
            elif required:
                raise _Mismatch(f"missing (required by {self.name})").at(name)
        return out


class _TypedDict(_Fields):
    def dump(self, value: Any) -> Any:
        if not isinstance(value, dict):
            _expected(f"{self.name} (a dict)", value)
        return self._dump_mapping(value)

    def load(self, data: Any) -> Any:
        return self._load_mapping(data)


class _Dataclass(_Fields):
    def dump(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            out = {}
            for name, dump, _ in self._dumps:
                try:
                    out[name] = dump(getattr(value, name))
                except _Mismatch as exc:
                    raise exc.at(name) from None
            return out
        if isinstance(value, dict):
            return self._dump_mapping(value)
        _expected(f"{self.name} (an instance, or a dict of its fields)", value)

    def load(self, data: Any) -> Any:
        return _built(self.cls, self._load_mapping(data))

    def holds(self, value: object) -> bool:
        return isinstance(value, self.cls)


class _Model(_Type):
    """A pydantic v2 model: pydantic checks it. Stored data is validated as JSON (as
    pydantic reads a request body), so that strict models get ISO strings for datetimes."""

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.name = cls.__name__

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.cls):
            if not isinstance(value, dict):
                _expected(f"{self.name} (an instance, or a dict of its fields)", value)
            value = self._validated(self.cls.model_validate, value)
        return value.model_dump(mode="json")

    def load(self, data: Any) -> Any:
        return self._validated(self.cls.model_validate_json, orjson.dumps(data))

    def holds(self, value: object) -> bool:
        return isinstance(value, self.cls)

    def _validated(self, validate: Callable[[Any], Any], value: Any) -> Any:
        errors = sys.modules["pydantic"].ValidationError
        try:
            return validate(value)
        except errors as exc:
            first = exc.errors()[0]
            mismatch = _Mismatch(first["msg"])
            for place in reversed(first["loc"]):
                mismatch.at(f"[{place}]" if isinstance(place, int) else str(place))
            raise mismatch from None


def _built(cls: type, fields: dict[str, Any]) -> Any:
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:  # its __post_init__ refused the data
        raise _Mismatch(f"{cls.__name__}() raised {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())}") from None


# --- compiling an annotation -----------------------------------------------------------------

_SCALARS: Final[dict[Any, _Type]] = {
    str: _Str(), int: _Int(), float: _Float(), bool: _Bool(), None: _None(),
    type(None): _None(), Any: _Any(), object: _Any(),
}


def _compile(tp: Any, seen: dict[type, _Type]) -> _Type:
    """The converter of annotation ``tp``; ``seen`` holds the classes being compiled, so
    that a recursive type (a tree of nodes) refers to itself. Raises `_Unsupported`."""
    tp = _unwrap(tp)
    try:
        known = seen.get(tp) or _SCALARS.get(tp)
    except TypeError:  # an unhashable annotation
        raise _Unsupported(f"{tp!r} is not supported: use {SUPPORTED}") from None
    if known is not None:
        return known
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        members = [_compile(a, seen) for a in args]
        others = [m for m in members if not isinstance(m, _None)]
        if len(others) == 1 and len(members) == 2:
            return _Optional(others[0])
        return _Union(members)
    if origin is typing.Literal:
        if not all(isinstance(a, str | int | bool) or a is None for a in args):
            raise _Unsupported(f"{tp!r}: Literal values must be str, int, bool or None")
        return _Literal(args)
    if tp is list or origin is list:
        return _List(_compile(args[0], seen) if args else _SCALARS[Any])
    if tp is dict or origin is dict:
        if args and _unwrap(args[0]) not in (str, Any):
            raise _Unsupported(f"{_type_name(tp)} is not supported: JSON object keys are "
                               "strings, use dict[str, X]")
        return _Dict(_compile(args[1], seen) if args else _SCALARS[Any])
    if isinstance(tp, type):
        found = _compile_class(tp, seen)
        if found is not None:
            return found
    raise _Unsupported(f"{_type_name(tp)} is not supported: use {SUPPORTED}")


def _compile_class(tp: type, seen: dict[type, _Type]) -> _Type | None:
    if issubclass(tp, enum.Enum):
        if not all(isinstance(m.value, str | int) and not isinstance(m.value, bool)
                   for m in tp):
            raise _Unsupported(f"enum {tp.__name__}: its values must be str or int")
        return _Enum(tp)
    if tp is datetime or tp is date:
        return _Parsed(tp, tp.fromisoformat, tp.isoformat)
    uuid = sys.modules.get("uuid")
    if uuid is not None and tp is uuid.UUID:
        return _Parsed(tp, uuid.UUID, str)
    if _is_model(tp):
        return _Model(tp)
    if _is_typeddict(tp):
        fields: _Fields = _TypedDict(tp)
    elif _is_dataclass(tp):
        fields = _Dataclass(tp)
    else:
        return None
    seen[tp] = fields
    try:
        hints = _hints(tp)
    except _Unsupported as exc:
        exc.problem = f"the annotations of {tp.__name__} {exc.problem}"
        raise
    if isinstance(fields, _Dataclass):
        declared = [(f.name, hints[f.name], _required(f))
                    for f in dataclasses.fields(typing.cast(Any, tp)) if f.init]
    else:
        declared = [(name, hint, _key_required(tp, name, hint)) for name, hint in hints.items()]
    for name, hint, required in declared:
        try:
            fields.add(name, _compile(hint, seen), required)
        except _Unsupported as exc:
            raise exc.at(name) from None
    return fields


def _required(field: dataclasses.Field[Any]) -> bool:
    return (field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING)


def _key_required(td: type, name: str, hint: Any) -> bool:
    """Whether a TypedDict's key is required. ``Required[]`` and ``NotRequired[]`` are read
    from the resolved hint: Python 3.11 misses them in ``__required_keys__`` when annotations
    are strings (``from __future__ import annotations``)."""
    origin = typing.get_origin(hint)
    if origin is typing.Required:
        return True
    if origin is typing.NotRequired:
        return False
    return name in td.__required_keys__  # type: ignore[attr-defined]


def _hints(obj: Any) -> dict[str, Any]:
    """``obj``'s annotations, resolved; `_Unsupported` saying why they cannot be."""
    try:
        return typing.get_type_hints(obj, include_extras=True)
    except Exception as exc:  # NameError mostly: a later class, or one under TYPE_CHECKING
        raise _Unsupported(
            f"cannot be resolved ({type(exc).__name__}: {' '.join(str(exc).split())}): "
            "define or import the types named there at module level, before the handler"
        ) from None


def _unwrap(tp: Any) -> Any:
    """``tp`` without the wrappers that do not change what is stored: Annotated, Required,
    NotRequired, NewType."""
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated or origin in (typing.Required, typing.NotRequired):
            tp = typing.get_args(tp)[0]
        elif isinstance(tp, typing.NewType):
            tp = tp.__supertype__
        else:
            return tp


def _is_typeddict(tp: Any) -> bool:
    # typing_extensions' TypedDict too, which typing.is_typeddict does not know on 3.11.
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _is_dataclass(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_model(tp: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    return (pydantic is not None and isinstance(tp, type)
            and issubclass(tp, pydantic.BaseModel))


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    return repr(tp).replace("typing.", "")
