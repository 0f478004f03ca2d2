"""Chargeback at the size of a large cluster's month (issue 40): the capacity ledger's write and its reports, the FOCUS
export and the accounts report, each beside the usage report of the same window, measured in the same run.

    python bench/chargeback.py                                       # 500 nodes, 10,000 namespaces, 30 days, SQLite
    python bench/chargeback.py --postgres                            # the same on a PostgreSQL server of its own
    python bench/chargeback.py --nodes 20 --namespaces 200 --days 2  # a quick look

What it builds, in a fresh database migrated to head (a SQLite file, or PostgreSQL on loopback with its durable
defaults, as testbed/postgres.py starts it), for the `--days` from 2026-11-01 (November: 30 days, 720 hours):

- `--nodes` GPU nodes (A100 80GB, H100 or T4, 1 to 8 GPUs each), observed on every hour through
  CapacityLedger.observe, the capacity ledger's own write path (the controller's `capacity` task), each pass timed;
  a fifth of them NotReady once, for 1 to 8 hours.
- `--pods-per-node` pods on every node at any time: slots each running one pod after another, each pod living 12 to
  36 hours (a day on average), holding an eighth or a quarter of its node's GPUs (at least a quarter GPU), its
  utilisation read by its node's agent; each pod in one of `--namespaces` namespaces chosen uniformly (the export's
  worst case: only pod-hours of one namespace, model and hour share a row), under 100-namespace teams and 10-team
  departments of group budgets.
- A price sheet for the three models, recorded (PriceLog) two days before the month.

The first `--sample-hours` are billed through ReportLedger.observe, the controller's `bills` pass: every running pod
observed in batches of 500, a pass every `--billing-minutes`, each pass timed, the node agents' utilisation readings
recorded between passes (not timed). Billing every pod-hour of a month that way would take hours here, so the rest of
the month is written in bulk: the same rows (pod_ledgers with `node`, pod_hours, pod_usage, namespace_usage and its
rollups), made by the ledger's own arithmetic (charge_hours, pod_charge, SpreadCharge) and written by its own
statements (UsageLedger.charge included), one transaction per 1,000 pods; the rows of the pods the sample billed whole
are checked against that arithmetic.

What it measures (the writes while it builds; then each read in `--rounds` rounds, in the order below, each in a
process of its own as a fresh web worker would make it, after one small request, with the clock a day after the
window: at 30 days November has closed, so the export is final and the first one pins its tags):

  capacity pass         CapacityLedger.observe over every node (p50 of the passes)
  billing batch         ReportLedger.observe of 500 running pods (p50; the smaller last batch of each pass apart)
  billing pass          every running pod's batches of one pass
  usage by namespace    GET /api/v1/usage?from&to&groupBy=namespace: the reads' yardstick
  usage by ns,model,day GET /api/v1/usage?from&to&groupBy=namespace,model,day
  utilization           CapacityLedger.utilization(start, end): the sums GET /api/v1/utilization answers
  node-hours            CapacityLedger.node_hours(start, end): every node-hour's figures
  FOCUS export          GET /api/v1/focus?from&to through the Flask app's test client with an admin's static token,
                        read to its last byte (its first comes once the whole file is written to the spool)
  accounts              GET /api/v1/accounts?from&to

Each with its wall-clock time, its CPU time in the process (a PostgreSQL server's is not in it), its peak memory (the
growth of the process's peak resident set over its resident set before: VmHWM after resetting it through
/proc/self/clear_refs, so that what SQLite and the drivers allocate counts as well as Python's objects; without
clear_refs, the growth of ru_maxrss), the rows it gives, rows/s, and its ratio to a yardstick measured in the same
run: the reads' to the usage report by namespace, the passes' to a billing batch. Then each table's rows and bytes,
indexes included (PostgreSQL's pg_total_relation_size, SQLite's dbstat). `--profile WHAT` runs one read once more,
under cProfile, and prints where its time went.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import json
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flask.testing import FlaskClient  # noqa: E402

from gpusharing.contract import Period  # noqa: E402
from gpusharing.gpu.capacity import NodeGpus, node_gpus  # noqa: E402
from gpusharing.gpu.catalogue import PRODUCT_LABEL, GpuCatalogue, shipped_catalogue  # noqa: E402
from gpusharing.idle.verdict import Reading  # noqa: E402
from gpusharing.utilisation import PodUtilisation, UtilisationSource  # noqa: E402
from testbed.postgres import bench_database  # noqa: E402
from timekeeper.accounting.hours import charge_hours  # noqa: E402
from timekeeper.accounting.ledger import Observation, PodLedger, share_time  # noqa: E402
from timekeeper.api.context import SERVICES  # noqa: E402
from timekeeper.app import create_app  # noqa: E402
from timekeeper.chargeback.prices import PriceSheet, price_sheet_from  # noqa: E402
from timekeeper.config import ChargebackSettings, TimekeeperConfig  # noqa: E402
from timekeeper.database.accounting.charging import PodObservation, ReportLedger, rolled_up  # noqa: E402

# The ledger's own column sets, so that the bulk rows are the rows it writes, column for column.
from timekeeper.database.accounting.pods import _ledger_columns, reading_columns  # noqa: E402
from timekeeper.database.accounting.usage import SpreadCharge, pod_charge  # noqa: E402
from timekeeper.database.chargeback.capacity import CapacityLedger  # noqa: E402
from timekeeper.database.chargeback.prices import PriceLog  # noqa: E402
from timekeeper.database.connection import Database  # noqa: E402
from timekeeper.database.tables import budgets, node_hours, pod_hours, pod_ledgers  # noqa: E402
from timekeeper.services import Services  # noqa: E402

UTC = dt.timezone.utc
START = dt.datetime(2026, 11, 1, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
CREATED = START - dt.timedelta(days=90)  # the nodes are older than the controller: each counts from its first pass
CLUSTER = "bench"
TOKEN = "bench-admin-token"
BATCH = 500  # the controller's observations per transaction (timekeeper.cluster.billing.OBSERVATIONS_PER_TRANSACTION)
BULK_PODS = 1_000  # pods written per transaction in bulk
NAMESPACES_PER_TEAM, TEAMS_PER_DEPARTMENT = 100, 10
TABLES = ("pod_hours", "pod_usage", "pod_ledgers", "node_hours", "node_capacity", "namespace_usage",
          "namespace_period_usage", "export_tags", "budgets")


@dataclass(frozen=True)
class NodeKind:
    model: str  # as the catalogue names it
    product: str  # the GPU operator's product label
    gpus: tuple[int, ...]
    weight: float  # the part of the nodes


KINDS = (
    NodeKind("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", (4, 8), 0.4),
    NodeKind("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", (8,), 0.2),
    NodeKind("Tesla T4", "Tesla-T4", (1, 2, 4), 0.4),
)
PRICES = """
currency: USD
prices:
- {model: NVIDIA A100-SXM4-80GB, from: "2026-01-01", listPerGpuHour: "3.00", contractedPerGpuHour: "2.40"}
- {model: NVIDIA H100 80GB HBM3, from: "2026-01-01", listPerGpuHour: "4.50", contractedPerGpuHour: "3.10"}
- {model: Tesla T4, from: "2026-01-01", listPerGpuHour: "0.35"}
"""


SOURCE = "bench/chargeback.py"
PRICE_SHEET: PriceSheet = price_sheet_from(yaml.safe_load(PRICES), SOURCE, shipped_catalogue())


def timekeeper_config(url: str, tokens: Path) -> TimekeeperConfig:
    """The timekeeper's settings: the bench's database, an admin's static token, the price sheet, a cluster name."""
    return TimekeeperConfig(database_url=url, auth="static", static_tokens_file=str(tokens), price_sheet=PRICE_SHEET,
                            price_sheet_source=SOURCE, chargeback=ChargebackSettings(cluster=CLUSTER))


