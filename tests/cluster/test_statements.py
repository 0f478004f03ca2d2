"""Signed statements of closed billing periods on the real control plane (issue 41, docs/audit.md): a period closes
during the run, its leader is killed mid-close, and its successor states it once; `gpusharing verify` passes on the
database and on an auditor's copy, and names each row and statement changed after the close.

The run has a daily billing period on a ledger of its own (`cluster.fresh_database`) and a grace that closes
*yesterday's* period (UTC) a little after the test starts: TIMEKEEPER_BILLING_GRACE is the time from today's midnight
to then. Every clock is the real one (the API server's record, which bills read, keeps the real time), so the pods
reach into yesterday through their record: the simulated kubelet writes their start in yesterday's last minute
(`cluster.gpusharing.io/started-before`), and their first bill charges that minute to yesterday's 23:00 hour, booked in
yesterday's period, still open. The tier's price sheet is recorded two days back, so that it prices that hour.

Two controllers run with a signing key (`gpusharing statements keygen`). Shortly before the statement is due (the
close and the minute it settles), the test holds SQLite's writer lock, so that the leader, once it has said it is
closing the period and read its rows, waits to write its statement; the leader (the Lease's holder) is killed there
with SIGKILL, and the lock released. Their Lease is longer than the tier's: renewing it writes to the database (the
controller's term, for the eviction fence), which waits for the lock too, and the leader must still lead when its
close begins. It shows that
- the other controller takes the Lease and states the period: one statement, the first of the chain, signed with the
  key, whose tree is the period's rows;
- `gpusharing verify --database` passes, and so does `gpusharing verify --dir` on `gpusharing statements export`'s copy;
- the copy signs each pod's charge for yesterday's 23:00 hour at exactly its share x the time from its recorded start
  to midnight, in micro-GPU-seconds, priced as the sheet priced that hour;
- on copies of the database, each change is found and named (exit status 1): a row of the period edited (the pod,
  its hour and the leaf), deleted (its leaf, and the row before it: only the leaf's hash is left to say what it was)
  or inserted (the pod and its hour); the statement's note edited (its signature no longer verifies, its tree no
  longer matches the rows), re-signed with another key of the same name, or deleted.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, update

from gpusharing.contract import ANNOTATION_GPU_SHARE
from gpusharing.gpu.catalogue import shipped_catalogue
from gpusharing.statements.note import generate_signer, open_note, sign_note
from gpusharing.units.duration import format_duration
from tests.cluster.conftest import PRICE_SHEET
from tests.cluster.nodes import METER, STARTED_BEFORE, NodeSimulator, advertised
from tests.cluster.workloads import delete_namespaces, pod, pod_template
from tests.e2e.system import SYSTEM_NAMESPACE, GpuSharing, wait_for
from timekeeper.chargeback.prices import load_price_sheet
from timekeeper.chargeback.statements import SETTLE
from timekeeper.cluster.leader import LEASE_NAME
from timekeeper.database.chargeback.prices import PriceLog
from timekeeper.database.connection import Database
from timekeeper.database.tables import pod_hours, pod_ledgers, statements

UTC = dt.timezone.utc
HOUR = dt.timedelta(hours=1)
LAST_MINUTE = dt.timedelta(minutes=1)  # of yesterday: where the pods' recorded starts lie
MICRO = 1_000_000
GPU_HOUR = 3_600_000_000  # micro-GPU-seconds
COST_PLACES = 12  # the FOCUS export's, which a signed row's costs are written as
# From the grace's reckoning to yesterday's close: room for both controllers to start, the pods to run and their last
# minute of yesterday to be charged, on a busy machine (the test fails, saying so, when that is not enough). About
# 15 s on a quiet machine; 90 s ran out at a load average near 20.
CLOSES_AFTER = dt.timedelta(seconds=180)
LOCK_BEFORE = dt.timedelta(seconds=2)  # the writer lock is taken this long before the statement is due
# The controllers' Lease here (the tier's is 2 s): a controller writes its term to the database (the eviction fence) as
# it renews the Lease, so while the test holds the writer lock the leader renews it no more, and must still lead when
# its close begins.
LEASE_SECONDS = 20
PRICES_RECORDED_BEFORE = dt.timedelta(days=2)  # the sheet prices yesterday's hours (conftest's prices only today's)
KEY_NAME = "cluster-tier"
GPUSHARING = str(Path(sys.executable).parent / "gpusharing")  # the installed command
A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
PRODUCT = "nvidia.com/gpu.product"  # GPU feature discovery's label: the model's name, its spaces as dashes
TRAIN, EVAL = "statements-train", "statements-eval"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE_NAME}"


@dataclass(frozen=True)
class Pool:
    name: str
    dialect: str
    model: str
    resources: dict[str, str]


POOLS = {p.name: p for p in (
    Pool("statements-t4", "whole", T4, advertised("whole", 15360)),  # whole GPUs: a share of 1
    Pool("statements-a100", "vcuda", A100, advertised("vcuda", 81920)),  # 25 % of a GPU's cores: a share of 0.25
)}
WORKLOADS = [  # name, namespace key, pool
    ("train-0", TRAIN, "statements-t4"),
    ("train-1", TRAIN, "statements-a100"),
    ("train-2", TRAIN, "statements-a100"),
    ("eval-0", EVAL, "statements-t4"),
    ("eval-1", EVAL, "statements-a100"),
]


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def instant(raw: str) -> dt.datetime:
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))


def utc_text(at: dt.datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpusharing(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `gpusharing` command, to its end, with `env` over this process's environment."""
    return subprocess.run([GPUSHARING, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def sqlite_path(database: str) -> str:
    return database.removeprefix("sqlite:///")


@contextmanager
def holding_the_writer_lock(database: str) -> Iterator[None]:
    """SQLite's writer lock (timekeeper.database.connection), as the timekeeper's writers take it: while it is held,
    every write of every process waits for it, a statement's among them."""
    with open(sqlite_path(database) + ".writer-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def snapshot(database: str, to: Path) -> str:
    """A copy of the SQLite database at `to` by SQLite's backup API (a consistent one, while others write); its URL."""
    source, target = sqlite3.connect(sqlite_path(database)), sqlite3.connect(to)
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()
    return f"sqlite:///{to}"


@contextmanager
def opened(database: str) -> Iterator[Database]:
    db = Database(database)
    try:
        yield db
    finally:
        db.engine.dispose()


def record_prices_before(database: str, prices: Path, before: dt.timedelta) -> None:
    """The sheet recorded as a timekeeper started with it `before` ago would have recorded it (see conftest's
    record_price_sheet_before): in force from the first whole hour after that."""
    with opened(database) as db:
        PriceLog(db).record(load_price_sheet(prices, shipped_catalogue()), now() - before, str(prices))


def stated(db: Database) -> list[tuple[int, dt.datetime | None, dt.datetime | None]]:
    """Every statement written: its sequence and period."""
    with db.read() as conn:
        rows = conn.execute(select(statements.c.sequence, statements.c.period_start, statements.c.period_end)
                            .order_by(statements.c.sequence)).all()
    return [(row.sequence, row.period_start, row.period_end) for row in rows]


def charged_in(db: Database, hour: dt.datetime) -> dict[tuple[str, str], list[tuple[dt.datetime, int]]]:
    """The pods' charges for `hour`, by (namespace, pod): the hour each was booked in and its micro-GPU-seconds."""
    query = (select(pod_ledgers.c.namespace, pod_ledgers.c.pod, pod_hours.c.booked_hour, pod_hours.c.micro_gpu_seconds)
             .select_from(pod_hours.join(pod_ledgers, pod_ledgers.c.pod_uid == pod_hours.c.pod_uid))
             .where(pod_hours.c.hour == hour))
    found: dict[tuple[str, str], list[tuple[dt.datetime, int]]] = {}
    with db.read() as conn:
        for row in conn.execute(query):
            found.setdefault((row.namespace, row.pod), []).append((row.booked_hour, row.micro_gpu_seconds))
    return found


def row_label(row: dict[str, Any]) -> str:
    """How verify names a charged row."""
    return f"pod {row['namespace']}/{row['pod']} ({row['podUid']}) on {row['model']} in the hour {row['hour']}"


def places(value: Fraction, digits: int) -> Fraction:
    """`value` rounded half to even to `digits` decimal places."""
    return Fraction(round(value * 10**digits), 10**digits)


@dataclass
class Run:
    database: str
    keys: Path  # the published verifier key (what keygen printed)
    # the timekeeper's billing calendar, which verify --database reads as the timekeeper does (statements removed
    # from the chain's end are told by it)
    calendar: dict[str, str]
    yesterday: dt.datetime  # the period stated: [yesterday, today)
    today: dt.datetime
    namespaces: dict[str, str]  # by key: the namespace's name
    pods: dict[str, dict[str, Any]]  # by name: as the API server had them once the period was stated
    leader: str  # the name of the controller killed mid-close
    logs: dict[str, str]  # by controller name: its log, once the period was stated
    statements: list[tuple[int, dt.datetime | None, dt.datetime | None]]
    note: bytes  # statement 1's signed note
    verified: subprocess.CompletedProcess[str]  # gpusharing verify --database
    exported: subprocess.CompletedProcess[str]  # gpusharing statements export
    copy: Path  # the auditor's copy
    verified_copy: subprocess.CompletedProcess[str]  # gpusharing verify --dir
    pristine: Path  # a snapshot of the database once the period was stated, for the tampering

    @property
    def period(self) -> str:
        return f"{utc_text(self.yesterday)}/{utc_text(self.today)}"

    @property
    def what(self) -> str:
        """How verify names the statement."""
        return f"statement 1 (period {self.period})"

    def rows(self) -> list[dict[str, Any]]:
        """The period's rows in the auditor's copy, in the tree's order."""
        return [json.loads(line) for line in (self.copy / "00000001.rows").read_bytes().splitlines()]

    def charge(self, name: str) -> tuple[int, dict[str, Any]]:
        """The pod's row in the copy, and its place (its leaf's index)."""
        ((index, row),) = [(i, r) for i, r in enumerate(self.rows()) if r["kind"] == "charge" and r["pod"] == name]
        return index, row


@pytest.fixture(scope="module")
def run(cluster: GpuSharing, nodes: NodeSimulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """The pools and namespaces; a ledger, a price history and a key of the test's own; the timekeeper and two
    controllers on them, yesterday's period closing CLOSES_AFTER from the reckoning; the pods running since yesterday's
    last minute, charged for it; the leader killed mid-close and the period stated by its successor; verify run on the
    database and on an auditor's copy."""
    for p in POOLS.values():
        nodes.add_pool(p.name, 1, p.dialect, labels={PRODUCT: p.model.replace(" ", "-")}, resources=p.resources)
    namespaces = {key: cluster.namespace(key) for key in (TRAIN, EVAL)}
    directory = tmp_path_factory.mktemp("statements")
    database = cluster.fresh_database("statements")
    record_prices_before(database, Path(cluster.timekeeper_env["TIMEKEEPER_GPU_PRICES_FILE"]), PRICES_RECORDED_BEFORE)
    signing_key, keys = directory / "statement.key", directory / "statement.pub"
    made = gpusharing("statements", "keygen", KEY_NAME, "--out", str(signing_key))
    assert made.returncode == 0, made.stderr
    keys.write_text(made.stdout)

    reckoned = now()
    today = reckoned.replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday = today - dt.timedelta(days=1)
    grace = dt.timedelta(seconds=math.ceil((reckoned - today).total_seconds())) + CLOSES_AFTER
    closes, due = today + grace, today + grace + SETTLE
    calendar = {"TIMEKEEPER_BILLING_PERIOD": "daily",
                "TIMEKEEPER_BILLING_GRACE": format_duration(grace.total_seconds())}
    settings = {"TIMEKEEPER_DATABASE_URL": database, **calendar, "TIMEKEEPER_STATEMENT_KEY_FILE": str(signing_key),
                "TIMEKEEPER_STATEMENTS_INTERVAL_SECONDS": "1", "TIMEKEEPER_LEASE_SECONDS": str(LEASE_SECONDS)}
    period = f"{utc_text(yesterday)}/{utc_text(today)}"
    try:
        with opened(database) as ledger, cluster.timekeeper_settings(**settings):
            second = cluster.controller_service("controller-2", database, **settings)
            logs = {cluster.controller: cluster.directory / "controller.log",
                    second: cluster.directory / "controller-2.log"}
            try:
                for name, key, pool in WORKLOADS:
                    # its start recorded at 23:59:00 yesterday, or the second or so after that its recording took
                    before = math.floor((now() - (today - LAST_MINUTE)).total_seconds())
                    template = pod_template(POOLS[pool].dialect, pool, {METER: "none", STARTED_BEFORE: str(before)})
                    cluster.create(namespaces[key], pod(name, template))

                def last_minute_charged() -> bool:
                    charged = charged_in(ledger, today - HOUR)
                    return all(
                        today - HOUR in {booked for booked, _ in charged.get((namespaces[key], name), [])}
                        for name, key, _ in WORKLOADS)

                wait_for(last_minute_charged, "each pod's last minute of yesterday charged before yesterday's period "
                         "closed (if the setup outlasted it, raise CLOSES_AFTER)",
                         timeout=max(1.0, (closes - now()).total_seconds()))
                margin = closes - now()
                assert margin > dt.timedelta(0), "charged only after the close: raise CLOSES_AFTER"
                print(f"yesterday's last minute charged {margin.total_seconds():.0f} s before its period closed")

                # The leader killed mid-close: once it has said it is closing the period, while its statement waits
                # for the writer lock.
                wait_for(lambda: now() >= due - LOCK_BEFORE, "the statement to be nearly due",
                         timeout=(due - now()).total_seconds() + 60)
                with holding_the_writer_lock(database):
                    assert now() < due and stated(ledger) == [], "stated before the test held the writer lock"
                    closing = f"closing billing period {period}: stating its rows"
                    closer = wait_for(
                        lambda: next((s for s, log in logs.items() if closing in log.read_text(errors="replace")),
                                     None), "a controller to begin closing yesterday's period", timeout=120)
                    holder = cluster.rest("GET", LEASE_PATH)["spec"]["holderIdentity"]
                    (leader,) = [s for s in logs if s.process is not None and f"-{s.process.pid}-" in holder]
                    assert leader is closer, "the period is closed by the Lease's holder"
                    assert leader.process is not None
                    os.kill(leader.process.pid, signal.SIGKILL)
                    leader.process.wait(timeout=60)
                    assert stated(ledger) == []  # its statement died with it
                (successor,) = [s for s in logs if s is not leader]
                wait_for(lambda: f"stated billing period {period}: statement" in logs[successor].read_text(
                    errors="replace"), "the successor to state yesterday's period", timeout=120)
                assert successor.process is not None
                assert f"-{successor.process.pid}-" in cluster.rest("GET", LEASE_PATH)["spec"]["holderIdentity"]

                written = stated(ledger)
                with ledger.read() as conn:
                    note = conn.execute(select(statements.c.note).where(statements.c.sequence == 1)).scalar_one()
                verified = gpusharing("verify", "--database", database, "--keys", str(keys), env=calendar)
                copy = directory / "auditors-copy"
                exported = gpusharing("statements", "export", "--database", database, str(copy))
                verified_copy = gpusharing("verify", "--dir", str(copy), "--keys", str(keys))
                pristine = directory / "pristine.sqlite"
                snapshot(database, pristine)
                pods = {p["metadata"]["name"]: p for ns in namespaces.values() for p in cluster.pods(ns)}
                yield Run(database, keys, calendar, yesterday, today, namespaces, pods, leader.name,
                          {s.name: log.read_text(errors="replace") for s, log in logs.items()}, written, note,
                          verified, exported, copy, verified_copy, pristine)
            finally:
                end_pods(cluster, namespaces.values())  # billed to the end on this ledger, by a live controller
                second.stop()
    finally:
        delete_namespaces(cluster, *namespaces.values())


def end_pods(cluster: GpuSharing, namespaces: Iterable[str]) -> None:
    """The pods deleted, and gone once their bills are closed (the billing finalizer released)."""
    namespaces = list(namespaces)
    for namespace in namespaces:
        for p in cluster.pods(namespace):
            cluster.rest("DELETE", f"/api/v1/namespaces/{namespace}/pods/{p['metadata']['name']}")
    wait_for(lambda: not any(cluster.pods(ns) for ns in namespaces), "the test's pods gone", timeout=120)


# --- the close -------------------------------------------------------------------------------------------------------


def test_the_leader_killed_mid_close_leaves_the_period_to_its_successor_who_states_it_once(run: Run) -> None:
    """The killed leader had begun the close and wrote nothing; its successor wrote the chain's first statement, of
    yesterday's period, with one leaf a row, signed with the test's key (its name and hash)."""
    closing = f"closing billing period {run.period}: stating its rows"
    (successor,) = [name for name in run.logs if name != run.leader]
    assert closing in run.logs[run.leader]
    assert "stated billing period" not in run.logs[run.leader]
    assert closing in run.logs[successor]
    assert f"stated billing period {run.period}: statement 1, " in run.logs[successor]
    assert run.statements == [(1, run.yesterday, run.today)]
    opened_note = open_note(run.note, [])
    origin, size, _root, *extensions = opened_note.text.splitlines()
    assert origin == "gpusharing.io/kubernetes/statements"
    assert extensions == [f"period daily {utc_text(run.yesterday)} {utc_text(run.today)}", "sequence 1",
                          "previous none"]
    assert int(size) == len(run.rows())
    assert [f"{line.name}+{line.key_hash:08x}" for line in opened_note.unknown] == [published(run)]


def test_verify_passes_on_the_database_and_on_an_auditors_copy(run: Run) -> None:
    rows = len(run.rows())
    assert (run.verified.returncode, run.verified.stdout) == (0, f"verified statements 1 to 1 and their {rows:,} rows: "
                                                                 "every signature, the chain and every row match\n")
    assert run.exported.returncode == 0, run.exported.stderr
    assert run.exported.stdout.startswith(f"wrote 1 statements and {rows:,} rows to {run.copy}")
    assert sorted(os.listdir(run.copy)) == ["00000001.leaves", "00000001.note", "00000001.rows", "keys"]
    assert (run.copy / "00000001.note").read_bytes() == run.note
    assert (run.copy / "keys").read_text() == run.keys.read_text()
    assert (run.verified_copy.returncode, run.verified_copy.stdout) == (0, run.verified.stdout)


def test_the_statement_signs_each_pods_last_minute_of_yesterday_exactly_and_priced(run: Run) -> None:
    """Each pod's charge for yesterday's 23:00 hour is its share x the time from its recorded start (in yesterday's
    last minute, whole seconds) to midnight, exactly, booked in that hour; costed at the sheet's prices as the FOCUS
    export costs it. The period's other rows can only be node-hours: the ledger is the test's own."""
    last_hour = utc_text(run.today - HOUR)
    rows = run.rows()
    charges = {(r["namespace"], r["pod"]): r for r in rows if r["kind"] == "charge"}
    assert len(charges) == len([r for r in rows if r["kind"] == "charge"]) == len(WORKLOADS)
    assert {r["kind"] for r in rows} <= {"charge", "capacity"}
    assert all(run.yesterday <= instant(r["hour"]) < run.today for r in rows if r["kind"] == "capacity")
    prices = {p["model"]: p for p in PRICE_SHEET["prices"]}
    for name, key, pool in WORKLOADS:
        recorded = run.pods[name]
        start = instant(recorded["status"]["startTime"])
        assert run.today - LAST_MINUTE <= start < run.today, (name, start)
        assert {c["state"]["running"]["startedAt"] for c in recorded["status"]["containerStatuses"]} == {
            recorded["status"]["startTime"]}
        share = Fraction(recorded["metadata"]["annotations"][ANNOTATION_GPU_SHARE])
        row = charges[run.namespaces[key], name]
        assert (row["podUid"], row["model"], row["hour"], row["bookedHour"]) == (
            recorded["metadata"]["uid"], POOLS[pool].model, last_hour, last_hour), name
        assert row["microGpuSeconds"] == share * int((run.today - start).total_seconds()) * MICRO, (name, share)
        assert row["weightedMicroGpuSeconds"] == row["microGpuSeconds"] and row["idleMicroGpuSeconds"] == 0, name
        price = prices[POOLS[pool].model]
        listed = Decimal(price["listPerGpuHour"])
        contracted = Decimal(price.get("contractedPerGpuHour", price["listPerGpuHour"]))
        hours = Fraction(row["microGpuSeconds"], GPU_HOUR)
        assert row["currency"] == PRICE_SHEET["currency"], name
        assert (Decimal(row["listPerGpuHour"]), Decimal(row["contractedPerGpuHour"])) == (listed, contracted), name
        assert Fraction(Decimal(row["listCost"])) == places(hours * Fraction(listed), COST_PLACES), name
        assert Fraction(Decimal(row["contractedCost"])) == places(hours * Fraction(contracted), COST_PLACES), name
    # whole GPUs and a quarter of one: one minute of yesterday is 60 and 15 GPU-seconds, give or take its first second
    assert {Fraction(run.pods[name]["metadata"]["annotations"][ANNOTATION_GPU_SHARE]) for name, _, _ in WORKLOADS} == {
        Fraction(1), Fraction(1, 4)}


# --- tampering -------------------------------------------------------------------------------------------------------


def edit_a_row(run: Run, db: Database) -> list[str]:
    index, row = run.charge("train-1")
    with db.write() as conn:
        changed = conn.execute(update(pod_hours).where(pod_hours.c.pod_uid == row["podUid"],
                                                       pod_hours.c.booked_hour == run.today - HOUR)
                               .values(micro_gpu_seconds=pod_hours.c.micro_gpu_seconds + 1)).rowcount
    assert changed == 1
    return [f"{run.what}: leaf {index} was changed after the close: it now reads as {row_label(row)}"]


def delete_a_row(run: Run, db: Database) -> list[str]:
    index, row = run.charge("eval-1")
    with db.write() as conn:
        deleted = conn.execute(delete(pod_hours).where(pod_hours.c.pod_uid == row["podUid"],
                                                       pod_hours.c.booked_hour == run.today - HOUR)).rowcount
    assert deleted == 1
    after = f", after {row_label(run.rows()[index - 1])}" if index else ""
    return [f"{run.what}: leaf {index} was deleted after the close{after}"]


def insert_a_row(run: Run, db: Database) -> list[str]:
    """An hour train-0 never ran, booked in the period: 22:00 yesterday."""
    _, row = run.charge("train-0")
    hour = run.today - 2 * HOUR
    with db.write() as conn:
        conn.execute(insert(pod_hours), [{
            "pod_uid": row["podUid"], "hour": hour, "model": row["model"], "booked_hour": hour,
            "micro_gpu_seconds": GPU_HOUR, "weighted_micro_gpu_seconds": GPU_HOUR, "metered_micro_gpu_seconds": 0,
            "idle_micro_gpu_seconds": 0, "idle_weighted_micro_gpu_seconds": 0}])
    added = {**row, "hour": utc_text(hour)}
    return [f"{run.what}: {row_label(added)} was added after the close (it is no leaf of the statement)"]


def published(run: Run) -> str:
    """The published key's name and hash, as verify names a signature."""
    return "+".join(run.keys.read_text().strip().split("+")[:2])


def set_note(db: Database, note: bytes) -> None:
    with db.write() as conn:
        assert conn.execute(update(statements).where(statements.c.sequence == 1).values(note=note)).rowcount == 1


def edit_the_note(run: Run, db: Database) -> list[str]:
    """Its tree's size, one less: as if a row were not in the period."""
    origin, size, rest = run.note.split(b"\n", 2)
    set_note(db, b"\n".join([origin, str(int(size) - 1).encode(), rest]))
    # Its rows are not checked against a root nobody signed.
    return [f"{run.what}: is signed by no published key; its signatures are by {published(run)}, a signature of the "
            "text as it was"]


def sign_the_note_again(run: Run, db: Database) -> list[str]:
    """The same statement signed with another key of the same name."""
    other = generate_signer(KEY_NAME)
    set_note(db, sign_note(open_note(run.note, []).text, [other]))
    return [f"{run.what}: is signed by no published key; its signatures are by {KEY_NAME}+{other.key_hash:08x} (not "
            "a published key)"]


def delete_the_statement(run: Run, db: Database) -> list[str]:
    with db.write() as conn:
        assert conn.execute(delete(statements)).rowcount == 1
    return ["the statements: there are none to verify"]


TAMPERING: dict[str, Callable[[Run, Database], list[str]]] = {
    "a row edited": edit_a_row,
    "a row deleted": delete_a_row,
    "a row inserted": insert_a_row,
    "the note edited": edit_the_note,
    "the note signed again with another key": sign_the_note_again,
    "the statement deleted": delete_the_statement,
}


@pytest.mark.parametrize("change", TAMPERING)
def test_verify_names_each_change_made_in_the_database_after_the_close(run: Run, change: str, tmp_path: Path) -> None:
    """Each change on a copy of its own of the database as the period was stated; verify's findings are exactly the
    change's, and its exit status is 1."""
    copy = snapshot(f"sqlite:///{run.pristine}", tmp_path / "tampered.sqlite")
    with opened(copy) as db:
        expected = TAMPERING[change](run, db)
    found = gpusharing("verify", "--database", copy, "--keys", str(run.keys), env=run.calendar)
    assert found.returncode == 1, (found.stdout, found.stderr)
    assert found.stdout.splitlines() == expected
    assert found.stderr.startswith(f"gpusharing verify: {len(expected)} findings in ")
