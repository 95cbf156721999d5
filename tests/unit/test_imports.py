"""The import graph of pgpool, its benchmarks and its tests: no cycles between pgpool's
modules, no module reaching into another's private names (``from m import _x`` or
``m._x`` on an imported module), and the walls between the folders (`WALLS`): the worker
imports the application API only, the host the worker, the installation and the API, no
wing imports a front end (the CLI, the dashboard, the bench, the test kit), only the
dispatcher imports the side parts, and what a worker process imports leaves out psycopg
and asyncio."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from places import ROOT

PACKAGE = ROOT / "pgpool"


#: The top-level names of our own modules: pgpool, the benchmarks' and the tests'.
OURS = frozenset({"pgpool", *(p.stem for p in [*(ROOT / "bench").glob("*.py"),
                                                *(ROOT / "tests").rglob("*.py")])})


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every import in ``path``, relative ones resolved."""
    return [found for node in ast.walk(ast.parse(path.read_text()))
            for found in _resolved(path, node)]


def imports_on_load(path: Path) -> set[str]:
    """The modules importing ``path`` imports: those of its body, not the ones inside its
    functions or under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            found.update(module for module, _ in _resolved(path, node))
            if isinstance(node, ast.If) and ast.unparse(node.test) != "TYPE_CHECKING":
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(handler.body for handler in node.handlers)):
                    visit(block)

    visit(ast.parse(path.read_text()).body)
    return found


def _resolved(path: Path, node: ast.AST) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for ``node`` if it is an import in ``path``."""
    if isinstance(node, ast.Import):
        return [(alias.name, []) for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []
    module = ".".join([*base, *([node.module] if node.module else [])])
    # `from . import x` may name a submodule.
    return [*((f"{module}.{alias.name}", []) for alias in node.names),
            (module, [alias.name for alias in node.names])]


def _ours(node: ast.Import | ast.ImportFrom, name: str) -> bool:
    """Whether ``name`` imported by ``node`` is pgpool's, a benchmark's or a test's."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return True
        name = node.module or name
    return name.split(".")[0] in OURS


def test_pgpool_modules_import_no_cycle() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    ours = {module_name(p) for p in paths}
    graph = {module_name(p): {m for m, _ in imports(p) if m in ours and m != module_name(p)}
             for p in paths}
    # A package imports its modules' names by design; a module's package is not a cycle.
    for name, deps in graph.items():
        deps -= {d for d in deps if name.startswith(d + ".")}
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_no_module_uses_another_modules_private_names() -> None:
    crossings = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(ROOT / "bench").rglob("*.py"),
                        *(ROOT / "tests").rglob("*.py")]):
        nodes = list(ast.walk(ast.parse(path.read_text())))
        for module, names in (found for node in nodes for found in _resolved(path, node)):
            crossings += [f"{path.relative_to(ROOT)}: from {module} import {n}"
                          for n in names if n.startswith("_") and n != "__future__"
                          and module != "__future__"]
        # Local names bound to our modules (not the standard library's `os._exit`...).
        modules = {alias.asname or alias.name for node in nodes
                   if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names
                   if _ours(node, alias.name)}
        crossings += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in nodes
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in modules and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    assert not crossings, "\n".join(crossings)


#: The wings of the package, by folder (`wing`), and which others each may import. The
#: application API is the flat top level (``pgpool/*.py``) with the statements in
#: ``pgpool/sql``; the host (the dispatcher's process) and the worker (a worker process)
#: each have a folder, as do the installation (``db``) and the front ends (the CLI, the
#: dashboard, the bench, the test kit), which may import anything and nothing imports.
WALLS: dict[str, frozenset[str]] = {
    "api": frozenset({"api", "sql"}),
    "sql": frozenset({"sql"}),
    "db": frozenset({"db", "api", "sql"}),
    "worker": frozenset({"worker", "api"}),
    "host": frozenset({"host", "parts", "worker", "db", "api", "sql"}),  # parts: `SUPERVISOR`
    "parts": frozenset({"parts", "host", "worker", "db", "api", "sql"}),
    "contrib": frozenset({"contrib", "db", "api", "sql"}),
}
#: The package's face hands on what users import: `current_job` from the worker's
#: ``main`` and `migrate` from the installation's ``schema``, nothing else of theirs.
FACE_IMPORTS = frozenset({"pgpool.worker.main", "pgpool.db.schema"})
#: The one module that builds the side parts (`pgpool.host.parts`).
SUPERVISOR = "pgpool.host.dispatcher"
#: What a worker process imports first: pgpool (handler modules use ``@pgpool.handler``),
#: pgpool.cli (the ``pgpool`` script's main module, which "spawn" imports again), the
#: worker's own module, and the bench's handler module.
WORKER_ENTRIES = ("pgpool", "pgpool.cli", "pgpool.worker.main", "pgpool.bench.jobs")
#: What a worker must never import: psycopg adds about 0.15 s of CPU to each worker's
#: start, and a worker never talks to the database (tests/host/test_pool.py checks the same
#: at run time).
NOT_IN_WORKERS = ("psycopg", "psycopg_pool", "asyncio")


def _within(name: str, places: tuple[str, ...] | str) -> bool:
    places = (places,) if isinstance(places, str) else places
    return any(name == p or name.startswith(p + ".") for p in places)


def wing(name: str) -> str:
    """The wing of pgpool's module ``name``: its folder, or "api" for the top level."""
    parts = name.split(".")
    if name == "pgpool":
        return "face"
    if parts[1] in ("cli", "web", "bench", "testing", "__main__"):
        return "front"
    if parts[1] == "host" and len(parts) > 2 and parts[2] == "parts":
        return "parts"
    if parts[1] in ("host", "worker", "db", "sql", "contrib"):
        return parts[1]
    return "api"


def test_each_wing_imports_only_the_wings_below_it() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    ours = {module_name(p) for p in paths}
    crossings = []
    for path in paths:
        name = module_name(path)
        mine = wing(name)
        for module, _ in imports(path):
            if module not in ours or module == "pgpool" or _within(name, module):
                continue  # not ours; the face, named by `from .. import x`; a parent package
            theirs = wing(module)
            if mine == "front":
                continue
            if mine == "face":
                allowed = theirs in ("api", "sql") or module in FACE_IMPORTS
            else:
                allowed = theirs in WALLS[mine]
            if not allowed:
                crossings.append(f"{name} ({mine}) imports {module} ({theirs})")
            if theirs == "parts" and mine != "parts" and name != SUPERVISOR:
                crossings.append(f"{name} imports the side part {module}")
    assert not crossings, "\n".join(crossings)


def test_the_folders_are_the_wings() -> None:
    # A new module goes in its wing: the top level holds the application API alone.
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {"host", "worker", "db", "sql", "cli", "web", "bench", "testing",
                       "contrib"}
    assert {p.name for p in (PACKAGE / "host").iterdir() if p.is_dir()} - {"__pycache__"} == {
        "parts"}
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= 20, top


def test_what_a_worker_imports_leaves_out_psycopg_and_asyncio() -> None:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    reached: dict[str, str] = {}  # module -> the module that imported it first
    todo = [(entry, "a worker") for entry in WORKER_ENTRIES]
    while todo:
        name, by = todo.pop()
        if name in reached:
            continue
        reached[name] = by
        if name not in paths:
            continue
        # Importing a module runs its packages' __init__ first.
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo += [(parent, name) for parent in parents]
        todo += [(module, name) for module in imports_on_load(paths[name])]
    found = [f"{name} (imported by {reached[name]})" for name in sorted(reached)
             if _within(name, NOT_IN_WORKERS)]
    assert not found, found
