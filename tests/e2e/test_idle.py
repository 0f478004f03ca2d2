"""Idle GPUs on a real control plane: a Deployment's pod whose meter (the real meter, reading a fake NVML that plays a
utilisation trace) reads an idle GPU is warned of, then demoted through the Eviction API within its
PodDisruptionBudget; its Deployment's replacement is admitted out of budget by the webhook until it uses its GPU;
a pod whose meter reads no utilisation is never acted on; the API server refuses an idle policy that cannot be one.

No kubelet runs here: the tests write each pod's status as a kubelet would (started, running, ready).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.apiserver import EXAMPLES
from demo.processes import Service
from gpusharing.contract import MeterEnv
from tests.e2e.system import ApiError, GpuSharing, wait_for
from tests.e2e.test_gpubudgets import budget_path, gpu_budget
from tests.sidecar.fake_nvml import TRACE_ENV

ROOT = Path(__file__).resolve().parents[2]
METER_INTERVAL = 0.5


@pytest.fixture(scope="module")
def timekeeper(gpusharing: GpuSharing) -> Iterator[Service]:
    """The system's timekeeper, on its own address (which the webhook polls), and its controller, passing the idle
    policies every half second and judging meters that report every half second."""
    with gpusharing.timekeeper_settings(TIMEKEEPER_BILLING_INTERVAL_SECONDS="0.5",
                                        GPUSHARING_METER_INTERVAL_SECONDS=str(2 * METER_INTERVAL)):
        yield gpusharing.timekeeper


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(gpusharing: GpuSharing, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod started, running and ready, as its kubelet would say."""
    metadata = pod["metadata"]
    status = {"phase": "Running", "startTime": now(), "conditions": [{"type": "Ready", "status": "True"}],
              "containerStatuses": [{"name": c["name"], "image": "x", "imageID": "", "ready": True, "restartCount": 0,
                                     "state": {"running": {"startedAt": now()}}} for c in pod["spec"]["containers"]]}
    path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
    return dict(gpusharing.rest("PATCH", path, {"status": status}, patch="merge"))


