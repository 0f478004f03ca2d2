"""`make dist`: every release artifact of the one version in setup.cfg, into a directory (`python -m release.dist
dist`).

- the sdist and the wheel (`python -m build`), `twine check --strict`ed, and the wheel installed alone in a fresh
  virtualenv, where `gpusharing --version` must name the version;
- the Helm chart packaged (Helm's own SDK, as the tests render it) with the repository's `index.yaml`;
- the krew archive (`plugins/build.py`);
- SHA256SUMS of them all.

Times written into the chart and the index are SOURCE_DATE_EPOCH's (the Makefile passes the last commit's), so that a
rebuild of the same commit gives the same bytes whatever the clone's file times and whichever Python builds.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import venv
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import helm_python as helm
import yaml

from plugins import build as krew

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kube-gpusharing"
CHANGELOG = ROOT / "CHANGELOG.md"
CONSTRAINTS = ROOT / "constraints.txt"
# The wheel's top-level packages, exactly: the product. demo/ (the demo and its stand-in Kubernetes API) and testbed/
# (what the tests and bench/ run on) are run from the repository, never installed (setup.cfg).
PACKAGES = ("gpusharing", "webhook", "timekeeper", "sidecar", "nodeagent", "migrations")
RELEASES = "https://github.com/kube-gpusharing/kube-gpusharing/releases/download"  # where a release's assets go


class ReleaseError(RuntimeError):
    """What is wrong with the release and what to do, a line each."""


def version() -> str:
    return krew.version()


def release_url(release: str) -> str:
    return f"{RELEASES}/v{release}"


def artifact_names(release: str) -> dict[str, str]:
    return {
        "sdist": f"kube_gpusharing-{release}.tar.gz",
        "wheel": f"kube_gpusharing-{release}-py3-none-any.whl",
        "chart": f"kube-gpusharing-{release}.tgz",
        "index": "index.yaml",
        "krew": krew.archive_name(release),
    }


def source_date_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "315532800"))  # default: 1980-01-01, the first time zip can hold


def package_chart(destination: Path, epoch: int, chart: Path = CHART) -> Path:
    """`helm package` of a copy of the chart in which every file has the time `epoch` and an ordinary mode: Helm
    writes each file's time and mode into the archive, which would otherwise differ from clone to clone. The copy
    follows symbolic links (the CRDs, the dashboard and the rules the chart shares with manifests/)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / chart.name
        shutil.copytree(chart, copy)
        for path in sorted(copy.rglob("*"), reverse=True) + [copy]:
            path.chmod(0o755 if path.is_dir() else 0o644)
            os.utime(path, (epoch, epoch))
        return Path(helm.package(copy, destination=destination))


def reproducible_sdist(path: Path, epoch: int) -> None:
    """The sdist rewritten the same from any clone, on any Python: setuptools writes each file's time, the build's time
    in the gzip header and the builder's owner. Its entries are kept in order, with the time `epoch`, no owner and an
    ordinary mode, and gzipped as the krew archive is."""
    raw = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member in source.getmembers():
            content = source.extractfile(member) if member.isfile() else None
            member.mtime, member.uid, member.gid, member.uname, member.gname = epoch, 0, 0, "", ""
            member.mode = 0o755 if member.isdir() or member.mode & 0o100 else 0o644
            member.pax_headers = {}
            tar.addfile(member, content)
    path.write_bytes(krew.gzip_member(raw.getvalue()))


def write_index(directory: Path, release: str, epoch: int) -> Path:
    """`helm repo index` of the directory's charts, served from the release's assets, its times `epoch`'s."""
    index = helm.repo_index_generate(directory, base_url=release_url(release))
    stamp = datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    index["generated"] = stamp
    for entries in index["entries"].values():
        for entry in entries:
            entry["created"] = stamp
    path = directory / "index.yaml"
    path.write_text(yaml.safe_dump(index, sort_keys=True, allow_unicode=True))
    return path


def changelog_versions(text: str) -> list[str]:
    """The versions CHANGELOG.md has entries for, newest first (`## 0.1.0 - 2026-11-25`)."""
    return re.findall(r"^## (\d+\.\d+\.\d+\S*)", text, re.M)


def _chart_metadata(archive: Path) -> dict[str, str]:
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"{CHART.name}/Chart.yaml")
        return yaml.safe_load(member.read()) if member is not None else {}


def _packaged_modules() -> set[str]:
    """What the wheel must hold: every module and data file of the product's packages."""
    wanted = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.suffix in (".py", ".yaml", ".ini", ".mako") and "__pycache__" not in path.parts:
                wanted.add(path.relative_to(ROOT).as_posix())
    return wanted


def top_level_packages(names: set[str]) -> set[str]:
    """The top-level packages and modules of a wheel holding `names`: what `import` finds once it is installed."""
    found = set()
    for name in names:
        first, _, rest = name.partition("/")
        if not first.endswith((".dist-info", ".data")):
            found.add(first if rest else first.partition(".")[0])
    return found