class BenchClock:
    """The timekeeper's clock (gpusharing.clock.Clock), set by the benchmark: the time of day is `at`."""

    def __init__(self, at: dt.datetime):
        self.at = at

    def now(self) -> dt.datetime:
        return self.at

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass(frozen=True)
class Node:
    name: str
    uid: str
    kind: NodeKind
    gpus: int
    outage: tuple[dt.datetime, dt.datetime] | None  # NotReady from, to

    def ready_at(self, now: dt.datetime) -> tuple[bool, dt.datetime]:
        """Its Ready condition at `now`: the status, and its lastTransitionTime."""
        if self.outage is None or now < self.outage[0]:
            return True, CREATED
        return (False, self.outage[0]) if now < self.outage[1] else (True, self.outage[1])


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    node: str
    model: str
    share: float
    start: dt.datetime
    end: dt.datetime  # may lie past the window: then it is still running at its end
    utilisation: float


def stamp(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def whole_second(at: dt.datetime) -> dt.datetime:
    return at.replace(microsecond=0)


def make_nodes(count: int, end: dt.datetime, rng: random.Random) -> list[Node]:
    nodes = []
    seconds = int((end - START).total_seconds())
    for index in range(count):
        kind = rng.choices(KINDS, [k.weight for k in KINDS])[0]
        outage = None
        if rng.random() < 0.2:
            down = START + dt.timedelta(seconds=rng.randrange(seconds))
            outage = (down, down + dt.timedelta(seconds=rng.randrange(3600, 8 * 3600)))
        nodes.append(Node(f"gpu-node-{index:04d}", str(uuid.UUID(int=rng.getrandbits(128))), kind,
                          rng.choice(kind.gpus), outage))
    return nodes


def make_pods(nodes: list[Node], per_node: int, namespaces: list[str], end: dt.datetime,
              rng: random.Random) -> list[Pod]:
    """Every node's slots, each a pod after another from before the window to its end."""
    pods: list[Pod] = []
    for node in nodes:
        shares = sorted({max(0.25, node.gpus / 8), node.gpus / 4})  # four slots hold about 3/4 of the node
        for _ in range(per_node):
            life = dt.timedelta(seconds=rng.randrange(12 * 3600, 36 * 3600))
            start = whole_second(START - life * rng.random())  # running when the window opens
            while start < end:
                number = len(pods)
                pods.append(Pod(str(uuid.UUID(int=rng.getrandbits(128), version=4)), rng.choice(namespaces),
                                f"train-{number:06d}", node.name, node.kind.model, rng.choice(shares), start,
                                start + life, round(rng.uniform(0, 100), 1)))
                start = start + life + dt.timedelta(seconds=rng.randrange(1800))
                life = dt.timedelta(seconds=rng.randrange(12 * 3600, 36 * 3600))
    return pods


def budget_rows(namespaces: list[str]) -> list[dict[str, Any]]:
    """A budget for every namespace under its team's, and each team's under its department's: as GPUBudgets would
    set them, so that the export's tags and the accounts tree have a hierarchy to show."""
    rows: list[tuple[str, float | None, str | None]] = []
    teams: dict[str, str] = {}
    for index, namespace in enumerate(namespaces):
        team = f"team.t{index // NAMESPACES_PER_TEAM:03d}"
        teams[team] = f"dept.d{index // (NAMESPACES_PER_TEAM * TEAMS_PER_DEPARTMENT):02d}"
        rows.append((namespace, 100_000.0, team))
    rows += [(team, None, department) for team, department in teams.items()]
    rows += [(department, None, None) for department in sorted(set(teams.values()))]
    return [{"namespace": name, "gpu_minutes": minutes, "period": Period.MONTHLY.value, "evict_on_exhaustion": False,
             "parent": parent, "warning_thresholds": "80,95", "created_at": CREATED, "updated_at": CREATED}
            for name, minutes, parent in rows]


@dataclass
class Figure:
    """One measurement over the rounds."""

    name: str
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)  # MiB
    rows: int | None = None
    size: int | None = None  # bytes
    note: str = ""


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1])
    raise KeyError(name)


