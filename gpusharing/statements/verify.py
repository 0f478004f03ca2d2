"""Verifying statements, from the database or an auditor's copy alike (docs/audit.md, "What verify proves"): each
statement's signature by the key in force, the chain of hashes and sequence numbers, periods that follow each other,
key handovers, and each period's rows against its signed tree; every mismatch named (which statement, which row or
leaf, which signature).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from gpusharing.statements.leaves import leaf_label
from gpusharing.statements.merkle import TreeBuilder, leaf_hash, root_of
from gpusharing.statements.note import NoteError, OpenedNote, Verifier, open_note
from gpusharing.statements.statement import Statement, note_hash

HASH_BYTES = 32
NAMED_ROWS = 20  # rows named per statement; more are counted


@dataclass(frozen=True)
class StoredStatement:
    """A statement as it is held: its signed note, the leaf hashes written with it, and a way to read its period's rows
    as they are now (None: not checked)."""

    number: int  # its number where it is held (the sequence it was written with)
    position: str  # where it is held, for findings about a note that cannot be read: "statements row 3", a file
    note: bytes
    leaf_hashes: bytes | None
    rows: Callable[[], Iterable[bytes]] | None


@dataclass(frozen=True)
class Finding:
    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


@dataclass
class Verification:
    statements: int = 0
    rows: int = 0
    first_sequence: int | None = None  # a copy may start mid-chain: its first statement's previous is not in it
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings and self.statements > 0


@dataclass
class _Chain:
    previous: tuple[Statement, bytes] | None = None  # the last statement read and its note's hash
    key: Verifier | None = None  # the key in force
    period_end: str | None = None
    origin: str | None = None


def verify(statements: Iterable[StoredStatement], keys: Sequence[Verifier]) -> Verification:
    """Every statement in chain order, checked against the published `keys`."""
    result, chain = Verification(), _Chain()
    for stored in statements:
        result.statements += 1
        read = _read(stored, keys, chain, result)
        if read is None:
            chain.previous = None  # what follows cannot be linked: said once, here
            continue
        statement, signed = read
        # The rows of a statement whose signature fails are not checked: its root is no one's word.
        if signed and stored.rows is not None and statement.period is not None:
            result.rows += _check_rows(statement, stored, result.findings)
    if result.statements == 0:
        result.findings.append(Finding("the statements", "there are none to verify"))
    return result


def _read(stored: StoredStatement, keys: Sequence[Verifier], chain: _Chain,
          result: Verification) -> tuple[Statement, bool] | None:
    """The statement held, and whether the key in force signed it; None for a note that is no statement."""
    findings = result.findings
    try:
        opened = open_note(stored.note, dict.fromkeys([*keys, *([chain.key] if chain.key else [])]))
        statement = Statement.parse(opened.text)
    except ValueError as exc:  # NoteError, or a handed-over key that shares a published key's name and hash
        findings.append(Finding(stored.position, f"is not a statement: {exc}"))
        return None
    where = statement.what
    signed_by = [key for key in keys if opened.signed_by(key)]
    signed = True
    if chain.key is not None:
        if not opened.signed_by(chain.key):
            signed = False
            findings.append(Finding(where, f"is not signed by the key in force, {chain.key.text}; "
                                           f"{_signatures(opened)}"))
    elif not signed_by:
        signed = False
        findings.append(Finding(where, f"is signed by no published key; {_signatures(opened)}"))
    else:
        chain.key = signed_by[0]
    if chain.origin is not None and statement.origin != chain.origin:
        findings.append(Finding(where, f"is of the log {statement.origin!r}, not {chain.origin!r}"))
    chain.origin = chain.origin or statement.origin
    _link(statement, stored.note, chain, result)
    if statement.period is not None:
        start, end = str(statement.period).split("/")
        if chain.period_end is not None and start != chain.period_end:
            gap = "a statement of the time between is missing" if start > chain.period_end else "they overlap"
            findings.append(Finding(where, f"its period starts at {start}, but the period before it ended at "
                                           f"{chain.period_end}: {gap}"))
        chain.period_end = end
    else:
        _hand_over(statement, stored.note, keys, chain, findings)
    return statement, signed


def _link(statement: Statement, note: bytes, chain: _Chain, result: Verification) -> None:
    where, findings = statement.what, result.findings
    if chain.previous is None:
        if result.first_sequence is None:
            result.first_sequence = statement.sequence
        if statement.sequence == 1 and statement.previous is not None:
            findings.append(Finding(where, "is the first of the chain but names a statement before it"))
    else:
        before, before_hash = chain.previous
        if statement.sequence != before.sequence + 1:
            missing = (f"statements {before.sequence + 1} to {statement.sequence - 1} are missing"
                       if statement.sequence > before.sequence + 1 else "the statements are out of order")
            findings.append(Finding(where, f"follows statement {before.sequence}: {missing}"))
        if statement.previous != before_hash:
            findings.append(Finding(where, f"names {_hex(statement.previous)} as the statement before it, but "
                                           f"{before.what} hashes to {_hex(before_hash)}: the chain is cut"))
    chain.previous = (statement, note_hash(note))


def _hand_over(statement: Statement, note: bytes, keys: Sequence[Verifier], chain: _Chain,
               findings: list[Finding]) -> None:
    where = statement.what
    try:
        new = Verifier.from_text(statement.key or "")
    except NoteError as exc:
        findings.append(Finding(where, f"hands over to a key that cannot be read: {exc}"))
        return
    if new not in keys:
        findings.append(Finding(where, f"hands over to {new.text}, which is not among the published keys"))
    if new not in keys and any((key.name, key.key_hash) == (new.name, new.key_hash) for key in keys):
        findings.append(Finding(where, f"hands over to {new.text}, which poses as a published key of its name"))
        return
    if not open_note(note, [new]).signed_by(new):
        findings.append(Finding(where, f"is not signed by the key it hands over to, {new.text}"))
    chain.key = new


def _check_rows(statement: Statement, stored: StoredStatement, findings: list[Finding]) -> int:
    """The period's rows now against the statement's tree; the rows read."""
    assert stored.rows is not None
    where = statement.what
    now = bytearray()
    tree = TreeBuilder()
    for row in stored.rows():
        digest = leaf_hash(row)
        tree.append(digest)
        now += digest
    if tree.size == statement.size and tree.root() == statement.root:
        if stored.leaf_hashes is not None and stored.leaf_hashes != now:
            findings.append(Finding(where, "its rows match its signed tree, but the leaf hashes stored with it were "
                                           "changed"))
        return tree.size
    signed = stored.leaf_hashes
    if signed is None or len(signed) % HASH_BYTES or len(signed) // HASH_BYTES != statement.size \
            or root_of(_split(signed)) != statement.root:
        findings.append(Finding(where, f"its {tree.size} rows now do not match the {statement.size} it signed, and "
                                       "no intact leaf hashes are stored with it to name which differ"))
        return tree.size
    changes = list(_diff(_split(signed), _split(bytes(now))))
    labels = _labels(stored, {index for _, _, index in changes if index is not None})
    for kind, leaf, index in changes[:NAMED_ROWS]:
        label = labels.get(index, "") if index is not None else ""
        if kind == "edited":
            findings.append(Finding(where, f"leaf {leaf} was changed after the close: it now reads as {label}"))
        elif kind == "inserted":
            findings.append(Finding(where, f"{label} was added after the close (it is no leaf of the statement)"))
        elif kind == "deleted":
            after = f", after {labels[index]}" if index is not None else ""
            findings.append(Finding(where, f"leaf {leaf} was deleted after the close{after}"))
        else:
            findings.append(Finding(where, f"leaf {leaf} is no longer in its place: it now comes as {label}"))
    if len(changes) > NAMED_ROWS:
        findings.append(Finding(where, f"and {len(changes) - NAMED_ROWS} more rows differ from its leaves"))
    return tree.size


def _diff(signed: list[bytes], now: list[bytes]) -> Iterator[tuple[str, int | None, int | None]]:
    """How the rows now differ from the signed leaves, both in the canonical order: (kind, signed leaf index, index of
    the row now); a deleted leaf's row index is the row before it, if any. Rows are unique, so are their hashes."""
    in_signed = {digest: index for index, digest in enumerate(signed)}
    in_now = {digest: index for index, digest in enumerate(now)}
    i = j = 0
    while i < len(signed) or j < len(now):
        if i < len(signed) and j < len(now) and signed[i] == now[j]:
            i, j = i + 1, j + 1
        elif i < len(signed) and signed[i] not in in_now:
            if j < len(now) and now[j] not in in_signed:
                yield "edited", i, j
                i, j = i + 1, j + 1
            else:
                yield "deleted", i, j - 1 if j else None
                i += 1
        elif j < len(now) and now[j] not in in_signed:
            yield "inserted", None, j
            j += 1
        else:  # both are elsewhere in the other: a row moved
            yield "moved", i, j
            i, j = i + 1, j + 1


def _labels(stored: StoredStatement, indexes: set[int]) -> dict[int, str]:
    """The rows at `indexes` in words, read again: a mismatch is rare, and the first read kept only hashes."""
    if not indexes or stored.rows is None:
        return {}
    last = max(indexes)
    labels = {}
    for index, row in enumerate(stored.rows()):
        if index in indexes:
            labels[index] = leaf_label(row)
        if index >= last:
            break
    return labels


def _split(hashes: bytes) -> list[bytes]:
    return [hashes[at:at + HASH_BYTES] for at in range(0, len(hashes), HASH_BYTES)]


def _signatures(opened: OpenedNote) -> str:
    names = [key.text for key in opened.verified]
    names += [f"{line.name}+{line.key_hash:08x}, a signature of the text as it was" for line in opened.failed]
    names += [f"{line.name}+{line.key_hash:08x} (not a published key)" for line in opened.unknown]
    return "its signatures are by " + "; ".join(names) if names else "it carries no signature"


def _hex(digest: bytes | None) -> str:
    return "none" if digest is None else digest.hex()[:16]
