"""Delivering one report to the timekeeper, and telling apart what is worth retrying from what is not."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from gpusharing.report import MeterReport
from gpusharing.serving.jsonhttp import JsonClient, Unreachable

CONNECT_TIMEOUT_SECONDS = 3.0
REPORTS_PATH = "/api/v1/reports"


class Delivery(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"  # a 4xx: the same report would be refused again, so it is not retried
    UNAVAILABLE = "unavailable"  # no connection, a timeout, a 5xx or no token yet: worth another try


@dataclass(frozen=True)
class Answer:
    delivery: Delivery
    detail: str  # the server's message, or what went wrong on the way
    budget_state: str | None = None


class TimekeeperClient:
    def __init__(self, timekeeper_url: str, token_path: Path) -> None:
        self.token_path = token_path
        self._http = JsonClient(timekeeper_url, connect_timeout=CONNECT_TIMEOUT_SECONDS)  # kept alive between reports

    def send(self, report: MeterReport, timeout: float) -> Answer:
        try:
            # Read afresh every time: the kubelet rotates the projected token in place.
            token = self.token_path.read_text().strip()
        except OSError as exc:
            return Answer(Delivery.UNAVAILABLE, f"cannot read the token file {self.token_path}: {exc.strerror or exc}")
        if not token:
            return Answer(Delivery.UNAVAILABLE, f"the token file {self.token_path} is empty")
        try:
            answer = self._http.request("POST", REPORTS_PATH, report.to_json(), token, timeout)
        except Unreachable as exc:
            return Answer(Delivery.UNAVAILABLE, str(exc))
        detail = f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else "")
        if answer.status >= 500:
            return Answer(Delivery.UNAVAILABLE, detail)
        if answer.status >= 400:
            return Answer(Delivery.REFUSED, detail)
        body = answer.json()
        state = body.get("state") if isinstance(body, dict) else None
        return Answer(Delivery.ACCEPTED, detail, state if isinstance(state, str) else None)

    def close(self) -> None:
        self._http.close()
