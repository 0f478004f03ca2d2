"""A usage report as asked for and as written, and the pod labels it may group by: plain data, without SQL.

The timekeeper's API (timekeeper/api/usage.py) and the administrators' command line (`gpusharing usage`) read the
same request and write the same CSV from here; the ledger records each pod's labels as recorded_labels keeps them.
The sums themselves are SQL, in usage.py.
"""

from __future__ import annotations

import csv
import datetime as dt
import heapq
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A pod's author chooses its labels: only this many are recorded (the first in key order), each a valid Kubernetes
# label. Their characters (letters, digits, '-', '_', '.', '/') cannot begin a spreadsheet formula in the CSV.
MAX_RECORDED_LABELS = 16
MAX_LABEL_VALUE = 63
_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
LABEL_KEY = re.compile(rf"(?:(?={_DNS_SUBDOMAIN}/)[-a-z0-9.]{{1,253}}/)?{_LABEL_NAME}")
LABEL_VALUE = re.compile(rf"(?:{_LABEL_NAME})?")
MAX_LABEL_KEY = 253 + 1 + 63

MAX_DAYS = 3660  # ten years in one report
MAX_GROUP_KEYS = 4
GROUP_KEYS = ("namespace", "day", "model", "pod")
LABEL_PREFIX = "label:"
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")

Labels = tuple[tuple[str, str], ...]


class UsageRequestError(ValueError):
    """A usage report that cannot be made as asked; the message says what to give instead."""


def recorded_labels(labels: object) -> Labels:
    """The labels of a pod that a usage report may group by: valid ones only, at most MAX_RECORDED_LABELS."""
    if not isinstance(labels, Mapping):
        return ()
    valid = (
        (key, value)
        for key, value in labels.items()
        if isinstance(key, str) and isinstance(value, str) and is_label_key(key)
        and len(value) <= MAX_LABEL_VALUE and LABEL_VALUE.fullmatch(value)
    )
    return tuple(heapq.nsmallest(MAX_RECORDED_LABELS, valid))


def is_label_key(key: str) -> bool:
    return len(key) <= MAX_LABEL_KEY and LABEL_KEY.fullmatch(key) is not None


@dataclass(frozen=True)
class UsageRequest:
    """What a usage report sums: the days from `start` to `end`, grouped by `group_by`, of one namespace or all."""

    start: dt.date  # the first day counted
    end: dt.date  # the first day not counted
    group_by: tuple[str, ...]
    namespace: str | None = None


def usage_request(
    start: str | None, end: str | None, group_by: str | None, namespace: str | None = None
) -> UsageRequest:
    """The request that `from`, `to` and `groupBy` (as the API and the command line take them) ask for."""
    first, after = report_days(start, end)
    return UsageRequest(first, after, _group_keys("namespace" if group_by is None else group_by), namespace)


def report_days(start: str | None, end: str | None) -> tuple[dt.date, dt.date]:
    """The UTC days a report's `from` and `to` ask for: the first counted, the first not counted."""
    first, after = _date(start, "from"), _date(end, "to")
    if after <= first:
        raise UsageRequestError(f"to ({after}) must be after from ({first}): to is the first day not counted")
    if (after - first).days > MAX_DAYS:
        raise UsageRequestError(f"a report covers at most {MAX_DAYS} days, not {(after - first).days}")
    return first, after


def _date(raw: str | None, name: str) -> dt.date:
    if raw is None or raw == "":
        raise UsageRequestError(f"{name} is required: a UTC day, YYYY-MM-DD")
    try:
        if not _DATE.fullmatch(raw):
            raise ValueError
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise UsageRequestError(f"{name} must be a UTC day, YYYY-MM-DD, not {raw[:40]!r}") from None


def _group_keys(raw: str) -> tuple[str, ...]:
    keys = raw.split(",", MAX_GROUP_KEYS)
    if len(keys) > MAX_GROUP_KEYS:
        raise UsageRequestError(f"groupBy takes at most {MAX_GROUP_KEYS} keys")
    for key in keys:
        if key in GROUP_KEYS:
            continue
        if not key.startswith(LABEL_PREFIX) or not is_label_key(key[len(LABEL_PREFIX):]):
            raise UsageRequestError(
                f"groupBy keys are {', '.join(GROUP_KEYS)} or {LABEL_PREFIX}KEY with KEY a Kubernetes label key, "
                f"not {key[:80]!r}"
            )
    if len(set(keys)) != len(keys):
        raise UsageRequestError(f"groupBy names a key twice: {raw[:200]!r}")
    return tuple(keys)


AMOUNT_COLUMNS = (
    "gpuSeconds",
    "gpuMinutes",
    "billedGpuSeconds",
    "billedGpuMinutes",
    "meteredGpuMinutes",
    "idleGpuMinutes",
    "idleBilledGpuMinutes",
)


def usage_csv(fields: Sequence[str], items: Iterable[Mapping[str, Any]]) -> str:
    """A report's items as CSV (the JSON's field names as the header; an absent label or idle figure is empty).

    Made from the JSON items, so that the API and the command line write the same CSV.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*fields, *AMOUNT_COLUMNS])
    for item in items:
        writer.writerow([_cell(item.get(column)) for column in (*fields, *AMOUNT_COLUMNS)])
    return out.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same number
    return str(value)
