"""docs/architecture.md stays true: every path it names exists, and every module of the roles and the core is named
in it, so that a newcomer finds in one read the file where a change belongs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("gpusharing", "timekeeper", "webhook", "sidecar", "admin")


def named_paths(text: str) -> set[str]:
    """Repository paths in code spans: `timekeeper/api/budgets.py`, `webhook/caches/`, `gpusharing/cli.py`."""
    return {span for span in re.findall(r"`([^`\s]+)`", text) if "/" in span and span.split("/")[0] in (*PACKAGES, "demo",
            "migrations", "manifests", "charts", "plugins", "release", "tests", "bench", "examples", "docs")}


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
