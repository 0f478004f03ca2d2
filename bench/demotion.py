"""A namespace's demotion against the stand-in Kubernetes API (demo/kubeapi.py): how long from the report that
crosses its budget to the last of its running pods evicted, with evictions `--concurrency` at a time beside one at a
time (TIMEKEEPER_EVICTION_CONCURRENCY=1), in alternation, in one run.

Each round starts a fresh database and stand-in API serving `--pods` running GPU pods of one namespace, a
`gpusharing timekeeper serve` (its REST API: the budget, the crossing's report) and one `gpusharing timekeeper
controller` (its budgets task every second); no webhook runs, so no acknowledgement is waited for. `--latency` adds
that many seconds to each eviction at the stand-in API (the API server's own work; 0: the stand-in's alone). The
real control plane's figure is tests/cluster/test_mass_demotion.py's: `--cluster` runs it at each concurrency, and
beside them its baseline, the same pods evicted by a plain client `--concurrency` at a time with no crossing and no
controller (GPUSHARING_DEMOTION_BASELINE=client): the control plane's own time for those evictions and replacements,
which no controller here can beat.

    .venv/bin/python bench/demotion.py                          # 5,000 pods, 16 at a time beside 1
    .venv/bin/python bench/demotion.py --pods 1000 --latency 0.05 --rounds 2
    KUBEBUILDER_ASSETS=$(...) .venv/bin/python bench/demotion.py --cluster   # the cluster tier's 500, 16 beside 1
    KUBEBUILDER_ASSETS=$(...) .venv/bin/python bench/demotion.py --cluster --skip-one --rounds 2  # the ratio alone
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_scale import PODS_CACHED, Layout, _demote, metric, scrape, serve_pods  # noqa: E402

from demo.kubeapi import FakeKube  # noqa: E402


def fake_round(pods: int, concurrency: int, latency: float, directory: Path) -> dict[str, float]:
    kube = FakeKube()
    figures: dict[str, object] = {}
    try:
        serve_pods(kube, 1, 0, pods)
        kube.eviction_seconds = latency
        layout = Layout(f"concurrency {concurrency}", directory, kube, None)
        layout.env["TIMEKEEPER_EVICTION_CONCURRENCY"] = str(concurrency)
        with layout.timekeeper(), layout.controller(0) as controller:
            deadline = time.monotonic() + 120
            while metric(scrape(controller), PODS_CACHED) < pods and time.monotonic() < deadline:
                time.sleep(0.2)
            _demote(layout, pods, figures)
    finally:
        kube.close()
    seconds, evicted = float(figures["demotion_s"]), float(figures["evicted"])  # type: ignore[arg-type]
    return {"seconds": seconds, "evicted": evicted, "per_second": evicted / seconds, "peak": kube.evictions_peak}


def cluster_round(concurrency: int, baseline: bool = False) -> list[str]:
    """tests/cluster/test_mass_demotion.py at `concurrency` (`baseline`: its evictions by a plain client): the lines it
    prints (the demotion, the admission beside it)."""
    env = {**os.environ, "GPUSHARING_EVICTION_CONCURRENCY": str(concurrency),
           "GPUSHARING_DEMOTION_BASELINE": "client" if baseline else ""}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "tests/cluster/test_mass_demotion.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [line for line in re.findall(r"^mass demotion: (.*)$", run.stdout, re.M) if line]
    if run.returncode == 0 and lines:
        return lines
    return [*lines, f"failed (exit {run.returncode}): {(run.stdout + run.stderr).strip()[-600:]}"]


def replaced_after(lines: list[str]) -> float | None:
    """The seconds from the crossing (or the baseline's first eviction) to every replacement running."""
    found = re.search(r"every replacement running after ([0-9.]+) s", " ".join(lines))
    return float(found[1]) if found else None


def cluster_rounds(rounds: int, concurrency: int, one_at_a_time: bool) -> None:
    """Each round: the plain client's baseline, then the controller evicting one at a time and `concurrency` at a
    time; the ratio of the latter to the baseline (issue 42's target: at most 1.25)."""
    for round_number in range(1, rounds + 1):
        baseline = cluster_round(concurrency, baseline=True)
        print(f"round {round_number}, baseline {concurrency:>3}: " + "\n    ".join(baseline), flush=True)
        for each in (1, concurrency) if one_at_a_time else (concurrency,):
            ours = cluster_round(each)
            print(f"round {round_number}, concurrency {each:>3}: " + "\n    ".join(ours), flush=True)
        took, floor = replaced_after(ours), replaced_after(baseline)
        if took is not None and floor:
            print(f"round {round_number}: the demotion at {concurrency} took {took / floor:.2f}x the plain client's "
                  f"time ({took:.1f} s against {floor:.1f} s; target at most 1.25x)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=5000, help="running pods of the namespace demoted (stand-in API)")
    parser.add_argument("--concurrency", type=int, default=16, help="TIMEKEEPER_EVICTION_CONCURRENCY measured beside 1")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the stand-in API adds to each eviction")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each, alternating (default 1)")
    parser.add_argument("--cluster", action="store_true", help="the cluster tier's test instead (KUBEBUILDER_ASSETS)")
    parser.add_argument("--skip-one", action="store_true",
                        help="--cluster: only the baseline and --concurrency, not one at a time (minutes shorter)")
    args = parser.parse_args()
    if args.cluster:
        cluster_rounds(args.rounds, args.concurrency, not args.skip_one)
        return 0
    for round_number in range(1, args.rounds + 1):
        for concurrency in (1, args.concurrency):
            with tempfile.TemporaryDirectory(prefix="gpusharing-demotion-") as directory:
                f = fake_round(args.pods, concurrency, args.latency, Path(directory))
            print(
                f"round {round_number}, concurrency {concurrency:>3}: "
                f"{f['evicted']:,.0f} of {args.pods:,} pods evicted in {f['seconds']:.1f} s from the crossing "
                f"({f['per_second']:.0f}/s; at most {f['peak']:.0f} in flight)",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
