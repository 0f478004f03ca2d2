"""constraints.txt from the pins of every supported Python: `make constraints` installs the project into one virtualenv
per Python, freezes each into DIRECTORY/3.X.txt and runs `python -m release.constraints DIRECTORY`.

A package every Python takes at one version is pinned plainly; one whose newest release leaves an older Python out
(or that only some Pythons need) gets a line per version, with the `python_version` range that takes it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def read_freeze(text: str) -> dict[str, str]:
    """`pip freeze` output as {name: version}; the names kept as pip spells them."""
    pins = {}
    for line in text.splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[match.group(1)] = match.group(2)
    return pins


def marker(pythons: list[str], taking: list[str]) -> str:
    """A `python_version` marker true for `taking`, some of `pythons` (ordered); a run of them as open-ended bounds,
    so that a newer Python takes what the newest supported one takes."""
    first, last = pythons.index(taking[0]), pythons.index(taking[-1])
    if taking != pythons[first : last + 1]:
        return " or ".join(f'python_version == "{python}"' for python in taking)
    bounds = [f'python_version >= "{taking[0]}"'] if first > 0 else []
    if last < len(pythons) - 1:
        bounds.append(f'python_version < "{pythons[last + 1]}"')
    return " and ".join(bounds)


def merge(freezes: dict[str, dict[str, str]]) -> list[str]:
    """Constraint lines from {python: {name: version}}, ordered by name as pip freeze orders them."""
    pythons = sorted(freezes, key=Version)
    names = {canonicalize_name(name): name for pins in freezes.values() for name in pins}
    canonical = {
        python: {canonicalize_name(name): version for name, version in freezes[python].items()} for python in pythons
    }
    lines = []
    for key in sorted(names, key=str.lower):
        versions: dict[str, list[str]] = {}
        for python in pythons:
            if key in canonical[python]:
                versions.setdefault(canonical[python][key], []).append(python)
        for version, taking in sorted(versions.items(), key=lambda item: Version(item[0])):
            condition = marker(pythons, taking)
            lines.append(f"{names[key]}=={version}" + (f"; {condition}" if condition else ""))
    return lines


def main(directory: str) -> None:
    freezes = {path.stem: read_freeze(path.read_text()) for path in Path(directory).glob("3.*.txt")}
    if not freezes:
        sys.exit(f"no freezes (3.X.txt) in {directory}")
    print("\n".join(merge(freezes)))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".venv-constraints")
