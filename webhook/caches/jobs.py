"""The cluster's Jobs' deadlines, kept in memory by a watch, so that a Job's `activeDeadlineSeconds` counts for its
pods under safe admission: the Job controller never writes it on them, so the webhook carries what it has left onto
each pod the Job creates. A review never waits for the watch: a pod whose Job it has not delivered is reviewed by its
own deadline (docs/safe-admission.md, deadlines and commitments).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client

from gpusharing.commitment import deadline_seconds
from gpusharing.decoded import as_list, as_mapping
from gpusharing.kube.watching import WatchedObjects

UTC = dt.timezone.utc


@dataclass(frozen=True)
class JobDeadline:
    """A Job's deadline and when it started, as the watch keeps it."""

    uid: str
    active_deadline_seconds: int | None
    started_at: dt.datetime | None  # the Job controller sets it with the first pods, or just after

    def remaining_seconds(self, now: dt.datetime) -> int | None:
        """Whole seconds the Job's deadline leaves it (at least 1: the API server wants a positive deadline)."""
        if self.active_deadline_seconds is None:
            return None
        elapsed = 0.0 if self.started_at is None else max(0.0, (now - self.started_at).total_seconds())
        return max(1, int(self.active_deadline_seconds - elapsed))


def job_deadline(obj: Mapping[str, Any]) -> JobDeadline:
    """What the watch keeps of a Job as the API server serves it."""
    metadata, spec, status = (as_mapping(obj.get(key)) for key in ("metadata", "spec", "status"))
    started = status.get("startTime")
    try:
        started_at = dt.datetime.fromisoformat(started.replace("Z", "+00:00")) if isinstance(started, str) else None
    except ValueError:
        started_at = None
    return JobDeadline(str(metadata.get("uid", "")), deadline_seconds(spec.get("activeDeadlineSeconds")), started_at)


def owning_job(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """The name and uid of the Job that controls the pod, if one does."""
    for ref in as_list(as_mapping(pod.get("metadata")).get("ownerReferences")):
        ref = as_mapping(ref)
        if (
            ref.get("controller") is True
            and ref.get("kind") == "Job"
            and str(ref.get("apiVersion", "")).startswith("batch/")
        ):
            name, uid = ref.get("name"), ref.get("uid")
            if isinstance(name, str) and isinstance(uid, str):
                return name, uid
    return None


class JobLookup(Protocol):
    def __call__(self, namespace: str, name: str, uid: str) -> JobDeadline | None: ...


def no_jobs(namespace: str, name: str, uid: str) -> JobDeadline | None:
    return None


class JobIndex:
    """Every Job's deadline, followed by a watch; `lookup` answers from memory at once."""

    def __init__(self, api_client: client.ApiClient, on_sync: Callable[[bool], None] | None = None):
        self._watched = WatchedObjects("Jobs", client.BatchV1Api(api_client).list_job_for_all_namespaces, job_deadline,
                                       on_sync=on_sync)

    def lookup(self, namespace: str, name: str, uid: str) -> JobDeadline | None:
        job = (self._watched.items or {}).get((namespace, name))
        return job if job is not None and job.uid == uid else None

    def start(self) -> None:
        self._watched.start()

    def stop(self) -> None:
        self._watched.stop()
