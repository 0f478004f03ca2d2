"""Kubernetes names as the API server checks them: namespaces are DNS-1123 labels, pods DNS-1123 subdomains."""

from __future__ import annotations

import pytest

from gpusharing.names import NAMESPACE, POD_NAME, UID, InvalidName


@pytest.mark.parametrize("name", ["ml-team", "a", "0", "a" * 63, "team-1-b"])
def test_namespaces(name: str) -> None:
    assert NAMESPACE.check(name, "namespace") == name


@pytest.mark.parametrize(
    "name", ["ML-Team ", "..", "'; DROP TABLE budgets; --", "-a", "a-", "a.b", "a" * 64, "", "tëam", "a\x00"]
)
def test_not_namespaces(name: str) -> None:
    with pytest.raises(InvalidName, match="is not a namespace name: lower-case letters"):
        NAMESPACE.check(name, "namespace")


def test_pod_names_are_subdomains() -> None:
    assert POD_NAME.check("web-0.shard-1", "pod") == "web-0.shard-1"
    assert POD_NAME.check("a" * 253, "pod")
    for name in ("Web", "web..0", ".web", "web.", "a" * 254, "web 0"):
        with pytest.raises(InvalidName, match="is not a pod name"):
            POD_NAME.check(name, "pod")


def test_uids_and_long_names_are_quoted_short() -> None:
    assert UID.check("4f1c9b2e-8a7d-4e6f-9c1b-2d3e4f5a6b7c", "podUid")
    with pytest.raises(InvalidName) as refused:
        UID.check("x\x00" * 5000, "podUid")
    assert "(10000 characters)" in str(refused.value) and len(str(refused.value)) < 400
