"""Billing that the billed cannot stop, on a real control plane: each governed pod is billed its share from the
kubelet's recorded start to its recorded end, pod by pod, by two timekeeper replicas on SQLite and on PostgreSQL;
what a namespace admin can do with the meter's word (a forged final, a forged seq, a silent meter) and with the
timekeepers down (a deletion) does not lower a bill.

No kubelet runs here: the tests write each pod's status as a kubelet would (startTime, running and terminated
containers), which is the record the timekeeper bills from.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client

from demo.apiserver import EXAMPLES
from demo.processes import Service
from gpusharing.contract import BILLING_FINALIZER, MeterEnv
from tests.e2e.system import ApiError, GpuSharing, wait_for

METER_INTERVAL_SECONDS = 2.0  # the bill of a pod is exact to within one of these
REPLICAS = 2


class Timekeepers:
    """Two replicas of the timekeeper, each with its controller, on one database, in place of the system's for this
    module."""

    def __init__(self, gpusharing: GpuSharing, database: str):
        self.gpusharing = gpusharing
        self.database = database
        self.services: list[Service] = []
        self.urls: list[str] = []

    def start(self) -> None:
        settings = {
            "TIMEKEEPER_BILLING_INTERVAL_SECONDS": "0.5",
            "GPUSHARING_METER_INTERVAL_SECONDS": str(METER_INTERVAL_SECONDS),
        }
        for index in range(REPLICAS):
            name = f"billing-{index}-{time.monotonic_ns()}"
            service, url = self.gpusharing.timekeeper_service(name, self.database, upgrade=index == 0, **settings)
            self.services += [
                service,
                self.gpusharing.controller_service(f"{name}-controller", self.database, **settings),
            ]
            self.urls.append(url)

    def stop(self) -> None:
        for service in self.services:
            service.stop()
        self.services, self.urls = [], []

    def call(self, method: str, path: str, token: str | None, body: Any = None, replica: int = 0) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.request(method, f"{self.urls[replica]}{path}", json=body, headers=headers, timeout=30)

    def ledger(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The pod's ledger as the timekeepers' API shows it (either replica: one database)."""
        namespace = pod["metadata"]["namespace"]
        answer = self.call("GET", f"/api/v1/pods?namespace={namespace}", self.gpusharing.budget_admin_token(),
                           replica=int(time.monotonic()) % REPLICAS)
        assert answer.status_code == 200, answer.text
        return next((p for p in answer.json()["items"] if p["podUid"] == pod["metadata"]["uid"]), None)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def timekeepers(
    request: pytest.FixtureRequest, gpusharing: GpuSharing, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Timekeepers]:
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path_factory.mktemp('billing') / 'timekeeper.sqlite'}"
    else:
        database = request.getfixturevalue("postgres").create_database(f"e2e_billing_{os.getpid()}")
    gpusharing.controller.stop()  # the system's own controller would bill (and release) the same pods
    replicas = Timekeepers(gpusharing, database)
    try:
        replicas.start()
        yield replicas
    finally:
        replicas.stop()
        gpusharing.controller.__enter__()


# --- a kubelet's part ---------------------------------------------------------------------------------------------

def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def instant(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def gpu_pod(gpusharing: GpuSharing, namespace: str, name: str, example: str = "kai-fraction.yaml") -> dict[str, Any]:
    pod = yaml.safe_load((EXAMPLES / example).read_text())
    pod["metadata"]["name"] = name
    return gpusharing.create(namespace, pod)


def set_status(gpusharing: GpuSharing, pod: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    metadata = pod["metadata"]
    path = f"/api/v1/namespaces/{metadata['namespace']}/pods/{metadata['name']}/status"
    return dict(gpusharing.rest("PATCH", path, {"status": status}, patch="merge"))


def start(gpusharing: GpuSharing, pod: dict[str, Any]) -> dict[str, Any]:
    names = [c["name"] for c in pod["spec"]["containers"]]
    return set_status(
        gpusharing,
        pod,
        {
            "phase": "Running",
            "startTime": now(),
            "containerStatuses": [
                {
                    "name": name,
                    "image": "x",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now()}},
                }
                for name in names
            ],
        },
    )


def finish(gpusharing: GpuSharing, pod: dict[str, Any], phase: str = "Succeeded") -> dict[str, Any]:
    names = [c["name"] for c in pod["spec"]["containers"]]
    return set_status(gpusharing, pod, {"phase": phase, "containerStatuses": [
        {"name": name, "image": "x", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now()}}} for name in names]})


def signal_blocked(pid: int, number: int) -> bool:
    """Whether the process blocks the signal now, as the kernel says (/proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    blocked = next(line.split(":", 1)[1] for line in status if line.startswith("SigBlk:"))
    return bool(int(blocked, 16) & 1 << (number - 1))


def recorded_seconds(pod: dict[str, Any]) -> float:
    status = pod["status"]
    finished = max(instant(c["state"]["terminated"]["finishedAt"]) for c in status["containerStatuses"])
    return (finished - instant(status["startTime"])).total_seconds()


def share_of(pod: dict[str, Any]) -> float:
    return float(pod["metadata"]["annotations"]["gpusharing.io/gpu-share"])


def closed(timekeepers: Timekeepers, pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's ledger once its bill is closed and its finalizer gone (or the pod with it)."""
    ledger = timekeepers.ledger(pod)
    stored = timekeepers.gpusharing.pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
    released = stored is None or BILLING_FINALIZER not in stored["metadata"].get("finalizers", [])
    return ledger if ledger is not None and ledger["endedAt"] and released else None


