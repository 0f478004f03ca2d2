"""The node agent's loop: every interval, one batch of the node's governed pods' readings to the timekeeper.

A reading is a measurement, not a bill: a batch the timekeeper cannot take is tried again until the next batch is
due, then dropped (the next one covers its own window), so nothing piles up however long the timekeeper is away.
A batch it refuses (4xx) is not tried again. When the kubelet or NVML cannot be read, nothing is sent for that
interval: no reading of the node's, rather than a wrong one, and the timekeeper falls back on the meters'.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpusharing.outage import Outage
from gpusharing.serving.delivery import Delivered, Delivery, TokenPoster
from gpusharing.utilisation import MAX_WINDOW_SECONDS, NodeReadings
from nodeagent.config import NodeAgentConfig
from nodeagent.devices import Gpus
from nodeagent.kubelet import KubeletUnavailable, PodResources
from nodeagent.pods import pod_uids, pods_of_processes
from nodeagent.readings import pod_readings

log = logging.getLogger(__name__)

READINGS_PATH = "/api/v1/node-readings"
REQUEST_TIMEOUT_SECONDS = 5.0
FIRST_RETRY_SECONDS = 0.5
MIN_WINDOW_SECONDS = 0.05


class NodeAgent:
    """Reads the node's governed pods every interval and posts their readings to the timekeeper as one batch."""

    def __init__(self, config: NodeAgentConfig, kubelet: PodResources, gpus: Gpus, poster: TokenPoster,
                 monotonic: Callable[[], float] = time.monotonic, stop: threading.Event | None = None) -> None:
        self.config = config
        self.kubelet = kubelet
        self.gpus = gpus
        self.poster = poster
        self.monotonic = monotonic
        self.stop = stop or threading.Event()
        self._window_start = monotonic()
        self._kubelet = Outage(
            log, f"the kubelet's PodResources API at {config.podresources_socket}", "listings", monotonic
        )
        self._nvml = Outage(log, "NVML", "readings", monotonic)
        self._timekeeper = Outage(log, f"the timekeeper at {config.timekeeper_url}", "batches", monotonic)
        self._ignored: frozenset[tuple[str, str]] = frozenset()

    def read(self) -> NodeReadings | None:
        """The batch of the interval since the last reading; None when the kubelet or NVML cannot be read."""
        try:
            node = self.kubelet.read()
        except KubeletUnavailable as exc:
            self._kubelet.failed(exc, "no readings are sent meanwhile")
            return None
        self._kubelet.succeeded()
        try:
            windows = self.gpus.read()
        except self.gpus.nvml.NVMLError as exc:
            self._nvml.failed(exc, "no readings are sent meanwhile")
            return None
        self._nvml.succeeded()
        now = self.monotonic()
        window, self._window_start = now - self._window_start, now
        pids = {pid for w in windows.values() for pid in (*(w.busy_by_pid or {}), *(p for p, _ in w.processes))}
        owners = pods_of_processes(self.config.proc_root, pids)
        uids = pod_uids(self.config.pod_logs, set(owners.values()))
        readings = pod_readings(node, windows, owners, uids)
        return NodeReadings(self.config.node, min(MAX_WINDOW_SECONDS, max(MIN_WINDOW_SECONDS, window)), readings)

    def deliver(self, batch: NodeReadings, deadline: float) -> Delivered:
        """Posts the batch, again after a failure to reach the timekeeper (backing off), until `deadline`
        (monotonic)."""
        delay = FIRST_RETRY_SECONDS
        while True:
            timeout = max(0.1, min(REQUEST_TIMEOUT_SECONDS, deadline - self.monotonic()))
            delivered = self.poster.post(READINGS_PATH, batch.to_json(), timeout)
            if delivered.delivery is not Delivery.UNAVAILABLE:
                break
            self._timekeeper.failed(delivered.detail, "each batch is tried until the next is due, then dropped")
            if self.monotonic() + delay >= deadline or self.stop.wait(delay):
                log.debug("batch of %d readings dropped: %s", len(batch.readings), delivered.detail)
                return delivered
            delay *= 2
        self._timekeeper.succeeded()
        if delivered.delivery is Delivery.REFUSED:
            log.warning("the timekeeper refused this node's readings (%s): check the node agent's ServiceAccount token "
                        "and the timekeeper's version", delivered.detail)
        else:
            self._note_ignored(delivered.body)
        return delivered

    def run(self) -> None:
        """Until `stop` is set: a batch every interval, on a fixed beat."""
        interval = self.config.interval_seconds
        due = self.monotonic() + interval
        log.info("node agent on %s reporting every %g s to %s", self.config.node, interval, self.config.timekeeper_url)
        while not self.stop.wait(max(0.0, due - self.monotonic())):
            due = max(due + interval, self.monotonic())  # a long pause skips beats instead of catching up
            try:
                batch = self.read()
                if batch is not None:
                    self.deliver(batch, due)
            except Exception:  # one interval's batch lost, never the agent: the DaemonSet's pod keeps reporting
                log.exception("this interval's readings were not sent")

    def _note_ignored(self, body: Any) -> None:
        """Logs which pods the timekeeper ignored, when that changes (not once per batch)."""
        ignored = body.get("ignored") if isinstance(body, dict) else None
        said = frozenset((str(i.get("podUid")), str(i.get("reason"))) for i in ignored or [] if isinstance(i, dict))
        if said != self._ignored and said:
            log.info("the timekeeper ignored %d of this node's readings: %s", len(said),
                     "; ".join(f"{uid}: {reason}" for uid, reason in sorted(said)[:5]))
        self._ignored = said
