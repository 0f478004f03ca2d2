"""The optional monitoring component: its alerts checked and unit-tested by promtool, the dashboard's queries
parsed by promtool, and every metric either names exported by the services."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kustomize import MANIFESTS, installable_manifests, kustomize

REPO = MANIFESTS.parent
HOW_TO_GET = (
    "promtool is needed: `make tools` puts Debian's beside this Python, in .venv/bin "
    "(or install the prometheus package)"
)


@pytest.fixture(scope="module")
def promtool() -> str:
    beside = Path(sys.executable).parent / "promtool"  # what `make tools` put in this virtualenv (.venv, .venv-py3.X)
    found = str(beside) if beside.exists() else shutil.which("promtool")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {HOW_TO_GET}", pytrace=False)
        pytest.skip(HOW_TO_GET)
    return found


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The install with the component, as an overlay includes it."""
    directory = tmp_path_factory.mktemp("monitoring")
    installable_manifests(directory)
    shutil.copytree(MANIFESTS / "monitoring", directory / "manifests" / "monitoring", dirs_exist_ok=True)
    overlay = directory / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["../manifests"], "components": ["../manifests/monitoring"]})
    )
    return kustomize(overlay)


def rule_groups(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    return list(rule["spec"]["groups"])


def dashboard(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpusharing-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    return dict(json.loads(config_map["data"]["gpusharing-budgets.json"]))


def dashboard_queries(board: dict[str, Any]) -> list[str]:
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    # Grafana's variables, as Grafana substitutes them (regex matchers).
    return [q.replace("$namespace", ".*") for q in queries]


def run(promtool: str, *args: str, cwd: Path) -> str:
    done = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_component_adds_alerts_scraping_and_the_dashboard_and_nothing_else(
    monitoring: list[dict[str, Any]], tmp_path: Path
) -> None:
    base = {(o["kind"], o["metadata"]["name"]) for o in kustomize(installable_manifests(tmp_path))}
    added = {(o["kind"], o["metadata"]["name"]) for o in monitoring} - base
    assert added == {("PrometheusRule", "gpusharing"), ("ServiceMonitor", "gpusharing-timekeeper"),
                     ("ServiceMonitor", "gpusharing-controller"), ("ServiceMonitor", "gpusharing-webhook"),
                     ("ConfigMap", "gpusharing-dashboard")}
    alerts = {rule["alert"] for group in rule_groups(monitoring) for rule in group["rules"]}
    assert alerts == {
        "GPUBudgetWarning",
        "GPUBudgetExhausted",
        "GPUBudgetExhaustionForecast",
        "GPUPodsIdle",
        "GPUMetersSilent",
        "GPUMeterReportsRefused",
        "GPUSharingTimekeeperDown",
        "GPUSharingControllerNotLeading",
        "GPUSharingControllerTaskLagging",
        "GPUSharingWebhookDown",
        "GPUSharingWebhookCannotReachTimekeeper",
    }


def test_promtool_checks_the_rules_and_the_dashboards_queries_and_the_alerts_fire_as_meant(
    promtool: str, monitoring: list[dict[str, Any]], tmp_path: Path
) -> None:
    groups = rule_groups(monitoring)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    assert "SUCCESS: 11 rules found" in run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    # The dashboard's queries, parsed by Prometheus' own parser as recording rules.
    records = [
        {"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(dashboard_queries(dashboard(monitoring)))
    ]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    run(promtool, "check", "rules", "dashboard.yaml", cwd=tmp_path)
    shutil.copy(Path(__file__).parent / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    assert "SUCCESS" in run(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)


def exported_metrics() -> set[str]:
    """The names the services export: counters with _total, histograms with their series, gauges as they are."""
    names = {"up"}
    for module in ("timekeeper/metrics.py", "webhook/metrics.py"):
        source = (REPO / module).read_text()
        for kind, name in re.findall(r'(Counter|Histogram|GaugeMetricFamily|Gauge)\(\s*"([a-z_]+)"', source):
            names |= (
                {f"{name}_total"}
                if kind == "Counter"
                else {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
                if kind == "Histogram"
                else {name}
            )
    return names


def test_every_metric_the_alerts_and_the_dashboard_use_is_exported(monitoring: list[dict[str, Any]]) -> None:
    expressions = [rule["expr"] for group in rule_groups(monitoring) for rule in group["rules"]]
    expressions += dashboard_queries(dashboard(monitoring))
    board = dashboard(monitoring)
    expressions += [v["query"]["query"] for v in board["templating"]["list"] if isinstance(v.get("query"), dict)]
    used = {
        name
        for expr in expressions
        for name in re.findall(
            r"\b(gpusharing_[a-z_]+|up)\b(?=\s*[{\[)]|\s*$|\s*[-+*/<>=,]|\s+(?:and|unless|or)\b)", expr
        )
    }
    assert used and used <= exported_metrics(), used - exported_metrics()
    assert {"gpusharing_timekeeper_pod_gpu_seconds", "gpusharing_timekeeper_remaining_gpu_seconds",
            "gpusharing_timekeeper_idle_gpu_seconds", "gpusharing_timekeeper_idle_pods_warned"} <= used
