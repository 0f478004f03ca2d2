"""release/constraints.py and constraints.txt: one pin per package on each supported Python, markers only where
the Pythons need different versions."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from release.constraints import merge, read_freeze

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = ("3.10", "3.11", "3.12", "3.13")


def test_a_version_every_python_takes_is_pinned_plainly_and_others_by_python_version() -> None:
    freezes = {
        "3.10": {"Flask": "3.1.3", "SQLAlchemy": "2.0.58", "tomli": "2.5.0", "zipp": "4.1.2", "odd": "1.0"},
        "3.11": {"Flask": "3.1.3", "SQLAlchemy": "2.1.9", "zipp": "4.1.2"},
        "3.12": {"Flask": "3.1.3", "SQLAlchemy": "2.1.9", "odd": "1.0"},
        "3.13": {"Flask": "3.1.3", "SQLAlchemy": "2.1.9"},
    }
    assert merge(freezes) == [
        "Flask==3.1.3",
        'odd==1.0; python_version == "3.10" or python_version == "3.12"',
        'SQLAlchemy==2.0.58; python_version < "3.11"',
        'SQLAlchemy==2.1.9; python_version >= "3.11"',
        'tomli==2.5.0; python_version < "3.11"',
        'zipp==4.1.2; python_version < "3.12"',
    ]


def test_a_freeze_is_read_as_pip_writes_it() -> None:
    assert read_freeze("# comment\nFlask==3.1.3\nkube-gpusharing @ file:///src\njaraco.classes==3.4.0\n") == {
        "Flask": "3.1.3", "jaraco.classes": "3.4.0"}


@pytest.mark.parametrize("python", SUPPORTED)
def test_constraints_txt_pins_each_package_once_on_every_supported_python(python: str) -> None:
    pinned: dict[str, list[str]] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            assert str(requirement.specifier).startswith("==") and len(requirement.specifier) == 1, line
            if requirement.marker is None or requirement.marker.evaluate({"python_version": python}):
                pinned.setdefault(canonicalize_name(requirement.name), []).append(str(requirement.specifier))
    assert {"flask", "sqlalchemy", "pytest", "twine", "setuptools"} <= set(pinned)
    assert not {name: pins for name, pins in pinned.items() if len(pins) > 1}
