"""The Dockerfile, read as Docker reads it: one non-root image for every role, on a pinned Debian and Python, that
installs exactly the versions constraints.txt pins (the ones the suite runs on), and `make image` building it."""

from __future__ import annotations

import configparser
import os
import re
import subprocess
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# Debian 12 or 13, a supported Python
BASE = re.compile(r"python:3\.(1[0-3])-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined and comments left out."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = (line.strip() for line in text.splitlines())
    return [
        (line.split()[0].upper(), line.partition(" ")[2].strip()) for line in lines if line and not line.startswith("#")
    ]


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, the FROM first."""
    found: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def pip_commands() -> list[str]:
    return [
        part.strip()
        for word, args in instructions()
        if word == "RUN"
        for part in args.split("&&")
        if re.search(r"\bpip (install|wheel)\b", part)
    ]


def test_every_stage_starts_from_the_one_pinned_base() -> None:
    arguments = dict(args.split("=", 1) for word, args in instructions() if word == "ARG" and "=" in args)
    assert BASE.fullmatch(arguments["BASE"]), (
        f"the base {arguments['BASE']} names no Debian release and supported Python"
    )
    assert [stage[0][1].split()[0] for stage in stages()] == ["${BASE}", "${BASE}"]


def test_it_installs_the_wheels_built_under_constraints_txt_and_nothing_else() -> None:
    build, final = stages()
    assert ("COPY", "constraints.txt pyproject.toml setup.cfg setup.py README.md ./") in build
    wheel, install = (re.sub(r"--mount=\S+\s*", "", command) for command in pip_commands())
    assert (
        wheel
        == "PIP_CONSTRAINT=/src/constraints.txt PIP_BUILD_CONSTRAINT=/src/constraints.txt pip wheel --wheel-dir "
            "/wheels -c constraints.txt ."
    )
    assert install == "pip install --no-index --find-links /wheels -c /constraints.txt kube-gpusharing"
    mounts = next(args for word, args in final if word == "RUN" and "pip install" in args)
    assert "source=/src/constraints.txt,target=/constraints.txt" in mounts and "source=/wheels,target=/wheels" in mounts


def runtime_requirements() -> list[Requirement]:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return [Requirement(line) for line in setup["options"]["install_requires"].split("\n") if line.strip()]


def needed_at_run_time() -> set[str]:
    """Every distribution the package needs at run time on this Python: setup.cfg's requirements and theirs, read from
    what is installed here (the same versions, pinned by constraints.txt)."""
    needed: set[str] = set()
    todo = [(requirement, {""}) for requirement in runtime_requirements()]
    while todo:
        requirement, extras = todo.pop()
        if requirement.marker is not None and not any(requirement.marker.evaluate({"extra": e}) for e in extras):
            continue
        name = canonicalize_name(requirement.name)
        if name in needed and not requirement.extras:
            continue
        needed.add(name)
        try:
            requires = distribution(requirement.name).requires or []
        except PackageNotFoundError:
            continue
        todo.extend((Requirement(line), {"", *requirement.extras}) for line in requires)
    return needed


def pinned_here() -> dict[str, str]:
    """constraints.txt's pins that apply to this Python."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate():
                pins[canonicalize_name(requirement.name)] = str(requirement.specifier)
    return pins


def test_constraints_txt_pins_everything_the_image_installs_on_this_python() -> None:
    """`make test-python` runs this on every supported Python, so on the image's too: a dependency that is not pinned
    would float in the image (pip wheel -c pins only what is listed)."""
    needed, pins = needed_at_run_time(), pinned_here()
    assert {"flask", "sqlalchemy", "psycopg-binary", "kubernetes", "urllib3"} <= needed
    assert not needed - set(pins), (
        f"constraints.txt pins none of {sorted(needed - set(pins))} for this Python: make constraints"
    )
    assert all(pin.startswith("==") for pin in pins.values())


def test_it_runs_as_non_root_ready_for_a_read_only_root_filesystem() -> None:
    final = stages()[-1]
    assert ("USER", "65532:65532") in final and final[-1] == ("ENTRYPOINT", '["gpusharing"]')
    environment = " ".join(args for word, args in final if word == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in environment  # nothing written beside the code, compiled at install
    assert any("chown 65532:65532 /var/lib/gpusharing-meter" in args for word, args in final if word == "RUN")


def test_it_holds_every_package_of_the_distribution() -> None:
    copied = {args for word, args in stages()[0] if word == "COPY"}
    packages = re.findall(r"^    (\w+)$", (ROOT / "setup.cfg").read_text(), re.M)
    assert packages and all(f"{package} {package}" in copied for package in packages)


def test_it_copies_the_product_alone_not_the_demo_nor_the_testbed() -> None:
    """The image holds what the wheel holds: the stand-in Kubernetes API (demo/) and what the tests and bench/ run on
    (testbed/) stay in the repository (docker-compose mounts demo/ for its stand-in API)."""
    sources = {args.split()[0] for stage in stages() for word, args in stage if word == "COPY"}
    packages = set(re.findall(r"^    (\w+)$", (ROOT / "setup.cfg").read_text(), re.M))
    assert {source for source in sources if (ROOT / source).is_dir()} == packages
    assert not packages & {"demo", "testbed", "tests", "bench"}


def test_make_image_builds_it_tagged_with_the_version() -> None:
    version = re.search(r"^version = (\S+)$", (ROOT / "setup.cfg").read_text(), re.M)
    assert version is not None
    outside_make = {
        name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    }
    planned = subprocess.run(["make", "-n", "image", "BASE=python:3.12-slim-bookworm@sha256:" + "0" * 64], cwd=ROOT,
                             capture_output=True, text=True, check=True, env=outside_make).stdout
    assert planned.split() == [
        "docker",
        "build",
        "--build-arg",
        "BASE=python:3.12-slim-bookworm@sha256:" + "0" * 64,
        "-t",
        f"ghcr.io/kube-gpusharing/gpusharing:{version.group(1)}",
        ".",
    ]