def _max_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss_kib() -> int:
    return _status_kib("VmHWM")


@contextmanager
def timed(figure: Figure) -> Iterator[None]:
    """The block's wall-clock and CPU time, and the growth of the process's peak resident set over it (see the
    module's docstring), added to `figure`."""
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from the resident set
        before, peak = _status_kib("VmRSS"), _peak_rss_kib
    except OSError:
        before, peak = _max_rss_kib(), _max_rss_kib
    began, cpu = time.perf_counter(), time.process_time()
    yield
    figure.walls.append(time.perf_counter() - began)
    figure.cpus.append(time.process_time() - cpu)
    figure.peaks.append(max(0, peak() - before) / 1024)


class ReadFailed(RuntimeError):
    """A read's process failed: its last line says why."""


class Bench:
    def __init__(self, url: str, args: argparse.Namespace, tokens: Path):
        self.args = args
        self.rng = random.Random(args.seed)
        self.catalogue: GpuCatalogue = shipped_catalogue()
        self.end = START + dt.timedelta(days=args.days)
        self.sample_end = min(self.end, START + dt.timedelta(hours=args.sample_hours))
        self.clock = BenchClock(START - dt.timedelta(days=2))
        self.app = create_app(timekeeper_config(url, tokens), clock=self.clock)
        self.services: Services = self.app.extensions[SERVICES]
        self.db: Database = self.services.database
        self.namespaces = [f"ns-{index:05d}" for index in range(args.namespaces)]
        self.nodes = make_nodes(args.nodes, self.end, self.rng)
        self.pods = make_pods(self.nodes, args.pods_per_node, self.namespaces, self.end, self.rng)
        self.figures: dict[str, Figure] = {}
        self.sampled: dict[str, Pod] = {}  # the pods the sample billed, by uid
        self.closed_in_sample: set[str] = set()  # of them, those whose bills it closed
        self.last_pass = START  # the sample's last pass

    def close(self) -> None:
        self.services.reports.close()
        self.db.dispose()

    def figure(self, name: str) -> Figure:
        return self.figures.setdefault(name, Figure(name))

    # -- the month -------------------------------------------------------------------------------------------------

    def build(self) -> None:
        args = self.args
        hours = int((self.end - START) / HOUR)
        kinds = ", ".join(f"{sum(node.kind is kind for node in self.nodes)} {kind.model}" for kind in KINDS)
        print(f"{args.nodes:,} GPU nodes ({kinds}"
              f"; {sum(n.gpus for n in self.nodes):,} GPUs; {sum(n.outage is not None for n in self.nodes)} NotReady "
              f"once), {args.days} days from {START.date()} ({hours:,} hours, {args.nodes * hours:,} node-hours), "
              f"{len(self.pods):,} pods ({args.pods_per_node} per node at any time) in {args.namespaces:,} "
              f"namespaces, on {'PostgreSQL' if args.postgres else 'SQLite'}", flush=True)
        with self.db.write() as conn:
            conn.execute(budgets.insert(), budget_rows(self.namespaces))
        recorded = PriceLog(self.db).record(PRICE_SHEET, self.clock.at, SOURCE)
        assert recorded is not None
        print(f"price sheet recorded at {stamp(recorded.recorded_at)}, in force from {stamp(recorded.effective_at)}",
              flush=True)
        self.observe_capacity()
        self.bill_sample()
        self.bill_rest()
        if not self.db.is_sqlite:  # as autovacuum would have by the time a month is exported
            with self.db.write() as conn:
                conn.exec_driver_sql("ANALYZE")

    def observe_capacity(self) -> None:
        """Every node observed on every hour of the window through the capacity ledger's write path."""
        ledger = CapacityLedger(self.db)
        cache: dict[tuple[str, bool, dt.datetime], NodeGpus] = {}

        def read(node: Node, now: dt.datetime) -> NodeGpus:
            """The node as the nodes cache reads it (node_gpus), made once per state."""
            ready, changed = node.ready_at(now)
            key = (node.name, ready, changed)
            if key not in cache:
                cache[key] = node_gpus({
                    "metadata": {"name": node.name, "uid": node.uid, "creationTimestamp": stamp(CREATED),
                                 "labels": {PRODUCT_LABEL: node.kind.product}},
                    "spec": {},
                    "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": str(node.gpus)}, "conditions": [
                        {"type": "Ready", "status": "True" if ready else "False",
                         "lastTransitionTime": stamp(changed)}]},
                }, self.catalogue)
            return cache[key]

        passes = self.figure("capacity pass")
        began = time.perf_counter()
        now = START
        while now <= self.end:
            cached = {node.name: read(node, now) for node in self.nodes}
            with timed(passes):
                passes.rows = len(ledger.observe(cached, now).advanced)
            now += HOUR
        passes.note = f"{len(passes.walls)} passes in {time.perf_counter() - began:.1f} s"
        print(f"capacity ledger: {len(passes.walls)} passes over {len(self.nodes)} nodes, p50 "
              f"{statistics.median(passes.walls) * 1000:.1f} ms", flush=True)

    def bill_sample(self) -> None:
        """The first hours billed as the controller bills them: every running pod observed at each pass."""
        ledger = self.services.ledger
        # Timed apart: the batch of 500 is the figure, the smaller last batch of each pass is not.
        full, partial = Figure("full batches"), Figure("partial batches")
        sample_passes = self.figure("billing pass")
        step = dt.timedelta(minutes=self.args.billing_minutes)
        ending = sorted((pod for pod in self.pods if pod.start <= self.sample_end), key=lambda pod: pod.start)
        closed = self.closed_in_sample
        began = time.perf_counter()
        now = START
        while now <= self.sample_end:
            self.clock.at = now
            running = [pod for pod in ending if pod.start <= now and pod.uid not in closed]
            observations = [PodObservation(pod.uid, pod.namespace, pod.name, pod.share,
                                           Observation(pod.share, pod.start, min(now, pod.end), pod.end <= now),
                                           (), pod.model, pod.node) for pod in running]
            pass_began = time.perf_counter()
            for first in range(0, len(observations), BATCH):
                chunk = observations[first:first + BATCH]
                batches = full if len(chunk) == BATCH else partial
                with timed(batches):
                    ledger.observe(chunk)
                batches.rows = max(batches.rows or 0, len(chunk))
            sample_passes.walls.append(time.perf_counter() - pass_began)
            sample_passes.rows = max(sample_passes.rows or 0, len(observations))
            self.sampled.update((pod.uid, pod) for pod in running)
            closed |= {pod.uid for pod in running if pod.end <= now}
            # The node agents' readings of the pods still running, fresh until the next pass (not timed).
            self.services.utilisation.record_utilisation(
                UtilisationSource.NODE,
                [PodUtilisation(pod.uid, pod.namespace, pod.name, pod.utilisation) for pod in running
                 if pod.uid not in closed],
                step.total_seconds(), now)
            self.last_pass = now
            now += step
        self.figures["billing batch"] = batches = full if full.walls else partial
        batches.name, batches.note = "billing batch", "" if full.walls else f"no batch of {BATCH}: up to {batches.rows}"
        print(f"billed through ReportLedger.observe: {len(sample_passes.walls)} passes over the first "
              f"{(self.sample_end - START) / HOUR:g} hours, {len(self.sampled):,} pods, "
              f"{len(full.walls) + len(partial.walls)} batches in {time.perf_counter() - began:.1f} s", flush=True)

    def bill_rest(self) -> None:
        """The rest of every pod's time to its end (or the window's) in bulk, as the ledger would have billed it."""
        ledger: ReportLedger = self.services.ledger
        weight = {kind.model: self.model_weight(kind.model) for kind in KINDS}
        with self.db.read() as conn:
            billed = {row.pod_uid: row.micro_gpu_seconds for row in conn.execute(
                select(pod_ledgers.c.pod_uid, pod_ledgers.c.micro_gpu_seconds).where(pod_ledgers.c.ended_at.is_(None)))}
        rest = [pod for pod in self.pods if pod.uid not in self.closed_in_sample]
        began = time.perf_counter()
        for first in range(0, len(rest), BULK_PODS):
            opened: list[dict[str, Any]] = []
            moved: list[dict[str, Any]] = []
            spreads: list[SpreadCharge] = []
            days: dict[tuple[str, dt.date], int] = defaultdict(int)
            for pod in rest[first:first + BULK_PODS]:
                since = self.last_pass if pod.uid in self.sampled else pod.start
                before = billed.get(pod.uid, 0)
                until, ended = min(pod.end, self.end), pod.end <= self.end
                after = before + share_time(pod.share, since, until)  # as the controller's observations add it up
                charge = pod_charge(after - before, weight[pod.model], pod.utilisation)
                spread = SpreadCharge(pod.uid, pod.model, charge,
                                      charge_hours(before, after, pod.start, pod.share, until))
                spreads.append(spread)
                for hour, part in spread.by_hour().items():
                    days[pod.namespace, hour.date()] += part.weighted_micro_gpu_seconds
                columns = _ledger_columns(PodLedger(observed=after, billed=after, started_at=pod.start,
                                                    observed_until=until, ended_at=until if ended else None,
                                                    share=pod.share, model=pod.model, node=pod.node))
                if pod.uid in self.sampled:
                    moved.append({"pod_uid": pod.uid, "pod": pod.name, **columns})
                else:
                    reading = Reading(pod.utilisation, until, UtilisationSource.NODE, until)
                    opened.append({"pod_uid": pod.uid, "namespace": pod.namespace, "pod": pod.name, **columns,
                                   **reading_columns(reading, None), "gpu_memory_requested_mib": None,
                                   "last_report_at": None, "meter_model": None, "first_report_at": None})
            charged = [{"namespace": ns, "day": day, "micro_gpu_seconds": micro}
                       for (ns, day), micro in sorted(days.items()) if micro]
            # A transaction of the ledger's charges one day; these charge many, so each period's rollup is summed
            # first (one statement may not update a row twice).
            periods: dict[tuple[str, str, dt.date], int] = defaultdict(int)
            for row in rolled_up(charged):
                periods[row["namespace"], row["period"], row["period_start"]] += row["micro_gpu_seconds"]
            rollups = [{"namespace": ns, "period": kind, "period_start": day, "micro_gpu_seconds": micro}
                       for (ns, kind, day), micro in sorted(periods.items())]
            with self.db.write() as conn:
                # The ledger's own statements: pods opened, pods moved on, their hours and days, the namespaces' use.
                if opened:
                    ledger._open.execute(conn, sorted(opened, key=lambda row: row["pod_uid"]))
                if moved:
                    ledger._observed.execute(conn, sorted(moved, key=lambda row: row["pod_uid"]))
                # Booked as of the window's start: every hour was billed while its billing period was open.
                ledger.usage.charge(conn, spreads, START)
                if charged:
                    ledger._charge.execute(conn, charged)
                    ledger._roll_up.execute(conn, rollups)
        print(f"written in bulk: {len(rest):,} pods' time after the sample in {time.perf_counter() - began:.1f} s",
              flush=True)
        self.check_sample()

    def model_weight(self, name: str) -> int:
        model = self.catalogue.by_name(name)
        assert model is not None, name
        return model.billing_weight

    def check_sample(self) -> None:
        """The bulk rows' arithmetic (charge_hours from the bill at each end) against the hours ReportLedger wrote for
        the pods the sample billed whole."""
        whole = [self.sampled[uid] for uid in sorted(self.closed_in_sample)]
        written: dict[str, dict[dt.datetime, int]] = defaultdict(dict)
        with self.db.read() as conn:
            for first in range(0, len(whole), 500):
                query = select(pod_hours.c.pod_uid, pod_hours.c.hour, pod_hours.c.micro_gpu_seconds).where(
                    pod_hours.c.pod_uid.in_([pod.uid for pod in whole[first:first + 500]]))
                for row in conn.execute(query):
                    written[row.pod_uid][row.hour] = row.micro_gpu_seconds
        differ = [pod.uid for pod in whole if written[pod.uid] != charge_hours(
            0, share_time(pod.share, pod.start, pod.end), pod.start, pod.share, pod.end)]
        print(f"checked: the hours of the {len(whole):,} pods the sample billed whole are "
              f"{'those the bulk arithmetic makes' if not differ else f'NOT the bulk arithmetic in {len(differ)}'}",
              flush=True)

    # -- the reads -------------------------------------------------------------------------------------------------

    def measure(self, url: str, tokens: Path) -> None:
        """Each read in a process of its own, as a fresh web worker would make it: this one's heap, grown by the
        build and freed, would hide what a read allocates."""
        for round_number in range(1, self.args.rounds + 1):
            for name in READS:
                figure = self.figure(name)
                try:
                    measured = self.run_read(name, url, tokens)
                except ReadFailed as failed:  # said, and the other reads made all the same
                    figure.note = f"failed: {failed}"
                    print(f"  round {round_number}  {name:<30} {figure.note}", flush=True)
                    continue
                figure.walls.append(measured["wall"])
                figure.cpus.append(measured["cpu"])
                figure.peaks.append(measured["peak"])
                figure.rows, figure.size, figure.note = measured["rows"], measured["size"], measured["note"]
                print(f"  round {round_number}  {name:<30} {figure.walls[-1]:8.2f} s  CPU {figure.cpus[-1]:8.2f} s  "
                      f"peak +{figure.peaks[-1]:7.1f} MiB  rows {figure.rows if figure.rows is not None else '-'}",
                      flush=True)

    def run_read(self, name: str, url: str, tokens: Path, profile: bool = False) -> dict[str, Any]:
        command = [sys.executable, __file__, "--read", name, "--url", url, "--tokens", str(tokens),
                   "--days", str(self.args.days), *(["--profile", name] if profile else [])]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()
            raise ReadFailed(said[-1][:300] if said else f"exit status {done.returncode}")
        *printed, last = done.stdout.splitlines()
        if printed:
            print("\n".join(printed))
        answer: dict[str, Any] = json.loads(last)
        return answer

    # -- the figures -----------------------------------------------------------------------------------------------

    def report(self) -> None:
        yardstick = statistics.median(self.figure("usage by namespace").walls or [float("nan")])
        batch = statistics.median(self.figure("billing batch").walls)
        print(f"\n{'':<30} {'wall s':>9} {'CPU s':>9} {'peak MiB':>9} {'rows':>11} {'rows/s':>11} {'MiB':>8} "
              f"{'x yardstick':>12}")
        order = ["capacity pass", "billing batch", "billing pass", *READS]
        for name in order:
            figure = self.figures[name]
            if not figure.walls:
                print(f"{name:<30} {figure.note}")
                continue
            wall = statistics.median(figure.walls)
            cpu = f"{statistics.median(figure.cpus):9.3f}" if figure.cpus else f"{'-':>9}"  # a pass: see its batches
            peak = f"{max(figure.peaks):9.1f}" if figure.peaks else f"{'-':>9}"
            rows = "-" if figure.rows is None else f"{figure.rows:,}"
            rate = "-" if figure.rows is None else f"{figure.rows / wall:,.0f}"
            size = "-" if figure.size is None else f"{figure.size / 2**20:,.1f}"
            ratio = wall / (batch if name in ("capacity pass", "billing batch", "billing pass") else yardstick)
            spread = f" ({min(figure.walls):.3g}-{max(figure.walls):.3g})" if len(figure.walls) > 1 else ""
            print(f"{name:<30} {wall:9.3f} {cpu} {peak} {rows:>11} {rate:>11} {size:>8} {ratio:11.2f}x"
                  f"{spread}{'  ' + figure.note if figure.note else ''}")
        print("(median of the passes, batches or rounds, the wall range in brackets; peak: the growth of the peak "
              "resident set over the call;\n x yardstick: the reads over the usage report by namespace, the passes "
              "and batches over a billing batch of 500 pods)")

    def sizes(self, url: str) -> None:
        """Each table's rows and bytes, indexes included."""
        database = Database(url)
        with database.read() as conn:
            counts = {table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one() for table in TABLES}
            if database.is_sqlite:
                owner: dict[str, str] = dict(conn.execute(text("SELECT name, tbl_name FROM sqlite_schema")).all())
                sizes: dict[str, int] = defaultdict(int)
                for name, pages in conn.execute(text("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")):
                    sizes[owner.get(name, name)] += pages
                what = "dbstat: the table's and its indexes' pages"
            else:
                sizes = {table: conn.execute(text(f"SELECT pg_total_relation_size('{table}')")).scalar_one()
                         for table in TABLES}
                what = "pg_total_relation_size"
        database.dispose()
        print(f"\ntables ({what}):")
        for table in TABLES:
            per_row = f"{sizes[table] / counts[table]:8.0f} B a row" if counts[table] else ""
            print(f"  {table:<24} {counts[table]:>11,} rows {sizes[table] / 2**20:10.1f} MiB {per_row}")


