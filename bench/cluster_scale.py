"""Scale figures of the controller layout beside the web-replica layout, measured in the same run: pod watches held
against the API server, memory, each controller task's duration, the listing, admission's p50/p99 and a demotion's
time, as namespaces and GPU pods grow (10,000 namespaces and 50,000 GPU pods at the largest size).

Two layouts, at each size, one after the other on a fresh database and a fresh stand-in Kubernetes API
(demo/kubeapi.py, on loopback) serving every GPU pod, governed (the webhook's share annotation) and running:

- the controller, this checkout: `gpusharing timekeeper serve` (2 workers, no cluster work) and 2 replicas of
  `gpusharing timekeeper controller` (one leading);
- the web replicas (`c7253fe`, with no controller process): `gpusharing timekeeper serve` (2 workers) of
  that revision, checked out into a temporary git worktree (removed at the end) and run from it with this Python, its
  database upgraded by its own `db upgrade`; each worker held a pod watch, the Lease's holder a second one for billing.
  When it cannot run (no git checkout, the commit absent, a start that fails), the run says why and prints the
  controller's figures alone.

Each timekeeper is given a budget for every namespace and one report for every pod (pods spread over the
namespaces; 16 concurrent clients); the webhook of the same layout (2 workers, TLS) polls its listing every second.
Measured:

- pod watches: the most watch requests on /api/v1/pods open at once at the stand-in API over 3 s (each of its watches
  ends within 0.5 s and is opened again at once);
- memory (resident, VmRSS): the controller's leader and follower, the web replica's largest worker, the webhook's
  largest worker; per cached pod, the leader's and the follower's growth over a leader's and a follower's with no pod
  (measured at the same size on the same database, before the pods are served), divided by the pods cached (a few
  MiB of noise: at small sizes the figure is noise);
- each controller task's duration, p50 and max over the runs seen: /metrics of both replicas scraped every 0.5 s, a
  run's duration the growth of gpusharing_controller_task_duration_seconds_sum (the mean of the runs, when several
  ended between two scrapes); at least two runs of every task (bills and silent-meters run every 30 s);
- the listing the webhook polls (its size, and the time to read it);
- the webhook's p50 and p99 over AdmissionReviews at 200/s from 4 client processes for 10 s (bench/webhook_load.py);
- the demotion of one namespace of `--demote` running pods: from the report that crosses its budget to the last
  eviction, which the stand-in API grants at once; it includes the wait for the webhook to hold the crossing (up to
  two of its polls) and the controller's next budgets run (every second here).

The pods' meters are taken to report (GPUSHARING_METER_INTERVAL_SECONDS=300 and pods started at the run's start: no
MeterSilent storm); the tasks run at their default intervals but for budgets (1 s, as the demotion's bound).

How long it takes on the 2-core development machine (another suite running beside it): about 6 minutes at
`--sizes 500:2500 --demote 200`, about 17 at `--sizes 2500:12500 --demote 500`; the default sizes, with 5,000 pods
demoted, take hours (the controller's bills and idle runs grow faster than the pods). Run it smaller:

    .venv/bin/python bench/cluster_scale.py                                      # the default sizes (make bench)
    .venv/bin/python bench/cluster_scale.py --sizes 500:2500 --demote 200        # one small size, quickly
    .venv/bin/python bench/cluster_scale.py --sizes 500:2500 --demote 200 --no-before   # the controller's alone
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from webhook_load import run_phase  # noqa: E402

from demo.kubeapi import FakeKube  # noqa: E402
from demo.processes import COMMAND, Service, child_pids, free_port  # noqa: E402
from gpusharing.contract import ANNOTATION_GPU_SHARE  # noqa: E402
from gpusharing.serving.certs import make_serving_certificate  # noqa: E402

BEFORE = "c7253fe"  # the web-replica layout: no controller process, each timekeeper worker holding a pod watch
ADMIN, METER = "bench-admin", "bench-meter"
DEMOTED = "demoted-team"
TASKS = ("bills", "ended", "idle", "budgets", "statuses", "commitments", "silent-meters")
PODS_CACHED = 'gpusharing_controller_cached_objects{kind="governed GPU pods"}'
_DURATION = re.compile(r'^gpusharing_controller_task_duration_seconds_(sum|count)\{task="([^"]+)"\} (\S+)$', re.M)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def workers_rss_mib(server: Service) -> float:
    """A gunicorn server's largest worker's resident memory."""
    return max(rss_mib(pid) for pid in child_pids(server.process.pid))  # type: ignore[union-attr]


def load(url: str, namespaces: int, pods: int) -> None:
    """A budget for every namespace, one report for every pod (16 concurrent clients)."""
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=16))

    def budget(i: int) -> None:
        answer = session.put(f"{url}/api/v1/budgets/team-{i:05d}", json={"gpuMinutes": 1e6}, timeout=60,
                             headers={"Authorization": f"Bearer {ADMIN}"})
        assert answer.status_code in (200, 201), answer.text

    def report(i: int) -> None:
        body = {
            "podUid": f"pod-{i:06d}",
            "namespace": f"team-{i % namespaces:05d}",
            "pod": f"pod-{i:06d}",
            "gpuShare": 0.25,
            "seq": 1,
            "gpuSeconds": 30.0,
        }
        answer = session.post(
            f"{url}/api/v1/reports", json=body, timeout=60, headers={"Authorization": f"Bearer {METER}"}
        )
        assert answer.status_code == 200, answer.text

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(budget, range(namespaces)))
        list(pool.map(report, range(pods)))


def serve_pods(kube: FakeKube, namespaces: int, pods: int, demote: int) -> None:
    """Every GPU pod running and governed, as the webhook admitted it (its share recorded), the reported ones under the
    uids of their reports; and the namespace to demote."""
    started = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    wanted = [(f"team-{i % namespaces:05d}", f"pod-{i:06d}", "0.25") for i in range(pods)]
    wanted += [(DEMOTED, f"train-{i:05d}", "0.5") for i in range(demote)]
    for namespace, name, share in wanted:
        pod = kube.add_pod(namespace, name, share=share)
        if name.startswith("pod-"):
            pod["metadata"]["uid"] = name
        pod["status"]["startTime"] = started
        assert pod["metadata"]["annotations"][ANNOTATION_GPU_SHARE] == share


def count_pod_watches(kube: FakeKube, seconds: float = 3.0) -> int:
    kube.reset_watch_peaks()
    time.sleep(seconds)
    return kube.watches_peak.get("pods", 0)


class Layout:
    """One layout's processes, from `cwd` (None: this checkout)."""

    def __init__(self, name: str, directory: Path, kube: FakeKube, cwd: Path | None):
        self.name, self.directory, self.kube, self.cwd = name, directory, kube, cwd
        self.database = f"sqlite:///{directory / 'timekeeper.sqlite'}"
        (directory / "kubeconfig").write_text(kube.kubeconfig())
        (directory / "tokens").write_text(f"{ADMIN} admin\n{METER} meter\n")
        self.env = {
            "TIMEKEEPER_DATABASE_URL": self.database,
            "TIMEKEEPER_AUTH": "static",
            "TIMEKEEPER_STATIC_TOKENS_FILE": str(directory / "tokens"),
            "TIMEKEEPER_KUBECONFIG": str(directory / "kubeconfig"),
            "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": "1",
        }
        if cwd is None:
            self.env["GPUSHARING_METER_INTERVAL_SECONDS"] = "300"
        else:  # c7253fe's name of it
            self.env["TIMEKEEPER_METER_INTERVAL_SECONDS"] = "300"
        upgrade = subprocess.run(
            [*COMMAND, "db", "upgrade"], env={**os.environ, **self.env}, cwd=cwd, capture_output=True, text=True
        )
        if upgrade.returncode != 0:
            raise RuntimeError(f"{name}: db upgrade failed: {upgrade.stderr.strip()[-500:]}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.webhook_service: Service | None = None  # the webhook, while it runs

    def timekeeper(self) -> Service:
        return Service(
            "timekeeper",
            ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "2"],
            f"{self.url}/readyz",
            env=self.env,
            log_path=self.directory / "timekeeper.log",
            cwd=self.cwd,
        )

    def controller(self, number: int) -> Service:
        port = free_port()
        return Service(
            f"controller-{number}",
            ["timekeeper", "controller", "--host", "127.0.0.1", "--port", str(port)],
            f"http://127.0.0.1:{port}/readyz",
            env=self.env,
            log_path=self.directory / f"controller-{number}.log",
            cwd=self.cwd,
        )

    def webhook(self) -> Service:
        token = self.directory / "webhook-token"
        token.write_text(ADMIN)
        paths = make_serving_certificate(["127.0.0.1"]).write(self.directory / "tls")
        self.ca = str(paths["ca"])
        self.webhook_port = free_port()
        return Service(
            "webhook",
            [
                "webhook",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.webhook_port),
                "--cert",
                str(paths["cert"]),
                "--key",
                str(paths["key"]),
                "--workers",
                "2",
                "--threads",
                "8",
            ],
            f"https://127.0.0.1:{self.webhook_port}/readyz",
            verify=self.ca,
            log_path=self.directory / "webhook.log",
            env={
                "GPUSHARING_TIMEKEEPER_URL": self.url,
                "GPUSHARING_TIMEKEEPER_TOKEN_FILE": str(token),
                "GPUSHARING_BUDGET_REFRESH_SECONDS": "1",
            },
            cwd=self.cwd,
        )


