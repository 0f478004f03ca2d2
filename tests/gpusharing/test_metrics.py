"""Every Prometheus metric of the webhook and the timekeeper, after real traffic, against the conventions the
client library enforces for OpenMetrics (counters end in _total, a declared unit ends the name) and Prometheus'
naming rules (base units: seconds, bytes; one prefix per service), with label values drawn from bounded sets:
no pod, uid or request id on the webhook, whose admissions are counted by the million."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from demo.apiserver import admission_review, example_manifests, example_pod
from gpusharing.gpu.dialects import Dialect
from gpusharing.gpu.dra import ClaimSource
from tests.gpusharing.test_request import INVALID
from timekeeper.app import create_app as create_timekeeper
from timekeeper.config import DEFAULT_BAND_CLASSES, TimekeeperConfig
from timekeeper.database.schema import upgrade
from timekeeper.metrics import LedgerCollector
from webhook.admission.safe import VERDICTS
from webhook.app import create_app as create_webhook
from webhook.caches.budgets import BudgetStateCache
from webhook.config import WebhookConfig

NAME = re.compile(r"^gpusharing_(webhook|timekeeper|controller)_[a-z][a-z0-9_]*[a-z0-9]$")
NOT_BASE_UNITS = ("_minutes", "_mib", "_milliseconds", "_kilobytes", "_megabytes", "_percent")
BOUNDED = {  # the label values a webhook metric may take, whatever the pods it sees
    "endpoint": {"mutate", "validate"},
    "operation": {"CREATE", "UPDATE", "DELETE", "CONNECT"},
    "decision": {"allowed", "denied"},
    "dialect": {str(d) for d in Dialect} | {"none"},
    "outcome": {"ok", "failed"},
    "kind": {str(source) for source in ClaimSource},
    "verdict": set(VERDICTS),
    "status": {"401", "403", "503"},  # a refused caller's (webhook.api.callers): set when tests/webhook ran first
    # the classes the webhook gives, fair-share bands' among them (an allowed class of the pod's own is never
    # resolved by the webhook)
    "priority_class": {
        WebhookConfig().priority_class_in_budget,
        WebhookConfig().priority_class_over_budget,
        *DEFAULT_BAND_CLASSES,
    },
}
PER_OBJECT_LABELS = {"pod", "uid", "pod_uid", "request_id", "name"}
PER_POD_FAMILIES = {
    "gpusharing_timekeeper_pod_gpu_memory_over_request_bytes": {"pod"},
    "gpusharing_timekeeper_pod_billed_gpu_share": {"pod", "uid"},
    "gpusharing_timekeeper_pod_billed_gpu_seconds": {"pod", "uid"},
    "gpusharing_timekeeper_pod_gpu_seconds": {"pod"},
}


def exposition(tmp_path: Path) -> str:
    """The OpenMetrics text of both services (one process: one registry) after admissions, refusals and reports."""
    webhook = create_webhook(WebhookConfig(), budgets=BudgetStateCache(None)).test_client()
    for name in example_manifests():
        for endpoint in ("/mutate", "/validate"):
            assert webhook.post(endpoint, json=admission_review(example_pod(name))).status_code == 200
    for pod, _ in INVALID:
        webhook.post("/mutate", json=admission_review(pod))
    webhook.post("/mutate", json={"not": "a review"})

    url = f"sqlite:///{tmp_path / 'timekeeper.sqlite'}"
    upgrade(url)
    app = create_timekeeper(TimekeeperConfig(database_url=url, auth="none"), kube=None)
    timekeeper = app.test_client()
    timekeeper.put("/api/v1/budgets/team-a", json={"gpuMinutes": 1})
    report = {"podUid": "u1", "namespace": "team-a", "pod": "p", "gpuShare": 1, "seq": 1, "gpuSeconds": 120,
              "gpuMemoryUsedMiB": 2048, "gpuMemoryRequestedMiB": 1024}
    for body in (report, report, {"bad": True}):
        timekeeper.post("/api/v1/reports", json=body)
    scraped = CollectorRegistry()
    scraped.register(LedgerCollector(app.extensions["ledger"]))
    try:
        return (generate_latest(REGISTRY).decode().removesuffix("# EOF\n") + generate_latest(scraped).decode())
    finally:
        app.extensions["reports"].close()
        app.extensions["database"].dispose()


def test_metric_names_units_and_labels_follow_the_conventions(tmp_path: Path) -> None:
    families = [f for f in text_string_to_metric_families(exposition(tmp_path)) if f.name.startswith("gpusharing_")]
    names = {f.name for f in families}
    assert {"gpusharing_webhook_admissions", "gpusharing_timekeeper_reports", "gpusharing_timekeeper_used_gpu_seconds",
            "gpusharing_timekeeper_pod_gpu_memory_over_request_bytes"} <= names
    for family in families:
        assert NAME.match(family.name), family.name
        assert not any(word in family.name for word in NOT_BASE_UNITS), (
            f"{family.name}: use base units (seconds, bytes)"
        )
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        if family.type == "histogram":
            assert family.unit == "seconds" and family.name.endswith("_seconds"), family.name
        for unit in ("seconds", "bytes"):
            if family.name.endswith(f"_{unit}"):
                assert family.unit.endswith(unit), f"{family.name} does not declare its unit"
        labels = {label for sample in family.samples for label in sample.labels if label not in ("le",)}
        if family.name.startswith("gpusharing_webhook_"):
            assert not labels & PER_OBJECT_LABELS, family.name
            for sample in family.samples:
                for label, value in sample.labels.items():
                    if label != "le":
                        assert value in BOUNDED[label], f"{family.name}{{{label}={value!r}}}"
        else:  # the timekeeper's per-pod series: pods overrunning their GPU memory now and running pods
            # by the labels cost tools join on (namespace, pod, uid), at most 10,000 each; the top 20 by GPU time
            allowed = PER_POD_FAMILIES.get(family.name, set())
            assert not labels & PER_OBJECT_LABELS - allowed, family.name
