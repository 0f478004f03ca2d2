"""A pod's controller (the owner that re-creates it), read from its ownerReferences alike by the webhook (which
admits a held owner's pods out of budget) and the timekeeper (which holds owners of idle pods it evicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpusharing.decoded import as_list, as_mapping


@dataclass(frozen=True)
class Owner:
    """The controller that owns a pod (its ownerReference with controller: true): a ReplicaSet, StatefulSet, Job..."""

    api_version: str
    kind: str
    name: str
    uid: str


def controller_of(pod: Mapping[str, Any]) -> Owner | None:
    """The pod's controller; None for a bare pod (or references the API server would not have stored)."""
    for reference in as_list(as_mapping(pod.get("metadata")).get("ownerReferences")):
        reference = as_mapping(reference)
        if reference.get("controller") is True:
            fields = [
                value
                for key in ("apiVersion", "kind", "name", "uid")
                if isinstance(value := reference.get(key), str) and value
            ]
            if len(fields) == 4:
                return Owner(*fields)
    return None
