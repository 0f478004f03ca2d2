"""Verifying a chain of statements (gpusharing/statements/verify.py) as `gpusharing verify` does, on statements made
here: an untouched chain passes, and every kind of tampering is named — a row edited, deleted, inserted or moved; leaf
hashes changed; a statement edited, removed, reordered, re-signed with another key, or cut from the chain; periods
with a gap; a key handover to an unpublished key; a statement's text that is no statement."""

from __future__ import annotations

import datetime as dt

import pytest

from gpusharing.statements.leaves import CapacityLeaf, ChargeLeaf, Price, leaf_label
from gpusharing.statements.merkle import TreeBuilder, leaf_hash
from gpusharing.statements.note import NoteError, Signer, generate_signer, open_note, sign_note
from gpusharing.statements.statement import StatedPeriod, Statement, note_hash
from gpusharing.statements.verify import StoredStatement, verify

UTC = dt.timezone.utc
DAY = dt.datetime(2026, 11, 1, tzinfo=UTC)
ORIGIN = "gpusharing.io/test/statements"
KEY = generate_signer("finance-2026")
OTHER = generate_signer("intruder")


def charge(hour: int, namespace: str, pod: str, micro: int, day: dt.datetime = DAY) -> bytes:
    at = day + dt.timedelta(hours=hour)
    price = Price("EUR", "2.950000", "2.137000", "0.000000000001", "0.000000000001")
    return ChargeLeaf(at, at, namespace, pod, f"uid-{pod}", "NVIDIA A100-SXM4-80GB", micro, micro, 0, price).encoded()


class Chain:
    """Statements of consecutive days, as the timekeeper writes them: each period's rows, its signed note, and the
    leaf hashes kept with it."""

    def __init__(self) -> None:
        self.stored: list[StoredStatement] = []
        self.rows: list[list[bytes]] = []
        self.previous: bytes | None = None
        self.sequence = 0

    def period(self, rows: list[bytes], signers: list[Signer] | None = None) -> None:
        start = DAY + dt.timedelta(days=len([s for s in self.statements() if s.period]))
        tree = TreeBuilder()
        for row in rows:
            tree.append(leaf_hash(row))
        self.sequence += 1
        statement = Statement(ORIGIN, self.sequence, self.previous, tree.size, tree.root(),
                              period=StatedPeriod("daily", start, start + dt.timedelta(days=1)))
        self._add(statement, signers or [KEY], rows)

    def handover(self, new: Signer, signers: list[Signer]) -> None:
        self.sequence += 1
        self._add(Statement.parse(Statement(ORIGIN, self.sequence, self.previous, 0, _empty_root(),
                                            key=new.verifier.text).text), signers, None)

    def _add(self, statement: Statement, signers: list[Signer], rows: list[bytes] | None) -> None:
        note = sign_note(statement.text, signers)
        self.previous = note_hash(note)
        kept = list(rows or [])
        self.rows.append(kept)
        hashes = b"".join(leaf_hash(row) for row in kept) if rows is not None else None
        self.stored.append(StoredStatement(statement.sequence, f"row {statement.sequence}", note, hashes,
                                           (lambda kept=kept: list(kept)) if rows is not None else None))

    def statements(self) -> list[Statement]:
        return [Statement.parse(open_note(s.note, []).text) for s in self.stored]


def _empty_root() -> bytes:
    return TreeBuilder().root()


def three_days() -> Chain:
    chain = Chain()
    chain.period([charge(9, "ml", "train-a", 1_800_000_000), charge(9, "vision", "eval", 600_000_000),
                  CapacityLeaf(DAY + dt.timedelta(hours=9), "gpu-1", "NVIDIA A100-SXM4-80GB", 8 * 3600 * 10**6,
                               0).encoded()])
    chain.period([charge(10, "ml", "train-a", 3_600_000_000, DAY + dt.timedelta(days=1))])
    chain.period([])  # a day nobody used a GPU is stated too: the chain has no gaps
    return chain


