"""`gpusharing statements keygen|export` and `gpusharing verify` (timekeeper/audit.py; docs/audit.md) on a ledger of
the past month stated day by day: a key made for the controller and its verifier printed; the database verified, and
the exit status 1 with each finding when rows or statements were changed or the last statements removed; an auditor's
copy exported and verified without the database; every mistake of use refused in one line, exit status 2."""

from __future__ import annotations

import datetime as dt
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete, func, insert, select, update

from gpusharing.cli import main
from gpusharing.contract import Period
from gpusharing.statements.note import Signer
from tests.timekeeper.conftest import Clock
from timekeeper.accounting.ledger import Observation
from timekeeper.chargeback.calendar import BillingCalendar
from timekeeper.chargeback.statements import SigningKeys
from timekeeper.cluster.statements import StatementTask
from timekeeper.database.accounting.charging import PodObservation, ReportLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.chargeback.statements import StatementLog
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_hours, statements

UTC = dt.timezone.utc
DAILY = BillingCalendar(Period.DAILY, dt.timedelta(minutes=30))
START = dt.datetime(2026, 10, 30, 22, 30, tzinfo=UTC)


@pytest.fixture
def key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Signer, Path]:
    """A key made as an admin makes it; its verifier key, as printed, in a file to publish."""
    secret = tmp_path / "statement.key"
    assert main(["statements", "keygen", "finance", "--out", str(secret)]) == 0
    published = tmp_path / "published.pub"
    published.write_text(capsys.readouterr().out)
    return Signer.from_text(secret.read_text().strip()), published