READS = ("usage by namespace", "usage by namespace,model,day", "utilization", "node-hours", "FOCUS export", "accounts")
Measured = tuple[int | None, int | None, str]  # rows, bytes, a note


class Reader:
    """The reads of the window, as an admin makes them through the API (the capacity ledger's, as its views call
    them), with the clock a day after the window."""

    def __init__(self, url: str, tokens: Path, days: int):
        self.end = START + dt.timedelta(days=days)
        self.app = create_app(timekeeper_config(url, tokens), clock=BenchClock(self.end + dt.timedelta(days=1)))
        self.services: Services = self.app.extensions[SERVICES]
        self.client: FlaskClient = self.app.test_client()
        self.window = f"from={START.date()}&to={self.end.date()}"
        with self.services.database.read() as conn:
            self.node_hour_count = conn.execute(select(func.count()).select_from(node_hours).where(
                node_hours.c.hour >= START, node_hours.c.hour < self.end)).scalar_one()

    def close(self) -> None:
        self.services.reports.close()
        self.services.database.dispose()

    def get(self, path: str) -> tuple[int, bytes]:
        answer = self.client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        return answer.status_code, answer.get_data()

    def read(self, name: str) -> Measured:
        if name.startswith("usage by "):
            status, body = self.get(f"/api/v1/usage?{self.window}&groupBy={name.removeprefix('usage by ')}")
            if status != 200:
                return None, len(body), f"HTTP {status}: {json.loads(body).get('error', '')}"
            return len(json.loads(body)["items"]), len(body), ""
        if name == "FOCUS export":
            return self.focus()
        if name == "accounts":
            status, body = self.get(f"/api/v1/accounts?{self.window}")
            assert status == 200, body[:500]
            return len(json.loads(body)["items"]), len(body), ""
        ledger = CapacityLedger(self.services.database)
        if name == "utilization":
            assert ledger.utilization(START, self.end).cluster.capacity > 0
            return self.node_hour_count, None, ""
        assert name == "node-hours", name
        return len(ledger.node_hours(START, self.end)), None, ""

    def focus(self) -> Measured:
        answer = self.client.get(f"/api/v1/focus?{self.window}", headers={"Authorization": f"Bearer {TOKEN}"},
                                 buffered=False)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        size = lines = 0
        for chunk in answer.iter_encoded():  # streamed, as an admin downloads it: a month's file is large
            size += len(chunk)
            lines += chunk.count(b"\n")
        answer.close()
        return lines - 1, size, f"final: {answer.headers['X-Gpusharing-Export-Final']}"


