"""The cluster's ResourceClaimTemplates and ResourceClaims, kept in memory by a LIST and a WATCH each (resource.k8s.io/v1).

A pod that gets GPUs through Dynamic Resource Allocation names its claims; what they ask for lives in those objects.
The webhook never calls the API on the request path: a background thread per kind lists them once, then follows
the watch, and relists when the watch expires or breaks. Only what billing needs is kept (`gpusharing.dra.ClaimSpec`).
A pod whose claim is not (yet) known is refused with the reason (fail closed: an unread claim would be an unbilled GPU).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpusharing.dra import ClaimSource, ClaimSpec, ClaimUnknown, claim_spec
from gpusharing.reading import as_mapping

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # the API server ends a watch after this; the thread resumes from where it was
BACKOFF_SECONDS = (0.5, 1, 2, 5, 10, 30)

Key = tuple[str, str]  # namespace, name


def spec_of(source: ClaimSource, obj: Mapping[str, Any]) -> ClaimSpec:
    """What billing needs of a ResourceClaim or a ResourceClaimTemplate, as the API server serves it."""
    spec = as_mapping(obj.get("spec"))
    return claim_spec(as_mapping(spec.get("spec")) if source is ClaimSource.TEMPLATE else spec)


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = as_mapping(obj.get("metadata"))
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class ClaimIndex:
    """Specs of every ResourceClaimTemplate and ResourceClaim; `lookup` is a `gpusharing.dra.ClaimLookup`."""

    def __init__(self, api_client: client.ApiClient, on_sync: Callable[[str, bool], None] | None = None):
        api = client.ResourceV1Api(api_client)
        self._lists = {
            ClaimSource.TEMPLATE: api.list_resource_claim_template_for_all_namespaces,
            ClaimSource.CLAIM: api.list_resource_claim_for_all_namespaces,
        }
        self._specs: dict[ClaimSource, dict[Key, ClaimSpec]] = {}  # a kind appears once listed
        self._on_sync = on_sync  # called with the kind and whether a list or watch succeeded (metrics)
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads: list[threading.Thread] = []

    def lookup(self, source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        specs = self._specs.get(source)
        if specs is None:
            raise ClaimUnknown(f"the webhook has not yet listed the cluster's {source}s (see its log); try again shortly")
        spec = specs.get((namespace, name))
        if spec is None:
            raise ClaimUnknown(f"no {source} {name!r} in namespace {namespace!r}: create it before the pod")
        return spec

    @property
    def synced(self) -> bool:
        return len(self._specs) == len(self._lists)

    def start(self) -> None:
        for source in self._lists:
            thread = threading.Thread(target=self._run, args=(source,), name=f"watch-{source}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for stream in list(self._watches):
            stream.stop()
        for thread in self._threads:
            thread.join(timeout=5)

    def _run(self, source: ClaimSource) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist(source)
                failures = 0
                for _ in self._follow(source, version):
                    failures = 0
            except Exception as exc:  # the API may be down, forbid us, or time out: keep what we have, try again
                wait = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                log.warning("%ss not followed (%s); the last known stay in force, retrying in %s s", source, _reason(exc), wait)
                self._report(source, False)
                self._stop.wait(wait)

    def _relist(self, source: ClaimSource) -> str:
        response = self._lists[source](_preload_content=False, _request_timeout=60)
        body = json.loads(response.data)
        specs = {key_of(item): spec_of(source, item) for item in body.get("items", [])}
        self._specs[source] = specs  # one reference swap: readers never see a half-built table
        self._report(source, True)
        log.info("%d %ss listed", len(specs), source)
        return str(as_mapping(body.get("metadata")).get("resourceVersion", ""))

    def _follow(self, source: ClaimSource, version: str) -> Iterator[None]:
        """Applies watch events until the watch ends; raises (to relist) on an expired version or a broken stream."""
        stream = watch.Watch()
        self._watches.append(stream)
        try:
            while not self._stop.is_set():
                for event in stream.stream(
                    self._lists[source], resource_version=version, timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True, _request_timeout=WATCH_SECONDS + 30,
                ):
                    kind, obj = event["type"], as_mapping(event["raw_object"])
                    version = str(as_mapping(obj.get("metadata")).get("resourceVersion", version))
                    # One dict operation at a time: a reader on another thread sees the entry before or after.
                    if kind in ("ADDED", "MODIFIED"):
                        self._specs[source][key_of(obj)] = spec_of(source, obj)
                    elif kind == "DELETED":
                        self._specs[source].pop(key_of(obj), None)
                    yield
        finally:
            self._watches.remove(stream)

    def _report(self, source: ClaimSource, ok: bool) -> None:
        if self._on_sync is not None:
            self._on_sync(str(source), ok)


def _reason(exc: Exception) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status}: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"
