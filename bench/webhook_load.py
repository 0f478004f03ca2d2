"""Load benchmark of the webhook beside its stack's ceiling: AdmissionReviews over keep-alive HTTPS, at a fixed rate
and at the maximum, the maximum side by side with a Flask app that returns a fixed answer.

Starts `gpusharing webhook serve` on loopback with a fresh certificate, and the fixed-answer app (the webhook's own
answer to the first review, returned as it is to every request) through the same gpusharing/serving/server.py, with
the same gunicorn settings, TLS and malloc settings. Drives each server at a fixed rate from client processes (one
persistent TLS connection each), then each in turn (alternating, `--rounds` times) at the maximum, with those
Python clients and with wrk (C; `apt-get install wrk`; skipped, with a line saying so, when it is not on the PATH),
and prints reviews/s, p50, p99, the CPU each server's processes spent per review (steadier than reviews/s, which
moves with how the keep-alive connections fell on the workers) and the webhook's share of the fixed app's
reviews/s and CPU per review; both servers' CPU per review at the fixed rate too, where they serve the same
throughput. Then, in this process with no HTTP and no TLS, each app's own CPU time per review
(called as gunicorn calls it, one thread; the least of several rounds, as other work on the machine slows some), the
webhook's steps apart (the body read within bounds, the review parsed, `admit`, the answer written), and the time to
parse a review and write an answer of the webhook's size with `json` (what any webhook in Python does at the least),
beside the most server CPU per review the webhook could add to the fixed app's and still serve 0.9 of its reviews/s
where the servers' CPU is what runs out. With --profile DIR, one more run of each server under py-spy (`pip install
py-spy`): each worker's time holding the GIL per review, by part (gunicorn's, Flask's, each of the webhook's steps).
Run by hand:

    .venv/bin/python bench/webhook_load.py                  # 500/s for 10 s, then the maximum, 2 rounds of 10 s
    .venv/bin/python bench/webhook_load.py --rate 1000 --duration 20 --workers 2 --clients 3
    .venv/bin/python bench/webhook_load.py --safe           # every pod under safe admission, with a deadline
    .venv/bin/python bench/webhook_load.py --rounds 4 --profile /tmp/webhook-profiles

With --safe, a stand-in for the timekeeper (on loopback) puts the pods' namespace under safe admission with room for
all of them, and every pod has a deadline: each review reserves its pod's commitment with the stand-in, over HTTP,
as it would with the timekeeper (whose own cost, a database transaction, bench/reservations.py measures).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import io
import json
import multiprocessing
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import ceiling  # bench/, this script's directory
from flask import Flask

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # demo/: the repository's, never installed

from profiling import print_profiles, profiled_run, py_spy  # noqa: E402  (bench/)

from demo.apiserver import admission_review, example_manifests, example_pod  # noqa: E402
from demo.processes import Service, free_port, tree_cpu_seconds  # noqa: E402
from gpusharing.serving.certs import make_serving_certificate  # noqa: E402
from gpusharing.serving.server import GC_THRESHOLDS, ServerOptions, serve  # noqa: E402

NAMESPACE = "ml-team"  # the example pods'
FIXED_ANSWER = "BENCH_FIXED_ANSWER_FILE"  # the fixed-answer app's answer, a file's bytes
WRK_SCRIPT = Path(__file__).with_name("webhook_reviews.lua")


def review_bodies(deadline: int | None = None) -> list[bytes]:
    pods = [example_pod(name) for name in sorted(example_manifests())]
    if deadline is not None:
        for pod in pods:
            pod["spec"]["activeDeadlineSeconds"] = deadline
    return [json.dumps(admission_review(pod)).encode() for pod in pods]


def safe_timekeeper() -> ThreadingHTTPServer:
    """The timekeeper's `GET /api/v1/budgets` as it reads for a namespace under safe admission, and its
    `POST /api/v1/reservations` granting every reservation (ample room), over keep-alive connections."""
    uncommitted = {
        "microGpuSeconds": 10**18,
        "gpuMinutes": 10**18 / 6e7,
        "budget": NAMESPACE,
        "remainingGpuMinutes": 10**18 / 6e7,
        "committedGpuMinutes": 0.0,
        "reservedGpuMinutes": 0.0,
    }
    listing = json.dumps(
        {
            "items": [
                {
                    "namespace": NAMESPACE,
                    "state": "in-budget",
                    "admission": "safe",
                    "onShortfall": "demote",
                    "committedGpuMinutes": 0.0,
                    "uncommitted": uncommitted,
                }
            ]
        }
    ).encode()
    granted = json.dumps({"granted": True, "uncommitted": uncommitted}).encode()

    class Timekeeper(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # its headers and body are two writes: no 40 ms wait for the client's ACK

        def do_GET(self) -> None:
            self._answer(listing)

        def do_POST(self) -> None:
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


def fixed_answer_app() -> Flask:
    """The stack's ceiling: reads each review and returns the same answer, read once at start."""
    return ceiling.fixed_answer_app("/mutate", Path(os.environ[FIXED_ANSWER]).read_bytes())