def metrics_url(controller: Service) -> str:
    return controller.ready_url.replace("/readyz", "/metrics")


def scrape(controller: Service) -> str:
    return requests.get(metrics_url(controller), timeout=10).text


def metric(text: str, series: str) -> float:
    prefix = f"{series} "
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


class TaskDurations:
    """Each run's duration of each task, from both replicas' /metrics scraped every 0.5 s."""

    def __init__(self, controllers: list[Service]):
        self.controllers = controllers
        self.runs: dict[str, list[float]] = {task: [] for task in TASKS}
        self._last: dict[tuple[int, str], tuple[float, float]] = {}  # (replica, task) -> (sum, count)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._scrape, daemon=True)

    def __enter__(self) -> "TaskDurations":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _scrape(self) -> None:
        while True:
            for replica, controller in enumerate(self.controllers):
                try:
                    text = scrape(controller)
                except requests.RequestException:
                    continue
                seen: dict[str, dict[str, float]] = {}
                for which, task, value in _DURATION.findall(text):
                    seen.setdefault(task, {})[which] = float(value)
                for task, figures in seen.items():
                    now = (figures.get("sum", 0.0), figures.get("count", 0.0))
                    before = self._last.get((replica, task), (0.0, 0.0))
                    self._last[(replica, task)] = now
                    runs = int(now[1] - before[1])
                    if task in self.runs and runs > 0:
                        self.runs[task] += [(now[0] - before[0]) / runs] * runs
            if self._stop.wait(0.5):
                return

    def fewest_runs(self) -> int:
        return min(len(self.runs[task]) for task in TASKS)


