"""Resident memory of the webhook's workers under large and hostile bodies: does it level off?

Starts `gpusharing webhook serve` on loopback (TLS, the default 2 workers x 8 threads), then sends rounds of
bodies from concurrent clients — a 1.4 MiB pod (a pod's size limit once stored), 2.9 MiB of tiny JSON objects
(the most Python objects a body the webhook reads can make), 1,000-container pods, 100,000-deep nesting and
10 MiB bodies (refused, 413) — and prints each worker's resident memory (VmRSS) after every round. Run by hand:

    .venv/bin/python bench/webhook_memory.py                     # 30 rounds
    .venv/bin/python bench/webhook_memory.py --rounds 100 --clients 8
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demo/: the repository's, never installed

from demo.apiserver import admission_review, api_server_pod, example_pod  # noqa: E402
from demo.processes import Service, child_pids, free_port  # noqa: E402
from gpusharing.serving.certs import make_serving_certificate  # noqa: E402

MIB = 1024 * 1024


def bodies() -> dict[str, bytes]:
    """The kinds of body sent in every round, by name."""
    large = example_pod("hami-fraction.yaml")
    large["metadata"].setdefault("annotations", {})["example.com/blob"] = "x" * (1400 * 1024)
    tiny = example_pod("kai-fraction.yaml")
    tiny["metadata"]["tiny"] = [{} for _ in range((2900 * 1024) // 3)]
    containers = [
        {"name": f"c{i}", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1e999999"}}} for i in range(1000)
    ]
    many = api_server_pod({"metadata": {"name": "many"}, "spec": {"containers": containers}})
    return {
        "1.4 MiB pod": json.dumps(admission_review(large)).encode(),
        "2.9 MiB of {}": json.dumps(admission_review(tiny), separators=(",", ":")).encode(),
        "1,000 containers": json.dumps(admission_review(many)).encode(),
        "100,000 deep": b"[" * 100_000 + b"]" * 100_000,
        "10 MiB": b'{"padding": "' + b"x" * (10 * MIB) + b'"}',
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def send_round(url: str, ca: str, kinds: dict[str, bytes], clients: int, statuses: dict[str, set[int]]) -> None:
    """Every client sends every kind once, all clients at the same time."""

    def client() -> None:
        session = requests.Session()
        session.trust_env = False
        for name, body in kinds.items():
            try:
                answer = session.post(
                    f"{url}/mutate", data=body, headers={"Content-Type": "application/json"}, verify=ca, timeout=60
                )
                statuses[name].add(answer.status_code)
            except requests.RequestException as exc:  # the server may close a connection it did not read to the end
                statuses[name].add(type(exc).__name__)  # type: ignore[arg-type]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--clients", type=int, default=8, help="concurrent clients, each sending every kind of body per round"
    )
    args = parser.parse_args()
    kinds = bodies()
    statuses: dict[str, set[Any]] = {name: set() for name in kinds}
    with tempfile.TemporaryDirectory() as directory:
        paths = make_serving_certificate(["127.0.0.1", "localhost"]).write(Path(directory))
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        server = Service(
            "webhook-memory",
            [
                "webhook",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--cert",
                str(paths["cert"]),
                "--key",
                str(paths["key"]),
            ],
            f"{url}/readyz",
            env={"GPUSHARING_TIMEKEEPER_URL": ""},
            verify=str(paths["ca"]),
        )
        with server:
            assert server.process is not None
            pids = child_pids(server.process.pid)
            print(f"webhook: workers {pids}; {args.clients} clients send each body once per round: "
                  + ", ".join(f"{name} ({len(body) / MIB:.1f} MiB)" for name, body in kinds.items()))
            print("round  " + "  ".join(f"worker {pid} RSS" for pid in pids))
            print("start  " + "  ".join(f"{rss_mib(pid):10.1f} MiB" for pid in pids))
            for number in range(1, args.rounds + 1):
                send_round(url, str(paths["ca"]), kinds, args.clients, statuses)
                print(f"{number:5}  " + "  ".join(f"{rss_mib(pid):10.1f} MiB" for pid in pids), flush=True)
            still = child_pids(server.process.pid)
    print("answers: " + "; ".join(f"{name}: {sorted(map(str, codes))}" for name, codes in statuses.items()))
    print("the same workers throughout (none restarted)" if still == pids else f"workers changed: {pids} -> {still}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