def serve_fixed_answer(port: int, cert: str, key: str, workers: int, threads: int) -> None:
    """The fixed-answer app through the webhook's serving path: gpusharing.serving.server, the webhook's options."""
    from webhook.cli import MALLOC_ARENAS

    serve("webhook_load:fixed_answer_app", ServerOptions(host="127.0.0.1", port=port, workers=workers, threads=threads,
                                                         certfile=cert, keyfile=key, malloc_arenas=MALLOC_ARENAS))


def client(
    port: int, ca_file: str, rate: float | None, duration: float, start_at: float, results: Any, deadline: int | None
) -> None:
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


def run_phase(
    port: int, ca_file: str, clients: int, rate: float | None, duration: float, deadline: int | None
) -> dict[str, float]:
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


def run_wrk(port: int, bodies_file: str, connections: int, duration: float) -> dict[str, float]:
    """The maximum driven by wrk (one thread, `connections` keep-alive TLS connections), the bodies round-robin."""
    output = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration:g}s",
            "-s",
            str(WRK_SCRIPT),
            f"https://127.0.0.1:{port}",
            "--",
            bodies_file,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    reviews, errors, elapsed, p50, p99 = next(
        line.split()[1:] for line in output.splitlines() if line.startswith("WRK ")
    )
    return {"reviews": int(reviews), "errors": int(errors), "reviews_per_s": int(reviews) / float(elapsed),
            "p50_ms": float(p50), "p99_ms": float(p99)}


def first_answer(port: int, ca_file: str, body: bytes) -> bytes:
    """The webhook's answer to `body`, as it is sent."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=ca_file))
    connection.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
    answer = connection.getresponse()
    assert answer.status == 200, answer.status
    return answer.read()


def per_review_us(call: Any, items: list[Any], rounds: int = 10, seconds: float = 0.2) -> float:
    """This thread's CPU microseconds per call of `call(item)`, the items in turn: the least of `rounds` rounds of about
    `seconds` each, after a warm-up pass. CPU time, and the least of several: other work on the shared cores stretches
    a wall clock's figures by half or more, and slows a round now and then."""
    for item in items:
        call(item)
    least = float("inf")
    for _ in range(rounds):
        calls, started = 0, time.thread_time()
        while time.thread_time() - started < seconds:
            for item in items:
                call(item)
            calls += len(items)
        least = min(least, (time.thread_time() - started) / calls * 1e6)
    return least


def wsgi_post(app: Any, path: str) -> Any:
    """A call of `app` with a body, as gunicorn makes it: a WSGI environ of a POST (no HTTP, no TLS)."""

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        pass

    def post(body: bytes) -> bytes:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8443", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1",
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
            "wsgi.input_terminated": True, "wsgi.url_scheme": "https", "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0), "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
        }
        answer = app(environ, start_response)
        try:
            return b"".join(answer)
        finally:
            if hasattr(answer, "close"):
                answer.close()

    return post


