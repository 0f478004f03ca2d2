"""Kubernetes names, checked as the API server checks them: a namespace is a DNS-1123 label, a pod's name a
DNS-1123 subdomain. One check for every endpoint, so that what one accepts another can look up."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpusharing.messages import shortened


class InvalidName(ValueError):
    """Not a name Kubernetes would give; the message says which rule it breaks."""


@dataclass(frozen=True)
class NameRule:
    kind: str
    pattern: re.Pattern[str]
    max_length: int
    rule: str

    def check(self, name: str, what: str) -> str:
        """`name`, or InvalidName saying that `what` (the field or parameter) breaks the rule."""
        if len(name) > self.max_length or not self.pattern.fullmatch(name):
            raise InvalidName(
                f"{what} {shortened(name)!r} is not a {self.kind}: {self.rule}, at most {self.max_length} characters"
            )
        return name


_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_LABEL_RULE = "lower-case letters, digits and '-', beginning and ending with a letter or digit (a DNS-1123 label)"
NAMESPACE = NameRule("namespace name", re.compile(_LABEL), 63, _LABEL_RULE)
POD_NAME = NameRule(
    "pod name",
    re.compile(rf"{_LABEL}(?:\.{_LABEL})*"),
    253,
    "lower-case letters, digits, '-' and '.', each part beginning and ending with a letter or digit "
    "(a DNS-1123 subdomain)",
)
NODE_NAME = NameRule("node name", POD_NAME.pattern, 253, POD_NAME.rule)
# The objects the chart and the manifests name (a Service's name must be a label, and the others are named alike).
OBJECT_NAME = NameRule("Kubernetes object name", re.compile(_LABEL), 63, _LABEL_RULE)
# A Kubernetes uid is a UUID; in static mode the meter's is free, but plain text a database takes.
UID = NameRule(
    "uid",
    re.compile(r"[A-Za-z0-9][-A-Za-z0-9._:]*"),
    253,
    "letters, digits, '-', '.', '_' and ':', beginning with a letter or digit",
)


# A group budget (a team, a department: a parent of namespaces' budgets) is named with at least one dot, so that it
# can never be a namespace (a label has none) and can be a cluster-scoped object's name (a ClusterGPUBudget's).
# At most 63 characters, as a namespace, so that one column holds both.
GROUP = NameRule(
    "group budget name", re.compile(rf"{_LABEL}(?:\.{_LABEL})+"), 63,
    "DNS-1123 labels joined by '.', at least two of them (e.g. team.vision)",
)


def check_namespace(name: str, what: str = "namespace") -> str:
    return NAMESPACE.check(name, what)


def is_group(name: str) -> bool:
    """Whether a budget's name is a group's (a namespace's has no dot)."""
    return "." in name


def check_budget_name(name: str, what: str = "budget name") -> str:
    """A namespace, or a group budget's name (one with a dot); InvalidName saying which rule it breaks."""
    return (GROUP if is_group(name) else NAMESPACE).check(name, what)