def with_rows(stored: StoredStatement, rows: list[bytes]) -> StoredStatement:
    return StoredStatement(stored.number, stored.position, stored.note, stored.leaf_hashes, lambda: rows)


def findings(chain: list[StoredStatement], keys: list[Signer] | None = None) -> list[str]:
    result = verify(chain, [key.verifier for key in (keys or [KEY])])
    return [str(finding) for finding in result.findings]


def test_an_untouched_chain_verifies_every_signature_link_and_row() -> None:
    chain = three_days()
    result = verify(chain.stored, [KEY.verifier])
    assert result.ok and result.findings == []
    assert (result.statements, result.rows, result.first_sequence) == (3, 4, 1)


def test_a_row_edited_after_the_close_is_named_by_its_leaf_and_what_it_now_reads() -> None:
    chain = three_days()
    rows = list(chain.rows[0])
    rows[1] = charge(9, "vision", "eval", 599_999_999)  # a micro-GPU-second less
    assert findings([with_rows(chain.stored[0], rows), *chain.stored[1:]]) == [
        "statement 1 (period 2026-11-01T00:00:00Z/2026-11-02T00:00:00Z): leaf 1 was changed after the close: it now "
        "reads as pod vision/eval (uid-eval) on NVIDIA A100-SXM4-80GB in the hour 2026-11-01T09:00:00Z"]


def test_a_row_deleted_after_the_close_is_named_by_its_leaf_and_the_row_before_it() -> None:
    chain = three_days()
    rows = [chain.rows[0][0], chain.rows[0][2]]
    (problem,) = findings([with_rows(chain.stored[0], rows), *chain.stored[1:]])
    assert problem.endswith("leaf 1 was deleted after the close, after pod ml/train-a (uid-train-a) on NVIDIA "
                            "A100-SXM4-80GB in the hour 2026-11-01T09:00:00Z")


def test_a_row_inserted_after_the_close_is_named() -> None:
    chain = three_days()
    rows = [chain.rows[1][0], charge(11, "ml", "sneaky", 5, DAY + dt.timedelta(days=1))]
    (problem,) = findings([chain.stored[0], with_rows(chain.stored[1], rows), chain.stored[2]])
    assert problem == ("statement 2 (period 2026-11-02T00:00:00Z/2026-11-03T00:00:00Z): pod ml/sneaky (uid-sneaky) "
                       "on NVIDIA A100-SXM4-80GB in the hour 2026-11-02T11:00:00Z was added after the close (it is no "
                       "leaf of the statement)")


def test_rows_in_another_order_are_named_as_moved() -> None:
    chain = three_days()
    rows = [chain.rows[0][1], chain.rows[0][0], chain.rows[0][2]]
    problems = findings([with_rows(chain.stored[0], rows), *chain.stored[1:]])
    assert problems and all("is no longer in its place" in problem for problem in problems)


def test_rows_changed_together_with_their_stored_leaf_hashes_are_caught_by_the_signed_root() -> None:
    chain = three_days()
    rows = [charge(9, "ml", "train-a", 1), *chain.rows[0][1:]]
    forged = StoredStatement(1, "row 1", chain.stored[0].note, b"".join(leaf_hash(row) for row in rows), lambda: rows)
    assert findings([forged, *chain.stored[1:]]) == [
        "statement 1 (period 2026-11-01T00:00:00Z/2026-11-02T00:00:00Z): its 3 rows now do not match the 3 it signed, "
        "and no intact leaf hashes are stored with it to name which differ"]


def test_leaf_hashes_changed_beside_intact_rows_are_named() -> None:
    chain = three_days()
    first = chain.stored[0]
    assert first.leaf_hashes is not None
    changed = StoredStatement(1, "row 1", first.note, bytes(32) + first.leaf_hashes[32:], first.rows)
    assert findings([changed, *chain.stored[1:]]) == [
        "statement 1 (period 2026-11-01T00:00:00Z/2026-11-02T00:00:00Z): its rows match its signed tree, but the leaf "
        "hashes stored with it were changed"]


