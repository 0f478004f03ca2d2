"""Command-line argument types whose refusals say what to give instead (argparse prints them as usage errors)."""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable

from gpusharing.names import GROUP, OBJECT_NAME, InvalidName, check_budget_name, check_namespace
from gpusharing.settings.env import ConfigError, check_http_url
from gpusharing.thresholds import check_warning_thresholds

_DNS_NAME = re.compile(r"^(\*\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$")


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argument type for a whole number from `low` to `high`."""
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{raw} must be from {low:,} to {high:,}")
        return value

    return parse


def namespace(raw: str) -> str:
    try:
        return check_namespace(raw, "")
    except InvalidName as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None


def object_name(raw: str) -> str:
    """The name of a Service, a Secret, a ServiceAccount or a webhook configuration, as the chart names them."""
    try:
        return OBJECT_NAME.check(raw, "")
    except InvalidName as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None


def budget_name(raw: str) -> str:
    """A namespace, or a group budget's name (team.vision)."""
    try:
        return check_budget_name(raw, "")
    except InvalidName as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None


def group_name(raw: str) -> str:
    try:
        return GROUP.check(raw, "")
    except InvalidName as exc:
        raise argparse.ArgumentTypeError(str(exc).strip()) from None


def percents(raw: str) -> tuple[int, ...]:
    """Warning thresholds: whole percents joined by commas ('80,95'; '' for none)."""
    try:
        return check_warning_thresholds([int(part) for part in raw.split(",") if part.strip()], "the thresholds")
    except ValueError as exc:
        message = str(exc) if "thresholds" in str(exc) else f"{raw!r} is not a list of whole percents joined by commas"
        raise argparse.ArgumentTypeError(message) from None


def host_name(raw: str) -> str:
    """A DNS name or an IP address, as a certificate names its server."""
    try:
        ipaddress.ip_address(raw)
        return raw
    except ValueError:
        pass
    if len(raw) > 253 or not _DNS_NAME.match(raw):
        raise argparse.ArgumentTypeError(f"{raw!r} is neither a DNS name (lower-case) nor an IP address")
    return raw


def gpu_minutes(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of GPU-minutes: give a finite number, 0 or more")
    return value


def http_url(raw: str) -> str:
    try:
        return check_http_url(raw)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
