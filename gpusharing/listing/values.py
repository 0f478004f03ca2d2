"""The listing's JSON values read within bounds: each reader returns the value, or None where it is unreadable."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar, TypeGuard, TypeVar

from gpusharing.compat import from_iso

MAX_ITEMS = 100_000  # budgets in one listing: more namespaces and groups than any cluster has
MAX_NAME = 253  # a Kubernetes name's most; budgets' names are at most 63
MAX_TEXT = 64  # an instant, a duration, a kind: a few dozen characters
MAX_REASON = 1024  # a band's one-line reason, cut there
MAX_LEVELS = 16  # a budget's ancestors, warnings or path levels: the hierarchy allows 4 levels above a namespace
MAX_THRESHOLDS = 16  # warning thresholds: at most 5 are set
MAX_IDLE_HOLDS = 100_000  # owners held in one namespace: more than any namespace has
MAX_BAND_CLASSES = 8  # fair share's bands

E = TypeVar("E", bound=Enum)
T = TypeVar("T")


class ListingError(ValueError):
    """An answer that is no budget listing (or no budget's status); the message says what is wrong with it."""


class JsonRecord:
    """A contract object whose JSON is its FIELDS (JSON key: attribute), in the order the timekeeper writes them."""

    FIELDS: ClassVar[Mapping[str, str]]

    def to_json(self) -> dict[str, Any]:
        """The object as the API answers it: one key per field, nested objects and enums as their JSON."""
        return {key: plain(getattr(self, attr)) for key, attr in self.FIELDS.items()}




def plain(value: object) -> Any:
    """A field's value as JSON: a contract object as its JSON, a tuple as a list, an enum as its value."""
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, tuple):
        return [plain(item) for item in value]
    if isinstance(value, Enum):
        return str(value)
    return value


# The readers below check exact types first: the webhook reads every listing every few seconds, in each process, and
# json's decoded values are exactly dict, list, str, int, float or bool.


def is_object(raw: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether it is a JSON object (a dict, or another mapping a caller built)."""
    return type(raw) is dict or isinstance(raw, Mapping)


def read_items(raw: object, read: Callable[[object], T | None], most: int) -> tuple[T, ...]:
    """The first `most` entries of a list that `read` can read; none of anything else."""
    if type(raw) is not list or not raw:
        return ()
    entries = [read(entry) for entry in raw[:most]]
    return tuple(entry for entry in entries if entry is not None)


def read_number(raw: object) -> float | None:
    """A finite JSON number as it came (an int stays one, so that it is written back alike); None otherwise."""
    if type(raw) is float:
        return raw if -math.inf < raw < math.inf else None  # NaN compares false
    return raw if type(raw) is int else None


def read_amount(raw: object) -> float | None:
    """A finite number not below 0; None otherwise."""
    if type(raw) is float:
        return raw if 0 <= raw < math.inf else None
    return raw if type(raw) is int and raw >= 0 else None


def read_whole(raw: object) -> int | None:
    """A JSON whole number (not a boolean); None otherwise."""
    return raw if type(raw) is int else None


def read_flag(raw: object) -> bool | None:
    """true or false; None otherwise."""
    return raw if type(raw) is bool else None


def read_name(raw: object, most: int = MAX_NAME) -> str | None:
    """A non-empty string of at most `most` characters; None otherwise."""
    return raw if type(raw) is str and 0 < len(raw) <= most else None


def read_text(raw: object) -> str | None:
    """A string of at most MAX_TEXT characters; None otherwise."""
    return raw if type(raw) is str and len(raw) <= MAX_TEXT else None


def read_instant(raw: object) -> str | None:
    """An RFC 3339 instant, as it came; None when it is none."""
    text = read_text(raw)
    if text is None:
        return None
    try:
        from_iso(text)
    except ValueError:
        return None
    return text


def read_enum(kind: type[E], raw: object) -> E | None:
    """The member of that value; None for any other."""
    if type(raw) is not str:
        return None
    try:
        return kind(raw)
    except ValueError:
        return None

