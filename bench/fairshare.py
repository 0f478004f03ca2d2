"""The fair-share pass at 10,000 namespaces in a four-level hierarchy with a year of history, beside a baseline that
recomputes the decayed usage from the whole history, measured in the same run.

    python bench/fairshare.py                              # 10 x 10 x 10 x 10 namespaces, a year of hourly intervals
    python bench/fairshare.py --fanout 5 --hours 720       # 625 namespaces, a month: a quick look
    python bench/fairshare.py --converge                   # 1,000 GPUs shared by 50 teams with backlogs

--converge runs the cluster instead (testbed/fairshare_sim.py, in simulated time): teams of mixed weights, some of them
departments of several namespaces, each keeping a backlog of one-GPU pods larger than its share; the controller's
pass with the fair-share queue (its release, and the room it makes by eviction) and a scheduler that places released
pods. It prints each team's entitled share, what it received after the first half-life, and the evictions per hour
made for the queue, beside the yardstick of the same cluster with fair share off (first come, first served).

The hierarchy: `--fanout` divisions x departments x teams x namespaces, random weights. Each namespace has a base
rate (a fifth of them idle, the rest exponential around 4 GPUs) times a daily cycle, billed one interval an hour, as
the ledger would hand them over: first `--hours` hours of history folded into each namespace's (usage, as of), then
`--passes` passes, each one more hour. A pass is timed in three steps:
  fold     the pass's new intervals added to every namespace's decayed usage (DecayedUsage.plus)
  rank     the ShareNodes built and rank_fair_tree over every namespace
  bands    next_band for every namespace
and beside it, alternating pass by pass, the baseline: each namespace's decayed usage recomputed from its whole
history (every interval since the first), timed on `--baseline-sample` namespaces and scaled to all of them (the
whole of it would take minutes a pass); its result is checked against the incremental one. p50 and p99 over the
passes (with few passes, p99 is the slowest). Peak memory: tracemalloc over one more pass, apart from the timings
(tracing slows Python down), and the process's peak resident size. Beside the wall-clock times, the CPU time of the
pass and of the baseline: on a shared machine the wall clock counts the other processes' turns too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpusharing.units.duration import format_duration  # noqa: E402
from testbed.fairshare_sim import Group, Received, Settings, Simulation, Team  # noqa: E402
from timekeeper.fairshare.bands import BandState, FairShareBands, next_band  # noqa: E402
from timekeeper.fairshare.decay import DecayedUsage  # noqa: E402
from timekeeper.fairshare.queue import FairShareOrder, HeldPod, QueuedPod, make_room, mean_life, release  # noqa: E402
from timekeeper.fairshare.tree import NamespaceStanding, ShareNode, rank_fair_tree  # noqa: E402

START = dt.datetime(2027, 1, 1, tzinfo=dt.timezone.utc)
HOUR = dt.timedelta(hours=1)
BANDS = FairShareBands(
    ("gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy"),
    (0.8, 1.25),
    0.1,
    dt.timedelta(minutes=10),
)
QUEUED, HELD, ROOM = 20_000, 10_000, 1_000  # the queue's pass: pods waiting, GPUs held, GPUs just freed
# GPU-seconds of a GPU per hour of day
CYCLE = [3600.0 * (0.6 + 0.4 * math.sin(2 * math.pi * hour / 24)) for hour in range(24)]


class Cluster:
    """The hierarchy, each namespace's base rate, and its decayed usage so far."""

    def __init__(self, fanout: int, seed: int) -> None:
        rng = random.Random(seed)
        self.groups: list[ShareNode] = []
        self.namespaces: list[tuple[str, str, float]] = []  # name, team, weight
        self.rate: dict[str, float] = {}
        for d in range(fanout):
            division = f"div{d}"
            self.groups.append(ShareNode(division, None, rng.uniform(1, 10), 0.0, False))
            for p in range(fanout):
                department = f"{division}.dept{p}"
                self.groups.append(ShareNode(department, division, rng.uniform(1, 10), 0.0, False))
                for t in range(fanout):
                    team = f"{department}.team{t}"
                    self.groups.append(ShareNode(team, department, rng.uniform(1, 10), 0.0, False))
                    for n in range(fanout):
                        name = f"ns-{d}-{p}-{t}-{n}"
                        self.namespaces.append((name, team, rng.uniform(1, 10)))
                        self.rate[name] = 0.0 if rng.random() < 0.2 else rng.expovariate(1 / 4)
        self.usage = {name: DecayedUsage.zero(START) for name, _, _ in self.namespaces}
        self.states: dict[str, BandState] = {}

    def interval(self, name: str, hour: int) -> tuple[float, dt.datetime, dt.datetime]:
        return self.rate[name] * CYCLE[hour % 24], START + HOUR * hour, START + HOUR * (hour + 1)

    def fold(self, hours: range, half_life: dt.timedelta) -> None:
        """The intervals of `hours` added to every namespace's usage, hour by hour as passes would."""
        ends = [(START + HOUR * hour, START + HOUR * (hour + 1), hour % 24) for hour in hours]
        for name, usage in self.usage.items():
            rate = self.rate[name]
            for start, end, of_day in ends:
                usage = usage.plus(rate * CYCLE[of_day], start, end, half_life)
            self.usage[name] = usage

    def nodes(self) -> list[ShareNode]:
        return [*self.groups, *(ShareNode(name, team, weight, self.usage[name].gpu_seconds, True)
                                for name, team, weight in self.namespaces)]

    def rank(self) -> dict[str, NamespaceStanding]:
        return rank_fair_tree(self.nodes())

    def queue(self, now: dt.datetime, half_life: dt.timedelta) -> None:
        """The fair-share queue's pass: QUEUED pods waiting over the namespaces in use, HELD GPUs held, ROOM GPUs just
        freed: the waiting pods released into them, then room made by eviction for those past the grace."""
        busy = [name for name, _, _ in self.namespaces if self.rate[name] > 0]
        queued = [QueuedPod(busy[i % len(busy)], f"q-{i}", f"q-{i}", 1.0, True, now - dt.timedelta(minutes=i % 10))
                  for i in range(QUEUED)]
        held = [HeldPod(busy[i % len(busy)], f"h-{i}", f"h-{i}", 1.0, True, True) for i in range(HELD)]
        holding: dict[str, float] = {}
        for pod in held:
            holding[pod.namespace] = holding.get(pod.namespace, 0.0) + pod.gpus
        order = FairShareOrder(self.nodes(), holding, dict.fromkeys(self.rate, mean_life(half_life)))
        released = {pod.uid for pod in release(order, queued, ROOM, ROOM)}
        make_room(order, [p for p in queued if p.uid not in released], held, 0.0, HELD + ROOM, now,
                  dt.timedelta(minutes=5))

    def band(self, standings: dict[str, NamespaceStanding], now: dt.datetime) -> None:
        for name, standing in standings.items():
            self.states[name] = next_band(BANDS, self.states.get(name), standing, now)

    def recomputed(self, name: str, hours: int, half_life: dt.timedelta) -> DecayedUsage:
        """The baseline: the namespace's decayed usage from its whole history, every interval since the first."""
        usage = DecayedUsage.zero(START)
        for hour in range(hours):
            gpu_seconds, start, end = self.interval(name, hour)
            usage = usage.plus(gpu_seconds, start, end, half_life)
        return usage


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):9.1f} ms   p99 {p99:9.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--fanout",
        type=int,
        default=10,
        help="children per node at each of the four levels (default 10: 10,000 namespaces)",
    )
    parser.add_argument(
        "--hours", type=int, default=24 * 365, help="hours of history before the passes (default a year, 8,760)"
    )
    parser.add_argument(
        "--passes", type=int, default=24, help="passes timed, one hour of new intervals each (default 24)"
    )
    parser.add_argument(
        "--baseline-sample", type=int, default=20, help="namespaces the baseline recomputes each pass (default 20)"
    )
    parser.add_argument("--half-life-hours", type=float, default=24.0, help="the half-life (default 24)")
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument("--converge", action="store_true", help="simulate the cluster's shares instead (see above)")
    args = parser.parse_args()
    if args.converge:
        return converge(args.seed)
    half_life = dt.timedelta(hours=args.half_life_hours)
    cluster = Cluster(args.fanout, args.seed)
    count = len(cluster.namespaces)
    print(f"{count:,} namespaces under {len(cluster.groups):,} groups (4 levels), {args.hours:,} hours of history, "
          f"half-life {format_duration(half_life.total_seconds())}", flush=True)

    began = time.perf_counter()
    cluster.fold(range(args.hours), half_life)
    history = (time.perf_counter() - began) * 1000
    print(
        f"history folded: {count * args.hours:,} intervals in {history / 1000:.1f} s "
        f"({history * 1000 / (count * args.hours):.2f} us an interval)",
        flush=True,
    )

    sample = random.Random(args.seed).sample(
        [name for name, _, _ in cluster.namespaces], min(args.baseline_sample, count)
    )
    folds: list[float] = []
    ranks: list[float] = []
    bands: list[float] = []
    queues: list[float] = []
    passes: list[float] = []
    baselines: list[float] = []
    pass_cpu: list[float] = []
    baseline_cpus: list[float] = []
    worst_gap = 0.0
    for number in range(args.passes):
        hour = args.hours + number
        began, cpu = time.perf_counter(), time.process_time()
        cluster.fold(range(hour, hour + 1), half_life)
        folded = time.perf_counter()
        standings = cluster.rank()
        ranked = time.perf_counter()
        cluster.band(standings, START + HOUR * (hour + 1))
        banded = time.perf_counter()
        cluster.queue(START + HOUR * (hour + 1), half_life)
        queued, queued_cpu = time.perf_counter(), time.process_time()
        recomputed = {name: cluster.recomputed(name, hour + 1, half_life) for name in sample}
        baseline, baseline_cpu = time.perf_counter(), time.process_time()
        pass_cpu.append((queued_cpu - cpu) * 1000)
        baseline_cpus.append((baseline_cpu - queued_cpu) * 1000 * count / len(sample))
        folds.append((folded - began) * 1000)
        ranks.append((ranked - folded) * 1000)
        bands.append((banded - ranked) * 1000)
        queues.append((queued - banded) * 1000)
        passes.append((queued - began) * 1000)
        baselines.append((baseline - queued) * 1000 * count / len(sample))
        for name, usage in recomputed.items():
            incremental = cluster.usage[name]
            assert usage.as_of == incremental.as_of
            worst_gap = max(
                worst_gap, abs(usage.gpu_seconds - incremental.gpu_seconds) / max(usage.gpu_seconds, 1e-300)
            )

    print(f"\n{args.passes} passes over {count:,} namespaces:")
    print(f"  fold a pass's new intervals   {percentiles(folds)}   ({count:,} intervals)")
    print(f"  rank_fair_tree                {percentiles(ranks)}")
    print(f"  next_band over all            {percentiles(bands)}")
    print(f"  the queue                     {percentiles(queues)}   ({QUEUED:,} pods waiting, {ROOM:,} GPUs "
          f"free, {HELD:,} held: released, then room made past the grace)")
    print(f"  the whole pass                {percentiles(passes)}")
    print(f"    its CPU time                {percentiles(pass_cpu)}")
    print(f"  baseline: usage recomputed from the whole history, scaled from {len(sample)} namespaces:")
    print(
        f"                                {percentiles(baselines)}   "
        f"({count * (args.hours + args.passes // 2):,} intervals a pass)"
    )
    print(f"    its CPU time                {percentiles(baseline_cpus)}")
    print(
        f"  the pass is {statistics.median(baselines) / statistics.median(passes):,.0f}x faster than the baseline "
        "(p50); "
        f"incremental and recomputed usage agree to {worst_gap:.1e} (relative)"
    )

    tracemalloc.start()
    hour = args.hours + args.passes
    cluster.fold(range(hour, hour + 1), half_life)
    cluster.band(cluster.rank(), START + HOUR * (hour + 1))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    counts = [0] * len(BANDS.classes)
    for state in cluster.states.values():
        counts[state.band] += 1
    print(
        f"\npeak memory of a pass (tracemalloc): {peak / 2**20:.1f} MiB; "
        f"process peak resident: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    print("bands: " + ", ".join(f"{name} {n:,}" for name, n in zip(BANDS.classes, counts)))
    return 0



def converge(seed: int, gpus: int = 1_000, teams: int = 50, hours: float = 6.0) -> int:
    """Each team's received share against its entitlement on a simulated cluster (docs/fair-share.md, Convergence)."""
    rng = random.Random(seed)
    weights = [rng.choice([1, 1, 2, 3, 5, 8]) for _ in range(teams)]
    groups: list[Group] = []
    members: list[Team] = []
    for number, weight in enumerate(weights):
        share_gpus = gpus * weight / sum(weights)
        minutes = rng.uniform(5, 30)
        if number % 5 == 0:  # a department of two to four namespaces, each with a backlog of its own
            name = f"dept{number}"
            groups.append(Group(name, weight))
            count = rng.randint(2, 4)
            backlog = int(2 * share_gpus / count) + 2
            members += [Team(f"{name}.ns{i}", 1.0, backlog, minutes * 60, name) for i in range(count)]
        else:
            members.append(Team(f"team{number}", weight, int(2 * share_gpus) + 2, minutes * 60))
    half_life = dt.timedelta(hours=1)
    settings = Settings(half_life, 30.0, dt.timedelta(minutes=5), dt.timedelta(minutes=10))
    seconds, window = hours * 3600, half_life.total_seconds()
    print(f"{gpus:,} GPUs, {teams} teams ({len(groups)} of them departments of 2-4 namespaces, {len(members)} "
          f"namespaces), each with a backlog of twice its share, pods of 5-30 min; {hours:g} h simulated, half-life "
          f"{format_duration(window)}, shares counted after the first half-life", flush=True)
    began = time.process_time()
    on = Simulation(gpus, groups, members, settings, seed).run(seconds, window)
    cpu = time.process_time() - began
    off = Simulation(gpus, groups, members, settings, seed, fair_share=False).run(seconds, window)
    print(f"\n{'team':<10} {'entitled':>9} {'fair share on':>14} {'off (FCFS)':>11}")
    for name, entitled in sorted(_by_team(on.entitled).items(), key=lambda item: -item[1]):
        with_it, without = _off_by(on, name, entitled), _off_by(off, name, entitled)
        print(f"{name:<10} {entitled:9.2%} {with_it:>+14.1%} {without:>+11.1%}")
    for label, run in (("fair share on", on), ("off (FCFS)", off)):
        errors = sorted(abs(_off_by(run, name, e)) for name, e in _by_team(run.entitled).items())
        print(f"{label:<14} teams within 10 % of their share: {sum(e <= 0.10 for e in errors)} of {len(errors)}; "
              f"median {statistics.median(errors):.1%}, worst {errors[-1]:.1%}; "
              f"{run.evictions / hours:.1f} evictions an hour")
    print(f"\nsimulated {hours:g} h in {cpu:.1f} s of CPU")
    return 0


def _by_team(by_namespace: dict[str, float]) -> dict[str, float]:
    """Namespaces of a department summed under the department's name."""
    teams: dict[str, float] = {}
    for name, value in by_namespace.items():
        team = name.split(".")[0]
        teams[team] = teams.get(team, 0.0) + value
    return teams


def _off_by(run: Received, team: str, entitled: float) -> float:
    received = _by_team({name: run.share(name) for name in run.entitled})
    return received.get(team, 0.0) / entitled - 1.0


if __name__ == "__main__":
    sys.exit(main())
