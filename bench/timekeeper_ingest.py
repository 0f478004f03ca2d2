"""Meter reports into a real timekeeper (gunicorn) on PostgreSQL and on SQLite: reports/s, p50/p99 latency and the CPU
each report costs, beside a baseline revision's timekeeper measured in the same run.

    python bench/timekeeper_ingest.py                      # both backends, this checkout beside the baseline, 2 rounds
    python bench/timekeeper_ingest.py --baseline c5d63a6 --rounds 3
    python bench/timekeeper_ingest.py --baseline none --backend postgresql --rate 1000 --seconds 10

For each backend one PostgreSQL is started (initdb, on loopback, PostgreSQL's durable defaults unless --no-fsync);
each run gets a fresh database (or SQLite file) migrated by its own tree's `db upgrade`, and starts that tree's
`gpusharing timekeeper serve` with static tokens; the baseline's tree is a temporary git worktree, and the two trees
alternate (baseline, this, baseline, ...) so that what else the machine does falls on both alike. Client processes
send reports over keep-alive connections as running pods would: every pod reports a rising cumulative with a rising
seq. At a fixed rate each client thread sends on a schedule; at the maximum, every thread sends as soon as its
previous answer came. The CPU per report is the user and system time of the timekeeper's processes (and of
PostgreSQL's) over the measurement, divided by the reports answered: on a shared machine it moves far less than the
throughput does.

Beside both trees, in each round, the stack's ceiling: a Flask app that reads each report and returns a fixed
answer (the timekeeper's to a report), through the same gpusharing/serving/server.py with the same workers and
threads, driven by the same clients: what any app on this stack could take, were its work free. And the durable
floor (durable_floor.py): that app answering each report only once it is written, in the timekeeper's own batches
(ReportQueue) and transactions (Database), on a fresh database of the same server: what any timekeeper that answers
a report only once it is durable costs here, were accounting free.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ceiling  # noqa: E402  (bench/, this script's directory)
import durable_floor  # noqa: E402  (bench/)
from flask import Flask  # noqa: E402
from profiling import print_profiles, profiled_run, py_spy  # noqa: E402  (bench/)

from demo.processes import COMMAND, Service, free_port, tree_cpu_seconds, tree_usage  # noqa: E402
from gpusharing.serving.server import ServerOptions, serve  # noqa: E402
from testbed.postgres import PostgresServer  # noqa: E402
from testbed.timekeeper_processes import TimekeeperProcess  # noqa: E402

# The timekeeper this one's ingest is measured against by default: the revision that billed from meter reports alone,
# the baseline of docs/development.md's figures.
BASELINE = "c5d63a6"

TOKEN = "bench-meter-token"
NAMESPACES = 20
CLIENTS = 2  # client processes, so that the load generator is not one GIL
CEILING = "the stack's ceiling"  # the fixed-answer app's label
FLOOR = "the durable floor"  # the fixed-answer app that writes each report first
UNBATCHED_FLOOR = "the unbatched floor"  # the same, each report written in its request's own transaction
FLOOR_DATABASE_ENV = "BENCH_DURABLE_FLOOR_DATABASE_URL"  # its database, for each of its workers
# An answer of the timekeeper's shape to an accepted report (timekeeper/database/accounting/pods.py), given to every
# report.
FIXED_ANSWER = json.dumps({"namespace": "ns-0", "state": "in-budget", "outcome": "accepted", "chargedGpuSeconds": 7.5,
                           "billedGpuSeconds": 7.5}).encode()

# What a profile's samples are counted under (bench/profiling.py): the first part whose marks one of its frames holds,
# the ledger thread's first, then the report's own steps, as they run under the stack's frames.
PROFILE_PARTS = (
    ("the ledger's transaction (ReportLedger.record)", ("record (timekeeper/database/accounting/charging.py",)),
    ("the floor's durable write", ("record (bench/durable_floor.py", "record (durable_floor.py")),
    ("the ledger thread's hand-off (batching, waking)", ("_run (timekeeper/database/accounting/report_queue.py",)),
    ("the request's hand-off (ReportQueue.submit)", ("submit (timekeeper/database/accounting/report_queue.py",)),
    ("the caller authenticated (the token)", ("caller (timekeeper/auth.py", "caller (timekeeper/api/context.py")),
    ("the caller's right to report (report_terms)", ("report_terms (timekeeper/auth.py",)),
    ("the body read within bounds (read_json)", ("gpusharing/serving/jsonbody.py", "body (timekeeper/api/context.py")),
    ("the report parsed (MeterReport)", ("gpusharing/report.py",)),
    ("the answer written", ("to_json (timekeeper/database/accounting/charging.py", "jsonify", "flask/json/")),
    ("metrics (prometheus_client)", ("prometheus_client/",)),
    ("logging", ("logging/__init__.py",)),
    ("the rest of the report's view", ("timekeeper/api/", "timekeeper/app.py")),
    ("the fixed answer's view", ("ceiling.py",)),
    ("Flask and Werkzeug", ("flask/", "werkzeug/")),
    ("gunicorn: the answer sent", ("Response.write (gunicorn", "Response.close (gunicorn",
                                   "Response.start_response (gunicorn")),
    ("gunicorn: its WSGI environ", ("gunicorn/http/wsgi.py",)),
    ("gunicorn: the request read (parser)", ("gunicorn/http/",)),
    ("gunicorn: the poller and thread pool",
     ("gunicorn/workers/", "concurrent/futures/", "selectors.py", "threading.py", "queue.py")),
)


def fixed_answer_app() -> Flask:
    """The stack's ceiling: reads each report and answers as the timekeeper does, but does nothing with it."""
    return ceiling.fixed_answer_app("/api/v1/reports", FIXED_ANSWER)


