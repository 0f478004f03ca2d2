"""`gpusharing node-agent` as the DaemonSet runs it: a process that sends its node's batches every interval until
SIGTERM, through the NVML seam (a fake driver playing a trace), a real kubelet socket and /proc on disk; a bad
setting or a node without NVML stops it at start with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nodeagent.conftest import ReadingsEndpoint
from tests.nodeagent.fake_nvml import MIB, TRACE_ENV, write_trace
from tests.nodeagent.kubelet import FakeKubelet, KubeletSocket, Pod, node_view, systemd_cgroup
from tests.sidecar import fake_gpu

ROOT = Path(__file__).resolve().parents[2]  # the agent imports the tests' fake driver from here
A = "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f"
GPU0 = "GPU-5b2b8a1e-0000-1111-2222-333344445555"


def agent_env(tmp_path: Path, endpoint: ReadingsEndpoint, socket: Path, **change: str) -> dict[str, str]:
    pods = [Pod("team-a", "trainer", A, {"nvidia.com/gpu": [GPU0]})]
    proc, logs = node_view(tmp_path, {4242: systemd_cgroup(A)}, pods)
    (tmp_path / "token").write_text("node-agent-token")
    trace = write_trace(
        tmp_path / "trace.json", [{"uuid": GPU0, "processes": {"4242": 3 * 1024 * MIB}, "busy": {"4242": 40}}]
    )
    return {
        **os.environ,
        "GPUSHARING_NODE_AGENT_NODE_NAME": "gpu-node-1",
        "GPUSHARING_NODE_AGENT_TIMEKEEPER_URL": endpoint.url,
        "GPUSHARING_NODE_AGENT_TOKEN_PATH": str(tmp_path / "token"),
        "GPUSHARING_NODE_AGENT_INTERVAL_SECONDS": "0.3",
        "GPUSHARING_NODE_AGENT_PODRESOURCES_SOCKET": str(socket),
        "GPUSHARING_NODE_AGENT_PROC_ROOT": str(proc),
        "GPUSHARING_NODE_AGENT_POD_LOGS": str(logs),
        "GPUSHARING_NODE_AGENT_NVML": "tests.nodeagent.fake_nvml:open_nvml",
        TRACE_ENV: str(trace),
        **change,
    }


def test_sends_its_nodes_readings_every_interval_until_sigterm_then_exits_0(
    tmp_path: Path, socket_dir: Path, endpoint: ReadingsEndpoint
) -> None:
    kubelet = KubeletSocket(
        socket_dir / "kubelet.sock", FakeKubelet([Pod("team-a", "trainer", A, {"nvidia.com/gpu": [GPU0]})])
    ).start()
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpusharing.cli", "node-agent"],
        env=agent_env(tmp_path, endpoint, kubelet.socket),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        batches = endpoint.wait_for(2)
        agent.send_signal(signal.SIGTERM)
        output, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
        kubelet.stop()
    assert agent.returncode == 0, output
    assert {b.authorization for b in batches} == {"Bearer node-agent-token"}
    assert [b.body["node"] for b in batches] == ["gpu-node-1"] * 2
    assert batches[1].body["readings"] == [
        {"podUid": A, "namespace": "team-a", "pod": "trainer", "utilisationPercent": 40.0, "memoryUsedMiB": 3072.0}
    ]


def test_a_bad_setting_stops_it_at_start_with_one_line(
    tmp_path: Path, socket_dir: Path, endpoint: ReadingsEndpoint
) -> None:
    env = agent_env(tmp_path, endpoint, socket_dir / "kubelet.sock", GPUSHARING_NODE_AGENT_INTERVAL_SECONDS="soon")
    result = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "node-agent"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == "gpusharing: GPUSHARING_NODE_AGENT_INTERVAL_SECONDS='soon' must be a finite number\n"


@pytest.mark.skipif(fake_gpu.nvidia_driver_present(), reason="an NVIDIA driver is present")
def test_without_nvml_it_stops_at_start_saying_what_to_check(
    tmp_path: Path, socket_dir: Path, endpoint: ReadingsEndpoint
) -> None:
    env = agent_env(
        tmp_path, endpoint, socket_dir / "kubelet.sock", GPUSHARING_NODE_AGENT_NVML="nodeagent.devices:open_nvml"
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpusharing.cli", "node-agent"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "the node agent cannot read the GPUs through NVML" in result.stderr
        and "NVIDIA_VISIBLE_DEVICES=all" in result.stderr
    )
    assert endpoint.received == []
