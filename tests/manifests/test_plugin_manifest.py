"""plugins/gpusharing.yaml, krew's manifest of the kubectl plugin: krew's rules for a manifest, the version of the
package, and the sha256 of the archive `make plugin` builds, whose launcher runs the installed plugin."""

from __future__ import annotations

import glob
import hashlib
import io
import os
import re
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
sys.path.insert(0, str(PLUGINS))
import build  # noqa: E402  (plugins/build.py, what `make plugin` runs)

SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?$")


def manifest() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((PLUGINS / "gpusharing.yaml").read_text())


def test_the_manifest_follows_krews_rules() -> None:
    plugin = manifest()
    assert (plugin["apiVersion"], plugin["kind"]) == ("krew.googlecontainertools.github.com/v1alpha2", "Plugin")
    assert plugin["metadata"]["name"] == "gpusharing" == (PLUGINS / "gpusharing.yaml").stem
    spec = plugin["spec"]
    assert SEMVER.match(spec["version"]) and 0 < len(spec["shortDescription"]) <= 50 and spec["description"]
    assert spec["platforms"]
    for platform in spec["platforms"]:
        for expression in platform["selector"]["matchExpressions"]:
            assert (
                expression["key"] in ("os", "arch")
                and expression["operator"] in ("In", "NotIn")
                and expression["values"]
            )
        assert re.fullmatch(r"[0-9a-f]{64}", platform["sha256"]) and platform["uri"].startswith("https://")
        assert platform["bin"] and not platform["bin"].startswith("/") and ".." not in platform["bin"]


def test_the_manifest_names_this_versions_archive_and_its_sha256() -> None:
    spec = manifest()["spec"]
    assert spec["version"] == f"v{build.version()}"
    data = build.archive()
    assert build.archive() == data  # the same bytes each time, so a sha256 can be published
    for platform in spec["platforms"]:
        assert platform["uri"].endswith(f"/v{build.version()}/{build.archive_name()}")
        assert platform["sha256"] == hashlib.sha256(data).hexdigest(), (
            "run `make plugin` and put its sha256 in the manifest"
        )
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
        assert platform["bin"] in names and all(f["from"] in names for f in platform["files"])


def test_the_archive_carries_no_trace_of_the_python_or_the_machine_that_built_it() -> None:
    data = build.archive()
    flags, mtime, _, os_byte = struct.unpack("<BIBB", data[3:10])
    assert (flags, mtime, os_byte) == (0, 0, 3)  # no file name, no time, Unix: not the OS byte of Python's gzip
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [(m.name, m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname, m.type) for m in members] == [
        ("kubectl-gpusharing", 0o755, 0, 0, 0, "", "", tarfile.REGTYPE)]


def supported_pythons() -> list[str]:
    """The other supported interpreters this machine has (the system's, or pyenv's)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = {
        str(Path(p).resolve())
        for minor in (10, 11, 12, 13)
        for p in [f"/usr/bin/python3.{minor}", *glob.glob(str(pyenv / f"3.{minor}.*" / "bin" / "python3"))]
        if Path(p).exists()
    }
    return sorted(found - {str(Path(sys.executable).resolve())})


@pytest.mark.parametrize(
    "python", supported_pythons() or [pytest.param(None, marks=pytest.mark.skip("no other Python 3.10-3.13 here"))]
)
def test_every_supported_python_builds_the_same_archive(python: str, tmp_path: Path) -> None:
    built = subprocess.run(
        [python, str(PLUGINS / "build.py"), str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert built.stdout.split()[0] == hashlib.sha256(build.archive()).hexdigest(), python


def test_the_archives_launcher_runs_the_installed_plugin(tmp_path: Path) -> None:
    launcher = tmp_path / "kubectl-gpusharing"
    with tarfile.open(fileobj=io.BytesIO(build.archive())) as tar:  # (extractall's filter needs Python 3.11.4)
        member = tar.extractfile("kubectl-gpusharing")
        assert member is not None
        launcher.write_bytes(member.read())
    launcher.chmod(0o755)
    env = {**os.environ, "GPUSHARING_PYTHON": sys.executable}
    ran = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, env=env)
    assert (ran.returncode, ran.stdout.split()[:2]) == (0, ["kubectl", "gpusharing"])
    bare_python = tmp_path / "python-without-packages"  # isolated, no site-packages: the package is not there
    bare_python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare_python.chmod(0o755)
    bare = subprocess.run([str(launcher), "budget", "ls"], capture_output=True, text=True,
                          env={**env, "GPUSHARING_PYTHON": str(bare_python)})
    assert bare.returncode == 2 and bare.stderr.count("\n") == 1 and "pip install kube-gpusharing" in bare.stderr
