"""How the cluster's GPU backends are configured (GPUSHARING_* environment variables), read alike by the webhook, which
admits pods by it, and the timekeeper, which bills them by it: both must read a pod's GPU request the same way."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpusharing.gpu.catalogue import catalogue_from_env
from gpusharing.gpu.request import DEFAULT_DRA_GPU_CLASSES, GpuRequestSettings, HamiSettings
from gpusharing.settings.env import ConfigError, env_choice, env_int, env_list, env_text

ALIYUN_UNITS = {"GiB": 1024, "MiB": 1}


def gpu_request_settings(environ: Mapping[str, str] = os.environ) -> GpuRequestSettings:
    unit = env_choice("GPUSHARING_ALIYUN_MEM_UNIT", "GiB", tuple(ALIYUN_UNITS), environ)
    return GpuRequestSettings(
        catalogue=catalogue_from_env(environ),
        aliyun_memory_unit_mib=ALIYUN_UNITS[unit],
        hami=_hami(environ),
        dra_gpu_classes=frozenset(
            env_list("GPUSHARING_DRA_GPU_DEVICE_CLASSES", tuple(sorted(DEFAULT_DRA_GPU_CLASSES)), environ)
        ),
        dra_devices_per_node=env_int("GPUSHARING_DRA_DEVICES_PER_NODE", 8, 1, environ),
    )


def _hami(environ: Mapping[str, str]) -> HamiSettings:
    """HAMi's own configuration, under the names of its Helm chart's values."""
    defaults = HamiSettings()
    hami = HamiSettings(
        count=env_text("GPUSHARING_HAMI_RESOURCE_NAME", defaults.count, environ),
        memory=env_text("GPUSHARING_HAMI_RESOURCE_MEM", defaults.memory, environ),
        memory_percentage=env_text("GPUSHARING_HAMI_RESOURCE_MEM_PERCENTAGE", defaults.memory_percentage, environ),
        cores=env_text("GPUSHARING_HAMI_RESOURCE_CORES", defaults.cores, environ),
        memory_factor=env_int("GPUSHARING_HAMI_MEMORY_FACTOR", defaults.memory_factor, 1, environ),
        default_memory_mib=env_int("GPUSHARING_HAMI_DEFAULT_MEMORY_MIB", defaults.default_memory_mib, 0, environ),
        scheduler_name=env_text("GPUSHARING_HAMI_SCHEDULER_NAME", defaults.scheduler_name, environ),
    )
    names = (hami.count, hami.memory, hami.memory_percentage, hami.cores)
    if len(set(names)) < len(names):
        raise ConfigError(
            "GPUSHARING_HAMI_RESOURCE_NAME, _MEM, _MEM_PERCENTAGE and _CORES must be four different resource names"
        )
    return hami
