"""Which part of sluicegate may import which, no import cycle between modules,
and no module over ``MAX_LINES`` lines but those still listed to be split.

The imports are read from the source with ``ast``, not by importing it: every
``import`` counts, at module level, inside a function or under
``TYPE_CHECKING``. ``from a import b`` where ``a.b`` is a module is an import of
``a.b``. The rule is written down in docs/ARCHITECTURE.md, "Layers".
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path

import pytest

import sluicegate

# Part -> the other parts it may import. A part is a subpackage of a layer
# (``server.streaming``), the modules directly in a layer (``core``: its shared
# modules and its ``__init__``), a top-level module, or the package's own
# ``__init__`` under its name. A package's ``__init__`` may also import its own
# subpackages (``core`` re-exports public names from ``core.decoding``). The
# parts form layers: no part may import one that imports it (see
# ``test_the_layer_rule_itself_points_down``).
CORE = frozenset({"core", "core.decoding", "core.wire", "core.upstream"})
ENGINES = frozenset(
    {"engines", "engines.llamacpp", "engines.scripted", "engines.upstream"}
    | {"engines.remote"}
)
SERVER_BELOW_APIS = frozenset(
    {"server", "server.admission", "server.http", "server.schemas", "server.ledger"}
    | {"server.stores", "server.redis", "server.prepare", "server.streaming"}
    | {"server.metering", "server.resumable"}
)
SERVER = SERVER_BELOW_APIS | {"server.apis", "server.app"}
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "core.decoding": frozenset({"core"}),
    "core.wire": frozenset({"core"}),
    "core.upstream": frozenset({"core", "core.decoding", "core.wire"}),
    "engines": CORE,
    # The vocabulary cache lives in the data directory.
    "engines.llamacpp": CORE | {"engines", "model"},
    "engines.scripted": CORE | {"engines"},
    "engines.upstream": CORE | {"engines"},
    # The engine process hosts a llama.cpp engine, and checks grammars with it.
    "engines.remote": CORE | {"engines", "engines.llamacpp"},
    # The server's parts, bottom to top.
    "server.schemas": CORE,
    # The read deadlines and the Redis timers run on engines/clocks.py.
    "server.http": CORE | {"engines"},
    # server.http holds the errors every part above it raises and answers.
    "server.admission": CORE | {"server.http"},
    "server": CORE | {"server.admission", "server.schemas"},
    "server.ledger": CORE | ENGINES,
    "server.stores": CORE | {"server", "server.http"},
    "server.redis": CORE
    | {"engines", "server", "server.admission", "server.http", "server.stores"},
    "server.prepare": CORE | ENGINES | {"server", "server.schemas", "sluicegate"},
    "server.streaming": CORE
    | ENGINES
    | {"server", "server.admission", "server.http", "server.prepare"}
    | {"server.stores"},
    "server.metering": CORE
    | ENGINES
    | {"server.admission", "server.http", "server.ledger", "server.prepare"}
    | {"server.streaming"},
    "server.resumable": CORE
    | ENGINES
    | {"server", "server.admission", "server.http", "server.metering"}
    | {"server.prepare", "server.stores", "server.streaming"},
    "server.apis": CORE | ENGINES | SERVER_BELOW_APIS | {"sluicegate"},
    "server.app": CORE
    | ENGINES
    | SERVER_BELOW_APIS
    | {"server.apis", "sluicegate", "model"},
    "client": CORE,
    "check": CORE | {"client"},
    "sluicegate": CORE,
    "demo": CORE,
    "cpu": frozenset(),
    "model": frozenset(),
    "testing": frozenset(),
    "doctor": CORE | ENGINES | {"cpu"},
    "doctor_upstream": ENGINES,
    "cli": CORE
    | ENGINES
    | SERVER
    | {"check", "demo", "doctor", "doctor_upstream", "model"},
    "__main__": frozenset({"cli"}),
}

# A module fits in one sentence and about this many lines.
MAX_LINES = 400

# The modules still over MAX_LINES, each with the most lines it may have: its
# count when it was listed. A listed module may not grow, none may join, and one
# split to MAX_LINES or fewer (or gone) must leave: the list only shrinks.
OVER_MAX_LINES: dict[str, int] = {}

# What core may import besides the standard library: one fast JSON encoder, and
# typing_extensions for ``@override`` on Python 3.11.
CORE_THIRD_PARTY = frozenset({"orjson", "typing_extensions"})

Graph = dict[str, set[str]]


def modules(root: Path) -> dict[str, Path]:
    """Every module below ``root`` (a package directory) by its dotted name."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_names(path: Path, known: Collection[str]) -> Iterator[str]:
    """The names one file's import statements import, submodules first.

    ``from a import b`` is an import of ``a.b`` when ``a.b`` is in ``known``, else
    of ``a``.
    """
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # No module uses relative imports; a new one would be misread here.
            assert node.level == 0, f"relative import in {path}"
            assert node.module is not None
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield submodule if submodule in known else node.module