def in_process_costs(bodies: list[bytes], answer_file: Path) -> dict[str, float]:
    """Each app's own CPU time per review in this process (called as gunicorn calls it, with no HTTP and no TLS), the
    webhook's parts (the body read within bounds, the review parsed, `admit`, the answer written), and json's floor:
    a review parsed and an answer of the webhook's size written."""
    from gpusharing.serving.jsonbody import read_json
    from webhook.admission.policy import admit
    from webhook.admission.review import encoded_response, parse_review
    from webhook.api.reviews import REVIEWER, Reviewer
    from webhook.app import create_app
    from webhook.config import WebhookConfig

    os.environ[FIXED_ANSWER] = str(answer_file)
    config = WebhookConfig.from_env({"GPUSHARING_TIMEKEEPER_URL": ""})
    app = create_app(config)
    answer = json.loads(answer_file.read_bytes())
    reviewer: Reviewer = app.extensions[REVIEWER]

    def decide(request: Any) -> Any:  # as webhook.api.reviews calls it for /mutate, with no client authentication
        return admit(request, config, reviewer.budgets.budget_of, True, reviewer.claims, reviewer.jobs,
                     reviewer.reserve, False, reviewer.priorities, reviewer.budgets.fair_share())

    gc.freeze()  # as a worker settles before it serves (gpusharing.serving.server): its young objects alone collected
    gc.set_threshold(*GC_THRESHOLDS)
    decoded = [read_json(body) for body in bodies]
    requests = [parse_review(value) for value in decoded]
    decided = [(request, decide(request)) for request in requests]
    return {
        "webhook": per_review_us(wsgi_post(app, "/mutate"), bodies),
        "fixed answer": per_review_us(wsgi_post(fixed_answer_app(), "/mutate"), bodies),
        "json": per_review_us(lambda body: (json.loads(body), json.dumps(answer)), bodies),
        "read": per_review_us(read_json, bodies),
        "parse": per_review_us(parse_review, decoded),
        "admit": per_review_us(decide, requests),
        "answer": per_review_us(lambda pair: encoded_response(*pair), decided),
    }


# What a profile's samples are counted under: the first part whose marks one of its frames holds (the webhook's own
# steps first, as they run under the stack's frames). py-spy's raw frames read "function (file:line)".
PROFILE_PARTS = (
    ("the pod's GPU request (parse_gpu_request)", ("parse_gpu_request (gpusharing/gpu/request.py",)),
    ("the rest of admit", ("admit (webhook/admission/policy.py",)),
    ("the body read within bounds (read_json)", ("read_json (gpusharing/serving/jsonbody.py",)),
    ("the review parsed (parse_review)", ("parse_review (webhook/admission/review.py",)),
    ("the answer written (encoded_response)", ("encoded_response (webhook/admission/review.py",)),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("logging", ("logging/__init__.py",)),
    ("the caller checked", ("webhook/api/callers.py",)),
    ("the rest of the review's view", ("webhook/api/reviews.py",)),
    ("the fixed answer's view", ("ceiling.py",)),
    ("Flask and Werkzeug", ("flask/", "werkzeug/")),
    ("gunicorn: the answer sent (TLS)", ("_OneWriteResponse", "Response.write (gunicorn", "Response.close (gunicorn",
                                         "Response.start_response (gunicorn")),
    ("gunicorn: its WSGI environ", ("gunicorn/http/wsgi.py",)),
    ("gunicorn: the request read (TLS, parser)", ("gunicorn/http/", "ssl.py")),
    ("gunicorn: the poller and thread pool",
     ("gunicorn/workers/", "concurrent/futures/", "selectors.py", "threading.py")),
)


def _line(label: str, figures: dict[str, float]) -> str:
    cpu = f"  server CPU {figures['cpu_us']:5.0f} us/review" if "cpu_us" in figures else ""
    return (f"{label:>30}: {figures['reviews_per_s']:8.0f} reviews/s  p50 {figures['p50_ms']:6.2f} ms  "
            f"p99 {figures['p99_ms']:6.2f} ms{cpu}  ({figures['reviews']:.0f} reviews, {figures['errors']:.0f} errors)")


