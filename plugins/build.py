"""Builds the archive plugins/gpusharing.yaml (krew's manifest) points at, byte for byte the same each time, and
prints its sha256: `python plugins/build.py DIRECTORY` (`make plugin`). Upload it as the release's asset."""

from __future__ import annotations

import configparser
import hashlib
import io
import struct
import sys
import tarfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "kubectl-gpusharing"


def version() -> str:
    setup = configparser.ConfigParser()
    setup.read(HERE.parent / "setup.cfg")
    return setup["metadata"]["version"]


def archive_name(release: str = "") -> str:
    return f"kubectl-gpusharing-{release or version()}.tar.gz"


def archive() -> bytes:
    """A tar.gz of the launcher with no timestamps, owners or other traces of the machine or Python that built it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(LAUNCHER.name)
        data = LAUNCHER.read_bytes()
        info.size, info.mode, info.mtime, info.type = len(data), 0o755, 0, tarfile.REGTYPE
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tar.addfile(info, io.BytesIO(data))
    return gzip_member(raw.getvalue())


# Magic, deflate, no flags (so no file name or comment), mtime 0, XFL 2 (best compression), OS 3 (Unix). Written here
# because Python's gzip module writes an OS byte that depends on its version (255, or zlib's 3 from 3.11 to 3.12).
GZIP_HEADER = struct.pack("<BBBBIBB", 0x1F, 0x8B, 8, 0, 0, 2, 3)


def gzip_member(data: bytes) -> bytes:
    """`data` gzipped (RFC 1952) at level 9, the same bytes on every Python."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(data) + deflate.flush()
    return GZIP_HEADER + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


def main(directory: str) -> None:
    data = archive()
    path = Path(directory) / archive_name()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    print(f"{hashlib.sha256(data).hexdigest()}  {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dist")
