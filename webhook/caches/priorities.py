"""The cluster's PriorityClasses, kept in memory by a watch, so that the webhook writes a pod's `spec.priority` and
`spec.preemptionPolicy` as its new class says: the API server's Priority plugin, run again after the webhook changed the
pod, then changes nothing, and one `/mutate` call per GPU pod is enough (docs/concepts.md). A class the watch does not
know (yet) is left to the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpusharing.kube.watching import WatchedObjects

# What the API server writes into a PriorityClass without one, and the policies it accepts.
DEFAULT_PREEMPTION_POLICY = "PreemptLowerPriority"
PREEMPTION_POLICIES = frozenset({DEFAULT_PREEMPTION_POLICY, "Never"})
INT32 = range(-(2**31), 2**31)  # a PriorityClass's value (user classes stay within 1e9, system ones above)


@dataclass(frozen=True)
class ResolvedPriority:
    """What the Priority plugin writes into a pod of the class."""

    value: int
    preemption_policy: str


PriorityLookup = Callable[[str], ResolvedPriority | None]


def no_priorities(name: str) -> ResolvedPriority | None:
    """No PriorityClass known: the Priority plugin resolves every class (and the webhook is called twice)."""
    return None


def resolved_priority(obj: Mapping[str, Any]) -> ResolvedPriority | None:
    """A PriorityClass as the API server serves it; None for one the Priority plugin would not read this way."""
    value = obj.get("value")
    policy = obj.get("preemptionPolicy", DEFAULT_PREEMPTION_POLICY)
    if isinstance(value, bool) or not isinstance(value, int) or value not in INT32 or policy not in PREEMPTION_POLICIES:
        return None
    return ResolvedPriority(value, policy)


class PriorityClassIndex:
    """Every PriorityClass's value and preemption policy; `lookup` is a `PriorityLookup`."""

    def __init__(self, api_client: client.ApiClient, on_sync: Callable[[bool], None] | None = None):
        self._watched = WatchedObjects("PriorityClasses", client.SchedulingV1Api(api_client).list_priority_class,
                                       resolved_priority, on_sync=on_sync)

    def lookup(self, name: str) -> ResolvedPriority | None:
        return (self._watched.items or {}).get(("", name))  # cluster-scoped: no namespace

    def start(self) -> None:
        self._watched.start()

    def stop(self) -> None:
        self._watched.stop()