def leader_and_follower_mib(controllers: list[Service]) -> tuple[float, float]:
    """The resident memory of the replica that leads, and of the other."""
    leading = [metric(scrape(c), "gpusharing_controller_leading") for c in controllers]
    leader, follower = controllers if leading[0] >= leading[1] else controllers[::-1]
    return rss_mib(leader.process.pid), rss_mib(follower.process.pid)  # type: ignore[union-attr]


def controller_layout(namespaces: int, pods: int, demote: int, directory: Path) -> dict[str, object]:
    kube = FakeKube()
    figures: dict[str, object] = {}
    try:
        layout = Layout("controller", directory, kube, None)
        with layout.timekeeper() as timekeeper:
            load(layout.url, namespaces, pods)
            with ExitStack() as stack:  # no pod served yet: a leader's and a follower's own memory
                controllers = [stack.enter_context(layout.controller(n)) for n in (0, 1)]
                deadline = time.monotonic() + 60
                while (
                    max(scrape(c).count("gpusharing_controller_task_duration_seconds_count") for c in controllers)
                    < len(TASKS) + 2
                ):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
                time.sleep(1)
                figures["empty_leader_mib"], figures["empty_follower_mib"] = leader_and_follower_mib(controllers)
            serve_pods(kube, namespaces, pods, demote)
            with ExitStack() as stack:
                controllers = [stack.enter_context(layout.controller(n)) for n in (2, 3)]
                durations = stack.enter_context(TaskDurations(controllers))
                deadline = time.monotonic() + 120
                while (
                    min(metric(scrape(c), PODS_CACHED) for c in controllers) < pods + demote
                    and time.monotonic() < deadline
                ):
                    time.sleep(0.5)
                figures["cached"] = min(metric(scrape(c), PODS_CACHED) for c in controllers)
                figures["watches"] = count_pod_watches(kube)
                _measure_serving(layout, timekeeper, figures)
                figures["leader_mib"], figures["follower_mib"] = leader_and_follower_mib(controllers)
                _demote(layout, demote, figures)
                deadline = time.monotonic() + 75  # two runs of every task, bills' and silent-meters' every 30 s
                while durations.fewest_runs() < 2 and time.monotonic() < deadline:
                    time.sleep(0.5)
            figures["tasks"] = durations.runs
    finally:
        kube.close()
    return figures


