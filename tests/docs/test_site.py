"""The documentation: a short README, and a site in docs/ that MkDocs builds with every link, anchor and page
checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link or anchor, or a page in docs/ that the nav leaves out, fails the build."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["strict"] is True
    assert set(config["validation"].values()) == {"warn"}, "strict mode fails only on what validation warns of"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "index.html").is_file()


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) < 2000, "the README is the short path: the rest goes into docs/"
    lines = readme.splitlines()
    assert lines[0].startswith("# ") and lines[2] == "```sh" and lines[5] == "```"
    assert lines[3].startswith("make demo ") and lines[4].startswith("make test ")
