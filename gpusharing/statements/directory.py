"""An auditor's copy of statements as plain files (docs/audit.md, "An auditor's copy"):

    DIR/keys                    the verifier keys that signed them, a line each (compare with the published ones)
    DIR/NNNNNNNN.note           statement NNNNNNNN's signed note
    DIR/NNNNNNNN.rows           its period's rows, one leaf a line, in the tree's order (a period statement's)
    DIR/NNNNNNNN.leaves         the leaf hashes written at the close, 32 bytes each (names a changed row)

`gpusharing statements export` writes it, `gpusharing verify --dir` reads it.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from gpusharing.statements.leaves import MAX_LEAF_BYTES
from gpusharing.statements.note import NoteError, Verifier
from gpusharing.statements.verify import StoredStatement

KEYS_FILE = "keys"
MAX_NOTE_BYTES = 64 * 1024
MAX_KEYS_BYTES = 64 * 1024
_NOTE = re.compile(r"(\d{8})\.note")


class CopyError(ValueError):
    """An auditor's copy that cannot be read; the message names the file."""


def write_statement(directory: Path, sequence: int, note: bytes, leaf_hashes: bytes | None,
                    rows: Iterable[bytes] | None) -> int:
    """Statement `sequence` into `directory`; the rows written."""
    stem = directory / f"{sequence:08d}"
    count = 0
    if rows is not None:
        with open(stem.with_suffix(".rows"), "wb") as out:
            for row in rows:
                out.write(row + b"\n")
                count += 1
    if leaf_hashes is not None:
        stem.with_suffix(".leaves").write_bytes(leaf_hashes)
    stem.with_suffix(".note").write_bytes(note)
    return count


def write_keys(directory: Path, keys: Sequence[str]) -> None:
    (directory / KEYS_FILE).write_text("".join(f"{key}\n" for key in keys))


def read_keys(path: Path) -> list[Verifier]:
    """Verifier keys, a line each (blank lines and # comments skipped)."""
    try:
        if path.stat().st_size > MAX_KEYS_BYTES:
            raise CopyError(f"{path} is longer than {MAX_KEYS_BYTES} bytes: not a list of keys")
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CopyError(f"cannot read the keys in {path}: {exc}") from None
    keys = []
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                keys.append(Verifier.from_text(line.strip()))
            except NoteError as exc:
                raise CopyError(f"{path}, line {number}: {exc}") from None
    if not keys:
        raise CopyError(f"{path} holds no verifier key")
    return keys


def read_statements(directory: Path) -> Iterator[StoredStatement]:
    """The statements of a copy, by their numbers."""
    if not directory.is_dir():
        raise CopyError(f"{directory} is not a directory")
    numbers = sorted(match.group(1) for name in os.listdir(directory) if (match := _NOTE.fullmatch(name)))
    for number in numbers:
        stem = directory / number
        note_path = stem.with_suffix(".note")
        if note_path.stat().st_size > MAX_NOTE_BYTES:
            raise CopyError(f"{note_path} is longer than {MAX_NOTE_BYTES} bytes: not a statement")
        leaves = stem.with_suffix(".leaves")
        rows = stem.with_suffix(".rows")
        yield StoredStatement(
            number=int(number),
            position=str(note_path),
            note=note_path.read_bytes(),
            leaf_hashes=leaves.read_bytes() if leaves.exists() else None,
            rows=functools.partial(_rows, rows),  # a missing file: no rows, every leaf named deleted
        )


def _rows(path: Path) -> Iterator[bytes]:
    if not path.exists():
        return
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, 1):
            if len(line) > MAX_LEAF_BYTES + 1 or not line.endswith(b"\n"):
                raise CopyError(f"{path}, line {number}: a row is one line of at most {MAX_LEAF_BYTES} bytes")
            yield line[:-1]
