"""Durations as Kubernetes writes them (Go's time.ParseDuration, metav1.Duration): `4h`, `90s`, `1h30m`, `2.5h`.

Read within bounds, so that a policy's duration is never negative, never absurd, and never costs more to read than
a few dozen characters."""

from __future__ import annotations

import re

MAX_DURATION_TEXT = 32  # "8760h" is 5 characters; a long one is a mistake or an attack
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_WHOLE = re.compile(rf"(?:{_PART.pattern})+")


class DurationError(ValueError):
    """Text that is not a duration within bounds; the message says what to give."""


def parse_duration(raw: object, name: str, low: float = 0.0, high: float = 365 * 24 * 3600.0) -> float:
    """Seconds of a duration (`4h`, `90s`, `1h30m`; a bare `0` too), from `low` to `high` seconds."""
    if not isinstance(raw, str) or not 0 < len(raw) <= MAX_DURATION_TEXT:
        raise DurationError(f"{name} must be a duration as Kubernetes writes it, e.g. 4h, 30m, 90s or 1h30m")
    if raw == "0":
        seconds = 0.0
    elif _WHOLE.fullmatch(raw):
        seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(raw))
    else:
        raise DurationError(
            f"{name} must be a duration as Kubernetes writes it, e.g. 4h, 30m, 90s or 1h30m, not {raw!r}"
        )
    if not low <= seconds <= high:
        raise DurationError(f"{name} must be from {format_duration(low)} to {format_duration(high)}, not {raw}")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest way Kubernetes would read it back: `4h`, `1h30m`, `90s` is `1m30s`, `0s`."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "")
    return text or "0s"
