"""`gpusharing node-agent`: the DaemonSet on GPU nodes that reports each governed pod's GPU utilisation, read on the
node, to the timekeeper."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = subparsers.add_parser(
        "node-agent",
        help="the node agent: report the GPU utilisation of this node's governed pods to the timekeeper until SIGTERM",
        description="Settings come from GPUSHARING_NODE_AGENT_* environment variables "
        "(docs/reference/settings.md#the-node-agent).",
    )
    agent.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    # Imported here so that the other roles' commands load neither gRPC nor NVML.
    from gpusharing.serving.delivery import TokenPoster
    from nodeagent.agent import NodeAgent
    from nodeagent.config import NodeAgentConfig
    from nodeagent.devices import Gpus, NvmlUnavailable, load_nvml
    from nodeagent.kubelet import PodResources

    config = NodeAgentConfig.from_env()
    try:
        nvml = load_nvml(config.nvml)
    except NvmlUnavailable as exc:
        log.error("the node agent cannot read the GPUs through NVML (%s): is the container given the driver "
                  "(NVIDIA_VISIBLE_DEVICES=all, the NVIDIA runtime or its runtimeClassName)?", exc)
        return 1
    stop = threading.Event()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: stop.set())
    kubelet = PodResources(config.podresources_socket, config.resources)
    poster = TokenPoster(config.timekeeper_url, config.token_path)
    try:
        NodeAgent(config, kubelet, Gpus(nvml), poster, stop=stop).run()
    finally:
        kubelet.close()
        poster.close()
    return 0