class Meters:
    """Real meter processes, each for one pod, reading a fake NVML that plays its trace."""

    def __init__(self, gpusharing: GpuSharing, directory: Path):
        self.gpusharing, self.directory = gpusharing, directory
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, pod: dict[str, Any], trace: list[float | None]) -> None:
        metadata = pod["metadata"]
        workdir = self.directory / metadata["name"]
        workdir.mkdir()
        (workdir / "token").write_text(self.gpusharing.token(metadata["namespace"], "default", pod=pod))
        env = {
            **os.environ,
            MeterEnv.NAMESPACE: metadata["namespace"],
            MeterEnv.POD_NAME: metadata["name"],
            MeterEnv.POD_UID: metadata["uid"],
            MeterEnv.GPU_SHARE: metadata["annotations"]["gpusharing.io/gpu-share"],
            MeterEnv.TIMEKEEPER_URL: self.gpusharing.timekeeper_url,
            MeterEnv.TOKEN_PATH: str(workdir / "token"),
            MeterEnv.STATE_DIR: str(workdir / "state"),
            MeterEnv.INTERVAL: str(METER_INTERVAL),
            "GPUSHARING_METER_GPU_READER": "tests.sidecar.fake_nvml:open_reader",
            TRACE_ENV: json.dumps(trace),
        }
        log = (workdir / "meter.log").open("wb")
        self.processes.append(subprocess.Popen([sys.executable, "-m", "gpusharing.cli", "meter"], env=env, cwd=ROOT,
                                               stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture
def meters(gpusharing: GpuSharing, tmp_path: Path) -> Iterator[Meters]:
    running = Meters(gpusharing, tmp_path)
    yield running
    running.stop()


def events(gpusharing: GpuSharing, namespace: str, reason: str) -> list[dict[str, Any]]:
    return [
        e for e in gpusharing.rest("GET", f"/api/v1/namespaces/{namespace}/events")["items"] if e["reason"] == reason
    ]


def idle_actions(gpusharing: GpuSharing, result: str) -> float:
    lines = [line for line in gpusharing.controller_metrics().splitlines()
             if line.startswith(f'gpusharing_timekeeper_idle_actions_total{{action="demote",result="{result}"}}')]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


def holds(gpusharing: GpuSharing, namespace: str) -> list[dict[str, Any]]:
    answer = gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token())
    assert answer.status_code == 200, answer.text
    return list(answer.json()["idleHolds"])


def test_an_idle_pod_is_warned_of_then_demoted_within_its_disruption_budget_and_its_replacement_runs_out_of_budget(
    gpusharing: GpuSharing, timekeeper: Service, meters: Meters,
) -> None:
    gpusharing.require_controllers()
    namespace = gpusharing.namespace("e2e-idle")
    idle = {"after": "4s", "action": "demote", "warnBefore": "2s"}
    gpusharing.rest("POST", budget_path(namespace), gpu_budget(namespace, gpuMinutes=6000, idle=idle))
    wait_for(lambda: (gpusharing.timekeeper_call("GET", f"/api/v1/budgets/{namespace}", gpusharing.budget_admin_token())
                      .json().get("idle") or {}).get("action") == "demote", "the GPUBudget's idle policy in the ledger")
    template = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    template["metadata"] = {"labels": {"app": "nb"}, "annotations": template["metadata"]["annotations"]}
    gpusharing.create(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "nb"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "nb"}}, "template": template},
        },
    )
    (pod,) = wait_for(lambda: gpusharing.pods(namespace, "app=nb"), "the Deployment's pod")
    assert pod["spec"]["priorityClassName"] == "gpusharing-in-budget"
    pod = run(gpusharing, pod)
    gpusharing.create(namespace, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "nb"},
                                  "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "nb"}}}})
    pdb = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/nb"
    wait_for(
        lambda: gpusharing.rest("GET", pdb).get("status", {}).get("currentHealthy") == 1,
        "the disruption controller to count the pod",
    )
    # A bare pod beside it whose meter reads no utilisation (no NVML data): unknown, never acted on.
    blind = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    blind["metadata"]["name"] = "blind"
    blind = run(gpusharing, gpusharing.create(namespace, blind))
    meters.start(pod, [0])
    meters.start(blind, [None])

    (warning, *_) = wait_for(lambda: events(gpusharing, namespace, "GPUIdleWarning"), "the GPUIdleWarning Event")
    assert (
        warning["involvedObject"]["name"] == pod["metadata"]["name"] and "it will be demoted at" in warning["message"]
    )
    (held,) = wait_for(lambda: holds(gpusharing, namespace), "the Deployment's ReplicaSet held out of budget")
    assert (held["kind"], held["pod"]) == ("ReplicaSet", pod["metadata"]["name"])
    wait_for(
        lambda: idle_actions(gpusharing, "refused") >= 2,
        "the eviction to be refused by the PodDisruptionBudget, and tried again",
    )
    assert "deletionTimestamp" not in (gpusharing.pod(namespace, pod["metadata"]["name"]) or {}).get("metadata", {})

    gpusharing.rest("DELETE", pdb)
    replacement = wait_for(
        lambda: [p for p in gpusharing.pods(namespace, "app=nb") if p["metadata"]["uid"] != pod["metadata"]["uid"]],
        "the Deployment to replace its evicted pod",
    )[0]
    evicted = gpusharing.pod(namespace, pod["metadata"]["name"])
    assert evicted is None or evicted["metadata"].get("deletionTimestamp")
    assert replacement["spec"]["priorityClassName"] == "gpusharing-over-budget"
    assert replacement["metadata"]["annotations"]["gpusharing.io/idle-hold"] == f"ReplicaSet/{held['name']}"
    told = {
        e["involvedObject"]["kind"]: e["message"]
        for e in wait_for(lambda: events(gpusharing, namespace, "GPUIdle"), "GPUIdle")
    }
    assert told["Pod"].endswith(
        f"; evicted; ReplicaSet {held['name']}'s next pods are admitted out of budget until one uses its GPU"
    )
    wait_for(lambda: "Deployment" in {e["involvedObject"]["kind"] for e in events(gpusharing, namespace, "GPUIdle")},
             "the GPUIdle Event on the Deployment that owns the pod's ReplicaSet")

    # The replacement uses its GPU: its owner is back in budget, and so are the pods it makes next.
    meters.start(run(gpusharing, replacement), [85])
    wait_for(lambda: holds(gpusharing, namespace) == [], "the hold to end")
    probe = yaml.safe_load((EXAMPLES / "kai-fraction.yaml").read_text())
    probe["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": held["name"],
                                             "uid": held["uid"], "controller": True}]
    wait_for(
        lambda: (
            gpusharing.create(namespace, probe, dry_run=True)["spec"]["priorityClassName"] == "gpusharing-in-budget"
        ),
        "the webhook to admit the ReplicaSet's pods in budget again",
    )
    assert not [e for e in events(gpusharing, namespace, "GPUIdle") + events(gpusharing, namespace, "GPUIdleWarning")
                if e["involvedObject"]["name"] == "blind"]


@pytest.mark.parametrize(
    ("idle", "message"),
    [
        (
            {"after": "4 hours"},
            "idle.after is a duration from 1s to 8760h, as Kubernetes writes it (e.g. 4h, 30m, 90s)",
        ),
        ({"after": "0s"}, "idle.after is a duration from 1s to 8760h"),
        (
            {"after": "1h", "warnBefore": "2h"},
            "idle.warnBefore must be shorter than idle.after (the warning comes before the action)",
        ),
        ({"after": "1h", "utilisationPercent": 0}, "idle.utilisationPercent is a percent above 0 and at most 100"),
        ({"after": "1h", "action": "delete"}, 'spec.idle.action: Unsupported value: "delete"'),
        ({"warnBefore": "1m"}, "spec.idle.after: Required value"),
    ],
)
def test_the_api_server_refuses_an_idle_policy_that_cannot_be_one(
    gpusharing: GpuSharing, idle: dict[str, Any], message: str
) -> None:
    namespace = gpusharing.namespace("e2e-idle-cel")
    with pytest.raises(ApiError) as refused:
        gpusharing.rest("POST", budget_path(namespace), gpu_budget(namespace, gpuMinutes=10, idle=idle))
    assert refused.value.status == 422 and message in refused.value.message