def assert_billed_as_recorded(ledger: dict[str, Any], pod: dict[str, Any]) -> None:
    expected = share_of(pod) * recorded_seconds(pod)
    assert abs(ledger["gpuSeconds"] - expected) <= share_of(pod) * METER_INTERVAL_SECONDS, (ledger, expected)


# --- the tests -----------------------------------------------------------------------------------------------------

def test_every_pod_is_billed_its_share_from_its_recorded_start_to_its_recorded_end(
    gpusharing: GpuSharing, timekeepers: Timekeepers,
) -> None:
    namespace = gpusharing.namespace("e2e-billing")
    pods = [gpu_pod(gpusharing, namespace, f"fraction-{i}") for i in range(3)]
    pods.append(gpu_pod(gpusharing, namespace, "hami", "hami-fraction.yaml"))
    assert all(BILLING_FINALIZER in p["metadata"]["finalizers"] for p in pods)  # the webhook's, on every governed pod
    pods = [start(gpusharing, pod) for pod in pods]
    wait_for(
        lambda: all((timekeepers.ledger(p) or {}).get("observedGpuSeconds") for p in pods),
        "the running pods' bills to grow",
    )
    ended = []
    for pod in pods:  # each ends at its own time
        time.sleep(1)
        ended.append(finish(gpusharing, pod))
    for pod in ended:
        ledger = wait_for(lambda pod=pod: closed(timekeepers, pod), f"the bill of {pod['metadata']['name']} to close")
        assert_billed_as_recorded(ledger, pod)
        assert ledger["meteredGpuSeconds"] == 0  # no meter runs here: the record alone


@pytest.mark.parametrize("forged", [{"final": True, "seq": 1}, {"final": False, "seq": 2**62}])
def test_a_forged_report_from_a_namespace_admin_does_not_stop_the_bill(
    gpusharing: GpuSharing, timekeepers: Timekeepers, forged: dict[str, Any],
) -> None:
    namespace = gpusharing.namespace("e2e-forged")
    tenant = gpusharing.namespace_admin(namespace)
    pod = start(gpusharing, gpu_pod(gpusharing, namespace, "trainer"))
    # A namespace admin mints the pod's own token for the timekeeper's audience, without touching the pod.
    minted = tenant.create_namespaced_service_account_token("default", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=["gpusharing-timekeeper"], expiration_seconds=3600,
                                       bound_object_ref=client.V1BoundObjectReference(
                                           api_version="v1", kind="Pod", name="trainer", uid=pod["metadata"]["uid"]))))
    body = {"podUid": pod["metadata"]["uid"], "namespace": namespace, "pod": "trainer", "gpuShare": share_of(pod),
            "gpuSeconds": 0.5, **forged}
    answer = timekeepers.call("POST", "/api/v1/reports", minted.status.token, body)
    assert answer.status_code == 200, answer.text  # accepted, as the pod's own meter's word: it is evidence
    time.sleep(3 * METER_INTERVAL_SECONDS)  # the pod keeps its GPU
    pod = finish(gpusharing, pod)
    ledger = wait_for(lambda: closed(timekeepers, pod), "the pod's bill to close")
    assert_billed_as_recorded(ledger, pod)
    assert recorded_seconds(pod) >= 3 * METER_INTERVAL_SECONDS


def test_a_pod_whose_meter_never_reports_is_billed_and_flagged(
    gpusharing: GpuSharing, timekeepers: Timekeepers
) -> None:
    namespace = gpusharing.namespace("e2e-silent")
    pod = start(gpusharing, gpu_pod(gpusharing, namespace, "quiet"))
    selector = f"involvedObject.kind=Pod,involvedObject.name=quiet,involvedObject.uid={pod['metadata']['uid']}"
    (event,) = wait_for(lambda: [e for e in gpusharing.rest("GET", f"/api/v1/namespaces/{namespace}/events",
                                                             query={"fieldSelector": selector})["items"]
                                 if e["reason"] == "MeterSilent"], "the MeterSilent Event on the pod")
    assert event["type"] == "Warning" and "billed from its recorded start all the same" in event["message"]
    ledger = timekeepers.ledger(pod)
    assert ledger is not None and ledger["meterSilentSince"] and ledger["gpuSeconds"] > 0
    metrics = requests.get(f"{timekeepers.urls[1]}/metrics", timeout=10).text
    assert [line for line in metrics.splitlines() if line.startswith("gpusharing_timekeeper_meters_silent ")] != [
        "gpusharing_timekeeper_meters_silent 0.0"]
    pod = finish(gpusharing, pod)
    assert_billed_as_recorded(wait_for(lambda: closed(timekeepers, pod), "the pod's bill to close"), pod)


