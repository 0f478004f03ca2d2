"""Builds the archive plugins/gpusharing.yaml (krew's manifest) points at, byte for byte the same each time, and
prints its sha256: `python plugins/build.py DIRECTORY` (`make plugin`). Upload it as the release's asset."""

from __future__ import annotations

import configparser
import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "kubectl-gpusharing"


def version() -> str:
    setup = configparser.ConfigParser()
    setup.read(HERE.parent / "setup.cfg")
    return setup["metadata"]["version"]


def archive_name() -> str:
    return f"kubectl-gpusharing-{version()}.tar.gz"


def archive() -> bytes:
    """A tar.gz of the launcher with no timestamps, owners or other traces of the machine that built it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(LAUNCHER.name)
        data = LAUNCHER.read_bytes()
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def main(directory: str) -> None:
    data = archive()
    path = Path(directory) / archive_name()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(f"{hashlib.sha256(data).hexdigest()}  {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dist")
