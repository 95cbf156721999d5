"""The import graph of pgpool, its benchmarks and its tests: no cycles between pgpool's
modules, and no module reaching into another's private names (``from m import _x`` or
``m._x`` on an imported module)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pgpool"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every import in ``path``, relative ones resolved."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:  # `from . import x` may name a submodule
                found.append((f"{module}.{alias.name}", []))
            found.append((module, [alias.name for alias in node.names]))
    return found


def _ours(node: ast.Import | ast.ImportFrom, name: str) -> bool:
    """Whether ``name`` imported by ``node`` is pgpool's, a benchmark's or a test's."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return True
        name = node.module or name
    local = {p.stem for p in [*(ROOT / "bench").glob("*.py"), *(ROOT / "tests").glob("*.py")]}
    return name.split(".")[0] in {"pgpool", *local}


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
                        *(ROOT / "tests").glob("*.py")]):
        tree = ast.parse(path.read_text())
        for module, names in imports(path):
            crossings += [f"{path.relative_to(ROOT)}: from {module} import {n}"
                          for n in names if n.startswith("_") and n != "__future__"
                          and module != "__future__"]
        # Local names bound to our modules (not the standard library's `os._exit`...).
        modules = {alias.asname or alias.name for node in ast.walk(tree)
                   if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names
                   if _ours(node, alias.name)}
        crossings += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in modules and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    assert not crossings, "\n".join(crossings)