def read_once(args: argparse.Namespace) -> int:
    """A read measured in this process (started by Bench.measure), its figures printed as the last line."""
    reader = Reader(args.url, Path(args.tokens), args.days)
    try:
        reader.get("/api/v1/prices")  # a first request: Flask's and the views' lazy set-up is no part of the read
        gc.collect()
        figure = Figure(args.read)
        with timed(figure):
            rows, size, note = reader.read(args.read)
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(reader.read, args.read)
            print(f"\nwhere {args.read}'s time goes (cProfile, one more run in the same process):")
            stats = pstats.Stats(profiler, stream=sys.stdout)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(30)
        print(json.dumps({"wall": figure.walls[0], "cpu": figure.cpus[0], "peak": figure.peaks[0], "rows": rows,
                          "size": size, "note": note}))
    finally:
        reader.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500, help="GPU nodes (default 500)")
    parser.add_argument("--namespaces", type=int, default=10_000, help="namespaces (default 10,000)")
    parser.add_argument("--days", type=int, default=30, help="days from 2026-11-01 (default 30: November)")
    parser.add_argument("--pods-per-node", type=int, default=4, help="pods on a node at any time (default 4)")
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL server on loopback instead of SQLite")
    parser.add_argument("--sample-hours", type=int, default=24,
                        help="hours billed through ReportLedger.observe, from the start (default 24; at least 1)")
    parser.add_argument("--billing-minutes", type=int, default=60,
                        help="the sample's passes apart (default 60; the controller's are 30 s apart)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the reads (default 2)")
    parser.add_argument("--profile", choices=READS, help="run one read once more under cProfile, and print where its "
                                                          "time went")
    parser.add_argument("--seed", type=int, default=40)
    for internal in ("--read", "--url", "--tokens"):  # a read in a process of its own (Bench.measure)
        parser.add_argument(internal, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read:
        return read_once(args)
    if args.sample_hours < 1 or 60 % args.billing_minutes and args.billing_minutes % 60:
        parser.error("--sample-hours must be at least 1, and --billing-minutes divide an hour or be whole hours")
    with tempfile.TemporaryDirectory(prefix="tk-chargeback-") as work, \
            bench_database("postgresql" if args.postgres else "sqlite", Path(work)) as url:
        tokens = Path(work) / "tokens"
        tokens.write_text(f"{TOKEN} admin bench\n")
        bench = Bench(url, args, tokens)
        try:
            bench.build()
        finally:
            bench.close()
        bench.measure(url, tokens)
        bench.report()
        bench.sizes(url)
        if args.profile:
            bench.run_read(args.profile, url, tokens, profile=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