def test_a_statement_whose_text_was_edited_no_longer_carries_the_key_s_signature() -> None:
    chain = three_days()
    note = chain.stored[1].note.replace(b"\n1\n", b"\n2\n", 1)  # its size, one row more
    edited = StoredStatement(2, "row 2", note, chain.stored[1].leaf_hashes, chain.stored[1].rows)
    problems = findings([chain.stored[0], edited, chain.stored[2]])
    assert problems[0].startswith("statement 2 (period 2026-11-02T00:00:00Z/2026-11-03T00:00:00Z): is not signed by "
                                  "the key in force, finance-2026+")
    assert problems[0].endswith(", a signature of the text as it was")
    assert not any("rows now do not match" in problem for problem in problems)  # an unsigned root is not checked
    assert any("the chain is cut" in problem for problem in problems)  # the next one names the note as it was


def test_a_statement_removed_from_the_middle_breaks_the_chain_and_leaves_a_gap_of_periods() -> None:
    chain = three_days()
    assert findings([chain.stored[0], chain.stored[2]]) == [
        "statement 3 (period 2026-11-03T00:00:00Z/2026-11-04T00:00:00Z): follows statement 1: statements 2 to 2 are "
        "missing",
        f"statement 3 (period 2026-11-03T00:00:00Z/2026-11-04T00:00:00Z): names "
        f"{note_hash(chain.stored[1].note).hex()[:16]} as the statement before it, but statement 1 (period "
        f"2026-11-01T00:00:00Z/2026-11-02T00:00:00Z) hashes to {note_hash(chain.stored[0].note).hex()[:16]}: the chain "
        "is cut",
        "statement 3 (period 2026-11-03T00:00:00Z/2026-11-04T00:00:00Z): its period starts at 2026-11-03T00:00:00Z, "
        "but the period before it ended at 2026-11-02T00:00:00Z: a statement of the time between is missing"]


def test_statements_reordered_are_named_out_of_order() -> None:
    chain = three_days()
    problems = findings([chain.stored[0], chain.stored[2], chain.stored[1]])
    assert any("statements 2 to 2 are missing" in problem for problem in problems)
    assert any(problem.startswith("statement 2 ") and "the statements are out of order" in problem
               for problem in problems)
    assert any("they overlap" in problem for problem in problems)


def test_a_statement_re_signed_with_another_key_is_named_with_whose_signature_it_carries() -> None:
    chain = three_days()
    text = chain.statements()[1].text
    resigned = StoredStatement(2, "row 2", sign_note(text, [OTHER]), chain.stored[1].leaf_hashes, chain.stored[1].rows)
    problem, cut = findings([chain.stored[0], resigned, chain.stored[2]])
    assert cut.startswith("statement 3 ") and cut.endswith("the chain is cut")  # it names the note as signed
    assert problem == (f"statement 2 (period 2026-11-02T00:00:00Z/2026-11-03T00:00:00Z): is not signed by the key in "
                       f"force, {KEY.verifier.text}; its signatures are by intruder+{OTHER.key_hash:08x} (not a "
                       "published key)")


def test_a_chain_signed_by_no_published_key_is_refused_from_its_first_statement() -> None:
    chain = three_days()
    problems = findings(chain.stored, keys=[OTHER])
    assert problems[0].startswith("statement 1 (period 2026-11-01T00:00:00Z/2026-11-02T00:00:00Z): is signed by no "
                                  "published key; its signatures are by finance-2026+")


def test_a_key_handover_signed_by_both_keys_moves_the_key_in_force() -> None:
    new = generate_signer("finance-2027")
    chain = Chain()
    chain.period([charge(9, "ml", "train-a", 7)])
    chain.handover(new, [KEY, new])
    chain.period([charge(9, "ml", "train-b", 8, DAY + dt.timedelta(days=1))], signers=[new])
    assert verify(chain.stored, [KEY.verifier, new.verifier]).ok
    # The auditor publishes only the first key: the handover to another is named, and the chain goes on under it.
    assert findings(chain.stored, keys=[KEY]) == [
        f"statement 2 (key handover): hands over to {new.verifier.text}, which is not among the published keys"]


