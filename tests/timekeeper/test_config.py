"""Where the timekeeper finds the Kubernetes API: its own setting, then KUBECONFIG as kubectl reads it, then in-cluster;
the default budget's idle policy from TIMEKEEPER_IDLE_*; the utilisation source; the evictions' concurrency and
retries."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusharing.idle.policy import IdleAction, IdlePolicy
from gpusharing.kube.client import REQUEST_TIMEOUT_SECONDS
from gpusharing.settings.env import ConfigError
from gpusharing.statements.note import Verifier, generate_signer
from timekeeper.accounting.dcgm import DcgmQuery
from timekeeper.chargeback.statements import SigningKeys
from timekeeper.cluster.evictions import MAX_RETRY_SECONDS
from timekeeper.config import EVICTION_RETRY_LIMIT_SECONDS, PrometheusSource, TimekeeperConfig
from timekeeper.database.cluster.fencing import STALE_CLAIM_SECONDS


@pytest.mark.parametrize(
    ("environ", "kubeconfig"),
    [
        ({"TIMEKEEPER_KUBECONFIG": "/etc/tk.kubeconfig", "KUBECONFIG": "/home/ana/.kube/config"}, "/etc/tk.kubeconfig"),
        ({"KUBECONFIG": "/home/ana/.kube/config:/home/ana/.kube/lab"}, "/home/ana/.kube/config:/home/ana/.kube/lab"),
        ({"TIMEKEEPER_KUBECONFIG": " ", "KUBECONFIG": "/home/ana/.kube/config"}, "/home/ana/.kube/config"),
        ({}, None),  # inside a pod: the in-cluster ServiceAccount
    ],
)
def test_the_kubeconfig_follows_the_kubernetes_clients_convention(
    environ: dict[str, str], kubeconfig: str | None
) -> None:
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ}).kubeconfig == kubeconfig


def test_the_default_budgets_idle_policy_comes_from_the_idle_settings() -> None:
    environ = {
        "TIMEKEEPER_AUTH": "none",
        "TIMEKEEPER_IDLE_AFTER": "4h",
        "TIMEKEEPER_IDLE_ACTION": "evict",
        "TIMEKEEPER_IDLE_WARN_BEFORE": "30m",
        "TIMEKEEPER_IDLE_UTILISATION_PERCENT": "2.5",
        "TIMEKEEPER_IDLE_MIN_AGE": "1h",
    }
    assert TimekeeperConfig.from_env(environ).default_idle == IdlePolicy(4 * 3600, IdleAction.EVICT, 1800, 2.5, 3600)
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"}).default_idle is None  # no policy unless asked


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"TIMEKEEPER_IDLE_ACTION": "evict"},
            "TIMEKEEPER_IDLE_ACTION set without TIMEKEEPER_IDLE_AFTER: set it (e.g. 4h)",
        ),
        ({"TIMEKEEPER_IDLE_AFTER": "4 hours"}, "TIMEKEEPER_IDLE_AFTER must be a duration as Kubernetes writes it"),
        (
            {"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_WARN_BEFORE": "1h"},
            "TIMEKEEPER_IDLE_WARN_BEFORE (1h) must be shorter than TIMEKEEPER_IDLE_AFTER (1h)",
        ),
        (
            {"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_UTILISATION_PERCENT": "one"},
            "TIMEKEEPER_IDLE_UTILISATION_PERCENT='one' must be a number",
        ),
        (
            {"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_ACTION": "kill"},
            "TIMEKEEPER_IDLE_ACTION must be one of warn, demote, evict",
        ),
    ],
)
def test_idle_settings_that_cannot_be_a_policy_are_refused_in_one_line(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ})
    assert str(refused.value).startswith(message)


def test_the_meters_interval_is_the_installations_one_setting_the_webhook_injects() -> None:
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"}).meter_interval_seconds == 30.0
    environ = {"TIMEKEEPER_AUTH": "none", "GPUSHARING_METER_INTERVAL_SECONDS": "12.5"}
    assert TimekeeperConfig.from_env(environ).meter_interval_seconds == 12.5


def test_the_timekeepers_own_meter_interval_is_refused_naming_the_setting_to_use_instead() -> None:
    environ = {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_METER_INTERVAL_SECONDS": "10"}
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env(environ)
    assert str(refused.value) == ("TIMEKEEPER_METER_INTERVAL_SECONDS is no longer read: "
                                  "set GPUSHARING_METER_INTERVAL_SECONDS instead")
    with pytest.raises(ConfigError):  # set beside the new one too: the old value would be lost without a word
        TimekeeperConfig.from_env({**environ, "GPUSHARING_METER_INTERVAL_SECONDS": "10"})


@pytest.mark.parametrize("raw", ["0.01", "301", "-30"])
def test_a_meter_interval_out_of_bounds_is_refused_with_the_bounds(raw: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", "GPUSHARING_METER_INTERVAL_SECONDS": raw})
    assert str(refused.value) == f"GPUSHARING_METER_INTERVAL_SECONDS={raw!r} must be a finite number from 0.05 to 300"


def test_the_utilisation_source_is_the_meters_unless_prometheus_is_named_with_its_url() -> None:
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"}).prometheus is None
    environ = {
        "TIMEKEEPER_AUTH": "none",
        "TIMEKEEPER_UTILISATION_SOURCE": "prometheus",
        "TIMEKEEPER_PROMETHEUS_URL": "https://thanos-querier.openshift-monitoring.svc:9091/",
        "TIMEKEEPER_PROMETHEUS_CA_FILE": "/etc/ca/service-ca.crt",
        "TIMEKEEPER_PROMETHEUS_TOKEN_FILE": "/var/run/token",
        "TIMEKEEPER_PROMETHEUS_POD_LABEL": "pod",
        "TIMEKEEPER_PROMETHEUS_NAMESPACE_LABEL": "namespace",
        "TIMEKEEPER_PROMETHEUS_POD_UID_LABEL": "",
        "TIMEKEEPER_PROMETHEUS_METRICS": "DCGM_FI_DEV_GPU_UTIL",
        "TIMEKEEPER_PROMETHEUS_PER_POD_METRIC": "DCGM_FI_DEV_GPU_UTIL",
        "TIMEKEEPER_UTILISATION_INTERVAL_SECONDS": "30",
        "TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS": "60",
        "TIMEKEEPER_PROMETHEUS_SELECTOR": 'namespace="nvidia-gpu-operator"',
    }
    config = TimekeeperConfig.from_env(environ)
    assert config.tasks.utilisation == 30.0
    assert config.prometheus == PrometheusSource(
        url="https://thanos-querier.openshift-monitoring.svc:9091",
        ca_file="/etc/ca/service-ca.crt",
        token_file="/var/run/token",
        query=DcgmQuery(
            namespace_label="namespace",
            pod_label="pod",
            pod_uid_label="",
            metrics=("DCGM_FI_DEV_GPU_UTIL",),
            per_pod_metric="DCGM_FI_DEV_GPU_UTIL",
            window_seconds=60,
            selector='namespace="nvidia-gpu-operator"',
        ),
    )
    defaults = TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_UTILISATION_SOURCE": "prometheus",
                                          "TIMEKEEPER_PROMETHEUS_URL": "http://prometheus:9090"}).prometheus
    assert defaults is not None and defaults.query == DcgmQuery()  # the GPU Operator's labels, GR_ENGINE_ACTIVE first


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"TIMEKEEPER_UTILISATION_SOURCE": "dcgm"},
            "TIMEKEEPER_UTILISATION_SOURCE='dcgm' must be one of meter, prometheus",
        ),
        ({"TIMEKEEPER_PROMETHEUS_URL": ""}, "TIMEKEEPER_PROMETHEUS_URL must be set"),
        (
            {"TIMEKEEPER_PROMETHEUS_URL": "prometheus:9090"},
            "TIMEKEEPER_PROMETHEUS_URL='prometheus:9090' must be an http:// or https:// URL",
        ),
        (
            {"TIMEKEEPER_PROMETHEUS_POD_LABEL": 'pod"}) or vector(1'},
            "TIMEKEEPER_PROMETHEUS_POD_LABEL='pod\"}) or vector(1' must be a Prometheus label name",
        ),
        (
            {"TIMEKEEPER_PROMETHEUS_SELECTOR": 'namespace="gpu-operator"} or vector(100) or x{a="b"'},
            "TIMEKEEPER_PROMETHEUS_SELECTOR='namespace=\"gpu-operator\"} or vector(100) or x{a=\"b\"' must be PromQL "
            "label matchers",
        ),
        (
            {"TIMEKEEPER_PROMETHEUS_NAMESPACE_LABEL": ""},
            "TIMEKEEPER_PROMETHEUS_NAMESPACE_LABEL='' must be a Prometheus label name",
        ),
        (
            {"TIMEKEEPER_PROMETHEUS_METRICS": "DCGM_FI_DEV_POWER_USAGE"},
            "'DCGM_FI_DEV_POWER_USAGE' is not one of DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        ),
        ({"TIMEKEEPER_PROMETHEUS_METRICS": ","}, "TIMEKEEPER_PROMETHEUS_METRICS must name at least one metric"),
        ({"TIMEKEEPER_PROMETHEUS_PER_POD_METRIC": "up"}, "'up' is not one of"),
        (
            {"TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS": "30"},
            "TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS=30 must be from TIMEKEEPER_UTILISATION_INTERVAL_SECONDS (60) to 3600",
        ),
        (
            {"TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS": "5"},
            "TIMEKEEPER_PROMETHEUS_WINDOW_SECONDS='5' must be a whole number, at least 10",
        ),
    ],
)
def test_a_prometheus_source_it_cannot_query_is_refused_at_start_naming_the_setting(
    environ: dict[str, str], message: str
) -> None:
    base = {
        "TIMEKEEPER_AUTH": "none",
        "TIMEKEEPER_UTILISATION_SOURCE": "prometheus",
        "TIMEKEEPER_PROMETHEUS_URL": "http://prometheus:9090",
    }
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env({**base, **environ})
    assert message in str(refused.value)
def test_evictions_in_flight_and_their_retries_come_from_their_settings() -> None:
    default = TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"})
    assert (default.eviction_concurrency, default.eviction_retry_seconds) == (16, 30.0)  # sized for a real API server
    environ = {
        "TIMEKEEPER_AUTH": "none",
        "TIMEKEEPER_EVICTION_CONCURRENCY": "4",
        "TIMEKEEPER_EVICTION_RETRY_SECONDS": "0",
    }
    assert (
        TimekeeperConfig.from_env(environ).eviction_concurrency,
        TimekeeperConfig.from_env(environ).eviction_retry_seconds,
    ) == (4, 0.0)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TIMEKEEPER_EVICTION_CONCURRENCY": "0"}, "TIMEKEEPER_EVICTION_CONCURRENCY='0' must be"),
        ({"TIMEKEEPER_EVICTION_CONCURRENCY": "many"}, "TIMEKEEPER_EVICTION_CONCURRENCY='many' must be"),
        # Retries past this would outlast the claim: another leader may take a claim over once it is stale.
        (
            {"TIMEKEEPER_EVICTION_RETRY_SECONDS": "50"},
            "TIMEKEEPER_EVICTION_RETRY_SECONDS='50' must be a finite number from 0 to 45",
        ),
    ],
)
def test_eviction_settings_out_of_bounds_are_refused_in_one_line(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ})
    assert str(refused.value).startswith(message)


def test_the_retry_limit_ends_a_claims_retries_before_another_leader_may_take_it_over() -> None:
    assert EVICTION_RETRY_LIMIT_SECONDS <= MAX_RETRY_SECONDS
    assert MAX_RETRY_SECONDS + REQUEST_TIMEOUT_SECONDS < STALE_CLAIM_SECONDS


def test_statements_are_signed_with_the_key_files_given_and_off_without_one(tmp_path: Path) -> None:
    current, previous = generate_signer("finance-2027"), generate_signer("finance")
    (tmp_path / "key").write_text(current.text + "\n")
    (tmp_path / "previous-key").write_text(previous.text + "\n")
    assert TimekeeperConfig.from_env({}).chargeback.signing is None
    signing = TimekeeperConfig.from_env({"TIMEKEEPER_STATEMENT_KEY_FILE": str(tmp_path / "key"),
                                         "TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE": str(tmp_path / "previous-key")})
    assert _verifiers(signing.chargeback.signing) == (current.verifier, previous.verifier)
    # The chart mounts both paths: a previous key's file that is absent is no previous key.
    alone = TimekeeperConfig.from_env({"TIMEKEEPER_STATEMENT_KEY_FILE": str(tmp_path / "key"),
                                       "TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE": str(tmp_path / "absent")})
    assert _verifiers(alone.chargeback.signing) == (current.verifier, None)


def _verifiers(keys: SigningKeys | None) -> tuple[Verifier, Verifier | None]:
    assert keys is not None
    return keys.current.verifier, keys.previous.verifier if keys.previous else None


@pytest.mark.parametrize(("content", "message"), [
    (None, "TIMEKEEPER_STATEMENT_KEY_FILE=.* cannot be read"),
    ("finance+01234567+AQ==", "TIMEKEEPER_STATEMENT_KEY_FILE=.* is not a signing key"),
    ("x" * 5000, "is longer than a signing key"),
])
def test_a_signing_key_file_that_is_no_key_is_refused_at_start(tmp_path: Path, content: str | None,
                                                              message: str) -> None:
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        TimekeeperConfig.from_env({"TIMEKEEPER_STATEMENT_KEY_FILE": str(path)})
    with pytest.raises(ConfigError, match="TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE is set without"):
        TimekeeperConfig.from_env({"TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE": str(path)})