def import_graph(root: Path) -> tuple[Graph, Graph]:
    """The package's imports: module -> its modules; module -> outside packages.

    Outside packages are given by their top-level names (``orjson``, ``os``).
    """
    known = modules(root)
    graph: Graph = {name: set() for name in known}
    outside: Graph = {name: set() for name in known}
    for name, path in known.items():
        for target in imported_names(path, known):
            if target.split(".")[0] != root.name:
                outside[name].add(target.split(".")[0])
                continue
            while target not in known:
                target = target.rsplit(".", 1)[0]
            if target != name:
                graph[name].add(target)
    return graph, outside


def subpackages(root: Path) -> frozenset[str]:
    """The dotted names of the packages two levels below ``root``
    (``pkg.server.streaming``): the parts a layer is split into."""
    return frozenset(
        ".".join([root.name, *path.parent.relative_to(root).parts])
        for path in root.glob("*/*/__init__.py")
    )


def part(module: str, packages: Collection[str] = ()) -> str:
    """The part a module belongs to: ``a.server.streaming.x`` ->
    ``server.streaming`` when ``a.server.streaming`` is in ``packages``;
    ``a.core.x`` -> ``core``; ``a`` -> ``a``."""
    pieces = module.split(".")
    if ".".join(pieces[:3]) in packages:
        return ".".join(pieces[1:3])
    return pieces[1] if len(pieces) > 1 else pieces[0]


def layer_violations(
    graph: Graph,
    allowed: Mapping[str, frozenset[str]],
    packages: Collection[str] = (),
) -> list[str]:
    """Each import from one part into another that ``allowed`` does not list;
    a package's ``__init__`` may import what is below it."""
    return sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if part(target, packages) != part(source, packages)
        and part(target, packages)
        not in allowed.get(part(source, packages), frozenset())
        and not target.startswith(source + ".")
    )


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


PACKAGE = Path(sluicegate.__file__).parent


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(PACKAGE)[0]


PARTS = subpackages(PACKAGE)


def test_every_part_of_the_package_has_a_rule(graph: Graph) -> None:
    assert {part(module, PARTS) for module in graph} == set(ALLOWED)


def test_imports_follow_the_layer_rule(graph: Graph) -> None:
    assert layer_violations(graph, ALLOWED, PARTS) == []


def test_the_layer_rule_itself_points_down() -> None:
    assert cycles({name: set(targets) for name, targets in ALLOWED.items()}) == []


def test_no_two_modules_import_each_other_even_indirectly(graph: Graph) -> None:
    assert cycles(graph) == []


def test_core_imports_only_the_standard_library_and_orjson() -> None:
    _, outside = import_graph(PACKAGE)
    core = set().union(*(names for m, names in outside.items() if part(m) == "core"))
    assert core - sys.stdlib_module_names - CORE_THIRD_PARTY == set()