def problems(directory: Path, release: str) -> list[str]:
    """What is missing from the artifacts in `directory`, or says another version than `release`; one line each."""
    names = artifact_names(release)
    found = [
        f"{kind}: {name} is missing from {directory}"
        for kind, name in names.items()
        if not (directory / name).is_file()
    ]
    if found:
        return found
    if changelog_versions(CHANGELOG.read_text())[:1] != [release]:
        found.append(f"CHANGELOG.md: its newest entry is not `## {release}`: add what {release} changes")
    chart = _chart_metadata(directory / names["chart"])
    if (chart.get("version"), chart.get("appVersion")) != (release, release):
        found.append(
            f"chart: version {chart.get('version')}, appVersion {chart.get('appVersion')}: make both {release} in "
            f"{CHART / 'Chart.yaml'}"
        )
    index = yaml.safe_load((directory / names["index"]).read_text())
    listed = [(e["version"], e["urls"]) for e in index["entries"].get(CHART.name, [])]
    if listed != [(release, [f"{release_url(release)}/{names['chart']}"])]:
        found.append(f"index.yaml: lists {listed}, not chart {release} at {release_url(release)}")
    plugin = yaml.safe_load((ROOT / "plugins" / "gpusharing.yaml").read_text())["spec"]
    digest = hashlib.sha256((directory / names["krew"]).read_bytes()).hexdigest()
    if plugin["version"] != f"v{release}" or any(p["sha256"] != digest for p in plugin["platforms"]):
        found.append(f"plugins/gpusharing.yaml: put version v{release} and sha256 {digest} in it")
    with zipfile.ZipFile(directory / names["wheel"]) as wheel:
        held = set(wheel.namelist())
        metadata = wheel.read(f"kube_gpusharing-{release}.dist-info/METADATA").decode()
    if f"\nVersion: {release}\n" not in metadata:
        found.append(f"wheel: its METADATA does not say Version: {release}")
    missing = sorted(_packaged_modules() - held)
    if missing:
        found.append(f"wheel: lacks {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}: list it in setup.cfg")
    extra = sorted(top_level_packages(held) - set(PACKAGES))
    if extra:
        found.append(f"wheel: holds {', '.join(extra)} beside the product ({', '.join(PACKAGES)}): leave "
                     f"{'it' if len(extra) == 1 else 'them'} out of setup.cfg's [options.packages.find]")
    return found


def write_checksums(directory: Path, release: str) -> Path:
    lines = [
        f"{hashlib.sha256((directory / name).read_bytes()).hexdigest()}  {name}"
        for name in sorted(artifact_names(release).values())
    ]
    path = directory / "SHA256SUMS"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(*command: str | Path) -> str:
    done = subprocess.run([str(part) for part in command], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ReleaseError(
            f"`{' '.join(str(part) for part in command[:4])}` failed: {detail[-1] if detail else done.returncode}"
        )
    return done.stdout


def check_wheel_alone(wheel: Path, release: str) -> None:
    """The wheel in a fresh virtualenv, with the versions constraints.txt pins and nothing of this checkout: a user's
    `pip install`. Its `gpusharing --version` must name the release."""
    with tempfile.TemporaryDirectory() as scratch:
        venv.create(scratch, with_pip=True)
        bin_directory = Path(scratch) / "bin"
        _run(bin_directory / "pip", "install", "--quiet", "-c", CONSTRAINTS, wheel)
        said = subprocess.run([bin_directory / "gpusharing", "--version"], cwd=scratch, capture_output=True, text=True)
    if said.stdout.strip() != f"gpusharing {release}":
        raise ReleaseError(
            f"the wheel installed alone says {said.stdout.strip() or said.stderr.strip()!r}, not `gpusharing {release}`"
        )


def build(directory: Path) -> list[Path]:
    """Every artifact into `directory` (emptied first), checked; the paths written."""
    release, epoch = version(), source_date_epoch()
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    names = artifact_names(release)
    # Without a VCS plugin setuptools adds the files a previous build's SOURCES.txt lists to the sdist: a module or
    # package left out of the product since that build would linger in this clone's sdist alone.
    (ROOT / "kube_gpusharing.egg-info" / "SOURCES.txt").unlink(missing_ok=True)
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", directory, ROOT)
    reproducible_sdist(directory / names["sdist"], epoch)
    _run(sys.executable, "-m", "twine", "check", "--strict", directory / names["sdist"], directory / names["wheel"])
    (directory / names["krew"]).write_bytes(krew.archive())
    package_chart(directory, epoch)
    write_index(directory, release, epoch)
    found = problems(directory, release)
    if found:
        raise ReleaseError("\n".join(found))
    check_wheel_alone(directory / names["wheel"], release)
    write_checksums(directory, release)
    return [directory / name for name in sorted(names.values())] + [directory / "SHA256SUMS"]


def main(argv: list[str]) -> int:
    directory = Path(argv[0] if argv else "dist").resolve()
    try:
        written = build(directory)
    except (ReleaseError, helm.HelmError) as error:
        print("\n".join(f"make dist: {line}" for line in str(error).splitlines()), file=sys.stderr)
        return 1
    print((directory / "SHA256SUMS").read_text(), end="")
    print(f"{len(written)} files of kube-gpusharing {version()} in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
