"""`gpusharing meter`: the metering sidecar the webhook injects into every GPU pod."""

from __future__ import annotations

import argparse

from sidecar.signals import block_stop_signals


def prepare() -> None:
    """Before anything else is loaded (a fifth of a second of imports): SIGTERM and SIGINT wait for the meter."""
    block_stop_signals()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    meter = subparsers.add_parser(
        "meter",
        help="the metering sidecar: report this pod's GPU use to the timekeeper until SIGTERM",
        description="Settings come from GPUSHARING_* environment variables (see docs/reference/settings.md).",
    )
    meter.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    # Imported here so that the other roles' commands do not load NVML.
    from sidecar.config import MeterConfig
    from sidecar.meter import run_meter

    run_meter(MeterConfig.from_env())
    return 0
