"""The cluster's ResourceClaimTemplates and ResourceClaims, kept in memory by a LIST and a WATCH each
(resource.k8s.io/v1).

A pod that gets GPUs through Dynamic Resource Allocation names its claims; what they ask for lives in those objects.
The webhook never calls the API on the request path: each kind is followed by a watch (gpusharing.kube.watching), and
only what billing needs is kept (`gpusharing.gpu.dra.ClaimSpec`).
A pod whose claim is not (yet) known is refused with the reason (fail closed: an unread claim would be an unbilled GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from kubernetes import client

from gpusharing.decoded import as_mapping
from gpusharing.gpu.dra import ClaimSource, ClaimSpec, ClaimUnknown, claim_spec
from gpusharing.kube.watching import WatchedObjects


def spec_of(source: ClaimSource, obj: Mapping[str, Any]) -> ClaimSpec:
    """What billing needs of a ResourceClaim or a ResourceClaimTemplate, as the API server serves it."""
    spec = as_mapping(obj.get("spec"))
    return claim_spec(as_mapping(spec.get("spec")) if source is ClaimSource.TEMPLATE else spec)


class ClaimIndex:
    """Specs of every ResourceClaimTemplate and ResourceClaim; `lookup` is a `gpusharing.gpu.dra.ClaimLookup`."""

    def __init__(self, api_client: client.ApiClient, on_sync: Callable[[str, bool], None] | None = None):
        api = client.ResourceV1Api(api_client)
        lists = {
            ClaimSource.TEMPLATE: api.list_resource_claim_template_for_all_namespaces,
            ClaimSource.CLAIM: api.list_resource_claim_for_all_namespaces,
        }
        self._watched = {
            source: WatchedObjects(
                f"{source}s", list_all, partial(spec_of, source),
                on_sync=None if on_sync is None else partial(on_sync, str(source)),
            )
            for source, list_all in lists.items()
        }

    def lookup(self, source: ClaimSource, namespace: str, name: str) -> ClaimSpec:
        specs = self._watched[source].items
        if specs is None:
            raise ClaimUnknown(
                f"the webhook has not yet listed the cluster's {source}s (see its log); try again shortly"
            )
        spec = specs.get((namespace, name))
        if spec is None:
            raise ClaimUnknown(f"no {source} {name!r} in namespace {namespace!r}: create it before the pod")
        return spec

    @property
    def synced(self) -> bool:
        return all(watched.synced for watched in self._watched.values())

    def start(self) -> None:
        for watched in self._watched.values():
            watched.start()

    def stop(self) -> None:
        for watched in self._watched.values():
            watched.stop()
