"""Where the timekeeper finds the Kubernetes API: its own setting, then KUBECONFIG as kubectl reads it, then in-cluster;
the default budget's idle policy from TIMEKEEPER_IDLE_*; the evictions' concurrency and retries."""

from __future__ import annotations

import pytest

from gpusharing.settings.env import ConfigError
from timekeeper.budgets.idle import IdleAction, IdlePolicy
from timekeeper.cluster.evictions import MAX_RETRY_SECONDS
from timekeeper.cluster.fencing import STALE_CLAIM_SECONDS
from timekeeper.cluster.kube import REQUEST_TIMEOUT_SECONDS
from timekeeper.config import EVICTION_RETRY_LIMIT_SECONDS, TimekeeperConfig


@pytest.mark.parametrize(
    ("environ", "kubeconfig"),
    [
        ({"TIMEKEEPER_KUBECONFIG": "/etc/tk.kubeconfig", "KUBECONFIG": "/home/ana/.kube/config"}, "/etc/tk.kubeconfig"),
        ({"KUBECONFIG": "/home/ana/.kube/config:/home/ana/.kube/lab"}, "/home/ana/.kube/config:/home/ana/.kube/lab"),
        ({"TIMEKEEPER_KUBECONFIG": " ", "KUBECONFIG": "/home/ana/.kube/config"}, "/home/ana/.kube/config"),
        ({}, None),  # inside a pod: the in-cluster ServiceAccount
    ],
)
def test_the_kubeconfig_follows_the_kubernetes_clients_convention(environ: dict[str, str], kubeconfig: str | None) -> None:
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ}).kubeconfig == kubeconfig


def test_the_default_budgets_idle_policy_comes_from_the_idle_settings() -> None:
    environ = {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_IDLE_AFTER": "4h", "TIMEKEEPER_IDLE_ACTION": "evict",
               "TIMEKEEPER_IDLE_WARN_BEFORE": "30m", "TIMEKEEPER_IDLE_UTILISATION_PERCENT": "2.5", "TIMEKEEPER_IDLE_MIN_AGE": "1h"}
    assert TimekeeperConfig.from_env(environ).default_idle == IdlePolicy(4 * 3600, IdleAction.EVICT, 1800, 2.5, 3600)
    assert TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"}).default_idle is None  # no policy unless asked


@pytest.mark.parametrize(("environ", "message"), [
    ({"TIMEKEEPER_IDLE_ACTION": "evict"}, "TIMEKEEPER_IDLE_ACTION set without TIMEKEEPER_IDLE_AFTER: set it (e.g. 4h)"),
    ({"TIMEKEEPER_IDLE_AFTER": "4 hours"}, "TIMEKEEPER_IDLE_AFTER must be a duration as Kubernetes writes it"),
    ({"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_WARN_BEFORE": "1h"},
     "TIMEKEEPER_IDLE_WARN_BEFORE (1h) must be shorter than TIMEKEEPER_IDLE_AFTER (1h)"),
    ({"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_UTILISATION_PERCENT": "one"},
     "TIMEKEEPER_IDLE_UTILISATION_PERCENT='one' must be a number"),
    ({"TIMEKEEPER_IDLE_AFTER": "1h", "TIMEKEEPER_IDLE_ACTION": "kill"}, "TIMEKEEPER_IDLE_ACTION must be one of warn, demote, evict"),
])
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


def test_evictions_in_flight_and_their_retries_come_from_their_settings() -> None:
    default = TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none"})
    assert (default.eviction_concurrency, default.eviction_retry_seconds) == (16, 30.0)  # sized for a real API server
    environ = {"TIMEKEEPER_AUTH": "none", "TIMEKEEPER_EVICTION_CONCURRENCY": "4", "TIMEKEEPER_EVICTION_RETRY_SECONDS": "0"}
    assert (TimekeeperConfig.from_env(environ).eviction_concurrency, TimekeeperConfig.from_env(environ).eviction_retry_seconds) == (4, 0.0)


@pytest.mark.parametrize(("environ", "message"), [
    ({"TIMEKEEPER_EVICTION_CONCURRENCY": "0"}, "TIMEKEEPER_EVICTION_CONCURRENCY='0' must be"),
    ({"TIMEKEEPER_EVICTION_CONCURRENCY": "many"}, "TIMEKEEPER_EVICTION_CONCURRENCY='many' must be"),
    # Retries past this would outlast the claim: another leader may take a claim over once it is stale.
    ({"TIMEKEEPER_EVICTION_RETRY_SECONDS": "50"}, "TIMEKEEPER_EVICTION_RETRY_SECONDS='50' must be a finite number from 0 to 45"),
])
def test_eviction_settings_out_of_bounds_are_refused_in_one_line(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **environ})
    assert str(refused.value).startswith(message)


def test_the_retry_limit_ends_a_claims_retries_before_another_leader_may_take_it_over() -> None:
    assert EVICTION_RETRY_LIMIT_SECONDS <= MAX_RETRY_SECONDS
    assert MAX_RETRY_SECONDS + REQUEST_TIMEOUT_SECONDS < STALE_CLAIM_SECONDS
