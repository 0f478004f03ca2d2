"""Safe admission's reservations in the timekeeper: the transaction a GPU pod with a deadline waits for, on PostgreSQL
and on SQLite, alone and with sibling namespaces reserving at once.

    python bench/reservations.py                      # both backends, 8 threads, 10 s each
    python bench/reservations.py --backend postgresql --threads 16 --seconds 20

Each run starts its own PostgreSQL (PostgreSQL's durable defaults) or SQLite file, migrates it, gives a group budget
four sibling namespaces under strict admission, and has `--threads` threads reserve one small commitment after
another (each in a namespace of its own turn, so siblings contend for their parent's row) through the timekeeper's
ReservationStore, with 200 running pods' commitments counted as the pod watch would. Prints reservations/s and
p50/p99 of one reservation. The webhook waits for this plus a loopback round trip (bench/webhook_load.py --safe).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusharing.contract import AdmissionMode, Period, Shortfall  # noqa: E402
from testbed.postgres import bench_database  # noqa: E402
from timekeeper.budgets.commitments import NamespaceCommitments  # noqa: E402
from timekeeper.budgets.requests import Reservation  # noqa: E402
from timekeeper.budgets.status import Budget  # noqa: E402
from timekeeper.database.budgets.reservations import ReservationStore  # noqa: E402
from timekeeper.database.budgets.store import BudgetStore  # noqa: E402
from timekeeper.database.connection import Database  # noqa: E402

SIBLINGS = ("team-a", "team-b", "team-c", "team-d")
GROUP = "org.research"


def measure(url: str, threads: int, seconds: float) -> dict[str, float]:
    database = Database(url, pool_size=threads)
    budgets = BudgetStore(database)
    budgets.set_budget(Budget(GROUP, 10**9, Period.MONTHLY), "bench")
    for namespace in SIBLINGS:
        budgets.set_budget(Budget(namespace, 10**9, Period.MONTHLY, parent=GROUP, admission=AdmissionMode.STRICT,
                                  on_shortfall=Shortfall.REFUSE), "bench")
    store = ReservationStore(budgets, 30.0)
    committed = {namespace: NamespaceCommitments(50 * 60_000_000) for namespace in SIBLINGS}  # 200 pods' worth
    latencies: list[float] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def reserve(index: int) -> None:
        turn = index
        while time.monotonic() < stop_at:
            asked = Reservation(str(uuid.uuid4()), SIBLINGS[turn % len(SIBLINGS)], 60_000_000)
            began = time.perf_counter()
            assert store.reserve(asked, committed, frozenset(), lambda _: None).granted
            with lock:
                latencies.append(time.perf_counter() - began)
            turn += 1

    workers = [threading.Thread(target=reserve, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    database.dispose()
    latencies.sort()
    return {"per_second": len(latencies) / elapsed, "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    for backend in ("postgresql", "sqlite") if args.backend == "both" else (args.backend,):
        with tempfile.TemporaryDirectory(prefix="tk-reservations-") as work, bench_database(backend, Path(work)) as url:
            m = measure(url, args.threads, args.seconds)
            print(
                f"{backend:<10}  {args.threads} threads  {m['per_second']:7.0f} reservations/s  "
                f"p50 {m['p50_ms']:6.2f} ms  "
                f"p99 {m['p99_ms']:7.2f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
