"""The meter's interval: the webhook gives every meter it injects the interval it is configured with
(GPUSHARING_METER_INTERVAL_SECONDS), the one the timekeeper reads too, so that the meter reports as the timekeeper
reckons; the admission stays idempotent, and the guard keeps recognising the meter."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from flask.testing import FlaskClient

from demo.apiserver import admission_review, example_pod
from gpusharing.contract import MeterEnv
from sidecar.config import MeterConfig
from tests.webhook.conftest import api_server_callers, as_api_server
from tests.webhook.test_admission import admitted, as_the_api_server_stores_it, meter_of, patch_of, review
from tests.webhook.test_guard import refused, update
from timekeeper.config import TimekeeperConfig
from webhook.app import create_app
from webhook.caches.budgets import BudgetStateCache
from webhook.config import WebhookConfig

EXAMPLE = "vcuda-fraction.yaml"


def webhook(budgets: BudgetStateCache, **environ: str) -> FlaskClient:
    """The webhook as `gpusharing webhook serve` builds it from `environ`, called by the API server."""
    return as_api_server(create_app(WebhookConfig.from_env(environ), budgets, callers=api_server_callers()))


def injected_meter(response: dict[str, Any]) -> dict[str, Any]:
    """The meter container the patch of a /mutate answer adds (the pod has no init containers: the list is added)."""
    (added,) = [op for op in patch_of(response) if op["op"] == "add" and op["path"] == "/spec/initContainers"]
    (meter,) = added["value"]
    assert meter["name"] == "gpusharing-meter"
    return meter


def interval_env(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [env for env in container["env"] if env["name"] == MeterEnv.INTERVAL]


def as_the_meter_reads_it(container: dict[str, Any]) -> MeterConfig:
    """The meter's settings from the container's environment, the downward API's fields filled in as the kubelet
    would."""
    fields = {
        "metadata.namespace": "ml-team",
        "metadata.name": "infer",
        "metadata.uid": "5f0c3a52-4d8e-4f3b-9a57-2f4f7f0f6a11",
    }
    environ = {env["name"]: env["value"] if "value" in env else fields[env["valueFrom"]["fieldRef"]["fieldPath"]]
               for env in container["env"]}
    return MeterConfig.from_env(environ)


def test_an_admission_review_of_an_example_gets_a_meter_with_the_configured_interval(budgets: BudgetStateCache) -> None:
    client = webhook(budgets, GPUSHARING_METER_INTERVAL_SECONDS="12.5")
    response = review(client, admission_review(example_pod(EXAMPLE)))
    assert response["allowed"]
    assert interval_env(injected_meter(response)) == [{"name": "GPUSHARING_METER_INTERVAL", "value": "12.5"}]


def test_unset_the_meter_is_given_the_default_interval_explicitly(budgets: BudgetStateCache) -> None:
    response = review(webhook(budgets), admission_review(example_pod(EXAMPLE)))
    assert interval_env(injected_meter(response)) == [{"name": "GPUSHARING_METER_INTERVAL", "value": "30"}]


@pytest.mark.parametrize("raw", ["0.05", "0.1", "7", "12.5", "30", "300", "45.123456789"])
def test_the_injected_meter_and_the_timekeeper_read_one_setting_as_the_same_interval(
    budgets: BudgetStateCache, raw: str
) -> None:
    """One value for the installation, set where the webhook and the timekeeper run: the meter reports at exactly the
    interval the timekeeper judges fresh readings and silent meters by."""
    installation = {"GPUSHARING_METER_INTERVAL_SECONDS": raw}
    _, mutated = admitted(webhook(budgets, **installation), example_pod(EXAMPLE))
    meter = as_the_meter_reads_it(meter_of(mutated))
    timekeeper = TimekeeperConfig.from_env({"TIMEKEEPER_AUTH": "none", **installation})
    assert meter.interval_seconds == timekeeper.meter_interval_seconds == float(raw)


def test_mutating_again_changes_nothing_and_the_validator_admits_the_pod(budgets: BudgetStateCache) -> None:
    client = webhook(budgets, GPUSHARING_METER_INTERVAL_SECONDS="10")
    _, mutated = admitted(client, example_pod(EXAMPLE))
    again = review(client, admission_review(mutated))
    assert again["allowed"] and "patch" not in again
    assert review(client, admission_review(mutated), "/validate")["allowed"]


def test_a_meter_injected_at_another_interval_is_not_one_of_the_webhooks(budgets: BudgetStateCache) -> None:
    """A pod that brings its own meter with another interval (a mutated pod copied from an installation reporting at
    another interval) is refused at creation: only what the webhook injects may carry the meter's name."""
    _, elsewhere = admitted(webhook(budgets, GPUSHARING_METER_INTERVAL_SECONDS="10"), example_pod(EXAMPLE))
    response = review(webhook(budgets), admission_review(elsewhere), "/validate")
    assert refused(response, "reserved for the GPU metering sidecar")


def test_a_pod_admitted_before_the_interval_changed_may_be_updated_but_its_meters_interval_not(
    budgets: BudgetStateCache,
) -> None:
    _, mutated = admitted(webhook(budgets, GPUSHARING_METER_INTERVAL_SECONDS="10"), example_pod(EXAMPLE))
    stored = as_the_api_server_stores_it(mutated)
    stored["metadata"].update(name="infer", uid="5f0c3a52-4d8e-4f3b-9a57-2f4f7f0f6a11")
    restarted = webhook(budgets, GPUSHARING_METER_INTERVAL_SECONDS="20")  # the installation now reports every 20 s

    labelled = copy.deepcopy(stored)
    labelled["metadata"]["labels"] = {"stage": "eval"}
    assert update(restarted, stored, labelled)["allowed"]

    faster = copy.deepcopy(stored)
    (env,) = interval_env(meter_of(faster))
    env["value"] = "0.05"  # a meter reporting 600 times as often as billed for
    assert refused(update(restarted, stored, faster), "GPU metering sidecar", "cannot be changed")