def durable_floor_app() -> Flask:
    """The durable floor: the same, answering each report once it is written."""
    return durable_floor.durable_floor_app("/api/v1/reports", FIXED_ANSWER, os.environ[FLOOR_DATABASE_ENV])


def unbatched_floor_app() -> Flask:
    """The unbatched floor: the same, each report written by its own request's thread."""
    return durable_floor.durable_floor_app("/api/v1/reports", FIXED_ANSWER, os.environ[FLOOR_DATABASE_ENV],
                                           batched=False)


class _KeepAliveClient:
    """POSTs over one keep-alive connection, and reads no more of the answer than its status and length.

    On two shared cores the load generator competes with the server: http.client costs several times the
    CPU of this, which would show up as the server's slowness.
    """

    def __init__(self, port: int, path: str, headers: dict[str, str]):
        self.port = port
        self.head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
                     + "Content-Length: ").encode()
        self.sock: socket.socket | None = None
        self.buffer = b""

    def post(self, body: bytes) -> int:
        """The answer's status; raises OSError when the connection failed (it is reopened at the next post)."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.buffer = b""
            self.sock.sendall(b"%s%d\r\n\r\n%s" % (self.head, len(body), body))
            while b"\r\n\r\n" not in self.buffer:
                self.buffer += self._receive()
            header, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = _CONTENT_LENGTH.search(header)
            size = int(length.group(1)) if length else 0
            while len(rest) < size:
                rest += self._receive()
            self.buffer = rest[size:]
            return int(header[9:12])
        except OSError:
            if self.sock is not None:
                self.sock.close()
            self.sock = None
            raise

    def _receive(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        return chunk


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length:\s*(\d+)")


def _client(
    port: int,
    client: int,
    threads: int,
    rate: float | None,
    seconds: float,
    start_at: float,
    results: "multiprocessing.Queue[tuple[list[float], int]]",
) -> None:
    """One client process of `threads` threads; each thread is one pod, reporting a rising cumulative."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()

    def run(thread: int) -> None:
        nonlocal errors
        connection = _KeepAliveClient(
            port, "/api/v1/reports", {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        )
        mine: list[float] = []
        failed = 0
        interval = None if rate is None else threads * CLIENTS / rate
        seq = 0
        pod = f"pod-{client}-{thread}"
        while time.time() < start_at:
            time.sleep(0.001)
        stop = start_at + seconds
        next_at = start_at + (0 if interval is None else interval * thread / threads)
        while True:
            if interval is not None:
                now = time.time()
                if next_at > now:
                    time.sleep(next_at - now)
                next_at += interval
            if time.time() >= stop:
                break
            seq += 1
            body = json.dumps({"podUid": f"uid-{pod}", "namespace": f"ns-{(client * threads + thread) % NAMESPACES}",
                               "pod": pod, "gpuShare": 0.5, "seq": seq, "gpuSeconds": seq * 15.0}).encode()
            sent = time.perf_counter()
            try:
                ok = connection.post(body) == 200
            except OSError:
                ok = False
            mine.append(time.perf_counter() - sent)
            failed += not ok
        with lock:
            latencies.extend(mine)
            errors += failed

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    results.put((latencies, errors))


def measure(port: int, threads: int, rate: float | None, seconds: float) -> dict[str, float]:
    results: multiprocessing.Queue[tuple[list[float], int]] = multiprocessing.Queue()
    start_at = time.time() + 1.0
    processes = [
        multiprocessing.Process(target=_client, args=(port, c, threads, rate, seconds, start_at, results))
        for c in range(CLIENTS)
    ]
    for p in processes:
        p.start()
    latencies: list[float] = []
    errors = 0
    for _ in processes:
        got, failed = results.get()
        latencies.extend(got)
        errors += failed
    for p in processes:
        p.join()
    latencies.sort()
    return {
        "reports": len(latencies),
        "per_second": len(latencies) / seconds,
        "p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000 if latencies else float("nan"),
        "errors": errors,
    }


def measure_with_wrk(port: int, connections: int, seconds: float) -> dict[str, float]:
    """The maximum rate driven by wrk (C, two threads): a load generator that leaves the cores to the server."""
    script = Path(__file__).with_name("timekeeper_reports.lua")
    output = subprocess.run(
        ["wrk", "-t2", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script), f"http://127.0.0.1:{port}",
         "--", "500", str(NAMESPACES), TOKEN],
        capture_output=True, text=True, check=True,
    ).stdout
    requests, errors, duration, p50, p99 = next(
        line.split()[1:] for line in output.splitlines() if line.startswith("WRK ")
    )
    return {"reports": int(requests), "per_second": int(requests) / float(duration), "p50_ms": float(p50),
            "p99_ms": float(p99), "errors": int(errors)}


