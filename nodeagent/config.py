"""The node agent's settings, read once at start from the environment the chart's DaemonSet gives it (documented in
docs/reference/settings.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpusharing.contract import (
    DEFAULT_METER_INTERVAL_SECONDS,
    METER_TOKEN_DIR,
    METER_TOKEN_FILE,
    MIN_METER_INTERVAL_SECONDS,
)
from gpusharing.gpu.dialects import ALIYUN_CORE, ALIYUN_MEMORY, NVIDIA_GPU, VCUDA_CORE, VCUDA_MEMORY, HamiSettings
from gpusharing.gpu.mig import MIG_RESOURCE_PREFIX
from gpusharing.names import NODE_NAME, InvalidName
from gpusharing.settings.env import ConfigError, env_code, env_float, env_list, env_text, env_url
from gpusharing.utilisation import MAX_WINDOW_SECONDS

PREFIX = "GPUSHARING_NODE_AGENT_"
NODE = PREFIX + "NODE_NAME"
TIMEKEEPER_URL = PREFIX + "TIMEKEEPER_URL"
TOKEN_PATH = PREFIX + "TOKEN_PATH"
INTERVAL = PREFIX + "INTERVAL_SECONDS"
PODRESOURCES_SOCKET = PREFIX + "PODRESOURCES_SOCKET"
PROC_ROOT = PREFIX + "PROC_ROOT"
POD_LOGS = PREFIX + "POD_LOGS"
RESOURCES = PREFIX + "RESOURCES"
NVML = PREFIX + "NVML"

DEFAULT_NVML = "nodeagent.devices:open_nvml"
_HAMI = HamiSettings()
# Every dialect the webhook reads, as the device plugins name what they hand out (a trailing * matches any suffix):
# NVIDIA's whole GPUs, time-sliced replicas and MIG instances; gpu-manager's vcuda; HAMi's (its count is
# nvidia.com/gpu); gpushare's.
DEFAULT_RESOURCES = (
    NVIDIA_GPU, f"{NVIDIA_GPU}.shared", f"{MIG_RESOURCE_PREFIX}*", VCUDA_CORE, VCUDA_MEMORY,
    _HAMI.memory, _HAMI.memory_percentage, _HAMI.cores, ALIYUN_MEMORY, ALIYUN_CORE,
)


@dataclass(frozen=True)
class NodeAgentConfig:
    """The node agent's settings (`from_env`)."""

    node: str  # the node this agent runs on: spec.nodeName, from the downward API
    timekeeper_url: str
    # projected token (audience gpusharing-timekeeper), re-read per report
    token_path: Path = Path(METER_TOKEN_DIR) / METER_TOKEN_FILE
    interval_seconds: float = DEFAULT_METER_INTERVAL_SECONDS  # one batch per interval, as a meter reports
    podresources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    proc_root: Path = Path("/host/proc")  # the host's /proc, mounted read-only
    pod_logs: Path = Path("/var/log/pods")  # the kubelet's <namespace>_<pod>_<uid> directories: a pod's uid by its name
    resources: tuple[str, ...] = DEFAULT_RESOURCES  # the GPU resources that make a pod governed here
    nvml: str = DEFAULT_NVML  # module:function giving the NVML module (pynvml), initialised; tests name a fake

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "NodeAgentConfig":
        node = env_text(NODE, environ=environ)
        try:
            NODE_NAME.check(node, NODE)
        except InvalidName as exc:
            raise ConfigError(str(exc)) from None
        resources = env_list(RESOURCES, DEFAULT_RESOURCES, environ)
        for pattern in resources:
            if "*" in pattern[:-1]:
                raise ConfigError(f"{RESOURCES}: {pattern!r} may end with * (any suffix), and hold no other *")
        return cls(
            node=node,
            timekeeper_url=str(env_url(TIMEKEEPER_URL, environ=environ, required=True)),
            token_path=Path(env_text(TOKEN_PATH, str(cls.token_path), environ)),
            interval_seconds=env_float(INTERVAL, cls.interval_seconds, MIN_METER_INTERVAL_SECONDS, environ,
                                       maximum=MAX_WINDOW_SECONDS),
            podresources_socket=Path(env_text(PODRESOURCES_SOCKET, str(cls.podresources_socket), environ)),
            proc_root=Path(env_text(PROC_ROOT, str(cls.proc_root), environ)),
            pod_logs=Path(env_text(POD_LOGS, str(cls.pod_logs), environ)),
            resources=resources,
            nvml=env_code(NVML, DEFAULT_NVML, environ),
        )


def governs(resource: str, patterns: tuple[str, ...]) -> bool:
    """Whether a device plugin's resource name is one of `patterns` (each exact, or a prefix before a trailing *)."""
    return any(resource.startswith(p[:-1]) if p.endswith("*") else resource == p for p in patterns)
