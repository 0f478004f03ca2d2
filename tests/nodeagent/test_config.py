"""NodeAgentConfig: the agent starts only on a complete, well-formed environment, and says which variable is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusharing.settings.env import ConfigError
from nodeagent.config import DEFAULT_RESOURCES, NodeAgentConfig, governs

ENV = {
    "GPUSHARING_NODE_AGENT_NODE_NAME": "gpu-node-1",
    "GPUSHARING_NODE_AGENT_TIMEKEEPER_URL": "http://gpusharing-timekeeper:8080/",
}


def test_defaults_are_the_charts_wiring() -> None:
    config = NodeAgentConfig.from_env(ENV)
    assert config == NodeAgentConfig(
        node="gpu-node-1",
        timekeeper_url="http://gpusharing-timekeeper:8080",
        token_path=Path("/var/run/secrets/gpusharing/token"),
        interval_seconds=30.0,
        podresources_socket=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
        proc_root=Path("/host/proc"),
        pod_logs=Path("/var/log/pods"),
        resources=DEFAULT_RESOURCES,
        nvml="nodeagent.devices:open_nvml",
    )


def test_every_setting_is_read() -> None:
    config = NodeAgentConfig.from_env({
        **ENV,
        "GPUSHARING_NODE_AGENT_TOKEN_PATH": "/t/token",
        "GPUSHARING_NODE_AGENT_INTERVAL_SECONDS": "10",
        "GPUSHARING_NODE_AGENT_PODRESOURCES_SOCKET": "/k/kubelet.sock",
        "GPUSHARING_NODE_AGENT_PROC_ROOT": "/p",
        "GPUSHARING_NODE_AGENT_POD_LOGS": "/l",
        "GPUSHARING_NODE_AGENT_RESOURCES": "nvidia.com/gpu, example.com/vgpu-*",
        "GPUSHARING_NODE_AGENT_NVML": "tests.nodeagent.fake_nvml:open_nvml",
    })
    assert (
        config.token_path,
        config.interval_seconds,
        config.podresources_socket,
        config.proc_root,
        config.pod_logs,
    ) == (Path("/t/token"), 10.0, Path("/k/kubelet.sock"), Path("/p"), Path("/l"))
    assert config.resources == ("nvidia.com/gpu", "example.com/vgpu-*")
    assert config.nvml == "tests.nodeagent.fake_nvml:open_nvml"


def test_the_default_resources_are_every_dialect_the_webhook_reads() -> None:
    governed = [
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb.me",
        "tencent.com/vcuda-core",
        "tencent.com/vcuda-memory",
        "nvidia.com/gpumem",
        "nvidia.com/gpucores",
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-core.percentage",
    ]
    assert all(governs(name, DEFAULT_RESOURCES) for name in governed)
    assert not any(
        governs(name, DEFAULT_RESOURCES)
        for name in ["nvidia.com/gpu-other", "example.com/nic", "cpu", "nvidia.com/mig"]
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"GPUSHARING_NODE_AGENT_NODE_NAME": ""}, "GPUSHARING_NODE_AGENT_NODE_NAME must be set"),
        (
            {"GPUSHARING_NODE_AGENT_NODE_NAME": "GPU_Node"},
            "GPUSHARING_NODE_AGENT_NODE_NAME 'GPU_Node' is not a node name",
        ),
        ({"GPUSHARING_NODE_AGENT_TIMEKEEPER_URL": ""}, "GPUSHARING_NODE_AGENT_TIMEKEEPER_URL must be set"),
        ({"GPUSHARING_NODE_AGENT_TIMEKEEPER_URL": "timekeeper:8080"}, "must be an http:// or https:// URL"),
        ({"GPUSHARING_NODE_AGENT_INTERVAL_SECONDS": "0"}, "GPUSHARING_NODE_AGENT_INTERVAL_SECONDS"),
        ({"GPUSHARING_NODE_AGENT_INTERVAL_SECONDS": "7200"}, "GPUSHARING_NODE_AGENT_INTERVAL_SECONDS"),
        (
            {"GPUSHARING_NODE_AGENT_RESOURCES": "nvidia.com/*gpu"},
            "'nvidia.com/*gpu' may end with * (any suffix), and hold no other *",
        ),
        ({"GPUSHARING_NODE_AGENT_NVML": "pynvml"}, "GPUSHARING_NODE_AGENT_NVML='pynvml' must be module:function"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        NodeAgentConfig.from_env({**ENV, **change})
    assert message in str(refused.value)
