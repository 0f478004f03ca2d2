"""The meter's report interval (GPUSHARING_METER_INTERVAL_SECONDS), read alike by the webhook, which gives it to every
meter it injects, and the timekeeper, which reckons by it when a meter's reading is fresh and when a meter is silent:
both must read the same value the same way."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpusharing.contract import (
    DEFAULT_METER_INTERVAL_SECONDS,
    MAX_METER_INTERVAL_SECONDS,
    METER_INTERVAL_SETTING,
    MIN_METER_INTERVAL_SECONDS,
)
from gpusharing.settings.env import env_float


def meter_interval_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds between a meter's reports, within the contract's bounds; ConfigError naming the setting otherwise."""
    return env_float(METER_INTERVAL_SETTING, DEFAULT_METER_INTERVAL_SECONDS, MIN_METER_INTERVAL_SECONDS, environ,
                     maximum=MAX_METER_INTERVAL_SECONDS)
