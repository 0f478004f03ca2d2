"""`make demo`: the whole system on loopback, on its embedded defaults.

The timekeeper on SQLite, its controller against a stand-in Kubernetes API on loopback (demo/kubeapi.py), the
webhook over TLS with a fresh certificate, the example pods sent as the API server sends them, three of them run
with their meters until the demo namespace is over budget, the controller's Events and evictions, the next pod
demoted, and a top-up promoting the namespace back. Everything it starts is stopped at the end.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests

from demo.apiserver import admission_review, apply_patch, example_manifests, example_pod
from demo.kubeapi import FakeKube
from demo.processes import COMMAND, Service, free_port, run_command
from gpusharing.serving.certs import make_serving_certificate

NAMESPACE = "ml-team"
BUDGET_GPU_MINUTES = 1
# The pods started this long before the demo runs them: the controller bills each from its recorded start (the meters'
# reports are evidence, never more than the record allows), so the namespace runs out within seconds.
STARTED_SECONDS_AGO = 40
ADMIN, READER, METER = "demo-admin-token", "demo-reader-token", "demo-meter-token"
METERED = ("vcuda-fraction.yaml", "hami-fraction.yaml", "kai-fraction.yaml")
REFRESH_SECONDS = 0.5  # how often each webhook worker polls the timekeeper
CONTROLLER_INTERVALS = ("TIMEKEEPER_DEMOTION_INTERVAL_SECONDS", "TIMEKEEPER_STATUS_INTERVAL_SECONDS",
                        "TIMEKEEPER_ENDED_INTERVAL_SECONDS", "TIMEKEEPER_BILLING_INTERVAL_SECONDS")


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def invalid_examples() -> dict[str, dict[str, Any]]:
    """Mistakes the webhook catches at admission instead of at the node."""
    vcuda = example_pod("vcuda-fraction.yaml", NAMESPACE)
    for kind in ("limits", "requests"):
        vcuda["spec"]["containers"][0]["resources"][kind]["tencent.com/vcuda-core"] = "150"
    kai = example_pod("kai-fraction.yaml", NAMESPACE)
    kai["metadata"]["annotations"]["gpu-fraction"] = "1.5"
    mixed = example_pod("hami-fraction.yaml", NAMESPACE)
    mixed["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    return {"(invalid) vcuda-core 150": vcuda, "(invalid) gpu-fraction 1.5": kai, "(invalid) KAI + HAMi": mixed}


class Decisions:
    """The webhook's answers, printed as a table."""

    WIDTHS = (32, 8, 15, 6, 23, 14)

    def __init__(self, url: str, ca_file: str):
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = ca_file
        self.header_printed = False

    def admit(self, name: str, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod as admitted (patched), or None when denied; prints the decision."""
        if not self.header_printed:
            columns = ("pod", "decision", "dialect", "share", "priority class", "sidecar")
            print("  ".join(c.ljust(w) for c, w in zip(columns, self.WIDTHS)))
            print("  ".join("-" * w for w in self.WIDTHS))
            self.header_printed = True
        answer = self.session.post(f"{self.url}/mutate", json=admission_review(pod), timeout=10)
        answer.raise_for_status()
        response = answer.json()["response"]
        if not response["allowed"]:
            print(f"{name[:32]:32}  {'DENIED':8}  {response['status']['message']}")
            return None
        patch = json.loads(base64.b64decode(response["patch"])) if "patch" in response else []
        admitted: dict[str, Any] = apply_patch(pod, patch)
        annotations = admitted["metadata"].get("annotations", {})
        meter = any(c["name"] == "gpusharing-meter" for c in admitted["spec"].get("initContainers", []))
        cells = (
            name,
            "allowed",
            annotations.get("gpusharing.io/dialect", "-"),
            annotations.get("gpusharing.io/gpu-share", "-"),
            admitted["spec"].get("priorityClassName", "-"),
            "native sidecar" if meter else "-",
        )
        print("  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, self.WIDTHS)))
        for warning in response.get("warnings", []):
            print(f"{'':32}  warning: {warning}")
        return admitted


def gpusharing(*args: str, env: dict[str, str]) -> str:
    result = run_command(*args, env=env)
    if result.returncode != 0:
        raise SystemExit(f"gpusharing {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def budget_state(timekeeper: str) -> dict[str, Any]:
    answer = requests.get(
        f"{timekeeper}/api/v1/budgets/{NAMESPACE}", headers={"Authorization": f"Bearer {READER}"}, timeout=5
    )
    answer.raise_for_status()
    return answer.json()


def wait_until(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: timed out waiting for {what}")
        time.sleep(0.2)


def run_on_node(kube: FakeKube, admitted: dict[str, Any]) -> dict[str, Any]:
    """The admitted pod as the API server would hold it once a kubelet runs it: named, with a uid, Running."""
    metadata = admitted["metadata"]
    name = metadata.get("name") or metadata["generateName"] + "x1"
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - STARTED_SECONDS_AGO))
    pod = {**admitted, "metadata": {**metadata, "name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4())},
           "status": {"phase": "Running", "startTime": started}}
    return kube.run_pod(pod)


def start_meter(pod: dict[str, Any], directory: Path, timekeeper: str, token_file: Path) -> subprocess.Popen[bytes]:
    """A meter as the kubelet would run the injected sidecar: its environment from the pod."""
    meter = next(c for c in pod["spec"]["initContainers"] if c["name"] == "gpusharing-meter")
    env = {e["name"]: e["value"] for e in meter["env"] if "value" in e}
    name = pod["metadata"]["name"]
    state = directory / f"meter-{name}"
    state.mkdir()
    env.update(
        GPUSHARING_NAMESPACE=NAMESPACE,
        GPUSHARING_POD_NAME=name,
        GPUSHARING_POD_UID=pod["metadata"]["uid"],
        GPUSHARING_TIMEKEEPER_URL=timekeeper,
        GPUSHARING_TOKEN_PATH=str(token_file),
        GPUSHARING_METER_STATE_DIR=str(state),
        GPUSHARING_METER_INTERVAL="0.5",
    )
    log = open(directory / f"meter-{name}.log", "wb")
    return subprocess.Popen([*COMMAND, "meter"], env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpusharing-demo-") as tmp, ExitStack() as stack:
        directory = Path(tmp)
        tokens = directory / "tokens"
        tokens.write_text(f"{ADMIN} admin\n{READER} reader\n{METER} meter\n")
        (directory / "reader-token").write_text(READER)
        (directory / "meter-token").write_text(METER)
        database = f"sqlite:///{directory / 'timekeeper.sqlite'}"
        env = {**os.environ, "TIMEKEEPER_DATABASE_URL": database, "TIMEKEEPER_URL": "", "TIMEKEEPER_TOKEN": ADMIN}

        step(f"timekeeper on SQLite ({database}), static tokens")
        gpusharing("db", "upgrade", env=env)
        tk_port = free_port()
        timekeeper = f"http://127.0.0.1:{tk_port}"
        env["TIMEKEEPER_URL"] = timekeeper
        stack.enter_context(
            Service(
                "timekeeper",
                ["timekeeper", "serve", "--host", "127.0.0.1", "--port", str(tk_port)],
                f"{timekeeper}/readyz",
                # No Kubernetes API: a developer's KUBECONFIG must not lead the demo to their cluster.
                env={
                    "TIMEKEEPER_DATABASE_URL": database,
                    "TIMEKEEPER_AUTH": "static",
                    "TIMEKEEPER_STATIC_TOKENS_FILE": str(tokens),
                    "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS": "0.5",
                    "TIMEKEEPER_KUBECONFIG": "",
                    "KUBECONFIG": "",
                },
            )
        )
        print(f"    serving {timekeeper}")

        step("the timekeeper's controller, against a stand-in Kubernetes API on loopback")
        kube = FakeKube()
        stack.callback(kube.close)
        (directory / "kubeconfig").write_text(kube.kubeconfig())
        ctl_port = free_port()
        stack.enter_context(
            Service(
                "controller",
                ["timekeeper", "controller", "--host", "127.0.0.1", "--port", str(ctl_port)],
                f"http://127.0.0.1:{ctl_port}/readyz",
                env={"TIMEKEEPER_DATABASE_URL": database, "TIMEKEEPER_KUBECONFIG": str(directory / "kubeconfig"),
                     **dict.fromkeys(CONTROLLER_INTERVALS, "0.5")},
            )
        )
        print(f"    its tasks every 0.5 s; /metrics on http://127.0.0.1:{ctl_port}")

        step("webhook over TLS on loopback, with a fresh CA and serving certificate")
        paths = make_serving_certificate(["127.0.0.1", "localhost"]).write(directory / "tls")
        wh_port = free_port()
        webhook = f"https://127.0.0.1:{wh_port}"
        stack.enter_context(
            Service(
                "webhook",
                [
                    "webhook",
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(wh_port),
                    "--cert",
                    str(paths["cert"]),
                    "--key",
                    str(paths["key"]),
                ],
                f"{webhook}/readyz",
                env={
                    "GPUSHARING_TIMEKEEPER_URL": timekeeper,
                    "GPUSHARING_TIMEKEEPER_TOKEN_FILE": str(directory / "reader-token"),
                    "GPUSHARING_BUDGET_REFRESH_SECONDS": str(REFRESH_SECONDS),
                    # No Kubernetes API either: the webhook reads no resource claims.
                    "GPUSHARING_KUBECONFIG": "",
                    "KUBECONFIG": "",
                },
                verify=str(paths["ca"]),
            )
        )
        print(f"    serving {webhook}; budget states polled from the timekeeper every 0.5 s")

        step(f"admin: gpusharing budget set {NAMESPACE} --gpu-minutes {BUDGET_GPU_MINUTES} --period daily")
        gpusharing("budget", "set", NAMESPACE, "--gpu-minutes", str(BUDGET_GPU_MINUTES), "--period", "daily",
                   "--evict-on-exhaustion", env=env)
        print(gpusharing("budget", "ls", env=env), end="")
        webhook_learns(webhook, paths["ca"], "in-budget")

        step(f"the example pods of examples/, sent as the API server would (namespace {NAMESPACE})")
        decisions = Decisions(webhook, str(paths["ca"]))
        pods = {name: example_pod(name, NAMESPACE) for name in example_manifests()} | invalid_examples()
        admitted = {name: decisions.admit(name, pod) for name, pod in pods.items()}

        step(
            f"{', '.join(METERED)} run, started {STARTED_SECONDS_AGO} s ago, each with its meter, until {NAMESPACE} "
            "is over budget: the controller bills them from their recorded start"
        )
        running = [run_on_node(kube, pod) for name in METERED if (pod := admitted[name])]
        meters = [start_meter(pod, directory, timekeeper, directory / "meter-token") for pod in running]
        stack.callback(_stop_meters, meters)
        deadline = time.monotonic() + 60
        while (status := budget_state(timekeeper))["state"] != "over-budget":
            print(
                f"    used {status['usedGpuMinutes']:6.2f} of {status['gpuMinutes']:g} GPU-minutes ({status['state']})",
                flush=True,
            )
            if time.monotonic() > deadline:
                logs = "".join(log.read_text()[-400:] for log in directory.glob("meter-*.log"))
                raise SystemExit(f"demo: the namespace never went over budget; the meters said:\n{logs}")
            time.sleep(1)
        print(f"    used {status['usedGpuMinutes']:6.2f} of {status['gpuMinutes']:g} GPU-minutes: {status['state']}")

        step("the controller records the crossing and evicts the namespace's pods admitted in budget")
        wait_until(lambda: len(kube.evicted) == len(running), "the controller to evict the running pods")
        for namespace, name in kube.evicted:
            print(f"    evicted {namespace}/{name} through the Eviction API (PodDisruptionBudgets honoured)")
        wait_until(
            lambda: any(e["reason"] == "GPUBudgetExhausted" for e in kube.events), "the GPUBudgetExhausted Event"
        )
        for event in kube.events:
            print(f"    Event {event['type']} {event['reason']} on {event['involvedObject']['kind']} "
                  f"{event['involvedObject']['name']}: {event['message'][:90]}...")
        _stop_meters(meters)
        print("    meters stopped, as the kubelet stops evicted pods (SIGTERM: each sent its final report)")

        step("the next GPU pod of the namespace is demoted")
        webhook_learns(webhook, paths["ca"], "over-budget")
        decisions.admit("kai-memory.yaml (over budget)", example_pod("kai-memory.yaml", NAMESPACE))

        step(f"admin: gpusharing budget top-up {NAMESPACE} 5 --reason 'deadline'")
        gpusharing("budget", "top-up", NAMESPACE, "5", "--reason", "deadline", env=env)
        print(gpusharing("budget", "ls", env=env), end="")
        webhook_learns(webhook, paths["ca"], "in-budget")
        decisions.admit("kai-memory.yaml (topped up)", example_pod("kai-memory.yaml", NAMESPACE))

        today = dt.datetime.now(dt.timezone.utc).date()
        window = ("--from", str(today), "--to", str(today + dt.timedelta(days=1)))
        step(f"finance: gpusharing report accounts {' '.join(window)} (GPU-hours by the hour they were used)")
        print(gpusharing("report", "accounts", *window, env=env), end="")

        step("stopping everything")
    print(f"\n==> done in {time.monotonic() - started:.0f} s; nothing left running")
    return 0


def webhook_learns(webhook: str, ca_file: Path, state: str) -> None:
    """Waits until every webhook worker has the namespace's new state.

    Each gunicorn worker polls the timekeeper on its own: once one of them answers with the new state, the
    others have it within one more refresh interval.
    """
    wait_until(lambda: _webhook_sees(webhook, ca_file, state), f"the webhook to learn that {NAMESPACE} is {state}")
    time.sleep(2 * REFRESH_SECONDS)


def _webhook_sees(webhook: str, ca_file: Path, state: str) -> bool:
    """Whether the webhook now annotates a pod of the namespace with `state`."""
    pod = example_pod("kai-memory.yaml", NAMESPACE)
    answer = requests.post(f"{webhook}/mutate", json=admission_review(pod), verify=str(ca_file), timeout=5)
    patch = json.loads(base64.b64decode(answer.json()["response"]["patch"]))
    return apply_patch(pod, patch)["metadata"]["annotations"]["gpusharing.io/budget-state"] == state


def _stop_meters(meters: list[subprocess.Popen[bytes]]) -> None:
    for meter in meters:
        if meter.poll() is None:
            meter.terminate()
    for meter in meters:
        try:
            meter.wait(timeout=20)
        except subprocess.TimeoutExpired:
            meter.kill()
            meter.wait()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as failed:
        sys.exit(f"demo: {failed}")
