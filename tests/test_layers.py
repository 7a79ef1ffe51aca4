"""The import direction: every import in delaywheel points down the layers.

Read from the source with ``ast``, not by importing: every import counts,
at the top of a module, inside a function (a lazy import for start-up
speed) or under ``TYPE_CHECKING``. A layer may import the layers below it
and its own modules, never one above or one beside it (the wheel and the
store know nothing of each other). Cycles between modules are refused too,
counting what runs: a type-only import back into an owner (a connection
names its server) is not executed, but it may not point up a layer either.
Cycles between packages are refused as well: a module given a layer of its
own below its package's (``net.tls`` once was, for ``config`` to import it
inside a function while ``net`` imports ``config``) would hide one from the
module-by-module check.

A new module or package must be given its layer here (docs/layout.md has
the picture).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENT = "delaywheel_client"

# Units, lowest layer first. A module belongs to the longest unit that is a
# prefix of its dotted name (``delaywheel`` itself is the package's own
# ``__init__``, holding the version).
LAYERS: dict[str, int] = {
    "delaywheel": 0,
    "delaywheel.errors": 0,
    "delaywheel.tallies": 0,
    # Cancelling tasks that may be inside a redis-py call (stores, brokers, leases).
    "delaywheel.cancelling": 0,
    "delaywheel.checks": 1,
    "delaywheel.wheel": 2,
    # The stores; store.redis, the Redis store (plain, Sentinel, Cluster), is
    # part of it: fencing is how it writes, below the leases (docs/layout.md).
    "delaywheel.store": 2,
    # Recurring schedules, the pure part: cron, the schedule map, the planner.
    "delaywheel.schedules": 2,
    "delaywheel.delivery": 3,
    # High availability: leases, membership, the coordinator, the ownership the engine gets.
    "delaywheel.ha": 4,
    "delaywheel.engine": 5,
    "delaywheel.config": 6,
    "delaywheel.net": 7,
    "delaywheel.logs": 8,
    "delaywheel.metrics": 8,
    # The dashboard: reads the running server, its settings shown as the logs show them.
    "delaywheel.web": 9,
    # The HTTP API (/v1): the protocol's methods as resources, beside the dashboard.
    "delaywheel.httpapi": 9,
    "delaywheel.app": 10,
    "delaywheel.cli": 11,
    "delaywheel.__main__": 12,
}


def _modules(package_dir: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


SERVER_MODULES = _modules(ROOT / "delaywheel", "delaywheel")
CLIENT_MODULES = _modules(ROOT / "client" / CLIENT, CLIENT)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """``(imported module, runs)`` for every import in ``path``; ``runs`` is
    False under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor.pop()
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in known else base, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


def _unit(module: str) -> str:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        unit = ".".join(parts[:end])
        if unit in LAYERS and (unit != "delaywheel" or module == "delaywheel"):
            return unit
    raise AssertionError(f"{module} has no layer: add it to LAYERS in {__file__}")


def _edges() -> list[tuple[str, str, bool]]:
    edges = []
    for module, path in SERVER_MODULES.items():
        for target, runs in _imports(module, path, SERVER_MODULES):
            if target in SERVER_MODULES and target != module:
                edges.append((module, target, runs))
    return edges


def test_every_module_has_a_layer() -> None:
    for module in SERVER_MODULES:
        _unit(module)


def test_imports_point_down_the_layers() -> None:
    upward = []
    for source, target, _ in _edges():
        a, b = _unit(source), _unit(target)
        if a != b and LAYERS[a] <= LAYERS[b]:
            upward.append(f"{source} ({a}, layer {LAYERS[a]}) imports {target} (layer {LAYERS[b]})")
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_no_module_imports_itself_through_others() -> None:
    graph: dict[str, set[str]] = {module: set() for module in SERVER_MODULES}
    for source, target, runs in _edges():
        if runs:
            graph[source].add(target)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first search meets, as ``a -> b -> a``."""
    colour = dict.fromkeys(graph, 0)  # white, grey (on the stack), black
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif colour[nxt] == 0:
                visit(nxt)
        stack.pop()
        colour[node] = 2

    for node in sorted(graph):
        if colour[node] == 0:
            visit(node)
    return cycles


def _package(module: str) -> str:
    """``delaywheel.net`` for ``delaywheel.net.tls``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def test_no_package_imports_itself_through_others() -> None:
    graph: dict[str, set[str]] = {_package(module): set() for module in SERVER_MODULES}
    for source, target, runs in _edges():
        if runs and _package(source) != _package(target):
            graph[_package(source)].add(_package(target))
    cycles = _cycles(graph)
    assert not cycles, "import cycles between packages:\n" + "\n".join(cycles)


def test_the_client_imports_nothing_of_the_server() -> None:
    leaks = [
        f"{module} imports {target}"
        for module, path in CLIENT_MODULES.items()
        for target, _ in _imports(module, path, CLIENT_MODULES)
        if target == "delaywheel" or target.startswith("delaywheel.")
    ]
    assert not leaks, "\n".join(leaks)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from delaywheel.wheel import Entry\n", ["delaywheel.wheel"]),
        ("from delaywheel.engine import validate\n", ["delaywheel.engine.validate"]),
        ("def f():\n    import delaywheel.app\n", ["delaywheel.app"]),
        ("if TYPE_CHECKING:\n    from delaywheel.net.server import Server\n", []),
    ],
)
def test_the_reader_sees_every_kind_of_import(
    source: str, expected: list[str], tmp_path: Path
) -> None:
    """The checks above are only as good as this reader: each form it must see."""
    path = tmp_path / "probe.py"
    path.write_text(source)
    found = _imports("delaywheel.engine.probe", path, SERVER_MODULES)
    assert [name for name, runs in found if runs] == expected
    if "TYPE_CHECKING" in source:
        assert found == [("delaywheel.net.server", False)]