@pytest.fixture
def ledger_url(database_url: str, key: tuple[Signer, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A pod billed on the 30th of October; every daily period from then to now stated, as a controller running all
    along would have; the timekeeper's settings in the environment."""
    monkeypatch.setenv("TIMEKEEPER_DATABASE_URL", database_url)
    monkeypatch.setenv("TIMEKEEPER_BILLING_PERIOD", "daily")
    monkeypatch.setenv("TIMEKEEPER_BILLING_GRACE", "30m")
    db = Database(database_url)
    clock = Clock(START + dt.timedelta(minutes=110))  # 00:20 on the 31st, before the 30th closed
    ledger = ReportLedger(BudgetStore(db, clock=clock), calendar=DAILY)
    ledger.observe([PodObservation("uid-1", "ml", "trainer", 0.5, Observation(0.5, START, clock.at, True))])
    task = StatementTask(StatementLog(db), DAILY, "gpusharing.io/test/statements", SigningKeys(key[0]))
    while task.run(db.now()).periods:
        pass
    yield database_url
    db.dispose()


def verified(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["verify", *args])
    return status, capsys.readouterr().out


def test_keygen_writes_a_key_only_its_owner_reads_and_prints_the_key_to_publish(key: tuple[Signer, Path],
                                                                                tmp_path: Path) -> None:
    signer, published = key
    assert stat.S_IMODE(os.stat(tmp_path / "statement.key").st_mode) == 0o600
    assert published.read_text() == signer.verifier.text + "\n"
    assert main(["statements", "keygen", "finance", "--out", str(tmp_path / "statement.key")]) == 2  # never replaced


def test_verify_passes_on_an_untouched_ledger(ledger_url: str, key: tuple[Signer, Path],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    status, out = verified(capsys, "--keys", str(key[1]))
    assert status == 0
    assert out.startswith("verified statements 1 to ") and out.endswith(
        " and their 3 rows: every signature, the chain and every row match\n")


def test_verify_exits_1_naming_a_changed_row(ledger_url: str, key: tuple[Signer, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    db = Database(ledger_url)
    with db.write() as conn:
        conn.execute(update(pod_hours).where(pod_hours.c.hour == dt.datetime(2026, 10, 30, 23, tzinfo=UTC))
                     .values(micro_gpu_seconds=0))
    db.dispose()
    status, out = verified(capsys, "--keys", str(key[1]))
    assert status == 1
    assert out == ("statement 1 (period 2026-10-30T00:00:00Z/2026-10-31T00:00:00Z): leaf 1 was changed after the "
                   "close: it now reads as pod ml/trainer (uid-1) on NVIDIA A100-SXM4-80GB in the hour "
                   "2026-10-30T23:00:00Z\n")


def test_verify_names_statements_removed_from_the_end_of_the_chain(ledger_url: str, key: tuple[Signer, Path],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = Database(ledger_url)
    with db.write() as conn:
        last = conn.execute(select(func.max(statements.c.sequence))).scalar_one()
        conn.execute(delete(statements).where(statements.c.sequence > last - 3))
    db.dispose()
    status, out = verified(capsys, "--keys", str(key[1]))
    assert status == 1
    assert out.startswith("the statements: the last one states the time up to ")
    assert "statements after it were removed, or the controller does not state them" in out


def test_an_auditor_s_copy_is_verified_without_the_database(ledger_url: str, key: tuple[Signer, Path],
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "october"
    assert main(["statements", "export", "--from", "2026-10-01", "--to", "2026-11-01", str(copy)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 2 statements and 3 rows to {copy}")
    assert sorted(path.name for path in copy.iterdir()) == [
        "00000001.leaves", "00000001.note", "00000001.rows", "00000002.leaves", "00000002.note", "00000002.rows",
        "keys"]
    monkeypatch.delenv("TIMEKEEPER_DATABASE_URL")
    assert verified(capsys, "--dir", str(copy), "--keys", str(key[1]))[0] == 0
    (copy / "00000002.note").unlink()  # the copy's last statement: nothing links to it, the copy is still whole
    assert verified(capsys, "--dir", str(copy))[0] == 0
    (copy / "00000001.rows").write_text("")
    status, out = verified(capsys, "--dir", str(copy), "--keys", str(key[1]))
    assert status == 1 and out.count("was deleted after the close") == 2


@pytest.mark.parametrize(("args", "message"), [
    (["verify"], "--keys: the published verifier keys"),
    (["verify", "--keys", "/nonexistent"], "cannot read the keys in /nonexistent"),
    (["verify", "--dir", "/nonexistent"], "cannot read the keys in /nonexistent/keys"),
    (["statements", "export", "/"], "/ exists and is not an empty directory"),
])
def test_mistakes_of_use_are_refused_in_one_line(ledger_url: str, args: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_database_never_migrated_is_refused_in_one_line(tmp_path: Path, key: tuple[Signer, Path],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TIMEKEEPER_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.sqlite'}")
    assert main(["verify", "--keys", str(key[1])]) == 2
    assert "cannot read the statements from the database: no such table: statements (is it migrated?" in \
        capsys.readouterr().err


def test_an_earlier_copy_shows_a_period_stated_again_from_edited_rows(
    ledger_url: str, key: tuple[Signer, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack the chain alone cannot see: the last statement removed, its period's rows edited, the period stated
    again by a controller that never saw it (restarted). The chain verifies; the auditor's earlier copy does not."""
    copy = tmp_path / "copy"
    assert main(["statements", "export", str(copy)]) == 0
    capsys.readouterr()
    db = Database(ledger_url)
    with db.write() as conn:
        last, start = conn.execute(select(statements.c.sequence, statements.c.period_start)
                                   .order_by(statements.c.sequence.desc()).limit(1)).one()
        conn.execute(delete(statements).where(statements.c.sequence == last))
        conn.execute(insert(pod_hours), [{
            "pod_uid": "uid-1", "hour": start, "model": "NVIDIA A100-SXM4-80GB", "booked_hour": start,
            "micro_gpu_seconds": 1, "weighted_micro_gpu_seconds": 1, "metered_micro_gpu_seconds": 0,
            "idle_micro_gpu_seconds": 0, "idle_weighted_micro_gpu_seconds": 0}])
    StatementTask(StatementLog(db), DAILY, "gpusharing.io/test/statements", SigningKeys(key[0])).run(db.now())
    db.dispose()
    assert verified(capsys, "--keys", str(key[1]))[0] == 0  # a chain of valid statements
    monkeypatch.delenv("TIMEKEEPER_BILLING_PERIOD")  # the calendar's kind comes from the statements themselves
    status, out = verified(capsys, "--keys", str(key[1]), "--against", str(copy))
    assert status == 1
    assert out.splitlines()[0] == (f"statement {last} of {copy}: differs from the database's statement {last}: the "
                                   "database's was replaced (a fork of the chain)")
