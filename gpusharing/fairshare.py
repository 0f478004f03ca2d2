"""Fair share's bands as both sides read them: the timekeeper picks each namespace's band
(timekeeper/fairshare/bands.py), the webhook admits a pod in it, or one lower past its namespace's fair share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gpusharing.contract import FAIR_SHARE_GATE
from gpusharing.decoded import as_list, as_mapping

# What a sum of fractional GPUs may carry of rounding and still be "at" the fair share.
GPU_SLACK = 1e-9


@dataclass(frozen=True)
class FairShareBands:
    """The bands, top (lightest) first, and the brakes on moving between them."""

    classes: tuple[str, ...]  # PriorityClass names, top (lightest) first
    # len(classes) - 1 ascending: band i holds ratios below ratio_bounds[i], e.g. (0.8, 1.25)
    ratio_bounds: tuple[float, ...]
    hysteresis: float  # relative margin a ratio must cross a bound by to change band, e.g. 0.1
    min_time_in_band: timedelta  # no change of band sooner than this after the last

    def __post_init__(self) -> None:
        if not self.classes or len(set(self.classes)) != len(self.classes):
            raise ValueError(
                f"fair-share bands need at least one PriorityClass, each named once, not {list(self.classes)}"
            )
        if len(self.ratio_bounds) != len(self.classes) - 1:
            raise ValueError(
                f"{len(self.classes)} bands need {len(self.classes) - 1} ratio bounds between them, "
                f"not {len(self.ratio_bounds)}"
            )
        if not all(math.isfinite(b) and b > 0 for b in self.ratio_bounds) or list(self.ratio_bounds) != sorted(
            set(self.ratio_bounds)
        ):
            raise ValueError(
                f"the bands' ratio bounds must be positive and strictly ascending, not {list(self.ratio_bounds)}"
            )
        if not (math.isfinite(self.hysteresis) and 0 <= self.hysteresis < 1):
            raise ValueError(f"the bands' hysteresis is a relative margin from 0 to below 1, not {self.hysteresis!r}")
        if self.min_time_in_band < timedelta(0):
            raise ValueError(f"the minimum time in a band cannot be negative, not {self.min_time_in_band}")

    def band_of(self, ratio: float, margin: float = 0.0) -> int:
        """The band that holds `ratio` with every bound moved by the relative `margin` (none: the plain band)."""
        for band, bound in enumerate(self.ratio_bounds):
            if ratio < bound * (1 + margin):
                return band
        return len(self.classes) - 1


def admission_band(
    bands: FairShareBands, band: int, held_gpus: float, fair_share_gpus: float, pod_gpus: float = 0.0
) -> int:
    """The band a new pod is admitted in (the burst guard, Kueue's entry penalty): its namespace's band, or one
    lower (never below the last) when the namespace holds more GPUs than its fair share of the cluster's
    (share_of_cluster x the cluster's GPUs). `held_gpus` are the GPUs its pods hold; with the pod's own `pod_gpus`
    the guard counts the pod too, so that exactly the fair share is admitted in the namespace's band."""
    if not 0 <= band < len(bands.classes):
        raise ValueError(f"band {band} is not one of the {len(bands.classes)} fair-share bands")
    for name, value in (
        ("held GPUs", held_gpus),
        ("the fair share of GPUs", fair_share_gpus),
        ("the pod's GPUs", pod_gpus),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number, at least 0, not {value!r}")
    return min(band + 1, len(bands.classes) - 1) if beyond_fair_share(held_gpus, fair_share_gpus, pod_gpus) else band


def beyond_fair_share(held_gpus: float, fair_share_gpus: float, pod_gpus: float = 0.0) -> bool:
    """Whether the namespace, holding `held_gpus`, would with the pod hold more than its fair share of the cluster's
    GPUs: the burst guard's test, the timekeeper's and the webhook's alike."""
    return held_gpus + pod_gpus > fair_share_gpus * (1 + GPU_SLACK) + GPU_SLACK


MAX_WEBHOOK_PROCESSES = 10_000  # more than any installation runs: a listing saying more is read as this


def beyond_process_part(
    held_gpus: float, fair_share_gpus: float, admitted_gpus: float, pod_gpus: float, processes: int
) -> bool:
    """The burst guard as one of `processes` webhook processes applies it between two counts of its namespace's GPUs
    (`held_gpus`), having admitted `admitted_gpus` in the band since: each process may fill its part of the room
    left, (fair share - held) / processes, and its first pod may take the room whole. A burst spread over every
    process then puts at most one pod per process beyond the fair share, not a fair share per process."""
    if processes <= 1 or admitted_gpus <= 0:
        return beyond_fair_share(held_gpus + admitted_gpus, fair_share_gpus, pod_gpus)
    part = max(0.0, fair_share_gpus - held_gpus) / min(processes, MAX_WEBHOOK_PROCESSES)
    return beyond_fair_share(admitted_gpus, part, pod_gpus)


def fair_share_gate(spec: Any) -> int | None:
    """Where the fair-share gate stands among a pod spec's scheduling gates; None: the pod is not in the queue."""
    names = [as_mapping(gate).get("name") for gate in as_list(as_mapping(spec).get("schedulingGates"))]
    return names.index(FAIR_SHARE_GATE) if FAIR_SHARE_GATE in names else None
