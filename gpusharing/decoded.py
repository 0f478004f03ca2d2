"""Decoded JSON read defensively: an object, a list or an RFC 3339 time where one is expected, else nothing."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from gpusharing.compat import from_iso


def as_mapping(value: object) -> Mapping[str, Any]:
    """The value if it is a JSON object, else empty: the API server sends typed pods, other callers may not."""
    if type(value) is dict:  # what JSON decodes to: spares the ABC check, a tenth of a review's reading
        return value
    if value is None or isinstance(value, (str, list, int, float)):  # a missing field, or JSON of another kind: no
        return {}  # ABC check either (a dozen of them a review, each slower than all else here)
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def instant(raw: object) -> dt.datetime | None:
    """An RFC 3339 time as the API server writes it (`2026-11-25T10:00:00Z`), or None."""
    if not isinstance(raw, str):
        return None
    try:
        at = from_iso(raw)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
