"""The project's manifests as `kubectl kustomize` renders them, for the manifest tests and the end-to-end tier."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"


def kustomize(path: Path = MANIFESTS) -> list[dict[str, Any]]:
    rendered = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]
