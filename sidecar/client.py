"""Delivering one report to the timekeeper, and telling apart what is worth retrying from what is not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpusharing.report import MeterReport
from gpusharing.serving.delivery import Delivery, TokenPoster

REPORTS_PATH = "/api/v1/reports"

__all__ = ["Answer", "Delivery", "TimekeeperClient"]


@dataclass(frozen=True)
class Answer:
    delivery: Delivery
    detail: str  # the server's message, or what went wrong on the way
    budget_state: str | None = None


class TimekeeperClient:
    """Sends the meter's reports to the timekeeper over one kept-alive connection, under the pod's projected token."""

    def __init__(self, timekeeper_url: str, token_path: Path) -> None:
        self.token_path = token_path
        self._poster = TokenPoster(timekeeper_url, token_path)  # kept alive between reports

    def send(self, report: MeterReport, timeout: float) -> Answer:
        delivered = self._poster.post(REPORTS_PATH, report.to_json(), timeout)
        state = delivered.body.get("state") if isinstance(delivered.body, dict) else None
        return Answer(delivered.delivery, delivered.detail, state if isinstance(state, str) else None)

    def close(self) -> None:
        self._poster.close()
