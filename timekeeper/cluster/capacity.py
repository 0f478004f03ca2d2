"""The `capacity` task: the GPU nodes of the shared nodes cache observed into the capacity ledger
(timekeeper.database.chargeback.capacity), and the GPUs installed and down now as metrics."""

from __future__ import annotations

import datetime as dt

from gpusharing.gpu.capacity import NodeGpus
from gpusharing.kube.watching import WatchedObjects
from timekeeper import metrics
from timekeeper.database.chargeback.capacity import CapacityLedger, CapacityPass


class CapacityTask:
    def __init__(self, ledger: CapacityLedger, nodes: WatchedObjects[NodeGpus]):
        self.ledger = ledger
        self.nodes = nodes

    def run(self, now: dt.datetime) -> CapacityPass | None:
        """Observes the cached nodes at `now`; nothing (None) until they are listed or while their watch is broken: a
        stale cache would keep a deleted node's time going, and the next pass on a fresh one covers the gap."""
        items = self.nodes.items
        if items is None or self.nodes.broken_since is not None:
            return None
        nodes = {name: node for (_, name), node in list(items.items())}
        metrics.GPU_CAPACITY.set(sum(node.installed for node in nodes.values()))
        metrics.GPUS_DOWN.set(sum(node.installed for node in nodes.values() if not node.ready))
        return self.ledger.observe(nodes, now)
