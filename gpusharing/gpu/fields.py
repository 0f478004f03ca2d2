"""What every dialect's reader shares: a pod's containers, bounded numbers and the errors found."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from typing import Any

from gpusharing.compat import StrEnum
from gpusharing.decoded import as_mapping
from gpusharing.messages import shortened
from gpusharing.units.quantity import BOUNDS, MAX_DIGITS, QuantityError, QuantityOutOfBounds, parse_whole_quantity
from gpusharing.units.share import MAX_GPU_SHARE

MAX_ERRORS_SHOWN = 10  # a pod with thousands of broken containers gets a message of reasonable length
TOO_MANY_DEVICES = f"more than {MAX_GPU_SHARE}, the most GPUs one pod may be billed for"
_UNSIGNED = re.compile(rf"[0-9]{{1,{MAX_DIGITS}}}")


class ContainerRole(StrEnum):
    INIT = "init"
    SIDECAR = "sidecar"  # a native sidecar: an init container with restartPolicy: Always
    REGULAR = "regular"


@dataclass
class Container:
    """One of the pod's containers or init containers, with the GPU keys it sets."""

    name: str
    role: ContainerRole
    index: int  # position among the pod's init containers or its containers
    raw: Mapping[str, Any]
    values: dict[str, str] = field(default_factory=dict)  # GPU keys set in limits or requests

    @cached_property  # once: each rule a dialect checks names it, a dozen times a container
    def subject(self) -> str:
        kind = "container" if self.role is ContainerRole.REGULAR else "init container"
        return f'{kind} "{shortened(self.name)}"'

    @property
    def privileged(self) -> bool:
        return as_mapping(self.raw.get("securityContext")).get("privileged") is True


@dataclass(frozen=True)
class GpuRequestError:
    """One rule a pod breaks: where, the key, the value (cut short) and the rule, read as one line."""

    subject: str  # 'container "infer"', 'annotation', 'label', 'pod'
    key: str  # empty for a rule of the whole pod
    value: str | None
    rule: str

    def __str__(self) -> str:
        shown = f'{self.key}="{self.value}"' if self.value is not None else self.key
        if self.subject in ("annotation", "label"):
            where = f"{self.subject} {shown}"
        else:
            where = ": ".join(p for p in (self.subject, shown) if p)
        return f"{where}: {self.rule}"


class InvalidGpuRequest(ValueError):
    """The pod breaks these rules; the message lists the first MAX_ERRORS_SHOWN and counts the rest."""

    def __init__(self, errors: list[GpuRequestError]):
        shown = "; ".join(str(e) for e in errors[:MAX_ERRORS_SHOWN])
        more = len(errors) - MAX_ERRORS_SHOWN
        super().__init__(shown + (f"; and {more} more" if more > 0 else ""))
        self.errors = errors


class Errors(list[GpuRequestError]):
    """The rules a pod breaks, collected so that one refusal names them all."""

    def add(self, subject: str, key: str, value: object, rule: str) -> None:
        self.append(GpuRequestError(subject, key, None if value is None else shortened(str(value)), rule))


def whole(errors: Errors, subject: str, key: str, raw: object, low: int, high: int | None, rule: str) -> int | None:
    """A quantity that is a whole number in [low, high]; records `rule` and returns None otherwise."""
    if raw is None:
        return None
    try:
        number = parse_whole_quantity(raw)
    except QuantityOutOfBounds as exc:
        errors.add(subject, key, raw, str(exc))
        return None
    except QuantityError:
        number = None
    if number is None or number < low or (high is not None and number > high):
        errors.add(subject, key, raw, rule)
        return None
    return number


def devices(errors: Errors, subject: str, key: str, raw: object, low: int, rule: str) -> int | None:
    """A whole number of devices, at least `low` and no more than one pod may be billed for."""
    count = whole(errors, subject, key, raw, low, None, rule)
    if count is not None and count > MAX_GPU_SHARE:
        errors.add(subject, key, raw, f"asks for {count} GPUs, {TOO_MANY_DEVICES}")
        return None
    return count


def unsigned(errors: Errors, subject: str, key: str, raw: object, rule: str) -> int | None:
    """Digits only, above 0, as Go's strconv.ParseUint reads an annotation (no sign, suffix, exponent or space)."""
    if raw is None:
        return None
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) > MAX_DIGITS:
        errors.add(subject, key, raw, f"has too many digits: {BOUNDS}")
        return None
    if not isinstance(raw, str) or not _UNSIGNED.fullmatch(raw) or int(raw) == 0:
        errors.add(subject, key, raw, rule)
        return None
    return int(raw)


def percent(value: int) -> Decimal:
    return Decimal(value) / 100
