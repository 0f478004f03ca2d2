"""A statement's text: a C2SP tlog-checkpoint of one closed billing period's tree (its origin, size and root) whose
extension lines say which period it is, where it stands in the chain of statements and the hash of the one before it;
or a key statement, which hands the chain over to a new signing key (docs/audit.md, "A statement").
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import re
from dataclasses import dataclass

from gpusharing.statements.leaves import utc_text
from gpusharing.statements.merkle import EMPTY_ROOT
from gpusharing.statements.note import Checkpoint, NoteError

PERIOD_KINDS = ("daily", "weekly", "monthly")
_INSTANT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_SEQUENCE = re.compile(r"[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class StatedPeriod:
    """The billing period a statement closes: [start, end), of the calendar's kind."""

    kind: str
    start: dt.datetime
    end: dt.datetime

    def __str__(self) -> str:
        return f"{utc_text(self.start)}/{utc_text(self.end)}"


@dataclass(frozen=True)
class Statement:
    """A period statement (`period`: its tree's `size` leaves hash to `root`) or a key statement (`key`: the verifier
    key that signs from the next statement on; size 0 and the empty tree's root)."""

    origin: str
    sequence: int  # 1 for the chain's first
    previous: bytes | None  # SHA-256 of the note before it in the chain; None for the first
    size: int
    root: bytes
    period: StatedPeriod | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.period is None) == (self.key is None):
            raise ValueError("a statement closes a period or hands over to a key, not both nor neither")
        if self.key is not None and (self.size or self.root != EMPTY_ROOT):
            raise ValueError("a key statement signs no rows")

    @property
    def what(self) -> str:
        """The statement in words, for findings: "statement 3 (period 2026-10-01T00:00:00Z/...)"."""
        return f"statement {self.sequence} ({f'period {self.period}' if self.period else 'key handover'})"

    def checkpoint(self) -> Checkpoint:
        first = (f"period {self.period.kind} {utc_text(self.period.start)} {utc_text(self.period.end)}"
                 if self.period is not None else f"key {self.key}")
        previous = "none" if self.previous is None else base64.b64encode(self.previous).decode()
        return Checkpoint(self.origin, self.size, self.root, (first, f"sequence {self.sequence}",
                                                              f"previous {previous}"))

    @property
    def text(self) -> str:
        return self.checkpoint().text

    @classmethod
    def parse(cls, text: str) -> Statement:
        """The statement a note's text is; NoteError saying what is wrong with it."""
        checkpoint = Checkpoint.parse(text)
        if len(checkpoint.extensions) != 3:
            raise NoteError(f"a statement has 3 lines after its root (period or key, sequence, previous), not "
                            f"{len(checkpoint.extensions)}")
        first, sequence, previous = (line.split(" ") for line in checkpoint.extensions)
        period, key = None, None
        if first[0] == "period" and len(first) == 4 and first[1] in PERIOD_KINDS:
            period = StatedPeriod(first[1], _parse_instant(first[2]), _parse_instant(first[3]))
            if period.end <= period.start:
                raise NoteError(f"the period {period} ends before it starts")
        elif first[0] == "key" and len(first) == 2:
            key = first[1]
        else:
            raise NoteError(f"the line after the root must be 'period KIND START END' or 'key KEY', not "
                            f"{' '.join(first)!r}")
        if len(sequence) != 2 or sequence[0] != "sequence" or not _SEQUENCE.fullmatch(sequence[1]):
            raise NoteError(f"expected 'sequence N' (a positive decimal), not {' '.join(sequence)!r}")
        if len(previous) != 2 or previous[0] != "previous":
            raise NoteError(f"expected 'previous HASH' or 'previous none', not {' '.join(previous)!r}")
        try:
            return cls(checkpoint.origin, int(sequence[1]), _parse_hash(previous[1]), checkpoint.size,
                       checkpoint.root, period, key)
        except ValueError as exc:
            raise NoteError(str(exc)) from None


def note_hash(note: bytes) -> bytes:
    """What the next statement names as its previous: SHA-256 of the whole signed note."""
    return hashlib.sha256(note).digest()


def origin_of(cluster: str) -> str:
    """The origin line of a cluster's statements (a checkpoint's log name)."""
    return f"gpusharing.io/{cluster}/statements"


def _parse_hash(raw: str) -> bytes | None:
    if raw == "none":
        return None
    try:
        digest = base64.b64decode(raw, validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != 32 or base64.b64encode(digest).decode() != raw:
        raise NoteError(f"the previous statement's hash must be 32 bytes in base64, or none, not {raw[:64]!r}")
    return digest


def _parse_instant(raw: str) -> dt.datetime:
    try:
        if _INSTANT.fullmatch(raw):
            return dt.datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        pass
    raise NoteError(f"a period's bounds are UTC instants such as 2026-11-01T00:00:00Z, not {raw[:64]!r}")
