"""release/dist.py, what `make dist` runs: the chart packaged and indexed the same from any clone, the sdist rewritten
the same, and every artifact checked to carry the one version of setup.cfg."""

from __future__ import annotations

import configparser
import hashlib
import io
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from setuptools import find_packages

from plugins import build as krew
from release import dist

EPOCH = 1_795_615_935  # 2026-11-25T14:12:15Z


def chart_copy(directory: Path, mtime: int, mode: int) -> Path:
    """The chart as another clone has it: other file times, another umask."""
    copy = directory / dist.CHART.name
    shutil.copytree(dist.CHART, copy)
    for path in [copy, *copy.rglob("*")]:
        if path.is_file():
            path.chmod(mode)
        os.utime(path, (mtime, mtime))
    return copy


def test_the_chart_packages_to_the_same_bytes_from_any_clone(tmp_path: Path) -> None:
    archives = []
    for number, (mtime, mode) in enumerate([(1_000_000_000, 0o664), (1_700_000_000, 0o600)]):
        chart = chart_copy(tmp_path / f"clone{number}", mtime, mode)
        archives.append(dist.package_chart(tmp_path / f"out{number}", EPOCH, chart))
    assert archives[0].name == f"kube-gpusharing-{dist.version()}.tgz"
    assert archives[0].read_bytes() == archives[1].read_bytes()
    with tarfile.open(archives[0]) as tar:
        members = tar.getmembers()
        chart_yaml = tar.extractfile("kube-gpusharing/Chart.yaml")
        assert chart_yaml is not None
        metadata = yaml.safe_load(chart_yaml.read())
    assert {(m.mtime, m.mode) for m in members if m.isfile()} == {(EPOCH, 0o644)}
    # the CRDs, rendered into manifests/crds too
    assert "kube-gpusharing/templates/crds.yaml" in {m.name for m in members}
    assert (metadata["version"], metadata["appVersion"]) == (dist.version(), dist.version())