def test_a_statement_signed_by_the_old_key_after_a_handover_is_named() -> None:
    new = generate_signer("finance-2027")
    chain = Chain()
    chain.period([])
    chain.handover(new, [KEY, new])
    chain.period([], signers=[KEY])
    (problem,) = findings(chain.stored, keys=[KEY, new])
    assert problem.startswith(f"statement 3 (period 2026-11-02T00:00:00Z/2026-11-03T00:00:00Z): is not signed by the "
                              f"key in force, {new.verifier.text}")


def test_a_handover_the_new_key_did_not_sign_is_named() -> None:
    new = generate_signer("finance-2027")
    chain = Chain()
    chain.period([])
    chain.handover(new, [KEY])
    (problem,) = findings(chain.stored, keys=[KEY, new])
    assert problem == f"statement 2 (key handover): is not signed by the key it hands over to, {new.verifier.text}"


@pytest.mark.parametrize(("note", "message"), [
    (b"not a note", "is not a statement: note has no blank line before a block of signatures"),
    (sign_note("gpusharing.io/test/statements\n1\n" + "A" * 43 + "=\n", [KEY]),
     "is not a statement: a statement has 3 lines after its root (period or key, sequence, previous), not 0"),
])
def test_a_note_that_is_no_statement_is_named_where_it_is_held(note: bytes, message: str) -> None:
    chain = three_days()
    broken = StoredStatement(2, "the statements row of sequence 2", note, None, None)
    problems = findings([chain.stored[0], broken, chain.stored[2]])
    assert problems[0] == f"the statements row of sequence 2: {message}"


def test_nothing_to_verify_is_a_finding() -> None:
    assert findings([]) == ["the statements: there are none to verify"]


def test_a_copy_that_starts_mid_chain_verifies_from_its_first_statement() -> None:
    chain = three_days()
    result = verify(chain.stored[1:], [KEY.verifier])
    assert result.ok and result.first_sequence == 2


@pytest.mark.parametrize(("text", "message"), [
    ("o\n0\n" + "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n" + "period hourly 2026-11-01T00:00:00Z "
     "2026-11-02T00:00:00Z\nsequence 1\nprevious none\n",
     "the line after the root must be 'period KIND START END' or 'key KEY', not 'period hourly"),
    ("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\nperiod daily 2026-11-02T00:00:00Z 2026-11-01T00:00:00Z\n"
     "sequence 1\nprevious none\n", "ends before it starts"),
    ("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\nperiod daily 2026-11-01 2026-11-02T00:00:00Z\n"
     "sequence 1\nprevious none\n", "a period's bounds are UTC instants"),
    ("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\nperiod daily 2026-11-01T00:00:00Z 2026-11-02T00:00:00Z\n"
     "sequence 01\nprevious none\n", "expected 'sequence N' (a positive decimal)"),
    ("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\nperiod daily 2026-11-01T00:00:00Z 2026-11-02T00:00:00Z\n"
     "sequence 1\nprevious abc\n", "the previous statement's hash must be 32 bytes in base64"),
    ("o\n3\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\nkey a+01234567+AQ==\nsequence 1\nprevious none\n",
     "a key statement signs no rows"),
])
def test_a_statement_s_text_is_read_strictly(text: str, message: str) -> None:
    with pytest.raises(NoteError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Statement.parse(text)


def test_a_statement_s_text_round_trips() -> None:
    chain = three_days()
    for statement in chain.statements():
        assert Statement.parse(statement.text) == statement


def test_a_leaf_s_label_names_a_correction_s_booked_hour_and_survives_garbage() -> None:
    booked = dt.datetime(2026, 12, 1, 3, tzinfo=UTC)
    late = ChargeLeaf(booked, DAY, "ml", "p", "u", "Tesla T4", 1, 1, 0, None).encoded()
    assert leaf_label(late) == "pod ml/p (u) on Tesla T4 in the hour 2026-11-01T00:00:00Z, booked 2026-12-01T03:00:00Z"
    assert leaf_label(b"\xff{") == "the row '\ufffd{'"


