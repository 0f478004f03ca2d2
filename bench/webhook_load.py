"""Load benchmark of the webhook: AdmissionReviews over keep-alive HTTPS, at a fixed rate and at the maximum.

Starts `gpusharing webhook serve` on loopback with a fresh certificate, then drives it from client processes
(one persistent TLS connection each) and prints reviews/s, p50 and p99. Run by hand:

    .venv/bin/python bench/webhook_load.py                  # 500/s for 10 s, then the maximum for 10 s
    .venv/bin/python bench/webhook_load.py --rate 1000 --duration 20 --workers 2 --clients 3
    .venv/bin/python bench/webhook_load.py --safe           # every pod under safe admission, with a deadline

With --safe, a stand-in for the timekeeper (on loopback) puts the pods' namespace under safe admission with room for
all of them, and every pod has a deadline: each review reserves its pod's commitment with the stand-in, over HTTP,
as it would with the timekeeper (whose own cost, a database transaction, bench/reservations.py measures).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import ssl
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from demo.apiserver import admission_review, example_manifests, example_pod
from demo.processes import Service, free_port
from gpusharing.serving.certs import make_serving_certificate

NAMESPACE = "ml-team"  # the example pods'


def review_bodies(deadline: int | None = None) -> list[bytes]:
    pods = [example_pod(name) for name in sorted(example_manifests())]
    if deadline is not None:
        for pod in pods:
            pod["spec"]["activeDeadlineSeconds"] = deadline
    return [json.dumps(admission_review(pod)).encode() for pod in pods]


def safe_timekeeper() -> ThreadingHTTPServer:
    """The timekeeper's `GET /api/v1/budgets` as it reads for a namespace under safe admission, and its
    `POST /api/v1/reservations` granting every reservation (ample room), over keep-alive connections."""
    uncommitted = {"microGpuSeconds": 10**18, "gpuMinutes": 10**18 / 6e7, "budget": NAMESPACE, "remainingGpuMinutes": 10**18 / 6e7,
                   "committedGpuMinutes": 0.0, "reservedGpuMinutes": 0.0}
    listing = json.dumps({"items": [{"namespace": NAMESPACE, "state": "in-budget", "admission": "safe", "onShortfall": "demote",
                                     "committedGpuMinutes": 0.0, "uncommitted": uncommitted}]}).encode()
    granted = json.dumps({"granted": True, "uncommitted": uncommitted}).encode()

    class Timekeeper(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # its headers and body are two writes: no 40 ms wait for the client's ACK

        def do_GET(self) -> None:  # noqa: N802
            self._answer(listing)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self._answer(granted)

        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Timekeeper)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def client(port: int, ca_file: str, rate: float | None, duration: float, start_at: float, results: Any, deadline: int | None) -> None:
    """One connection; `rate` reviews/s on a fixed schedule, or as fast as answers come when rate is None."""
    context = ssl.create_default_context(cafile=ca_file)
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)
    bodies = review_bodies(deadline)
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    errors = 0
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) - began < duration:
        if rate is not None:
            due = began + sent / rate
            if due > now:
                time.sleep(due - now)
        body = bodies[sent % len(bodies)]
        t0 = time.perf_counter()
        try:
            connection.request("POST", "/mutate", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                errors += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            connection.close()
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)
        latencies.append(time.perf_counter() - t0)
        sent += 1
    results.put((latencies, errors, time.perf_counter() - began))


def run_phase(port: int, ca_file: str, clients: int, rate: float | None, duration: float, deadline: int | None) -> dict[str, float]:
    results: multiprocessing.Queue = multiprocessing.Queue()
    start_at = time.time() + 0.5
    per_client = rate / clients if rate else None
    processes = [
        multiprocessing.Process(target=client, args=(port, ca_file, per_client, duration, start_at, results, deadline))
        for _ in range(clients)
    ]
    for process in processes:
        process.start()
    collected = [results.get() for _ in processes]
    for process in processes:
        process.join()
    latencies = sorted(latency for lat, _, _ in collected for latency in lat)
    elapsed = max(e for _, _, e in collected)
    return {
        "reviews": len(latencies),
        "errors": sum(err for _, err, _ in collected),
        "reviews_per_s": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


def safe_verdicts(port: int, ca_file: str) -> str:
    """Safe admission's verdicts, as the webhook counted them (all workers together)."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca_file))
    connection.request("GET", "/metrics")
    lines = connection.getresponse().read().decode().splitlines()
    counted = [line.split("{", 1)[1].replace('"}', "").replace('verdict="', "") for line in lines
               if line.startswith("gpusharing_webhook_safe_admissions_total{")]
    return ", ".join(counted) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500, help="fixed rate of the first phase, reviews/s")
    parser.add_argument("--duration", type=float, default=10, help="seconds per phase")
    parser.add_argument("--clients", type=int, default=4, help="client processes, one keep-alive connection each")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--safe", action="store_true", help="every pod under safe admission, with a deadline")
    args = parser.parse_args()
    stand_in = safe_timekeeper() if args.safe else None
    deadline = 3600 if args.safe else None

    with tempfile.TemporaryDirectory() as directory:
        paths = make_serving_certificate(["127.0.0.1", "localhost"]).write(Path(directory))
        port = free_port()
        server = Service(
            "webhook",
            ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(paths["cert"]),
             "--key", str(paths["key"]), "--workers", str(args.workers), "--threads", str(args.threads)],
            f"https://127.0.0.1:{port}/readyz",
            env={"GPUSHARING_TIMEKEEPER_URL": f"http://127.0.0.1:{stand_in.server_port}" if stand_in else ""},
            verify=str(paths["ca"]),
        )
        with server:
            print(f"webhook: {args.workers} gunicorn gthread workers x {args.threads} threads, TLS, keep-alive; "
                  f"{args.clients} client processes; {os.cpu_count()} CPUs shared by server and clients"
                  + ("; safe admission: every review reserves" if args.safe else ""))
            run_phase(port, str(paths["ca"]), args.clients, None, 2, deadline)  # warm-up
            for label, rate in ((f"fixed {args.rate:g}/s", args.rate), ("maximum", None)):
                figures = run_phase(port, str(paths["ca"]), args.clients, rate, args.duration, deadline)
                print(f"{label:>14}: {figures['reviews_per_s']:8.0f} reviews/s  p50 {figures['p50_ms']:6.2f} ms  "
                      f"p99 {figures['p99_ms']:6.2f} ms  ({figures['reviews']} reviews, {figures['errors']} errors)")
            if args.safe:
                print(f"{'verdicts':>14}: {safe_verdicts(port, str(paths['ca']))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
