"""Budgets and top-ups as the API takes them: JSON bodies checked, with refusals that say why. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypeVar

from gpusharing.commitment import ADMISSION_ID
from gpusharing.compat import StrEnum
from gpusharing.contract import AdmissionMode, Period, Shortfall
from gpusharing.idle.policy import IdlePolicyError, idle_policy_from_json
from gpusharing.names import InvalidName, check_budget_name, check_namespace, is_group
from gpusharing.thresholds import check_warning_thresholds
from timekeeper.budgets.status import Budget


class BudgetRequestError(ValueError):
    """A budget or top-up request that must be refused; the message says why."""


MAX_GPU_MINUTES = 1e12  # far beyond any fleet's month; rejects typos that would read as "unlimited"
MAX_REASON = 1000


BUDGET_FIELDS = {"gpuMinutes": "gpu_minutes", "period": "period", "evictOnExhaustion": "evict_on_exhaustion",
                 "parent": "parent", "warningThresholds": "warning_thresholds", "admission": "admission",
                 "onShortfall": "on_shortfall", "idle": "idle"}


def budget_from_json(name: str, body: object, default_period: Period) -> Budget:
    """A budget from `PUT /api/v1/budgets/{name}`: gpuMinutes (a number, or null for unlimited), period,
    evictOnExhaustion, parent, warningThresholds, admission, onShortfall, idle."""
    fields = _object(
        body, required=("gpuMinutes",), optional=tuple(key for key in BUDGET_FIELDS if key != "gpuMinutes")
    )
    given = _budget_fields(fields)
    return replace(Budget(check_budget_name(name), given["gpu_minutes"], default_period), **given)


def budget_changes_from_json(body: object) -> dict[str, Any]:
    """The changes of `PATCH /api/v1/budgets/{namespace}`: the fields it names, at least one, as Budget's."""
    changes = _budget_fields(_object(body, required=(), optional=tuple(BUDGET_FIELDS)))
    if not changes:
        raise BudgetRequestError(f"name at least one of {', '.join(BUDGET_FIELDS)}")
    return changes


def _budget_fields(fields: dict[str, Any]) -> dict[str, Any]:
    given: dict[str, Any] = {}
    if "gpuMinutes" in fields:
        raw = fields["gpuMinutes"]
        given["gpu_minutes"] = None if raw is None else _minutes(raw, "gpuMinutes", allow_zero=True)
    if "period" in fields:
        given["period"] = _one_of(fields["period"], "period", Period)
    if "evictOnExhaustion" in fields:
        if not isinstance(fields["evictOnExhaustion"], bool):
            raise BudgetRequestError("evictOnExhaustion must be true or false")
        given["evict_on_exhaustion"] = fields["evictOnExhaustion"]
    if "parent" in fields:
        parent = fields["parent"]
        if parent is not None and not isinstance(parent, str):
            raise BudgetRequestError("parent must be a group budget's name (e.g. team.vision), or null for none")
        if parent is not None and not is_group(parent):
            raise BudgetRequestError(
                f"parent {parent!r} is a namespace's name: a parent is a group budget (a name with a dot, "
                "e.g. team.vision)"
            )
        try:
            given["parent"] = None if parent is None else check_budget_name(parent, "parent")
        except InvalidName as exc:
            raise BudgetRequestError(str(exc)) from None
    if "warningThresholds" in fields:
        try:
            given["warning_thresholds"] = check_warning_thresholds(fields["warningThresholds"])
        except ValueError as exc:
            raise BudgetRequestError(str(exc)) from None
    if "admission" in fields:
        given["admission"] = _one_of(fields["admission"], "admission", AdmissionMode)
    if "onShortfall" in fields:
        given["on_shortfall"] = _one_of(fields["onShortfall"], "onShortfall", Shortfall)
    if "idle" in fields:
        try:
            given["idle"] = idle_policy_from_json(fields["idle"])
        except IdlePolicyError as exc:
            raise BudgetRequestError(str(exc)) from None
    return given


Choice = TypeVar("Choice", bound=StrEnum)


def _one_of(value: object, key: str, choices: type[Choice]) -> Choice:
    if not isinstance(value, str) or value not in tuple(choices):
        raise BudgetRequestError(f"{key} must be one of {', '.join(choices)}, not {value!r}")
    return choices(value)


def top_up_from_json(body: object) -> tuple[float, str]:
    """GPU-minutes and reason from `POST /api/v1/budgets/{namespace}/top-ups`."""
    fields = _object(body, required=("gpuMinutes", "reason"), optional=())
    reason = fields["reason"]
    # Printable: no control characters (a database refuses NUL) and no lone surrogates (not UTF-8).
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON or not reason.isprintable():
        raise BudgetRequestError(
            f"reason must be a non-empty line of printable text of at most {MAX_REASON} characters"
        )
    return _minutes(fields["gpuMinutes"], "gpuMinutes", allow_zero=False), reason.strip()


MAX_RESERVATION = 2**62  # weighted micro-GPU-seconds: far beyond any commitment, and within a BIGINT


@dataclass(frozen=True)
class Reservation:
    """Safe admission's request to hold a pod's commitment (`POST /api/v1/reservations`)."""

    id: str  # the AdmissionReview's uid
    namespace: str
    micro_gpu_seconds: int
    replaces: str | None = None  # the admission id the pod carried: the webhook's earlier reservation for it
    dry_run: bool = False  # only whether it would be granted


def reservation_from_json(body: object) -> Reservation:
    """A reservation: id, namespace, microGpuSeconds, and optionally replaces and dryRun."""
    fields = _object(body, required=("id", "namespace", "microGpuSeconds"), optional=("replaces", "dryRun"))
    ids = [fields["id"], *([fields["replaces"]] if fields.get("replaces") is not None else [])]
    if not all(isinstance(i, str) and ADMISSION_ID.fullmatch(i) for i in ids):
        raise BudgetRequestError("id and replaces must be admission ids: 1 to 64 letters, digits and dashes")
    micro = fields["microGpuSeconds"]
    if isinstance(micro, bool) or not isinstance(micro, int) or not 0 < micro <= MAX_RESERVATION:
        raise BudgetRequestError(f"microGpuSeconds must be a whole number from 1 to {MAX_RESERVATION}")
    dry_run = fields.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise BudgetRequestError("dryRun must be true or false")
    if not isinstance(fields["namespace"], str):
        raise BudgetRequestError("namespace must be a namespace's name")
    return Reservation(fields["id"], check_namespace(fields["namespace"]), micro, fields.get("replaces"), dry_run)


def _object(body: object, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BudgetRequestError("the body must be a JSON object")
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise BudgetRequestError(f"unknown field(s): {', '.join(unknown)}")
    missing = [key for key in required if key not in body]
    if missing:
        raise BudgetRequestError(f"missing field(s): {', '.join(missing)}")
    return body


def _minutes(value: object, key: str, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetRequestError(f"{key} must be a number")
    low_ok = value >= 0 if allow_zero else value > 0  # false for NaN too
    if not low_ok or value > MAX_GPU_MINUTES:
        bound = "at least 0" if allow_zero else "greater than 0"
        raise BudgetRequestError(f"{key} must be a finite number, {bound} and at most {MAX_GPU_MINUTES:g}, not {value}")
    return float(value)