def _write(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_rule_catches_an_import_up_the_layers(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/core/a.py": "def f():\n    from pkg.server import b\n",
            "pkg/server/__init__.py": "",
            "pkg/server/b.py": "from pkg.core import a\n",
        },
    )
    graph, _ = import_graph(root)
    allowed = {"core": frozenset(), "server": frozenset({"core"})}
    assert layer_violations(graph, allowed) == ["pkg.core.a imports pkg.server.b"]
    assert cycles(graph) == [["pkg.core.a", "pkg.server.b"]]


def test_the_rule_tells_the_subpackages_of_a_layer_apart(tmp_path: Path) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "from pkg.core.wire import sse\n",
            "pkg/core/events.py": "",
            "pkg/core/wire/__init__.py": "",
            "pkg/core/wire/sse.py": "from pkg.core import events\n",
            "pkg/core/decoding/__init__.py": "",
            "pkg/core/decoding/stops.py": "from pkg.core.wire import sse\n",
        },
    )
    graph, _ = import_graph(root)
    packages = subpackages(root)
    assert packages == {"pkg.core.wire", "pkg.core.decoding"}
    allowed = {
        "core": frozenset(),
        "core.wire": frozenset({"core"}),
        "core.decoding": frozenset({"core"}),
    }
    assert layer_violations(graph, allowed, packages) == [
        "pkg.core.decoding.stops imports pkg.core.wire.sse"
    ]


def test_a_cycle_through_type_checking_and_three_modules_is_found(
    tmp_path: Path,
) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "from pkg import c\n",
            "pkg/c.py": "if TYPE_CHECKING:\n    from pkg.a import thing\n",
            "pkg/d.py": "from pkg.a import thing\nimport os\n",
        },
    )
    graph, outside = import_graph(root)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert graph["pkg.d"] == {"pkg.a"}
    assert outside["pkg.d"] == {"os"}


def line_counts(root: Path) -> dict[str, int]:
    """Lines of each module below ``root`` (as ``wc -l`` counts them), by its
    path relative to ``root``."""
    return {
        path.relative_to(root).as_posix(): path.read_text().count("\n")
        for path in sorted(root.rglob("*.py"))
    }


def size_violations(
    counts: Mapping[str, int], allowed: Mapping[str, int], max_lines: int
) -> list[str]:
    """Each module longer than ``max_lines`` or than its listed ceiling, and each
    listed module that is gone or no longer over ``max_lines``."""
    found = [
        f"{path} has {lines} lines, more than {allowed.get(path, max_lines)}:"
        " split it along what its parts do"
        for path, lines in counts.items()
        if lines > allowed.get(path, max_lines)
    ]
    found += [
        f"{path} is listed in OVER_MAX_LINES but has {counts[path]} lines:"
        " remove it from the list"
        if path in counts
        else f"{path} is listed in OVER_MAX_LINES but is gone: remove it"
        for path in allowed
        if counts.get(path, 0) <= max_lines
    ]
    return sorted(found)


def test_no_module_grows_past_its_ceiling_and_the_list_only_shrinks() -> None:
    assert size_violations(line_counts(PACKAGE), OVER_MAX_LINES, MAX_LINES) == []


def test_the_size_rule_catches_growth_a_new_long_module_and_a_stale_entry(
    tmp_path: Path,
) -> None:
    root = _write(
        tmp_path,
        {
            "pkg/a.py": "x = 1\n" * 6,  # listed at 5: grew
            "pkg/b.py": "x = 1\n" * 5,  # listed at 5: as it was
            "pkg/c.py": "x = 1\n" * 4,  # not listed, over the bound
            "pkg/d.py": "x = 1\n" * 3,  # listed, split to within the bound
            "pkg/e.py": "x = 1\n" * 3,  # not listed, within the bound
        },
    )
    allowed = {"a.py": 5, "b.py": 5, "d.py": 5, "gone.py": 9}
    assert size_violations(line_counts(root), allowed, 3) == [
        "a.py has 6 lines, more than 5: split it along what its parts do",
        "c.py has 4 lines, more than 3: split it along what its parts do",
        "d.py is listed in OVER_MAX_LINES but has 3 lines: remove it from the list",
        "gone.py is listed in OVER_MAX_LINES but is gone: remove it",
    ]
