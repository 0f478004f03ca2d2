"""Fair share's bands in the core (gpusharing/fairshare.py), as the timekeeper and the webhook read them: their shape,
and the burst guard (Kueue's entry penalty) that admits a pod past its namespace's fair share one band lower."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from gpusharing.fairshare import FairShareBands, admission_band, beyond_process_part

MINUTE = dt.timedelta(minutes=1)
CLASSES = ("gpusharing-in-budget-light", "gpusharing-in-budget", "gpusharing-in-budget-heavy")
BANDS = FairShareBands(CLASSES, (0.8, 1.25), hysteresis=0.1, min_time_in_band=dt.timedelta(minutes=10))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"classes": ()}, "at least one PriorityClass"),
    ({"classes": ("a", "a", "b")}, "each named once"),
    ({"ratio_bounds": (0.8,)}, "3 bands need 2 ratio bounds"),
    ({"ratio_bounds": (1.25, 0.8)}, "strictly ascending"),
    ({"ratio_bounds": (0.8, 0.8)}, "strictly ascending"),
    ({"ratio_bounds": (0.0, 1.0)}, "positive"),
    ({"ratio_bounds": (0.8, math.inf)}, "positive"),
    ({"hysteresis": -0.1}, "hysteresis is a relative margin"),
    ({"hysteresis": 1.0}, "hysteresis is a relative margin"),
    ({"min_time_in_band": -MINUTE}, "minimum time in a band cannot be negative"),
])
def test_bands_out_of_shape_are_refused(kwargs: dict, message: str) -> None:
    settings = {
        "classes": CLASSES,
        "ratio_bounds": (0.8, 1.25),
        "hysteresis": 0.1,
        "min_time_in_band": MINUTE,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        FairShareBands(**settings)


def test_a_burst_takes_its_namespaces_band_only_up_to_its_fair_share() -> None:
    """A light team with a fair share of 5 GPUs sends 20 one-GPU pods: 5 in the top band, the rest one lower."""
    held = 0.0
    bands = []
    for _ in range(20):
        bands.append(admission_band(BANDS, 0, held, fair_share_gpus=5.0, pod_gpus=1.0))
        held += 1.0
    assert bands == [0] * 5 + [1] * 15
    # Without the pod's own GPUs, the guard counts what is held before it: one pod more in the band.
    assert [admission_band(BANDS, 0, h, 5.0) for h in (4.0, 5.0, 5.5)] == [0, 0, 1]
    assert admission_band(BANDS, 2, 50.0, 5.0, 1.0) == 2, "never below the last band"
    assert admission_band(BANDS, 1, 0.1 + 0.2, 0.3) == 1, "a sum of fractions at the share is at the share"


@pytest.mark.parametrize(("band", "held", "share", "pod", "message"), [
    (3, 0.0, 1.0, 0.0, "band 3 is not one of the 3"),
    (-1, 0.0, 1.0, 0.0, "band -1 is not one of the 3"),
    (0, -1.0, 1.0, 0.0, "held GPUs must be a finite number"),
    (0, 0.0, math.nan, 0.0, "the fair share of GPUs must be a finite number"),
    (0, 0.0, 1.0, math.inf, "the pod's GPUs must be a finite number"),
])
def test_the_burst_guard_refuses_figures_out_of_range(
    band: int, held: float, share: float, pod: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        admission_band(BANDS, band, held, share, pod)


def test_each_of_several_webhook_processes_fills_its_part_of_the_room_and_its_first_pod_the_whole() -> None:
    # Fair share 8, 2 held: 6 GPUs of room, 2 for each of 3 processes.
    assert not beyond_process_part(2.0, 8.0, 0.0, 6.0, 3)  # a first pod may take the room whole
    assert beyond_process_part(2.0, 8.0, 0.0, 7.0, 3)  # not more
    assert [beyond_process_part(2.0, 8.0, admitted, 1.0, 3) for admitted in (1.0, 2.0)] == [False, True]
    # One process: the plain guard, the admitted counted as held.
    assert [beyond_process_part(2.0, 8.0, admitted, 1.0, 1) for admitted in (5.0, 6.0)] == [False, True]
    # No room left: only what is beyond already.
    assert beyond_process_part(9.0, 8.0, 1.0, 0.5, 3) and beyond_process_part(9.0, 8.0, 0.0, 0.5, 3)
    # However many processes a listing claims, a process's first pod within the fair share is in the band.
    assert not beyond_process_part(0.0, 8.0, 0.0, 1.0, 10**9)