def before_layout(namespaces: int, pods: int, demote: int, directory: Path, checkout: Path) -> dict[str, object]:
    kube = FakeKube()
    serve_pods(kube, namespaces, pods, demote)
    figures: dict[str, object] = {}
    try:
        layout = Layout(f"web replicas ({BEFORE})", directory, kube, checkout)
        with layout.timekeeper() as timekeeper:
            load(layout.url, namespaces, pods)
            figures["watches"] = count_pod_watches(kube)
            _measure_serving(layout, timekeeper, figures)
            _demote(layout, demote, figures)
    finally:
        kube.close()
    return figures


def _measure_serving(layout: Layout, timekeeper: Service, figures: dict[str, object]) -> None:
    """The listing, admission's p50 and p99, the web replica's and the webhook's memory."""
    started = time.perf_counter()
    listing = requests.get(f"{layout.url}/api/v1/budgets", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=120)
    listing.raise_for_status()
    figures["listing_s"], figures["listing_mib"] = time.perf_counter() - started, len(listing.content) / 2**20
    webhook = layout.webhook_service = layout.webhook()
    webhook.__enter__()  # it runs on through the demotion, which stops it
    try:
        time.sleep(5)  # a few polls of the whole listing
        phase = run_phase(layout.webhook_port, layout.ca, 4, 200, 10, None)
        figures["admission_p50_ms"], figures["admission_p99_ms"] = phase["p50_ms"], phase["p99_ms"]
        figures["webhook_mib"], figures["web_mib"] = workers_rss_mib(webhook), workers_rss_mib(timekeeper)
    except BaseException:
        webhook.stop()
        raise


def _demote(layout: Layout, demote: int, figures: dict[str, object]) -> None:
    """A crossing's report, then every pod of the namespace evicted; the webhook stops after."""
    admin, meter = {"Authorization": f"Bearer {ADMIN}"}, {"Authorization": f"Bearer {METER}"}
    try:
        requests.put(
            f"{layout.url}/api/v1/budgets/{DEMOTED}",
            json={"gpuMinutes": 1, "evictOnExhaustion": True},
            timeout=60,
            headers=admin,
        ).raise_for_status()
        started = time.perf_counter()
        crossing = {
            "podUid": "crossing",
            "namespace": DEMOTED,
            "pod": "crossing",
            "gpuShare": 1,
            "seq": 1,
            "gpuSeconds": 120,
        }
        requests.post(f"{layout.url}/api/v1/reports", json=crossing, headers=meter, timeout=60).raise_for_status()
        deadline = time.monotonic() + 1800  # only stops a broken run from hanging
        while len(layout.kube.evicted) < demote and time.monotonic() < deadline:
            time.sleep(0.2)
        figures["demotion_s"], figures["evicted"] = time.perf_counter() - started, len(layout.kube.evicted)
    finally:
        if layout.webhook_service is not None:
            layout.webhook_service.stop()