@contextmanager
def _checkout(revision: str) -> Iterator[Path]:
    """The revision in a temporary git worktree, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="tk-bench-baseline-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(tree), revision], check=True
        )
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


@contextmanager
def _database_server(backend: str, durable: bool) -> Iterator[PostgresServer | None]:
    server = PostgresServer.start(durable=durable) if backend == "postgresql" else None
    try:
        yield server
    finally:
        if server:
            server.stop()


def _database(server: PostgresServer | None, workdir: Path, tree: Path) -> tuple[str, int | None]:
    """A fresh database migrated by `tree`'s own `db upgrade`, and the pid whose process tree is the database's."""
    url = server.create_database(workdir.name) if server else f"sqlite:///{workdir / 'bench.sqlite'}"
    migrated = subprocess.run([*COMMAND, "db", "upgrade"], env={**os.environ, "TIMEKEEPER_DATABASE_URL": url}, cwd=tree,
                              capture_output=True, text=True)
    if migrated.returncode != 0:
        raise RuntimeError(f"db upgrade of {tree} failed: {migrated.stderr.strip()[-1000:]}")
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0]) if server else None
    return url, postmaster


def _run(
    args: argparse.Namespace, backend: str, server: PostgresServer | None, tree: Path | None, label: str, scratch: Path,
    profile: dict[str, dict[str, float]] | None = None,
) -> dict[str, float]:
    """One timekeeper (of `tree`) on a fresh database, or a yardstick (`tree` None: the fixed-answer app, or the durable
    floor on a fresh database): its lines printed;
    returns the maximum's figures (`server_ms`: the server's CPU per report). With `profile`, the maximum alone,
    under py-spy (--profile): each part's GIL time per report is left in `profile[label]`."""
    workdir = Path(tempfile.mkdtemp(prefix="tk", dir=scratch))
    tokens = workdir / "tokens"
    tokens.write_text(f"{TOKEN} meter\n")
    if tree is None:
        loads = [(f"maximum ({args.client})", None)]
        port = free_port()
        serving, env = ["--serve-fixed-answer", str(port)], {}
        postmaster = None
        if label in (FLOOR, UNBATCHED_FLOOR):
            url = server.create_database(workdir.name) if server else f"sqlite:///{workdir / 'floor.sqlite'}"
            durable_floor.create_table(url)
            postmaster = int((server.data / "postmaster.pid").read_text().split()[0]) if server else None
            serving = ["--serve-durable-floor" if label == FLOOR else "--serve-unbatched-floor", str(port)]
            env = {FLOOR_DATABASE_ENV: url}
        process: Service = Service(
            label,
            [*serving, "--workers", str(args.workers), "--threads", str(args.threads)],
            f"http://127.0.0.1:{port}/readyz",
            log_path=workdir / "yardstick.log",
            command=[sys.executable, str(Path(__file__).resolve())],
            env=env,
        )
    else:
        url, postmaster = _database(server, workdir, tree)
        loads = [(f"fixed {args.rate:g}/s", args.rate)] * (profile is None) + [(f"maximum ({args.client})", None)]
        process = TimekeeperProcess(
            url, str(tokens), workdir / "timekeeper.log", workers=args.workers, threads=args.threads, cwd=tree
        )
        port = process.port
    maximum: dict[str, float] = {}
    with process as tk:
        assert tk.process is not None
        for load, rate in loads:
            server_before = tree_usage(tk.process.pid)
            database_before = tree_cpu_seconds(postmaster) if postmaster else 0.0

            def run(rate: float | None = rate) -> dict[str, float]:
                if rate is None and args.client == "wrk":
                    return measure_with_wrk(port, CLIENTS * args.client_threads, args.seconds)
                return measure(port, args.client_threads, rate, args.seconds)

            if profile is None:
                m = run()
            else:
                m, profile[label] = profiled_run(str(args.spy), f"{backend}-{label}", tk.process.pid, run, "reports",
                                                 args.seconds, args.profile, PROFILE_PARTS)
                load += ", profiled"
            used = tree_usage(tk.process.pid) - server_before
            reports = max(m["reports"], 1)
            server_ms = 1000 * (used.user_seconds + used.system_seconds) / reports
            # The server's system time and context switches: what its threads' hand-offs cost beside their Python.
            per_report = (f"server {server_ms:.2f} (system {1000 * used.system_seconds / reports:.2f})"
                          + (f" database {1000 * (tree_cpu_seconds(postmaster) - database_before) / reports:.2f}"
                             if postmaster else ""))
            print(
                f"{backend:<10}  {label:<19}  {load:<16}  {m['per_second']:7.0f} reports/s  p50 {m['p50_ms']:7.2f} ms  "
                f"p99 {m['p99_ms']:7.2f} ms  errors {m['errors']}  CPU ms/report: {per_report}; server context "
                f"switches/report {used.context_switches / reports:.1f}",
                flush=True,
            )
            if rate is None:
                maximum = {**m, "server_ms": server_ms}
    return maximum


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    parser.add_argument("--rate", type=float, default=1000.0, help="the fixed rate, reports/s (default 1000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measurement (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (default 2)")
    parser.add_argument("--threads", type=int, default=32, help="threads per worker (default 32, as the timekeeper)")
    parser.add_argument(
        "--client-threads", type=int, default=32, help="threads per client process (2 processes; default 32)"
    )
    parser.add_argument("--no-fsync", action="store_true", help="PostgreSQL without fsync (not durable)")
    parser.add_argument(
        "--client",
        choices=("python", "wrk"),
        default="python",
        help="load generator of the maximum-rate run: these Python processes, or wrk (apt-get install wrk)",
    )
    parser.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="REVISION",
        help=f"the revision measured beside this checkout, alternating (default {BASELINE}, the timekeeper "
        "before billing from the record); 'none' measures this checkout alone",
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree per backend, alternating (default 2)")
    parser.add_argument(
        "--no-ceiling", action="store_true", help="without the yardsticks' runs (fixed answer, durable floor)"
    )
    parser.add_argument(
        "--profile", metavar="DIR", type=Path,
        help="after each backend's rounds, one more run of this checkout and of the fixed-answer app at the maximum "
        "under py-spy (--gil): where each worker's time holding the GIL goes, per report; the raw samples are left "
        "in DIR",
    )
    parser.add_argument("--serve-fixed-answer", metavar="PORT", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-durable-floor", metavar="PORT", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-unbatched-floor", metavar="PORT", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--unbatched-floor", action="store_true",
                        help="one more yardstick: the durable floor with each report in a transaction of its own")
    args = parser.parse_args()
    args.spy = py_spy() if args.profile else None
    if args.profile:
        if args.spy is None:
            parser.error("--profile needs py-spy (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
    served = {"fixed_answer_app": args.serve_fixed_answer, "durable_floor_app": args.serve_durable_floor,
              "unbatched_floor_app": args.serve_unbatched_floor}
    if any(served.values()):  # the benchmark's own child: a yardstick until stopped
        factory, port = next((factory, port) for factory, port in served.items() if port)
        serve(f"timekeeper_ingest:{factory}",
              ServerOptions(host="127.0.0.1", port=port, workers=args.workers, threads=args.threads))
        return 0
    if args.client == "wrk" and shutil.which("wrk") is None:
        parser.error("--client wrk needs wrk on the PATH (apt-get install wrk)")
    backends = ("postgresql", "sqlite") if args.backend == "both" else (args.backend,)
    print(
        f"timekeeper ingest: {args.workers} workers x {args.threads} threads, {CLIENTS} client processes x "
        f"{args.client_threads} threads, {args.seconds:g} s per measurement; CPU of the timekeeper's processes and of "
        f"the database's (PostgreSQL's server processes; SQLite's runs in the timekeeper)",
        flush=True,
    )
    with ExitStack() as stack:
        trees: list[tuple[str, Path | None]] = []
        if args.baseline != "none":
            trees.append((f"baseline {args.baseline}", stack.enter_context(_checkout(args.baseline))))
        trees.append(("this checkout", ROOT))
        if not args.no_ceiling:
            trees += [(CEILING, None), (FLOOR, None)] + [(UNBATCHED_FLOOR, None)] * args.unbatched_floor
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tk-bench-")))
        maxima: dict[tuple[str, str], list[dict[str, float]]] = {}
        ratios: dict[str, str] = {}
        for backend in backends:
            server = stack.enter_context(_database_server(backend, durable=not args.no_fsync))
            for _ in range(args.rounds):
                for label, tree in trees:
                    maxima.setdefault((backend, label), []).append(_run(args, backend, server, tree, label, scratch))
            median = {label: {key: statistics.median(m[key] for m in maxima[backend, label]) for key in
                              ("per_second", "server_ms")} for label, _ in trees}
            this = median["this checkout"]
            compared = [
                f"{this['per_second'] / median[label]['per_second']:.2f}x {label}'s {median[label]['per_second']:.0f}"
                for label, _ in trees
                if label != "this checkout"
            ]
            print(f"{backend:<10}  maximum, median of {args.rounds} rounds: {this['per_second']:.0f} reports/s"
                  + (", " + ", ".join(compared) if compared else ""), flush=True)
            if CEILING in median:
                fixed, floor = median[CEILING]["server_ms"], median[FLOOR]["server_ms"]
                ratios[backend] = (f"{this['server_ms'] / fixed:.2f}x ({this['server_ms']:.2f} ms / {fixed:.2f} ms), "
                                   f"the durable floor {floor / fixed:.2f}x ({floor:.2f} ms)")
                print(f"{backend:<10}  server CPU per report at the maximum, median of {args.rounds} rounds, and its "
                      f"ratio to the fixed-answer app's {fixed:.2f} ms: " + ", ".join(
                          f"{label} {median[label]['server_ms']:.2f} ms, {median[label]['server_ms'] / fixed:.2f}x"
                          for label, _ in trees if label != CEILING)
                      + f"; this checkout over the durable floor: {this['server_ms'] / floor:.2f}x", flush=True)
            if args.spy:
                profiles: dict[str, dict[str, float]] = {}
                for label, tree in trees:
                    if label != f"baseline {args.baseline}":
                        _run(args, backend, server, tree, label, scratch, profiles)
                print_profiles(profiles, PROFILE_PARTS, "report")
        if ratios:
            print("ratio, this checkout's server CPU per report over the fixed-answer app's (the stack's ceiling), "
                  "same run, and the durable floor's: " + "; ".join(f"{backend} {ratio}" for backend, ratio in
                                                                   ratios.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
