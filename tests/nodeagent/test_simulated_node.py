"""The cluster tier's node agent for a simulated node (tests/cluster/nodeagents.py), here against a timekeeper's
endpoint on loopback: the pods the simulator runs there are reported, busy, idle or unknown as it says, and the ones
it removes no longer are."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.nodeagents import SimulatedNodeAgent
from tests.nodeagent.conftest import ReadingsEndpoint

A, B, C = (
    "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "1c9b4d2f-3a5e-4d66-8e1f-7b8c9d0e1f2a",
    "2dac5e3a-4b6f-4e77-9f2a-8c9d0e1f2a3b",
)


def readings(endpoint: ReadingsEndpoint, after: int) -> dict[str, float | None]:
    """The pods' utilisation in the first batch sent after `after` batches."""
    batch = endpoint.wait_for(after + 1)[after].body
    return {r["pod"]: r.get("utilisationPercent") for r in batch["readings"]}


def test_a_simulated_nodes_agent_reports_the_pods_it_is_told_run_there(
    tmp_path: Path, endpoint: ReadingsEndpoint
) -> None:
    token = tmp_path / "token"
    token.write_text("node-agent-token")
    agent = SimulatedNodeAgent("gpu-node-1", endpoint.url, token, tmp_path / "gpu-node-1", interval=0.3)
    agent.run_pod("team-a", "busy", A, {"nvidia.com/gpu": [agent.gpu(0)]}, utilisation=55)
    agent.run_pod("team-a", "idle", B, {"nvidia.com/gpu": [agent.gpu(1)]}, utilisation=0)
    agent.run_pod("team-b", "unknown", C, {"nvidia.com/gpu": [agent.gpu(2)]}, utilisation=None)
    agent.start()
    try:
        seen = len(endpoint.wait_for(2))  # the first batch's window may begin before the trace was read
        assert readings(endpoint, seen) == {"busy": 55.0, "idle": 0.0, "unknown": None}
        agent.set_utilisation(B, 30)
        agent.remove_pod(A)
        seen = len(endpoint.wait_for(seen + 2))
        assert readings(endpoint, seen) == {"idle": 30.0, "unknown": None}
    finally:
        assert agent.stop() == 0
    assert endpoint.received[0].authorization == "Bearer node-agent-token"
    assert {r.body["node"] for r in endpoint.received} == {"gpu-node-1"}
