"""A budget status read against years of history: the per-period rollups the timekeeper reads (namespace_period_usage)
beside the day sums (namespace_usage summed over each period's days, testbed/day_sums.py), in the same run, on the
same data.

    python bench/budget_reads.py                          # both backends, 500 namespaces, 1 to 3 years
    python bench/budget_reads.py --backend postgresql --namespaces 500 --years 5 --reads 300

Each backend gets its own PostgreSQL server (PostgreSQL's durable defaults) or SQLite file, migrated. Every namespace
has a budget that never resets (period `none`: the whole history is its period, the day sums' worst case) and one
charge a day; history is added a year at a time, older than the last, and after each year the reads are timed:
  one namespace  the use and top-ups of one namespace's status (the reads of GET /budgets/{ns}, of each report batch)
  listing        those of every namespace (GET /budgets, the webhook's poll, the controller's pass)
p50 and p99 of `--reads` reads each (a tenth as many listings), in random namespaces, after a warm-up read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusharing.contract import Period  # noqa: E402
from testbed.day_sums import TOPPED, TOPPED_OF, USED, USED_OF, day_sum_parameters  # noqa: E402
from testbed.postgres import bench_database  # noqa: E402
from timekeeper.budgets.periods import period_window  # noqa: E402
from timekeeper.database.accounting.charging import rolled_up  # noqa: E402
from timekeeper.database.budgets.reads import TOP_UPS, TOP_UPS_OF, USAGE, USAGE_OF, window_parameters  # noqa: E402
from timekeeper.database.connection import Database  # noqa: E402
from timekeeper.database.tables import budgets, namespace_period_usage, namespace_usage  # noqa: E402

NOW = dt.datetime(2029, 6, 15, 12, tzinfo=dt.timezone.utc)
CHUNK = 20_000


def add_year(database: Database, namespaces: list[str], year: int) -> None:
    """The year of daily charges `year` years before NOW's, for every namespace, with their rollups (as charged)."""
    last = NOW.date() - dt.timedelta(days=365 * (year - 1))
    days = [last - dt.timedelta(days=n) for n in range(365)]
    rows = [
        {"namespace": ns, "day": day, "micro_gpu_seconds": random.randint(1, 3_600_000_000)}
        for ns in namespaces
        for day in days
    ]
    rolled: dict[tuple[str, str, dt.date], int] = {}
    for row in rolled_up(rows):
        key = (row["namespace"], row["period"], row["period_start"])
        rolled[key] = rolled.get(key, 0) + row["micro_gpu_seconds"]
    with database.write() as conn:
        for start in range(0, len(rows), CHUNK):
            conn.execute(namespace_usage.insert(), rows[start:start + CHUNK])
        # A period that straddles two years' data got part of its use with the year before: added to it.
        upsert = database.insert(namespace_period_usage).on_conflict_do_update(
            index_elements=[
                namespace_period_usage.c.period,
                namespace_period_usage.c.period_start,
                namespace_period_usage.c.namespace,
            ],
            set_={
                "micro_gpu_seconds": namespace_period_usage.c.micro_gpu_seconds
                + database.insert(namespace_period_usage).excluded.micro_gpu_seconds
            },
        )
        items = [{"namespace": ns, "period": kind, "period_start": start, "micro_gpu_seconds": micro}
                 for (ns, kind, start), micro in rolled.items()]
        for start in range(0, len(items), CHUNK):
            conn.execute(upsert, items[start:start + CHUNK])


def timed(database: Database, read: Callable[[object], object], count: int) -> tuple[float, float]:
    """p50 and p99 of `count` reads, in milliseconds, each in a transaction of its own, as the timekeeper's."""
    with database.read() as conn:
        read(conn)  # warm: statements compiled, pages cached
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        with database.read() as conn:
            read(conn)
        latencies.append(1000 * (time.perf_counter() - began))
    latencies.sort()
    return statistics.median(latencies), latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def measure(url: str, namespace_count: int, years: int, reads: int) -> None:
    database = Database(url)
    namespaces = [f"team-{n:04d}" for n in range(namespace_count)]
    with database.write() as conn:
        conn.execute(budgets.insert(), [{"namespace": ns, "gpu_minutes": 1e9, "period": Period.NONE.value,
                                         "evict_on_exhaustion": False, "warning_thresholds": "80", "created_at": NOW,
                                         "updated_at": NOW} for ns in namespaces])
    rollups = window_parameters({kind: period_window(kind, NOW) for kind in Period})
    days = day_sum_parameters(NOW)

    def one(usage: object, top_ups: object, parameters: dict[str, object]) -> Callable[[object], object]:
        return lambda conn: [
            list(conn.execute(q, {**parameters, "namespaces": [random.choice(namespaces)]}))  # type: ignore[attr-defined]
            for q in (usage, top_ups)
        ]

    def every(usage: object, top_ups: object, parameters: dict[str, object]) -> Callable[[object], object]:
        return lambda conn: [list(conn.execute(q, parameters)) for q in (usage, top_ups)]  # type: ignore[attr-defined]

    for year in range(1, years + 1):
        add_year(database, namespaces, year)
        if not database.is_sqlite:
            with database.write() as conn:
                conn.exec_driver_sql("ANALYZE")
        for what, old, new, count in (
            ("one namespace", one(USED_OF, TOPPED_OF, days), one(USAGE_OF, TOP_UPS_OF, rollups), reads),
            ("listing", every(USED, TOPPED, days), every(USAGE, TOP_UPS, rollups), max(reads // 10, 5)),
        ):
            (old50, old99), (new50, new99) = timed(database, old, count), timed(database, new, count)
            print(
                f"  {year} year{'s' if year > 1 else ' '}  {what:<13}  "
                f"day sums p50 {old50:8.2f} ms  p99 {old99:8.2f} ms"
                f"   rollups p50 {new50:6.2f} ms  p99 {new99:6.2f} ms   x{old50 / new50:6.1f}",
                flush=True,
            )
    database.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--years", type=int, default=3)
    parser.add_argument("--reads", type=int, default=200)
    args = parser.parse_args()
    random.seed(23)
    for backend in ("postgresql", "sqlite") if args.backend == "both" else (args.backend,):
        print(f"{backend}: {args.namespaces} namespaces, a charge a day each, budgets of period none", flush=True)
        with tempfile.TemporaryDirectory(prefix="tk-budget-reads-") as work, bench_database(backend, Path(work)) as url:
            measure(url, args.namespaces, args.years, args.reads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
