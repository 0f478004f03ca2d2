"""What a statement signs, row by row: each charged pod-hour and each node-hour of a closed billing period as one
leaf of its Merkle tree, in one canonical byte encoding (docs/audit.md, "What is signed"). The timekeeper encodes its
ledger's rows with these when it closes a period and when it is verified; an auditor's copy holds the same bytes, a
line each.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from typing import Any

from gpusharing.messages import shortened

MAX_LEAF_BYTES = 4096  # a leaf is a few hundred bytes: a longer line of an auditor's copy is refused unread


@dataclass(frozen=True)
class Price:
    """The price sheet's in force for a charge's hour: per GPU-hour, and what the charge costs at it, as the FOCUS
    export writes them (decimal strings, exact)."""

    currency: str | None
    list_per_gpu_hour: str
    contracted_per_gpu_hour: str
    list_cost: str
    contracted_cost: str


@dataclass(frozen=True)
class ChargeLeaf:
    """A pod's GPU time on one model in one hour, as booked in `booked_hour` (a correction of a closed period where it
    differs from `hour`): one `pod_hours` row, its pod's namespace and name, and its price."""

    booked_hour: dt.datetime
    hour: dt.datetime
    namespace: str
    pod: str
    pod_uid: str
    model: str
    micro_gpu_seconds: int
    weighted_micro_gpu_seconds: int
    idle_micro_gpu_seconds: int
    price: Price | None  # None: no price was in force for that hour

    def encoded(self) -> bytes:
        price = self.price
        return canonical({
            "kind": "charge",
            "bookedHour": utc_text(self.booked_hour),
            "hour": utc_text(self.hour),
            "namespace": self.namespace,
            "pod": self.pod,
            "podUid": self.pod_uid,
            "model": self.model,
            "microGpuSeconds": self.micro_gpu_seconds,
            "weightedMicroGpuSeconds": self.weighted_micro_gpu_seconds,
            "idleMicroGpuSeconds": self.idle_micro_gpu_seconds,
            "currency": None if price is None else price.currency,
            "listPerGpuHour": None if price is None else price.list_per_gpu_hour,
            "contractedPerGpuHour": None if price is None else price.contracted_per_gpu_hour,
            "listCost": None if price is None else price.list_cost,
            "contractedCost": None if price is None else price.contracted_cost,
        })


@dataclass(frozen=True)
class CapacityLeaf:
    """A node's GPUs x time in one hour, and the part of it the node was down: one row of the capacity ledger, which
    the export's unallocated lines are made of."""

    hour: dt.datetime
    node: str
    model: str
    capacity_micro_gpu_seconds: int
    down_micro_gpu_seconds: int

    def encoded(self) -> bytes:
        return canonical({
            "kind": "capacity",
            "hour": utc_text(self.hour),
            "node": self.node,
            "model": self.model,
            "capacityMicroGpuSeconds": self.capacity_micro_gpu_seconds,
            "downMicroGpuSeconds": self.down_micro_gpu_seconds,
        })


def canonical(fields: dict[str, Any]) -> bytes:
    """JSON with its keys sorted, no white space and only ASCII: one object has one encoding."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def leaf_label(leaf: bytes) -> str:
    """The row a leaf is, in words: a finding names it so."""
    try:
        fields = json.loads(leaf) if len(leaf) <= MAX_LEAF_BYTES else None
    except ValueError:
        fields = None
    if not isinstance(fields, dict):
        return f"the row {shortened(leaf.decode('utf-8', 'replace'))!r}"
    if fields.get("kind") == "charge":
        booked = fields.get("bookedHour")
        late = f", booked {booked}" if booked != fields.get("hour") else ""
        return (f"pod {fields.get('namespace')}/{fields.get('pod')} ({fields.get('podUid')}) on {fields.get('model')} "
                f"in the hour {fields.get('hour')}{late}")
    if fields.get("kind") == "capacity":
        return f"node {fields.get('node')} ({fields.get('model')}) in the hour {fields.get('hour')}"
    return f"the row {shortened(leaf.decode('utf-8', 'replace'))!r}"


@functools.lru_cache(maxsize=4096)  # a period's rows share a few hundred hours
def utc_text(at: dt.datetime) -> str:
    """An instant as the statements write it: 2026-11-01T00:00:00Z."""
    return at.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