def test_a_pod_deleted_while_every_timekeeper_is_down_is_billed_to_its_end(
    gpusharing: GpuSharing, timekeepers: Timekeepers
) -> None:
    namespace = gpusharing.namespace("e2e-downtime")
    pod = start(gpusharing, gpu_pod(gpusharing, namespace, "ephemeral"))
    wait_for(lambda: (timekeepers.ledger(pod) or {}).get("observedGpuSeconds"), "the pod to be observed")
    timekeepers.stop()
    gpusharing.rest("DELETE", f"/api/v1/namespaces/{namespace}/pods/ephemeral")
    time.sleep(2)
    pod = finish(gpusharing, pod, phase="Failed")  # the kubelet stopped its containers
    held = gpusharing.pod(namespace, "ephemeral")
    assert held is not None and held["metadata"].get("deletionTimestamp")  # Terminating: held for its bill
    time.sleep(3)  # downtime after its end, which is not billed
    timekeepers.start()
    ledger = wait_for(lambda: closed(timekeepers, pod), "the pod's bill to close after the timekeepers returned")
    assert_billed_as_recorded(ledger, pod)
    wait_for(lambda: gpusharing.pod(namespace, "ephemeral") is None, "the API server to let the pod go")


def test_a_meter_stopped_in_its_first_instant_exits_cleanly_and_the_bill_does_not_depend_on_it(
    gpusharing: GpuSharing, timekeepers: Timekeepers, tmp_path: Path,
) -> None:
    namespace = gpusharing.namespace("e2e-sigterm")
    pod = start(gpusharing, gpu_pod(gpusharing, namespace, "short"))
    token = tmp_path / "token"
    token.write_text(gpusharing.token(namespace, "default", pod=pod))
    env = {
        **os.environ,
        MeterEnv.NAMESPACE: namespace,
        MeterEnv.POD_NAME: "short",
        MeterEnv.POD_UID: pod["metadata"]["uid"],
        MeterEnv.GPU_SHARE: str(share_of(pod)),
        MeterEnv.TIMEKEEPER_URL: timekeepers.urls[0],
        MeterEnv.TOKEN_PATH: str(token),
        MeterEnv.STATE_DIR: str(tmp_path / "state"),
        MeterEnv.INTERVAL: "1",
    }
    meter = subprocess.Popen([sys.executable, "-m", "gpusharing.cli", "meter"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # Stopped in its first instant: as soon as it has blocked its stop signals (its first act; before that only the
    # interpreter runs), long before its libraries are loaded.
    wait_for(lambda: signal_blocked(meter.pid, signal.SIGTERM), "the meter to block SIGTERM")
    meter.send_signal(signal.SIGTERM)
    output, _ = meter.communicate(timeout=30)
    assert meter.returncode == 0, output.decode()
    time.sleep(2 * METER_INTERVAL_SECONDS)
    pod = finish(gpusharing, pod)
    assert_billed_as_recorded(wait_for(lambda: closed(timekeepers, pod), "the pod's bill to close"), pod)


def test_a_dra_pod_is_billed_for_what_its_claim_was_allocated_not_what_was_admitted(
    gpusharing: GpuSharing, timekeepers: Timekeepers,
) -> None:
    namespace = gpusharing.namespace("e2e-dra-billing")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"

    def claim(devices: int) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "gpus"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": devices}}]
                }
            },
        }

    gpusharing.rest("POST", claims, claim(1))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra"}, "spec": {
        "containers": [{"name": "ctr", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpus"}]}}
    admitted = wait_for(lambda: _created(gpusharing, namespace, pod), "the webhook to know the claim and admit the pod")
    assert share_of(admitted) == 1.0
    # Before the pod is scheduled, its claim is made again with four devices, and allocated (as the scheduler would).
    gpusharing.rest("DELETE", f"{claims}/gpus")
    wait_for(lambda: not _exists(gpusharing, f"{claims}/gpus"), "the claim to go")
    gpusharing.rest("POST", claims, claim(4))
    allocation = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": f"gpu-{i}"} for i in range(4)]}}}}
    gpusharing.rest("PATCH", f"{claims}/gpus/status", allocation, patch="merge")
    running = start(gpusharing, admitted)
    time.sleep(2)
    ended = finish(gpusharing, running)
    ledger = wait_for(lambda: closed(timekeepers, ended), "the pod's bill to close")
    assert ledger["gpuShare"] == 4.0
    assert abs(ledger["gpuSeconds"] - 4.0 * recorded_seconds(ended)) <= 4.0 * METER_INTERVAL_SECONDS


def _created(gpusharing: GpuSharing, namespace: str, pod: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return gpusharing.create(namespace, pod)
    except ApiError as exc:
        if "ResourceClaim" in exc.message:  # the webhook's watch has not brought it the claim yet
            return None
        raise


def _exists(gpusharing: GpuSharing, path: str) -> bool:
    try:
        gpusharing.rest("GET", path)
    except ApiError:
        return False
    return True
