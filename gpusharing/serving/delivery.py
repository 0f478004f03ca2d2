"""A body posted to the timekeeper under the poster's projected ServiceAccount token, and its answer told apart as
what is worth another try and what is not: the meter's reports and the node agent's readings alike."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusharing.serving.jsonhttp import JsonClient, Unreachable

CONNECT_TIMEOUT_SECONDS = 3.0


class Delivery(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"  # a 4xx: the same body would be refused again, so it is not retried
    UNAVAILABLE = "unavailable"  # no connection, a timeout, a 5xx or no token yet: worth another try


@dataclass(frozen=True)
class Delivered:
    """How a post went, and the answer's words and body."""

    delivery: Delivery
    detail: str  # the server's message, or what went wrong on the way
    body: Any = None  # the answer's JSON body, when accepted


class TokenPoster:
    """Posts to one timekeeper over a connection kept alive, with the token in `token_path` re-read for every post:
    the kubelet rotates a projected token in place."""

    def __init__(self, timekeeper_url: str, token_path: Path) -> None:
        self.token_path = token_path
        self._http = JsonClient(timekeeper_url, connect_timeout=CONNECT_TIMEOUT_SECONDS)

    def post(self, path: str, body: Any, timeout: float) -> Delivered:
        try:
            token = self.token_path.read_text().strip()
        except OSError as exc:
            return Delivered(
                Delivery.UNAVAILABLE, f"cannot read the token file {self.token_path}: {exc.strerror or exc}"
            )
        if not token:
            return Delivered(Delivery.UNAVAILABLE, f"the token file {self.token_path} is empty")
        try:
            answer = self._http.request("POST", path, body, token, timeout)
        except Unreachable as exc:
            return Delivered(Delivery.UNAVAILABLE, str(exc))
        detail = f"HTTP {answer.status}" + (f": {answer.message}" if answer.message else "")
        if answer.status >= 500:
            return Delivered(Delivery.UNAVAILABLE, detail)
        if answer.status >= 400:
            return Delivered(Delivery.REFUSED, detail)
        return Delivered(Delivery.ACCEPTED, detail, answer.json())

    def close(self) -> None:
        self._http.close()