def test_the_index_lists_the_chart_at_the_releases_url_with_its_digest_and_time(tmp_path: Path) -> None:
    archive = dist.package_chart(tmp_path, EPOCH)
    first = dist.write_index(tmp_path, dist.version(), EPOCH).read_bytes()
    assert dist.write_index(tmp_path, dist.version(), EPOCH).read_bytes() == first
    index = yaml.safe_load(first)
    (entry,) = index["entries"]["kube-gpusharing"]
    assert entry["urls"] == [f"{dist.release_url(dist.version())}/{archive.name}"]
    assert entry["digest"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert entry["created"] == index["generated"] == "2026-11-25T14:12:15Z"


def test_the_krew_manifest_points_at_the_same_release_assets() -> None:
    plugin = yaml.safe_load((dist.ROOT / "plugins" / "gpusharing.yaml").read_text())
    assert all(
        p["uri"] == f"{dist.release_url(dist.version())}/{krew.archive_name()}" for p in plugin["spec"]["platforms"]
    )


def fake_sdist(path: Path, mtime: int) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [
            ("kube_gpusharing-0.1.0/PKG-INFO", b"Version: 0.1.0\n"),
            ("kube_gpusharing-0.1.0/setup.cfg", b"[x]\n"),
        ]:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.uname, info.mode = len(data), mtime, 1000, "builder", 0o664
            tar.addfile(info, io.BytesIO(data))


def test_the_sdist_is_rewritten_the_same_whatever_built_it(tmp_path: Path) -> None:
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    fake_sdist(first, 1_000_000_000)
    fake_sdist(second, 1_700_000_000)
    assert first.read_bytes() != second.read_bytes()
    for path in (first, second):
        dist.reproducible_sdist(path, EPOCH)
    assert first.read_bytes() == second.read_bytes() and first.read_bytes()[:10] == krew.GZIP_HEADER
    with tarfile.open(first) as tar:
        assert [(m.name, m.mtime, m.uid, m.uname, m.mode) for m in tar.getmembers()] == [
            ("kube_gpusharing-0.1.0/PKG-INFO", EPOCH, 0, "", 0o644),
            ("kube_gpusharing-0.1.0/setup.cfg", EPOCH, 0, "", 0o644),
        ]
        member = tar.extractfile("kube_gpusharing-0.1.0/PKG-INFO")
        assert member is not None and member.read() == b"Version: 0.1.0\n"


def release_directory(directory: Path, release: str, wheel_version: str, leave_out: str = "",
                      add: tuple[str, ...] = ()) -> Path:
    """Artifacts as `make dist` leaves them: the real chart, index and krew archive; a wheel and sdist that hold
    names."""
    names = dist.artifact_names(release)
    dist.package_chart(directory, EPOCH)
    dist.write_index(directory, release, EPOCH)
    (directory / names["krew"]).write_bytes(krew.archive())
    (directory / names["sdist"]).write_bytes(b"")
    with zipfile.ZipFile(directory / names["wheel"], "w") as wheel:
        wheel.writestr(
            f"kube_gpusharing-{release}.dist-info/METADATA", f"Name: kube-gpusharing\nVersion: {wheel_version}\n"
        )
        for module in (dist._packaged_modules() - {leave_out}) | set(add):
            wheel.writestr(module, "")
    return directory


def test_a_release_of_one_version_has_no_problems(tmp_path: Path) -> None:
    assert dist.problems(release_directory(tmp_path, dist.version(), dist.version()), dist.version()) == []


def test_each_artifact_of_another_version_or_missing_is_named_on_a_line(tmp_path: Path) -> None:
    release = dist.version()
    wrong = dist.problems(
        release_directory(tmp_path / "a", release, "9.9.9", leave_out="gpusharing/gpu/gpu-models.yaml"), release
    )
    assert wrong == ["wheel: its METADATA does not say Version: " + release,
                     "wheel: lacks gpusharing/gpu/gpu-models.yaml: list it in setup.cfg"]
    (tmp_path / "a" / dist.artifact_names(release)["krew"]).unlink()
    assert dist.problems(tmp_path / "a", release) == [f"krew: {krew.archive_name()} is missing from {tmp_path / 'a'}"]
    other = dist.problems(release_directory(tmp_path / "b", release, release), "0.2.0")
    assert len(other) == len(dist.artifact_names("0.2.0")) - 1  # every versioned name, the index aside
    assert all("0.2.0" in line and "is missing" in line for line in other)


def test_the_wheel_holds_the_product_alone_not_the_demo_nor_the_testbed(tmp_path: Path) -> None:
    """Its top-level packages are exactly the product's: demo/ (with the stand-in Kubernetes API) and testbed/ run
    from the repository, and a wheel that carries them, or anything else beside the product, is refused."""
    release = dist.version()
    assert set(dist.PACKAGES) == {"gpusharing", "webhook", "timekeeper", "sidecar", "nodeagent", "migrations"}
    assert dist.top_level_packages(dist._packaged_modules()) == set(dist.PACKAGES)
    extra = ("demo/__init__.py", "demo/kubeapi.py", "testbed/postgres.py", "admin/__init__.py", "conftest.py")
    found = dist.problems(release_directory(tmp_path, release, release, add=extra), release)
    assert found == ["wheel: holds admin, conftest, demo, testbed beside the product (gpusharing, webhook, timekeeper, "
                     "sidecar, nodeagent, migrations): leave them out of setup.cfg's [options.packages.find]"]
    held = {f"kube_gpusharing-{release}.dist-info/RECORD", f"kube_gpusharing-{release}.data/scripts/x",
            "gpusharing/cli.py", "six.py"}
    assert dist.top_level_packages(held) == {"gpusharing", "six"}


def test_setup_cfg_installs_neither_the_demo_nor_the_testbed() -> None:
    """What `pip install` of the wheel puts into site-packages: setup.cfg's packages, as setuptools finds them here."""
    setup = configparser.ConfigParser()
    setup.read(dist.ROOT / "setup.cfg")
    included = setup["options.packages.find"]["include"].split()
    installed = {package.split(".")[0] for package in find_packages(str(dist.ROOT), include=included)}
    assert set(dist.PACKAGES) <= installed
    assert not installed & {"demo", "testbed", "tests", "bench", "release", "plugins"}


def test_the_changelog_has_an_entry_for_this_version_first() -> None:
    assert dist.changelog_versions(dist.CHANGELOG.read_text())[0] == dist.version()
    assert dist.changelog_versions("# Changelog\n\n## 0.2.0 - 2027-01-04\n\n## 0.1.0 - 2026-11-30\n") == [
        "0.2.0",
        "0.1.0",
    ]


def test_make_dist_says_each_problem_on_a_line_of_its_own_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(directory: Path) -> list[Path]:
        raise dist.ReleaseError("chart: version 0.0.9, appVersion 0.1.0: make both 0.1.0\n"
                                "wheel: lacks gpusharing/x.py: list it")

    monkeypatch.setattr(dist, "build", failing)
    assert dist.main(["dist"]) == 1
    assert capsys.readouterr().err == ("make dist: chart: version 0.0.9, appVersion 0.1.0: make both 0.1.0\n"
                                       "make dist: wheel: lacks gpusharing/x.py: list it\n")
