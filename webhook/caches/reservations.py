"""Safe admission's reservations, asked of the timekeeper: the one call the webhook makes while it reviews a pod, for
a GPU pod with a deadline under safe or strict admission only, within a short timeout. Only the timekeeper's database
can weigh a reservation against every budget on its namespace's path, whichever process admits it
(docs/safe-admission.md, bursts). An answer that cannot be had is unknown: strict admission refuses the pod, safe
admission admits it saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.serving.jsonhttp import JsonClient, Unreachable

RESERVATIONS_PATH = "/api/v1/reservations"


@dataclass(frozen=True)
class Reservation:
    """A pod's commitment, in weighted micro-GPU-seconds, to hold against its namespace's budgets."""

    id: str  # the AdmissionReview's uid, written on the pod as gpusharing.io/admission-id
    namespace: str
    micro_gpu_seconds: int
    replaces: str | None = None  # the admission id the pod already carries (a reinvoked webhook's, or forged)
    dry_run: bool = False


@dataclass(frozen=True)
class Uncommitted:
    """What the tightest budget over a namespace had left before the pod, and why."""

    micro_gpu_seconds: int
    budget: str  # the namespace's own budget, or the ancestor whose is tighter
    remaining_gpu_minutes: float
    committed_gpu_minutes: float  # by the running pods' deadlines
    reserved_gpu_minutes: float  # by pods being admitted


class Outcome(StrEnum):
    GRANTED = "granted"
    SHORT = "short"  # the budgets on the path do not cover the pod
    TAKEN = "taken"  # the pod claims another pod's admission id
    UNKNOWN = "unknown"  # nothing could be counted: `reason` says why


@dataclass(frozen=True)
class Grant:
    """The timekeeper's answer to a reservation, and what the tightest budget had left."""

    outcome: Outcome
    uncommitted: Uncommitted | None = None  # None with GRANTED: no budget on the path has a limit
    reason: str = ""


Reserve = Callable[[Reservation], Grant]


def no_timekeeper(asked: Reservation) -> Grant:
    return Grant(Outcome.UNKNOWN, reason="the webhook has no timekeeper to reserve with (GPUSHARING_TIMEKEEPER_URL)")


def grant_of(answer: object) -> Grant:
    """The timekeeper's answer to a reservation; ValueError when it is not one."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("granted"), bool):
        raise ValueError("expected an object with granted true or false")
    raw = answer.get("uncommitted")
    uncommitted = None
    if raw is not None:
        try:
            uncommitted = Uncommitted(
                int(raw["microGpuSeconds"]),
                str(raw["budget"]),
                float(raw["remainingGpuMinutes"] or 0.0),
                float(raw["committedGpuMinutes"]),
                float(raw["reservedGpuMinutes"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"uncommitted is not what the timekeeper answers: {exc!r}") from None
    return Grant(Outcome.GRANTED if answer["granted"] else Outcome.SHORT, uncommitted)


class TimekeeperReservations:
    """Reserve, over one kept-alive connection to the timekeeper per thread."""

    def __init__(self, timekeeper_url: str, token: Callable[[], str | None], timeout_seconds: float):
        self._url = timekeeper_url
        self._token = token
        self._timeout = timeout_seconds
        self._local = threading.local()

    def __call__(self, asked: Reservation) -> Grant:
        body: dict[str, Any] = {
            "id": asked.id,
            "namespace": asked.namespace,
            "microGpuSeconds": asked.micro_gpu_seconds,
            "replaces": asked.replaces,
            "dryRun": asked.dry_run,
        }
        try:
            answer = self._client().request("POST", RESERVATIONS_PATH, body, token=self._token())
        except (Unreachable, OSError) as exc:
            return Grant(Outcome.UNKNOWN, reason=f"the timekeeper did not answer: {exc}")
        if answer.status == 409:
            return Grant(Outcome.TAKEN, reason=answer.message)
        if answer.status != 200:
            return Grant(
                Outcome.UNKNOWN, reason=f"the timekeeper could not reserve (HTTP {answer.status}): {answer.message}"
            )
        try:
            return grant_of(answer.json())
        except ValueError as exc:
            return Grant(Outcome.UNKNOWN, reason=f"the timekeeper's answer was not understood: {exc}")

    def _client(self) -> JsonClient:
        client: JsonClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = JsonClient(self._url, timeout=self._timeout)
        return client
