"""The meter's settings, read once at start from the environment the webhook injects (documented in
docs/reference/settings.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpusharing.contract import (
    DEFAULT_METER_INTERVAL_SECONDS,
    MAX_METER_INTERVAL_SECONDS,
    METER_STATE_DIR,
    METER_TOKEN_DIR,
    METER_TOKEN_FILE,
    MIN_METER_INTERVAL_SECONDS,
    MeterEnv,
)
from gpusharing.settings.env import ConfigError, env_code, env_float, env_text, env_url
from gpusharing.units.share import MAX_GPU_SHARE

TIME_SCALE = "GPUSHARING_METER_TIME_SCALE"
GPU_READER = "GPUSHARING_METER_GPU_READER"
DEFAULT_GPU_READER = "sidecar.nvml:open_reader"


@dataclass(frozen=True)
class MeterConfig:
    """What the meter is told of its pod and of the timekeeper (`from_env`)."""

    namespace: str  # the pod's, from the downward API like the name and uid
    pod_name: str
    pod_uid: str
    gpu_share: float  # billed share, as the webhook annotated it
    timekeeper_url: str
    token_path: Path = Path(METER_TOKEN_DIR) / METER_TOKEN_FILE  # projected token, re-read for every report
    state_dir: Path = Path(METER_STATE_DIR)  # the emptyDir that outlives a restart of the meter
    # The webhook injects the interval the timekeeper reckons by; this default is for a meter run by hand.
    interval_seconds: float = DEFAULT_METER_INTERVAL_SECONDS
    time_scale: float = 1.0  # DEMO ONLY: bills this many seconds per second so `make demo` spends a budget fast
    gpu_memory_requested_mib: float | None = None
    gpu_reader: str = DEFAULT_GPU_READER  # module:function opening the GPU reader; tests name a fake GPU

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "MeterConfig":
        return cls(
            namespace=env_text(MeterEnv.NAMESPACE, environ=environ),
            pod_name=env_text(MeterEnv.POD_NAME, environ=environ),
            pod_uid=env_text(MeterEnv.POD_UID, environ=environ),
            gpu_share=_positive(MeterEnv.GPU_SHARE, environ, MAX_GPU_SHARE),
            timekeeper_url=str(env_url(MeterEnv.TIMEKEEPER_URL, environ=environ, required=True)),
            token_path=Path(env_text(MeterEnv.TOKEN_PATH, str(cls.token_path), environ)),
            state_dir=Path(env_text(MeterEnv.STATE_DIR, str(cls.state_dir), environ)),
            interval_seconds=env_float(MeterEnv.INTERVAL, cls.interval_seconds, MIN_METER_INTERVAL_SECONDS, environ,
                                       maximum=MAX_METER_INTERVAL_SECONDS),
            time_scale=_time_scale(environ),
            # 0 or unset: not known, so no overrun can be judged (0 would make any use an overrun).
            gpu_memory_requested_mib=env_float(MeterEnv.GPU_MEMORY_MIB, 0.0, 0.0, environ) or None,
            gpu_reader=env_code(GPU_READER, DEFAULT_GPU_READER, environ),
        )


def _positive(name: str, environ: Mapping[str, str], maximum: float) -> float:
    raw = env_text(name, environ=environ)
    value = env_float(name, 0.0, 0.0, environ)
    if not 0 < value <= maximum:
        raise ConfigError(f"{name}={raw!r} must be above 0 and at most {maximum:g}")
    return value


def _time_scale(environ: Mapping[str, str]) -> float:
    if not environ.get(TIME_SCALE, "").strip():
        return 1.0
    return _positive(TIME_SCALE, environ, 1e6)
