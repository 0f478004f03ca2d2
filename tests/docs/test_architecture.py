"""docs/architecture.md stays true: every path it names exists, every module of the roles and the core is named in it,
so that a newcomer finds in one read the file where a change belongs, and imports point down only (no cycle)."""

from __future__ import annotations

import re
from pathlib import Path

import grimp

from tests.conftest import LONG_MODULES

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("gpusharing", "timekeeper", "webhook", "sidecar", "nodeagent")


def named_paths(text: str) -> set[str]:
    """Repository paths in code spans: `timekeeper/api/budgets.py`, `webhook/caches/`, `gpusharing/cli.py`."""
    return {
        span
        for span in re.findall(r"`([^`\s]+)`", text)
        if "/" in span
        and span.split("/")[0]
        in (
            *PACKAGES,
            "demo",
            "migrations",
            "manifests",
            "charts",
            "plugins",
            "release",
            "tests",
            "bench",
            "examples",
            "docs",
        )
    }


def test_every_path_it_names_exists() -> None:
    paths = named_paths(ARCHITECTURE.read_text())
    assert len(paths) > 50
    missing = sorted(path for path in paths if not (ROOT / path.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_module_of_the_roles_and_the_core_is_placed() -> None:
    lines = ARCHITECTURE.read_text().splitlines()
    unplaced = []
    for package in PACKAGES:
        for module in sorted((ROOT / package).rglob("*.py")):
            if module.name == "__init__.py":
                continue
            path = module.relative_to(ROOT).as_posix()
            folder = f"`{module.parent.relative_to(ROOT).as_posix()}/`"
            if not any(f"`{path}`" in line or (folder in line and f"`{module.name}`" in line) for line in lines):
                unplaced.append(path)
    assert not unplaced, f"docs/architecture.md does not say where these live: {unplaced}"


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The modules that import each other, directly or through others (strongly connected sets of two or more)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            cycle = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(cycle) > 1:
                cycles.append(sorted(cycle))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_imports_point_down_only_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph(*PACKAGES, "demo")
    assert import_cycles(graph) == []


def test_a_cycle_is_found() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=importer, imported=imported)
    assert import_cycles(graph) == [["a", "b", "c"]]


MAX_MODULE_LINES = 450  # past this a module holds more than one room: split it, named for what each part holds


def test_no_module_of_the_roles_and_the_core_passes_the_size_a_newcomer_reads_at_once() -> None:
    long = {module.relative_to(ROOT).as_posix(): lines for package in PACKAGES
            for module in (ROOT / package).rglob("*.py")
            if (lines := len(module.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_every_import_contract_is_listed_in_the_development_guide() -> None:
    contracts = re.findall(r"^\[importlinter:contract:([\w-]+)\]", (ROOT / ".importlinter").read_text(), re.M)
    guide = (ROOT / "docs" / "development.md").read_text()
    assert len(contracts) >= 9
    assert [name for name in contracts if f"| `{name}` |" not in guide] == []


def test_the_benchmarks_import_nothing_from_the_tests() -> None:
    """bench/ shares what it needs with the tests through testbed/, never tests/ itself."""
    importing = [path.name for path in sorted((ROOT / "bench").glob("*.py"))
                 if re.search(r"^\s*(from|import) tests\b", path.read_text(), re.M)]
    assert len(list((ROOT / "bench").glob("*.py"))) > 5
    assert importing == []


def test_the_long_modules_the_workers_take_first_exist() -> None:
    """tests/conftest.py collects these first; a module renamed would silently fall back into line."""
    assert len(LONG_MODULES) > 5
    assert [path for path in LONG_MODULES if not path.is_file()] == []
