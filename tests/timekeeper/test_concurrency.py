"""Two timekeeper processes with several gunicorn workers each on one PostgreSQL account exactly.

Thousands of reports, every one sent twice and all shuffled, from many threads to both processes: each pod's
ledger ends at its true cumulative, each namespace is charged the sum of its pods' truths, and the charges the
answers announce add up to exactly that (nothing counted twice, nothing lost).
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from pathlib import Path

import requests

from testbed.postgres import PostgresServer
from testbed.timekeeper_processes import TimekeeperProcess
from tests.timekeeper.conftest import ADMIN, METER
from timekeeper.database.schema import upgrade

NAMESPACES = 5
PODS_PER_NAMESPACE = 8
REPORTS_PER_POD = 30
THREADS = 16


def reports_counted(exposition: str) -> int:
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in exposition.splitlines()
        if line.startswith("gpusharing_timekeeper_reports_total{")
    )


def test_concurrent_duplicated_reordered_reports_are_accounted_exactly_once(
    postgres: PostgresServer, tokens_file: str, tmp_path: Path
) -> None:
    url = postgres.create_database("timekeeper_concurrency")
    upgrade(url)
    rng = random.Random(42)
    truth: dict[str, int] = defaultdict(int)  # namespace -> micro-GPU-seconds
    pod_truth: dict[str, float] = {}
    reports = []
    for n in range(NAMESPACES):
        namespace = f"team-{n}"
        for p in range(PODS_PER_NAMESPACE):
            uid, cumulative = f"uid-{n}-{p}", 0.0
            for seq in range(1, REPORTS_PER_POD + 1):
                cumulative += rng.randint(1, 600) * 0.25  # whole quarter-seconds: exact in floating point
                reports.append({"podUid": uid, "namespace": namespace, "pod": f"pod-{p}", "gpuShare": 0.25, "seq": seq,
                                "gpuSeconds": cumulative, "final": seq == REPORTS_PER_POD})
            pod_truth[uid] = cumulative
            truth[namespace] += round(cumulative * 1_000_000)
    stream = reports * 2
    rng.shuffle(stream)

    charged: list[float] = []
    failures: list[str] = []
    with (
        TimekeeperProcess(url, tokens_file, tmp_path / "a.log") as first,
        TimekeeperProcess(url, tokens_file, tmp_path / "b.log") as second,
    ):
        def send(chunk: list[dict[str, object]]) -> None:
            sessions = [requests.Session(), requests.Session()]
            for i, body in enumerate(chunk):
                target = (first, second)[i % 2]
                answer = sessions[i % 2].post(f"{target.url}/api/v1/reports", json=body,
                                              headers={"Authorization": f"Bearer {METER}"}, timeout=30)
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code} {answer.text}")
                else:
                    charged.append(answer.json()["chargedGpuSeconds"])

        threads = [threading.Thread(target=send, args=(stream[i::THREADS],)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        headers = {"Authorization": f"Bearer {ADMIN}"}
        statuses = {
            s["namespace"]: s
            for s in requests.get(f"{second.url}/api/v1/budgets", headers=headers, timeout=10).json()["items"]
        }
        pods = requests.get(f"{first.url}/api/v1/pods?limit=1000", headers=headers, timeout=10).json()["items"]
        usage = requests.get(f"{first.url}/api/v1/usage?from=2020-01-01&to=2030-01-01&groupBy=pod", headers=headers,
                             timeout=10).json()["items"]  # these processes run on the real clock
        # Each process's /metrics merges its workers' counters: together they counted every report once.
        counted = sum(reports_counted(requests.get(f"{tk.url}/metrics", timeout=10).text) for tk in (first, second))

    assert len(charged) == len(stream) == counted
    assert round(sum(charged) * 1_000_000) == sum(truth.values())
    assert {p["podUid"]: p["gpuSeconds"] for p in pods} == pod_truth
    assert {p["podUid"]: p["gpuSeconds"] for p in usage} == pod_truth  # each pod's daily rows, charged exactly once too
    assert all(p["seq"] == REPORTS_PER_POD and p["final"] for p in pods)
    for namespace, micro in truth.items():
        assert abs(statuses[namespace]["usedGpuMinutes"] - micro / 60_000_000) < 1e-6
