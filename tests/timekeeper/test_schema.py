"""Alembic is the only way the schema is made; a database that is behind is refused, by `serve` and by /readyz."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, select

from demo.processes import run_command
from gpusharing.contract import AdmissionMode, Period, Shortfall
from gpusharing.report import MeterReport
from testbed.day_sums import day_sum_reads
from testbed.postgres import PostgresServer
from tests.timekeeper.conftest import SpecClient
from timekeeper.accounting.ledger import Observation
from timekeeper.app import create_app
from timekeeper.budgets.periods import period_starts
from timekeeper.budgets.status import Budget
from timekeeper.config import TimekeeperConfig
from timekeeper.database.accounting.charging import PodObservation, ReportLedger
from timekeeper.database.budgets.store import BudgetStore
from timekeeper.database.connection import Database
from timekeeper.database.schema import alembic_config, head_revision, schema_problem, upgrade
from timekeeper.database.tables import Base, budgets, namespace_period_usage, namespace_usage, pod_ledgers, pod_usage

REPO = Path(__file__).resolve().parents[2]


def test_the_migrations_make_exactly_the_models_tables(database_url: str) -> None:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    assert schema_problem(engine) is None
    engine.dispose()


def test_an_unmigrated_database_is_named_as_such(tmp_path: Path) -> None:
    (tmp_path / "empty.sqlite").touch()
    engine = create_engine(f"sqlite:///{tmp_path / 'empty.sqlite'}")
    assert schema_problem(engine) == (
        f"the database is not migrated, this timekeeper needs revision {head_revision()}: run `gpusharing db upgrade`"
    )
    engine.dispose()


def test_a_missing_sqlite_file_is_named_and_not_created_by_looking(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'missing.sqlite'}")
    assert schema_problem(engine) == (
        f"the database file {tmp_path / 'missing.sqlite'} does not exist: run `gpusharing db upgrade` to create it"
    )
    assert list(tmp_path.iterdir()) == []


def test_readyz_is_503_with_the_reason_when_the_database_is_behind_or_gone(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    (tmp_path / "empty.sqlite").touch()
    behind = create_app(TimekeeperConfig(database_url=f"sqlite:///{tmp_path / 'empty.sqlite'}", auth="none"))
    answer = SpecClient(behind.test_client()).get("/readyz")
    assert answer.status_code == 503 and "not migrated" in answer.json["reason"]
    gone = create_app(TimekeeperConfig(database_url=postgres.url("no_such_database"), auth="none"))
    answer = SpecClient(gone.test_client()).get("/readyz")
    assert answer.status_code == 503 and answer.json["reason"].startswith("the database is unreachable")
    for app in (behind, gone):
        app.extensions["reports"].close()
        app.extensions["database"].dispose()


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_command(*args, cwd=cwd, env={"PYTHONPATH": str(REPO), **env})


def test_db_upgrade_works_from_any_directory_and_serve_refuses_until_it_ran(tmp_path: Path) -> None:
    url = "sqlite:///tk.sqlite"  # the default's form: a file in the working directory
    refused = cli(
        "timekeeper", "serve", "--port", "1", cwd=tmp_path, TIMEKEEPER_DATABASE_URL=url, TIMEKEEPER_AUTH="none"
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "gpusharing: not serving: the database file tk.sqlite does not exist: run `gpusharing db upgrade` to create it"
    ]
    assert list(tmp_path.iterdir()) == []  # serve left nothing behind that could pass for a database
    upgraded = cli("db", "upgrade", cwd=tmp_path, TIMEKEEPER_DATABASE_URL=url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert schema_problem(create_engine(f"sqlite:///{tmp_path / 'tk.sqlite'}")) is None


def test_upgrading_twice_changes_nothing(database_url: str) -> None:
    upgrade(database_url)
    assert schema_problem(create_engine(database_url)) is None


def migrated_to(revision: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A new database of `backend`, migrated up to `revision` only: a deployment of that version."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'before.sqlite'}"
    else:
        url = request.getfixturevalue("postgres").create_database(f"before_{revision}")
    upgrade(url, revision)
    return url


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_budgets_from_before_safe_admission_admit_openly_and_demote(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = migrated_to("0003_usage_reports", backend, tmp_path, request)
    engine = create_engine(url)
    now = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    with engine.begin() as conn:  # the columns of 0003 alone
        conn.execute(
            budgets.insert().values(
                namespace="team-a",
                gpu_minutes=60.0,
                period="weekly",
                evict_on_exhaustion=True,
                parent=None,
                warning_thresholds="80",
                managed_by=None,
                created_at=now,
                updated_at=now,
            )
        )
    upgrade(url)
    database = Database(url)
    kept = Budget(
        "team-a", 60.0, Period.WEEKLY, True, None, (80,), admission=AdmissionMode.OPEN, on_shortfall=Shortfall.DEMOTE
    )
    assert BudgetStore(database).budgets() == {"team-a": kept}
    database.dispose()
    command.downgrade(alembic_config(url), "0003_usage_reports")
    assert {"admission", "on_shortfall"}.isdisjoint(c["name"] for c in inspect(engine).get_columns("budgets"))
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ledgers_from_before_billing_by_the_record_carry_over_and_in_flight_pods_go_on(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = migrated_to("0004_safe_admission", backend, tmp_path, request)
    engine = create_engine(url)
    start = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)
    with engine.begin() as conn:  # 0004's columns: one pod ended (final), one in flight, billed 30 GPU-s by its meter
        for uid, final in (("uid-ended", True), ("uid-running", False)):
            conn.execute(pod_ledgers.insert().values(
                pod_uid=uid, namespace="ml", pod=uid, billed_share=0.5, micro_gpu_seconds=30_000_000, last_seq=3,
                final=final, first_report_at=start, last_report_at=start + dt.timedelta(seconds=60)))
        conn.execute(namespace_usage.insert().values(namespace="ml", day=start.date(), micro_gpu_seconds=60_000_000))
    upgrade(url)
    database = Database(url)
    clock = start + dt.timedelta(seconds=100)
    ledger = ReportLedger(BudgetStore(database, clock=lambda: clock))
    kept = {pod.pod_uid: pod for pod in ledger.pods("ml")}
    assert {uid: (pod.micro_gpu_seconds, pod.metered_micro_gpu_seconds, pod.observed_micro_gpu_seconds, pod.final)
            for uid, pod in kept.items()} == {"uid-ended": (30_000_000, 30_000_000, 0, True),
                                              "uid-running": (30_000_000, 30_000_000, 0, False)}
    # The in-flight pod, observed from its start for the first time: only what its record adds beyond its bill.
    ledger.observe(
        [PodObservation("uid-running", "ml", "uid-running", 0.5, Observation(0.5, start, clock, ended=False))]
    )
    assert ledger.budgets.status("ml").used_micro_gpu_seconds == 60_000_000 + 20_000_000  # 0.5 x 100 s = 50, was 30
    # ... and its meter's next report, below what is now billed, adds nothing.
    ledger.record([(MeterReport("uid-running", "ml", "uid-running", 0.5, 4, 45.0), None)])
    assert ledger.budgets.status("ml").used_micro_gpu_seconds == 80_000_000
    database.dispose()
    command.downgrade(alembic_config(url), "0004_safe_admission")
    assert "observed_micro_gpu_seconds" not in {c["name"] for c in inspect(engine).get_columns("pod_ledgers")}
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_usage_from_before_idle_policies_gets_its_idle_cost_and_budgets_no_policy(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = migrated_to("0006_reservations", backend, tmp_path, request)
    engine = create_engine(url)
    day = dt.date(2026, 11, 25)
    with engine.begin() as conn:  # an H100 day (weight 2.5) 40 % idle, and a day of a pod whose meter read nothing
        conn.execute(pod_usage.insert().values(
            [{"pod_uid": "uid-a", "day": day, "model": "NVIDIA H100 80GB HBM3", "micro_gpu_seconds": 3_600_000_000,
              "weighted_micro_gpu_seconds": 9_000_000_000, "metered_micro_gpu_seconds": 3_600_000_000,
              "idle_micro_gpu_seconds": 1_440_000_000},
             {"pod_uid": "uid-b", "day": day, "model": "Tesla T4", "micro_gpu_seconds": 60_000_000,
              "weighted_micro_gpu_seconds": 60_000_000, "metered_micro_gpu_seconds": 0, "idle_micro_gpu_seconds": 0}]))
        conn.execute(
            budgets.insert().values(
                namespace="ml",
                gpu_minutes=60.0,
                period="monthly",
                evict_on_exhaustion=False,
                warning_thresholds="80,95",
                created_at=dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc),
                updated_at=dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc),
            )
        )
    upgrade(url)
    with engine.connect() as conn:
        costs = dict(conn.execute(select(pod_usage.c.pod_uid, pod_usage.c.idle_weighted_micro_gpu_seconds)).all())
        assert costs == {"uid-a": 3_600_000_000, "uid-b": 0}  # 1,440 idle GPU-s at the row's weight 2.5
        assert conn.execute(select(budgets.c.idle)).scalar_one() is None
    command.downgrade(alembic_config(url), "0006_reservations")
    assert "idle_since" not in {c["name"] for c in inspect(engine).get_columns("pod_ledgers")}
    assert "idle_holds" not in inspect(engine).get_table_names()
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_daily_usage_from_before_rollups_is_rolled_up_into_every_kind_of_period(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = migrated_to("0009_eviction_fencing", backend, tmp_path, request)
    engine = create_engine(url)
    first = dt.date(2027, 12, 1)  # 100 days: ISO weeks across the new year, months, a leap day
    days = [{"namespace": namespace, "day": first + dt.timedelta(days=n), "micro_gpu_seconds": (n + 1) * scale}
            for n in range(100) for namespace, scale in (("ml", 1_000_000), ("cv", 7))]
    with engine.begin() as conn:
        conn.execute(namespace_usage.insert(), days)
    upgrade(url)
    expected: dict[tuple[str, str, dt.date], int] = {}
    for row in days:
        for kind, start in period_starts(row["day"]).items():
            key = (row["namespace"], kind.value, start)
            expected[key] = expected.get(key, 0) + row["micro_gpu_seconds"]
    with engine.connect() as conn:
        rolled = {
            (r.namespace, r.period, r.period_start): r.micro_gpu_seconds
            for r in conn.execute(select(namespace_period_usage))
        }
    assert rolled == expected
    assert rolled["ml", "none", dt.date(1970, 1, 1)] == 5050 * 1_000_000
    assert rolled["ml", "weekly", dt.date(2027, 12, 27)] == sum(range(27, 34)) * 1_000_000  # Mon 27 Dec .. Sun 2 Jan
    database = Database(url)
    clock = dt.datetime(2028, 2, 29, 12, tzinfo=dt.timezone.utc)
    store = BudgetStore(database, default_gpu_minutes=1.0, default_period=Period.MONTHLY, clock=lambda: clock)
    with database.read() as conn:
        assert store.statuses_in(conn, None, clock) == day_sum_reads(store, conn, None, clock).statuses()
    assert store.status("ml").used_micro_gpu_seconds == sum(range(63, 92)) * 1_000_000  # February's 29 days
    database.dispose()
    command.downgrade(alembic_config(url), "0009_eviction_fencing")
    assert "namespace_period_usage" not in inspect(engine).get_table_names()
    assert "ix_top_ups_period_start" not in {index["name"] for index in inspect(engine).get_indexes("top_ups")}
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_readings_from_before_sources_are_the_meters_and_their_streaks_go_on(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    url = migrated_to("0011_published_commitments", backend, tmp_path, request)
    engine = create_engine(url)
    start = dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.timezone.utc)
    idle_since = start + dt.timedelta(seconds=30)
    with engine.begin() as conn:  # a pod idle since its second report, and one whose meter never reported
        conn.execute(pod_ledgers.insert().values(
            pod_uid="uid-idle", namespace="ml", pod="idle", billed_share=0.5, micro_gpu_seconds=30_000_000,
            metered_micro_gpu_seconds=30_000_000, last_seq=2, final=False, first_report_at=start,
            last_report_at=start + dt.timedelta(seconds=60), gpu_utilization_percent=0.0, idle_since=idle_since))
        conn.execute(pod_ledgers.insert().values(
            pod_uid="uid-watched", namespace="ml", pod="watched", billed_share=0.5, micro_gpu_seconds=0, last_seq=-1,
            final=False, started_at=start, observed_until=start))
    upgrade(url)
    with engine.connect() as conn:
        sources = {row.pod_uid: (row.utilisation_source, row.utilisation_at, row.utilisation_fresh_until)
                   for row in conn.execute(select(pod_ledgers))}
    assert sources == {"uid-idle": ("meter", start + dt.timedelta(seconds=60), None), "uid-watched": (None, None, None)}
    database = Database(url)
    clock = start + dt.timedelta(seconds=90)
    ledger = ReportLedger(BudgetStore(database, clock=lambda: clock))
    ledger.record([(MeterReport("uid-idle", "ml", "idle", 0.5, 3, 45.0, gpu_utilization_percent=0.0), None)])
    (pod,) = [pod for pod in ledger.pods("ml") if pod.pod_uid == "uid-idle"]
    assert pod.idle_since == idle_since and pod.utilisation_at == clock  # the streak goes on, from the meter's word
    database.dispose()
    command.downgrade(alembic_config(url), "0011_published_commitments")
    assert "utilisation_source" not in {c["name"] for c in inspect(engine).get_columns("pod_ledgers")}
    engine.dispose()
