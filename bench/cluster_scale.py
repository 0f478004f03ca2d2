"""Scale figures: the timekeeper's and the webhook's memory, admission's p99 and a demotion's time, as namespaces and
GPU pods grow (10,000 namespaces and 50,000 GPU pods at the largest size).

For each size it starts a fresh timekeeper (SQLite, WAL; 2 workers), gives every namespace a budget and every pod
a report (pods spread over the namespaces), starts the webhook (2 workers, TLS) polling the timekeeper's listing
of them every second, and measures:

- each server's largest worker's resident memory once both hold everything;
- the listing the webhook polls (its size, and the time to read it);
- the webhook's p99 over AdmissionReviews at a fixed rate from 4 client processes (bench/webhook_load.py);
- the demotion of one namespace of `--demote` running pods: from the report that crosses its budget to the last
  eviction, through an HTTP-level fake of the Kubernetes API (demo/kubeapi.py) that grants each at once. It
  includes the wait for the webhook to hold the crossing (up to two of its polls).

Run by hand (about ten minutes on the 2-core development machine):

    .venv/bin/python bench/cluster_scale.py
    .venv/bin/python bench/cluster_scale.py --sizes 1000:5000 --demote 500     # one small size, quickly
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from webhook_load import run_phase  # noqa: E402

from demo.kubeapi import FakeKube  # noqa: E402
from demo.processes import COMMAND, Service, child_pids, free_port  # noqa: E402
from gpusharing.serving.certs import make_serving_certificate  # noqa: E402

ADMIN, METER = "bench-admin", "bench-meter"
DEMOTED = "demoted-team"


def rss_mib(server: Service) -> float:
    """The largest worker's resident memory."""
    sizes = []
    for pid in child_pids(server.process.pid):  # type: ignore[union-attr]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return max(sizes)


def load(url: str, namespaces: int, pods: int) -> None:
    """A budget for every namespace, one report for every pod (16 concurrent clients)."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))

    def budget(i: int) -> None:
        answer = session.put(f"{url}/api/v1/budgets/team-{i:05d}", json={"gpuMinutes": 1e6}, timeout=60,
                             headers={"Authorization": f"Bearer {ADMIN}"})
        assert answer.status_code in (200, 201), answer.text

    def report(i: int) -> None:
        body = {"podUid": f"pod-{i:06d}", "namespace": f"team-{i % namespaces:05d}", "pod": f"pod-{i:06d}", "gpuShare": 0.25,
                "seq": 1, "gpuSeconds": 30.0}
        answer = session.post(f"{url}/api/v1/reports", json=body, timeout=60, headers={"Authorization": f"Bearer {METER}"})
        assert answer.status_code == 200, answer.text

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(budget, range(namespaces)))
        list(pool.map(report, range(pods)))


def measure(namespaces: int, pods: int, demote: int, directory: Path) -> dict[str, float]:
    database = f"sqlite:///{directory / 'timekeeper.sqlite'}"
    subprocess.run([*COMMAND, "db", "upgrade"], env={**os.environ, "TIMEKEEPER_DATABASE_URL": database}, check=True, capture_output=True)
    tokens = directory / "tokens"
    tokens.write_text(f"{ADMIN} admin\n{METER} meter\n")
    kube = FakeKube()
    for i in range(demote):
        kube.add_pod(DEMOTED, f"train-{i:05d}")
    (directory / "kubeconfig").write_text(kube.kubeconfig())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    timekeeper = Service("timekeeper", ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(port)], f"{url}/readyz",
                         env={"TIMEKEEPER_DATABASE_URL": database, "TIMEKEEPER_AUTH": "static", "TIMEKEEPER_STATIC_TOKENS_FILE": str(tokens),
                              "TIMEKEEPER_KUBECONFIG": str(directory / "kubeconfig"), "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": "1"},
                         log_path=directory / "timekeeper.log")
    figures: dict[str, float] = {}
    with timekeeper:
        load(url, namespaces, pods)
        started = time.perf_counter()
        listing = requests.get(f"{url}/api/v1/budgets", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)
        figures["listing_s"], figures["listing_mib"] = time.perf_counter() - started, len(listing.content) / 2**20
        token = directory / "webhook-token"
        token.write_text(ADMIN)
        paths = make_serving_certificate(["127.0.0.1"]).write(directory / "tls")
        webhook_port = free_port()
        webhook = Service("webhook", ["webhook", "serve", "--host", "127.0.0.1", "--port", str(webhook_port), "--cert", str(paths["cert"]),
                                      "--key", str(paths["key"]), "--workers", "2", "--threads", "8"],
                          f"https://127.0.0.1:{webhook_port}/readyz", verify=str(paths["ca"]), log_path=directory / "webhook.log",
                          env={"GPUSHARING_TIMEKEEPER_URL": url, "GPUSHARING_TIMEKEEPER_TOKEN_FILE": str(token),
                               "GPUSHARING_BUDGET_REFRESH_SECONDS": "1"})
        with webhook:
            time.sleep(5)  # a few polls of the whole listing
            phase = run_phase(webhook_port, str(paths["ca"]), 4, 200, 10, None)
            figures["admission_p50_ms"], figures["admission_p99_ms"] = phase["p50_ms"], phase["p99_ms"]
            figures["webhook_mib"], figures["timekeeper_mib"] = rss_mib(webhook), rss_mib(timekeeper)

            requests.put(f"{url}/api/v1/budgets/{DEMOTED}", json={"gpuMinutes": 1, "evictOnExhaustion": True}, timeout=60,
                         headers={"Authorization": f"Bearer {ADMIN}"}).raise_for_status()
            started = time.perf_counter()
            crossing = {"podUid": "crossing", "namespace": DEMOTED, "pod": "crossing", "gpuShare": 1, "seq": 1, "gpuSeconds": 120}
            requests.post(f"{url}/api/v1/reports", json=crossing, headers={"Authorization": f"Bearer {METER}"}, timeout=60).raise_for_status()
            deadline = time.monotonic() + 1800  # only stops a broken run from hanging
            while len(kube.evicted) < demote and time.monotonic() < deadline:
                time.sleep(0.2)
            figures["demotion_s"], figures["evicted"] = time.perf_counter() - started, len(kube.evicted)
    kube.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000:5000,2500:12500,10000:50000", help="namespaces:GPU pods, comma-separated")
    parser.add_argument("--demote", type=int, default=5000, help="running pods of the namespace demoted")
    args = parser.parse_args()
    print(f"| namespaces | GPU pods | timekeeper RSS | webhook RSS | listing | admission p50 / p99 | demotion of {args.demote:,} pods |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes.split(","):
        namespaces, pods = (int(n) for n in size.split(":"))
        with tempfile.TemporaryDirectory() as directory:
            f = measure(namespaces, pods, args.demote, Path(directory))
        print(f"| {namespaces:,} | {pods:,} | {f['timekeeper_mib']:.0f} MiB | {f['webhook_mib']:.0f} MiB | "
              f"{f['listing_mib']:.1f} MiB in {f['listing_s']:.2f} s | {f['admission_p50_ms']:.1f} / {f['admission_p99_ms']:.1f} ms | "
              f"{f['demotion_s']:.1f} s ({f['evicted']:.0f} evicted) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
