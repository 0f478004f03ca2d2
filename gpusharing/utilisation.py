"""The node's word on GPU utilisation, as both sides read it: what a node agent reports, once per interval, for the
governed pods on its node (``POST /api/v1/node-readings``), and where a pod's reading came from. The node agent's and
Prometheus's (DCGM) readings outrank the meter's, read inside the tenant's pod: it usually sees no GPU, and where it
does its word is the tenant's (``UtilisationSource.outranks``; docs/operations.md, the node's word over the meter's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.names import NAMESPACE, NODE_NAME, POD_NAME, UID
from gpusharing.report import (
    MAX_GPU_MEMORY_MIB,
    ReportError,
    gpu_model_field,
    number_field,
    optional_number_field,
    text_field,
)

# A kubelet runs 110 pods by default and allows a few hundred; a node's batch is bounded well above that.
MAX_PODS_PER_NODE = 1000
MAX_WINDOW_SECONDS = 3600.0


class UtilisationSource(StrEnum):
    NODE = "node"  # the node agent: PodResources and NVML's per-process samples, on the node
    PROMETHEUS = "prometheus"  # DCGM's per-pod series, read from Prometheus by the controller
    METER = "meter"  # the meter's NVML reading, inside the tenant's pod: counted only where no other source reports

    def outranks(self, other: "UtilisationSource") -> bool:
        return _RANK[self] > _RANK[other]


_RANK = {UtilisationSource.METER: 0, UtilisationSource.PROMETHEUS: 1, UtilisationSource.NODE: 1}


@dataclass(frozen=True)
class PodUtilisation:
    """One pod's GPU utilisation over the window, summed over its processes and capped at what it was allotted."""

    pod_uid: str
    namespace: str
    pod: str
    utilisation_percent: float | None  # None: unknown (a MIG instance without GPM, no device found)
    memory_used_mib: float | None = None
    gpu_model: str | None = None  # NVML's name of the GPUs it was given: evidence beside its node's label

    def to_json(self) -> dict[str, Any]:
        body = {"podUid": self.pod_uid, "namespace": self.namespace, "pod": self.pod,
                "utilisationPercent": self.utilisation_percent, "memoryUsedMiB": self.memory_used_mib,
                "gpuModel": self.gpu_model}
        return {key: value for key, value in body.items() if value is not None}

    @classmethod
    def from_json(cls, body: object) -> "PodUtilisation":
        _expect_object(body, "a reading", {"podUid", "namespace", "pod"},
                       {"utilisationPercent", "memoryUsedMiB", "gpuModel"})
        assert isinstance(body, dict)
        return cls(
            pod_uid=UID.check(text_field(body, "podUid"), "podUid"),
            namespace=NAMESPACE.check(text_field(body, "namespace"), "namespace"),
            pod=POD_NAME.check(text_field(body, "pod"), "pod"),
            utilisation_percent=optional_number_field(body, "utilisationPercent", 0, 100),
            memory_used_mib=optional_number_field(body, "memoryUsedMiB", 0, MAX_GPU_MEMORY_MIB),
            gpu_model=gpu_model_field(body.get("gpuModel")),
        )


@dataclass(frozen=True)
class NodeReadings:
    """A node agent's batch: one request per node per interval."""

    node: str
    window_seconds: float  # how long the readings span, ending when they were sent
    readings: tuple[PodUtilisation, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "windowSeconds": self.window_seconds,
            "readings": [r.to_json() for r in self.readings],
        }

    @classmethod
    def from_json(cls, body: object) -> "NodeReadings":
        """The batch from its JSON body; ReportError (InvalidName for a name) naming the first thing wrong with it."""
        _expect_object(body, "the node's readings", {"node", "windowSeconds", "readings"}, set())
        assert isinstance(body, dict)
        readings = body["readings"]
        if not isinstance(readings, list):
            raise ReportError("readings must be a list")
        if len(readings) > MAX_PODS_PER_NODE:
            raise ReportError(f"readings: at most {MAX_PODS_PER_NODE} pods per node, not {len(readings)}")
        parsed = tuple(PodUtilisation.from_json(reading) for reading in readings)
        if len({reading.pod_uid for reading in parsed}) != len(parsed):
            raise ReportError("readings: each pod at most once")
        return cls(
            node=NODE_NAME.check(text_field(body, "node"), "node"),
            window_seconds=number_field(body, "windowSeconds", 0.05, MAX_WINDOW_SECONDS),
            readings=parsed,
        )


def _expect_object(body: object, what: str, required: set[str], optional: set[str]) -> None:
    if not isinstance(body, dict):
        raise ReportError(f"{what} must be a JSON object")
    unknown = sorted(set(body) - required - optional)
    if unknown:
        raise ReportError(f"{what}: unknown field(s): {', '.join(unknown)}")
    missing = sorted(required - set(body))
    if missing:
        raise ReportError(f"{what}: missing field(s): {', '.join(missing)}")
