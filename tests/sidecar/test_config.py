"""MeterConfig: the meter starts only on a complete, well-formed environment, and says which variable is wrong."""

from pathlib import Path

import pytest

from gpusharing.settings.env import ConfigError
from sidecar.config import MeterConfig
from webhook.admission.meter import SERVICE_ACCOUNT_TOKEN_DIR, meter_container
from webhook.config import MeterSpec

ENV = {
    "GPUSHARING_NAMESPACE": "ml",
    "GPUSHARING_POD_NAME": "train-0",
    "GPUSHARING_POD_UID": "0b8a3c1e-2f4d-4c55-9d0e-6a7b8c9d0e1f",
    "GPUSHARING_GPU_SHARE": "0.25",
    "GPUSHARING_TIMEKEEPER_URL": "http://gpusharing-timekeeper:8080/",
}


def test_defaults_are_the_webhook_wiring() -> None:
    config = MeterConfig.from_env(ENV)
    assert config.gpu_share == 0.25
    assert config.timekeeper_url == "http://gpusharing-timekeeper:8080"
    assert config.token_path == Path("/var/run/secrets/gpusharing/token")
    assert config.state_dir == Path("/var/lib/gpusharing-meter")
    assert config.interval_seconds == 30.0
    assert config.time_scale == 1.0
    assert config.gpu_memory_requested_mib is None
    assert config.gpu_reader == "sidecar.nvml:open_reader"


def test_every_setting_is_read() -> None:
    config = MeterConfig.from_env(
        {
            **ENV,
            "GPUSHARING_GPU_MEMORY_MIB": "20480",
            "GPUSHARING_TOKEN_PATH": "/tmp/token",
            "GPUSHARING_METER_STATE_DIR": "/tmp/state",
            "GPUSHARING_METER_INTERVAL": "0.2",
            "GPUSHARING_METER_TIME_SCALE": "60",
            "GPUSHARING_METER_GPU_READER": "tests.sidecar.fake_gpu:open_reader",
        }
    )
    assert (config.gpu_memory_requested_mib, config.interval_seconds, config.time_scale) == (20480.0, 0.2, 60.0)
    assert (config.token_path, config.state_dir) == (Path("/tmp/token"), Path("/tmp/state"))
    assert config.gpu_reader == "tests.sidecar.fake_gpu:open_reader"


def test_a_requested_memory_of_0_is_not_known() -> None:
    assert MeterConfig.from_env({**ENV, "GPUSHARING_GPU_MEMORY_MIB": "0"}).gpu_memory_requested_mib is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"GPUSHARING_NAMESPACE": ""}, "GPUSHARING_NAMESPACE must be set"),
        ({"GPUSHARING_POD_NAME": None}, "GPUSHARING_POD_NAME must be set"),
        ({"GPUSHARING_POD_UID": "  "}, "GPUSHARING_POD_UID must be set"),
        ({"GPUSHARING_GPU_SHARE": None}, "GPUSHARING_GPU_SHARE must be set"),
        ({"GPUSHARING_GPU_SHARE": "half"}, "GPUSHARING_GPU_SHARE='half' must be a finite number"),
        ({"GPUSHARING_GPU_SHARE": "0"}, "GPUSHARING_GPU_SHARE='0' must be above 0 and at most 1000"),
        ({"GPUSHARING_GPU_SHARE": "-1"}, "GPUSHARING_GPU_SHARE='-1' must be a finite number, at least 0"),
        ({"GPUSHARING_GPU_SHARE": "nan"}, "GPUSHARING_GPU_SHARE='nan' must be a finite number"),
        ({"GPUSHARING_GPU_SHARE": "5000"}, "GPUSHARING_GPU_SHARE='5000' must be above 0 and at most 1000"),
        ({"GPUSHARING_TIMEKEEPER_URL": None}, "GPUSHARING_TIMEKEEPER_URL must be set"),
        (
            {"GPUSHARING_TIMEKEEPER_URL": "timekeeper:8080"},
            "GPUSHARING_TIMEKEEPER_URL='timekeeper:8080' must be an http",
        ),
        ({"GPUSHARING_METER_INTERVAL": "soon"}, "GPUSHARING_METER_INTERVAL='soon' must be a finite number"),
        ({"GPUSHARING_METER_INTERVAL": "0"}, "GPUSHARING_METER_INTERVAL='0' must be a finite number from 0.05 to 300"),
        (
            {"GPUSHARING_METER_INTERVAL": "301"},
            "GPUSHARING_METER_INTERVAL='301' must be a finite number from 0.05 to 300",
        ),
        ({"GPUSHARING_METER_INTERVAL": "inf"}, "GPUSHARING_METER_INTERVAL='inf' must be a finite number"),
        ({"GPUSHARING_METER_TIME_SCALE": "0"}, "GPUSHARING_METER_TIME_SCALE='0' must be above 0"),
        ({"GPUSHARING_GPU_MEMORY_MIB": "20Gi"}, "GPUSHARING_GPU_MEMORY_MIB='20Gi' must be a finite number"),
        ({"GPUSHARING_METER_GPU_READER": "fake_gpu"}, "GPUSHARING_METER_GPU_READER='fake_gpu' must be module:function"),
    ],
)
def test_a_missing_or_malformed_setting_is_named(change: dict[str, str | None], message: str) -> None:
    environ = {key: value for key, value in {**ENV, **change}.items() if value is not None}
    with pytest.raises(ConfigError) as error:
        MeterConfig.from_env(environ)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_reads_the_environment_the_webhook_injects() -> None:
    downward_api = {"metadata.namespace": "ml", "metadata.name": "train-0", "metadata.uid": ENV["GPUSHARING_POD_UID"]}
    container = meter_container(MeterSpec(), "0.25", 20480)
    environ = {
        env["name"]: env["value"] if "value" in env else downward_api[env["valueFrom"]["fieldRef"]["fieldPath"]]
        for env in container["env"]
    }

    config = MeterConfig.from_env(environ)

    assert (config.namespace, config.pod_name, config.pod_uid) == ("ml", "train-0", ENV["GPUSHARING_POD_UID"])
    assert (config.gpu_share, config.gpu_memory_requested_mib) == (0.25, 20480.0)
    assert config.timekeeper_url == MeterSpec().timekeeper_url
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    # and nothing at the ServiceAccount token's place but the empty directory that keeps the workload's token out
    assert {str(config.token_path.parent), str(config.state_dir), SERVICE_ACCOUNT_TOKEN_DIR} == mounts