class Before:
    """c7253fe checked out into a temporary git worktree, removed on exit; `why` says why not when it cannot be."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.why: str | None = None
        self._parent: str | None = None

    def __enter__(self) -> "Before":
        if shutil.which("git") is None:
            self.why = "git is not installed"
            return self
        self._parent = tempfile.mkdtemp(prefix="gpusharing-before-")
        path = Path(self._parent) / "checkout"
        added = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), BEFORE], capture_output=True, text=True
        )
        if added.returncode != 0:
            self.why = f"`git worktree add {BEFORE}` failed: {added.stderr.strip()}"
        else:
            self.path = path
        return self

    def __exit__(self, *_: object) -> None:
        if self.path is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.path)], capture_output=True
            )
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
        if self._parent is not None:
            shutil.rmtree(self._parent, ignore_errors=True)


def _mib(value: object) -> str:
    return f"{value:.0f} MiB" if isinstance(value, float) else "-"


def row(namespaces: int, pods: int, layout: str, f: dict[str, object], demote: int) -> str:
    cached = f.get("cached")
    if isinstance(cached, float) and cached > 0:
        per = [(f[k] - f[f"empty_{k}"]) * 1024 / cached for k in ("leader_mib", "follower_mib")]  # type: ignore[operator]
        controller = f"{_mib(f['leader_mib'])} / {_mib(f['follower_mib'])}"
        per_pod = (f"{per[0]:.2f} / {per[1]:.2f} KiB ({cached:,.0f} pods; {_mib(f['empty_leader_mib'])} / "
                   f"{_mib(f['empty_follower_mib'])} without)")
    else:
        controller, per_pod = "-", "-"
    return (
        f"| {namespaces:,} | {pods:,} | {layout} | {f['watches']} | {controller} | {_mib(f['web_mib'])} | {per_pod} | "
        f"{_mib(f['webhook_mib'])} | {f['listing_mib']:.1f} MiB in {f['listing_s']:.2f} s | "
        f"{f['admission_p50_ms']:.1f} / {f['admission_p99_ms']:.1f} ms | "
        f"{f['demotion_s']:.1f} s ({f['evicted']} of {demote:,}) |"
    )


def task_row(namespaces: int, pods: int, runs: dict[str, list[float]]) -> str:
    def cell(task: str) -> str:
        seen = runs.get(task) or []
        if not seen:
            return "no run"
        return f"{statistics.median(seen) * 1000:.0f} / {max(seen) * 1000:.0f} ms ({len(seen)})"
    return f"| {namespaces:,} | {pods:,} | " + " | ".join(cell(task) for task in TASKS) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes", default="1000:5000,2500:12500,10000:50000", help="namespaces:GPU pods, comma-separated"
    )
    parser.add_argument("--demote", type=int, default=5000, help="running pods of the namespace demoted")
    parser.add_argument("--no-before", action="store_true", help=f"the controller's figures alone (no run of {BEFORE})")
    args = parser.parse_args()
    print("| namespaces | GPU pods | layout | pod watches | controller RSS (leader / follower) | web worker RSS | "
          "controller RSS per cached pod (leader / follower) | webhook worker RSS | listing | admission p50 / p99 | "
          f"demotion of {args.demote:,} pods |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    tasks: list[str] = []
    with Before() as before:
        if args.no_before:
            before.why = "--no-before"
        for size in args.sizes.split(","):
            namespaces, pods = (int(n) for n in size.split(":"))
            with tempfile.TemporaryDirectory() as directory:
                f = controller_layout(namespaces, pods, args.demote, Path(directory))
            print(row(namespaces, pods, "controller (now)", f, args.demote), flush=True)
            tasks.append(task_row(namespaces, pods, f["tasks"]))  # type: ignore[arg-type]
            if before.path is None:
                print(f"| {namespaces:,} | {pods:,} | web replicas ({BEFORE}) | not run: {before.why} |", flush=True)
                continue
            with tempfile.TemporaryDirectory() as directory:
                try:
                    f = before_layout(namespaces, pods, args.demote, Path(directory), before.path)
                except Exception as exc:  # its start, its migration: say why, keep the controller's figures
                    print(f"| {namespaces:,} | {pods:,} | web replicas ({BEFORE}) | not measured: "
                          f"{' '.join(str(exc).split())[:300]} |", flush=True)
                    continue
            print(row(namespaces, pods, f"web replicas ({BEFORE})", f, args.demote), flush=True)
    print()
    print("Controller tasks, p50 / max (runs seen):")
    print()
    print("| namespaces | GPU pods | " + " | ".join(TASKS) + " |")
    print("| ---: | ---: |" + " ---: |" * len(TASKS))
    print("\n".join(tasks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
