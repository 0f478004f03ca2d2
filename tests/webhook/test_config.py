"""The webhook's settings for reading GPU requests: the GPU model catalogue, HAMi's configuration, DRA, the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusharing.gpu.dra import ClaimSource, ClaimUnknown
from gpusharing.settings.env import ConfigError
from webhook.app import watched_indexes
from webhook.config import WebhookConfig


def test_defaults_are_the_shipped_catalogue_and_hamis_own_names() -> None:
    settings = WebhookConfig.from_env({}).gpu_request
    assert settings.catalogue.default.product == "NVIDIA-A100-SXM4-80GB"
    assert (settings.hami.count, settings.hami.memory, settings.hami.memory_factor) == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        1,
    )
    assert settings.dra_gpu_classes == {"gpu.nvidia.com", "mig.nvidia.com"} and settings.dra_devices_per_node == 8


def test_a_catalogue_file_from_a_config_map(tmp_path: Path) -> None:
    path = tmp_path / "gpu-models.yaml"
    path.write_text("default: NVIDIA H200\nmodels:\n- name: NVIDIA H200\n  memoryMiB: 143771\n")
    catalogue = WebhookConfig.from_env({"GPUSHARING_GPU_MODELS_FILE": str(path)}).gpu_request.catalogue
    assert (catalogue.default.name, catalogue.default.memory_mib) == ("NVIDIA H200", 143771)


def test_gpusharing_device_memory_mib_keeps_naming_the_default_models_memory() -> None:
    catalogue = WebhookConfig.from_env({"GPUSHARING_DEVICE_MEMORY_MIB": "24576"}).gpu_request.catalogue
    assert (catalogue.default.name, catalogue.default.memory_mib) == ("default", 24576)
    assert catalogue.by_product("NVIDIA-H200") is not None  # pods that name a model still get it


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"GPUSHARING_GPU_MODELS_FILE": "/x.yaml", "GPUSHARING_DEVICE_MEMORY_MIB": "1"},
            "set GPUSHARING_GPU_MODELS_FILE or GPUSHARING_DEVICE_MEMORY_MIB, not both",
        ),
        (
            {"GPUSHARING_GPU_MODELS_FILE": "/nonexistent/gpu-models.yaml"},
            "GPUSHARING_GPU_MODELS_FILE: cannot read /nonexistent/gpu-models.yaml",
        ),
        ({"GPUSHARING_DEVICE_MEMORY_MIB": "80Gi"}, "GPUSHARING_DEVICE_MEMORY_MIB='80Gi' must be a whole number"),
        (
            {"GPUSHARING_HAMI_RESOURCE_MEM": "nvidia.com/gpu"},
            "GPUSHARING_HAMI_RESOURCE_NAME, _MEM, _MEM_PERCENTAGE and _CORES must be four different",
        ),
        (
            {"GPUSHARING_HAMI_MEMORY_FACTOR": "0"},
            "GPUSHARING_HAMI_MEMORY_FACTOR='0' must be a whole number, at least 1",
        ),
        (
            {"GPUSHARING_DRA_DEVICES_PER_NODE": "0"},
            "GPUSHARING_DRA_DEVICES_PER_NODE='0' must be a whole number, at least 1",
        ),
        # A poll the timekeeper would answer 400 to (its refreshSeconds bounds, the contract's): refused at start.
        (
            {"GPUSHARING_BUDGET_REFRESH_SECONDS": "0.05"},
            "GPUSHARING_BUDGET_REFRESH_SECONDS='0.05' must be a finite number from 0.1 to 3600",
        ),
        (
            {"GPUSHARING_BUDGET_REFRESH_SECONDS": "7200"},
            "GPUSHARING_BUDGET_REFRESH_SECONDS='7200' must be a finite number from 0.1 to 3600",
        ),
        (
            {"GPUSHARING_METER_INTERVAL_SECONDS": "0"},
            "GPUSHARING_METER_INTERVAL_SECONDS='0' must be a finite number from 0.05 to 300",
        ),
        ({"GPUSHARING_METER_INTERVAL_SECONDS": "1h"}, "GPUSHARING_METER_INTERVAL_SECONDS='1h' must be a finite number"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        WebhookConfig.from_env(environ)
    assert str(refused.value).startswith(message)


def test_hami_and_dra_settings() -> None:
    config = WebhookConfig.from_env(
        {
            "GPUSHARING_HAMI_RESOURCE_NAME": "hami.io/gpu",
            "GPUSHARING_HAMI_RESOURCE_MEM": "hami.io/gpumem",
            "GPUSHARING_HAMI_RESOURCE_MEM_PERCENTAGE": "hami.io/gpumem-percentage",
            "GPUSHARING_HAMI_RESOURCE_CORES": "hami.io/gpucores",
            "GPUSHARING_HAMI_MEMORY_FACTOR": "2",
            "GPUSHARING_HAMI_DEFAULT_MEMORY_MIB": "512",
            "GPUSHARING_HAMI_SCHEDULER_NAME": "vgpu",
            "GPUSHARING_DRA_GPU_DEVICE_CLASSES": "gpu.example.com, gpu.nvidia.com",
            "GPUSHARING_DRA_DEVICES_PER_NODE": "4",
        }
    )
    hami = config.gpu_request.hami
    assert (hami.count, hami.cores, hami.memory_factor, hami.default_memory_mib, hami.scheduler_name) == (
        "hami.io/gpu",
        "hami.io/gpucores",
        2,
        512,
        "vgpu",
    )
    assert (
        config.gpu_request.dra_gpu_classes == {"gpu.example.com", "gpu.nvidia.com"}
        and config.gpu_request.dra_devices_per_node == 4
    )


@pytest.mark.parametrize(
    ("environ", "kubeconfig"),
    [
        ({}, None),
        ({"KUBECONFIG": "/home/ana/.kube/config"}, "/home/ana/.kube/config"),
        (
            {"GPUSHARING_KUBECONFIG": "/etc/webhook.kubeconfig", "KUBECONFIG": "/home/ana/.kube/config"},
            "/etc/webhook.kubeconfig",
        ),
    ],
)
def test_the_api_is_found_through_its_own_setting_then_kubeconfig_then_in_cluster(
    environ: dict[str, str], kubeconfig: str | None
) -> None:
    assert WebhookConfig.from_env(environ).kubeconfig == kubeconfig


def test_outside_a_cluster_without_a_kubeconfig_claims_are_refused_saying_why_and_no_job_or_priority_class_is_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    claims, jobs, priorities = watched_indexes(None)
    with pytest.raises(ClaimUnknown, match="it has no access to the Kubernetes API"):
        claims(ClaimSource.TEMPLATE, "ml-team", "single-gpu")
    assert jobs("ml-team", "train", "uid-1") is None
    assert priorities("gpusharing-in-budget") is None


def test_a_kubeconfig_that_cannot_be_read_stops_the_webhook(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"cannot configure the Kubernetes API from the kubeconfig .*missing \(GPUSHARING_KUBECONFIG, else "
            r"KUBECONFIG\)",
    ):
        watched_indexes(str(tmp_path / "missing"))


def test_safe_admission_waits_briefly_for_its_reservation() -> None:
    assert WebhookConfig.from_env({}).reservation_timeout_seconds == 2.0
    assert WebhookConfig.from_env({"GPUSHARING_RESERVATION_TIMEOUT_SECONDS": "0.5"}).reservation_timeout_seconds == 0.5
    with pytest.raises(ConfigError, match="GPUSHARING_RESERVATION_TIMEOUT_SECONDS"):
        WebhookConfig.from_env({"GPUSHARING_RESERVATION_TIMEOUT_SECONDS": "0"})


def test_the_billing_finalizer_is_on_and_removed_by_the_controller_of_the_webhooks_namespace() -> None:
    config = WebhookConfig.from_env({})
    assert config.billing_finalizer is True
    assert config.billing_accounts == {"system:serviceaccount:gpusharing-system:gpusharing-controller"}
    # Installed elsewhere (the chart's release namespace), the controller's ServiceAccount is there too.
    elsewhere = WebhookConfig.from_env({"GPUSHARING_WEBHOOK_NAMESPACE": "gpu-governance"})
    assert elsewhere.billing_accounts == {"system:serviceaccount:gpu-governance:gpusharing-controller"}
    given = WebhookConfig.from_env(
        {"GPUSHARING_BILLING_FINALIZER": "off", "GPUSHARING_BILLING_ACCOUNTS": " closer , ops "}
    )
    assert (given.billing_finalizer, given.billing_accounts) == (False, {"closer", "ops"})
    with pytest.raises(ConfigError, match="GPUSHARING_BILLING_FINALIZER='sometimes' must be true or false"):
        WebhookConfig.from_env({"GPUSHARING_BILLING_FINALIZER": "sometimes"})