def _median(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


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
    parser.add_argument(
        "--rounds", type=int, default=2, help="maximum-rate runs of each server with each client, alternating"
    )
    parser.add_argument(
        "--clients", type=int, default=4, help="client processes (wrk: connections), one keep-alive connection each"
    )
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=4, help="threads per gunicorn worker")
    parser.add_argument("--safe", action="store_true", help="every pod under safe admission, with a deadline")
    parser.add_argument(
        "--profile", metavar="DIR", type=Path,
        help="after the rounds, one more run of each server at the maximum under py-spy (--gil): where each worker's "
        "time holding the GIL goes, per review; the raw samples are left in DIR",
    )
    parser.add_argument("--serve-fixed-answer", nargs=3, metavar=("PORT", "CERT", "KEY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fixed_answer:  # the benchmark's own child process: the fixed-answer app until stopped
        port, cert, key = args.serve_fixed_answer
        serve_fixed_answer(int(port), cert, key, args.workers, args.threads)
        return 0
    stand_in = safe_timekeeper() if args.safe else None
    deadline = 3600 if args.safe else None
    clients = ["python"] + (["wrk"] if shutil.which("wrk") else [])

    with tempfile.TemporaryDirectory() as directory:
        paths = make_serving_certificate(["127.0.0.1", "localhost"]).write(Path(directory))
        ca = str(paths["ca"])
        bodies_file = Path(directory) / "reviews.jsonl"
        bodies_file.write_bytes(b"\n".join(review_bodies(deadline)) + b"\n")
        port = free_port()
        server = Service(
            "webhook",
            ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(paths["cert"]),
             "--key", str(paths["key"]), "--workers", str(args.workers), "--threads", str(args.threads)],
            f"https://127.0.0.1:{port}/readyz",
            env={"GPUSHARING_TIMEKEEPER_URL": f"http://127.0.0.1:{stand_in.server_port}" if stand_in else ""},
            verify=ca,
        )
        with server:
            answer_file = Path(directory) / "answer.json"
            answer_file.write_bytes(first_answer(port, ca, review_bodies(deadline)[0]))
            fixed_port = free_port()
            fixed = Service(
                "fixed-answer", ["--workers", str(args.workers), "--threads", str(args.threads),
                                 "--serve-fixed-answer", str(fixed_port), str(paths["cert"]), str(paths["key"])],
                f"https://127.0.0.1:{fixed_port}/readyz", env={FIXED_ANSWER: str(answer_file)}, verify=ca,
                command=[sys.executable, str(Path(__file__).resolve())],
            )
            with fixed:
                print(
                    f"webhook: {args.workers} gunicorn gthread workers x {args.threads} threads, TLS, keep-alive; "
                    f"{args.clients} client processes (wrk: {args.clients} connections); {os.cpu_count()} CPUs shared "
                    f"by servers and clients; the fixed-answer app's answer: {answer_file.stat().st_size} bytes"
                    + ("; safe admission: every review reserves" if args.safe else "")
                )
                if "wrk" not in clients:
                    print("wrk is not on the PATH (apt-get install wrk): the Python clients alone")
                servers = {"fixed answer": fixed_port, "webhook": port}
                assert fixed.process is not None and server.process is not None
                masters = {"fixed answer": fixed.process.pid, "webhook": server.process.pid}
                for server_port in servers.values():
                    run_phase(server_port, ca, args.clients, None, 2, deadline)  # warm-up
                # Both at the same fixed rate: at the maximum each is measured at its own throughput, and a server's CPU
                # per review falls as its throughput rises (fewer wake-ups per review), which the slower one lacks.
                at_rate = {}
                for name in sorted(servers, reverse=True):  # the webhook first, as before
                    cpu_before = tree_cpu_seconds(masters[name])
                    at_rate[name] = run_phase(servers[name], ca, args.clients, args.rate, args.duration, deadline)
                    at_rate[name]["cpu_us"] = (
                        (tree_cpu_seconds(masters[name]) - cpu_before) / max(at_rate[name]["reviews"], 1) * 1e6
                    )
                    print(_line(f"{name}, fixed {args.rate:g}/s", at_rate[name]), flush=True)
                print(f"{'ratio, fixed ' + format(args.rate, 'g') + '/s':>30}: server CPU per review "
                      f"{at_rate['webhook']['cpu_us'] / at_rate['fixed answer']['cpu_us']:.2f}x")
                measured: dict[tuple[str, str], list[dict[str, float]]] = {}
                for round_number in range(args.rounds):
                    for load in clients:
                        # Alternating which goes first, so that what else the machine does falls on both alike.
                        for name in sorted(servers, reverse=round_number % 2 == 1):
                            cpu_before = tree_cpu_seconds(masters[name])
                            if load == "wrk":
                                figures = run_wrk(servers[name], str(bodies_file), args.clients, args.duration)
                            else:
                                figures = run_phase(servers[name], ca, args.clients, None, args.duration, deadline)
                            # The server's master and workers: steadier than reviews/s, which moves with how the
                            # keep-alive connections fell on the workers and with what else the machine does.
                            figures["cpu_us"] = (
                                (tree_cpu_seconds(masters[name]) - cpu_before) / max(figures["reviews"], 1) * 1e6
                            )
                            print(_line(f"{name}, {load}, round {round_number + 1}", figures), flush=True)
                            measured.setdefault((load, name), []).append(figures)
                print(f"maximum, median of {args.rounds} rounds:")
                for load in clients:
                    ceiling, webhook = _median(measured[(load, "fixed answer")]), _median(measured[(load, "webhook")])
                    print(_line(f"fixed answer, {load}", ceiling))
                    print(_line(f"webhook, {load}", webhook))
                    print(
                        f"{'ratio, ' + load:>30}: "
                        f"{webhook['reviews_per_s'] / ceiling['reviews_per_s']:8.2f}x reviews/s  "
                        f"p50 {webhook['p50_ms'] / ceiling['p50_ms']:.2f}x  "
                        f"p99 {webhook['p99_ms'] / ceiling['p99_ms']:.2f}x  "
                        f"server CPU per review {webhook['cpu_us'] / ceiling['cpu_us']:.2f}x"
                    )
                if args.safe:
                    print(f"{'verdicts':>30}: {safe_verdicts(port, ca)}")
                spy = py_spy() if args.profile else None
                if args.profile and spy is None:
                    print("py-spy is not installed (pip install py-spy): no profile")
                elif spy is not None:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    load = clients[-1]  # wrk where there is one: its own CPU is the least beside the servers'
                    profiles = {}
                    for name in sorted(servers):
                        def run(name: str = name) -> dict[str, float]:
                            if load == "wrk":
                                return run_wrk(servers[name], str(bodies_file), args.clients, args.duration)
                            return run_phase(servers[name], ca, args.clients, None, args.duration, deadline)

                        figures, profiles[name] = profiled_run(spy, name, masters[name], run, "reviews",
                                                               args.duration, args.profile, PROFILE_PARTS)
                        print(_line(f"{name}, {load}, profiled", figures), flush=True)
                    print_profiles(profiles, PROFILE_PARTS, "review")
            if not args.safe:  # safe admission's reservations are calls to the stand-in: not the webhook's own work
                costs = in_process_costs(review_bodies(deadline), answer_file)
                fixed_cpu = statistics.median(f["cpu_us"] for load in clients for f in measured[(load, "fixed answer")])
                webhook_cpu = statistics.median(f["cpu_us"] for load in clients for f in measured[(load, "webhook")])
                room = (1 / 0.9 - 1) * fixed_cpu
                parts = costs["read"] + costs["parse"] + costs["admit"] + costs["answer"]
                print(f"in process, CPU per review (no HTTP, no TLS; the least of 10 rounds): webhook "
                      f"{costs['webhook']:.0f} us (the body read within bounds {costs['read']:.0f}, the review parsed "
                      f"{costs['parse']:.0f}, admit {costs['admit']:.0f}, the answer written {costs['answer']:.0f}, "
                      f"the rest {costs['webhook'] - parts:.0f}), fixed answer {costs['fixed answer']:.0f} us, json "
                      f"parse and write alone {costs['json']:.0f} us")
                print(
                    f"server CPU per review, median of every run: fixed answer {fixed_cpu:.0f} us, "
                    f"webhook {webhook_cpu:.0f} us; "
                    "for 0.9x of the fixed answer's reviews/s where the servers' CPU is what runs out, the webhook may "
                    f"add at most {room:.0f} us; it adds {webhook_cpu - fixed_cpu:.0f} us "
                    f"(in process {costs['webhook'] - costs['fixed answer']:.0f} us), "
                    "and parsing the review and writing its answer "
                    f"alone take {costs['json']:.0f} us"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
