"""Delivering one report to the timekeeper, and telling apart what is worth retrying from what is not."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import requests

from gpusharing.report import MeterReport

CONNECT_TIMEOUT_SECONDS = 3.0
MAX_MESSAGE_CHARS = 300


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
    def __init__(self, reports_url: str, token_path: Path) -> None:
        self.reports_url = reports_url
        self.token_path = token_path
        self._session = requests.Session()  # keep-alive between reports

    def send(self, report: MeterReport, timeout: float) -> Answer:
        try:
            # Read afresh every time: the kubelet rotates the projected token in place.
            token = self.token_path.read_text().strip()
        except OSError as exc:
            return Answer(Delivery.UNAVAILABLE, f"cannot read the token file {self.token_path}: {exc.strerror or exc}")
        if not token:
            return Answer(Delivery.UNAVAILABLE, f"the token file {self.token_path} is empty")
        try:
            response = self._session.post(
                self.reports_url,
                json=report.to_json(),
                headers={"Authorization": f"Bearer {token}"},
                timeout=(min(CONNECT_TIMEOUT_SECONDS, timeout), timeout),
            )
        except requests.RequestException as exc:
            return Answer(Delivery.UNAVAILABLE, f"cannot reach {self.reports_url}: {type(exc).__name__}")
        detail = _message(response)
        if response.status_code >= 500:
            return Answer(Delivery.UNAVAILABLE, detail)
        if response.status_code >= 400:
            return Answer(Delivery.REFUSED, detail)
        state = _json(response).get("state")
        return Answer(Delivery.ACCEPTED, detail, state if isinstance(state, str) else None)

    def close(self) -> None:
        self._session.close()


def _json(response: requests.Response) -> dict[str, object]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(response: requests.Response) -> str:
    """HTTP status and the server's own words, on one line."""
    body = _json(response)
    said = next((body[key] for key in ("message", "error", "detail") if isinstance(body.get(key), str)), None)
    text = said if said is not None else response.text
    text = " ".join(text.split())[:MAX_MESSAGE_CHARS]
    return f"HTTP {response.status_code}" + (f": {text}" if text else "")
