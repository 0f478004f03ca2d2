"""JSON over HTTP with the standard library, for whatever talks to the timekeeper: the meter, the webhook's budget
poller and the `gpusharing budget` commands.

The meter runs in every GPU pod under a small memory limit, and http.client costs it a fraction of the memory of
`requests` and its dependencies (docs/operations.md, the meter's footprint). A failure to get an answer is said in
words that tell what to check.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from gpusharing.settings.env import check_http_url

MAX_MESSAGE_CHARS = 300


class Unreachable(Exception):
    """No answer came: the message says why (refused, unknown host, timed out, TLS) and where."""


class TooLarge(Exception):
    """The answer's body is larger than the request allowed: it is not read further."""


@dataclass(frozen=True)
class Answer:
    """A server's answer: its status and reason, and its body as read (within the request's bound)."""

    status: int
    reason: str
    body: bytes

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def message(self) -> str:
        """The server's own words (its `error`, `message` or `detail`, else its body), on one line, cut short."""
        body = self.json()
        said = None
        if isinstance(body, dict):
            said = next((body[key] for key in ("error", "message", "detail") if isinstance(body.get(key), str)), None)
        text = said if said is not None else self.body.decode("utf-8", "replace")
        return " ".join(text.split())[:MAX_MESSAGE_CHARS]


class JsonClient:
    """Requests to one server (`base_url`, http or https), over one connection kept alive between them."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 10.0,
        connect_timeout: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
        token_header: str = "Authorization",
    ) -> None:
        """`ssl_context` for https (default: the system's CAs), `headers` sent with every request, the token of each
        request sent as `token_header: Bearer TOKEN`."""
        self.base_url = check_http_url(base_url)
        self._ssl_context = ssl_context
        self._headers = dict(headers or {})
        self._token_header = token_header
        parts = urllib.parse.urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path
        self.timeout = timeout
        self.connect_timeout = connect_timeout  # None: the request's timeout
        self._connection: http.client.HTTPConnection | None = None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout: float | None = None,
        query: dict[str, str] | None = None,
        max_bytes: int | None = None,
    ) -> Answer:
        """One request; `body` is sent as JSON. Raises Unreachable when no answer comes, whatever its status, and
        TooLarge when its body is longer than `max_bytes`."""
        headers = {"Accept": "application/json", **self._headers}
        payload = None
        if body is not None:
            payload = json.dumps(body, allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        if token:
            headers[self._token_header] = f"Bearer {token}"
        target = self._prefix + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        wait = self.timeout if timeout is None else timeout
        try:
            connection = self._connect(wait)
            connection.request(method, target, body=payload, headers=headers)
            response = connection.getresponse()
            answer = Answer(response.status, response.reason,
                            response.read() if max_bytes is None else response.read(max_bytes + 1))
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise Unreachable(self.describe(exc, wait)) from None
        if max_bytes is not None and len(answer.body) > max_bytes:
            self.close()  # the rest of the body is still on the connection
            raise TooLarge(f"{self.base_url} answered with more than {max_bytes} bytes")
        if response.will_close:
            self.close()
        return answer

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is not None and (connection.sock is None or _dropped(connection.sock)):
            self.close()  # the server closed it while idle (a restart, its keep-alive timeout): open a new one
            connection = None
        if connection is None:
            connect = min(timeout, self.connect_timeout or timeout)
            if self._https:
                connection = http.client.HTTPSConnection(self.host, self.port, timeout=connect,
                                                         context=self._ssl_context or ssl.create_default_context())
            else:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=connect)
            self._connection = connection
            connection.connect()
        assert connection.sock is not None
        connection.sock.settimeout(timeout)  # for the request and its answer
        return connection

    def describe(self, exc: BaseException, timeout: float) -> str:
        """Why no answer came from the server, in words that say what to check."""
        return unreachable_reason(exc, self.host, self.port, self.base_url, timeout)


def unreachable_reason(exc: BaseException, host: str, port: int, url: str, timeout: float) -> str:
    """Why no answer came from `url` (at `host`:`port`), in words that say what to check."""
    where = f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"the host name {host!r} does not resolve: check the URL {url}"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {where}: is the server running there?"
    if isinstance(exc, TimeoutError):
        return f"no answer from {where} within {timeout:g} s"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the TLS certificate of {where} is not trusted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS with {where} failed: {exc.reason or exc}"
    if isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
        return f"{where} closed the connection without an answer"
    if isinstance(exc, OSError) and (exc.strerror or exc.args):
        return f"cannot reach {where}: {exc.strerror or exc}"
    return f"cannot reach {where}: {type(exc).__name__}"


def _dropped(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection was closed by the other end (it reads as ready: end of file)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
