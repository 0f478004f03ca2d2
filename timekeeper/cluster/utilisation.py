"""The `utilisation` task (TIMEKEEPER_UTILISATION_SOURCE=prometheus): every interval, DCGM's series read from
Prometheus (timekeeper.accounting.dcgm), made readings of the governed pods in the shared cache, and handed to the
ingestion (a UtilisationSink). Prometheus unreachable or unreadable is an outage, logged when it starts and ends;
the pods' readings are unknown meanwhile.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpusharing.outage import Outage
from gpusharing.serving.jsonhttp import JsonClient, TooLarge, Unreachable
from gpusharing.settings.env import ConfigError
from gpusharing.utilisation import PodUtilisation, UtilisationSource
from timekeeper import metrics
from timekeeper.accounting.dcgm import MAX_ANSWER_BYTES, AnswerError, pod_readings, read_answer, utilisation_query
from timekeeper.accounting.record import RecordedPod
from timekeeper.config import PrometheusSource

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 16 * 1024
MEANWHILE = (
    "the pods' GPU utilisation from Prometheus is unknown meanwhile (the meters' and node agents' reports still count)"
)


class UtilisationSink(Protocol):
    """The timekeeper's ingestion of utilisation readings (timekeeper.accounting's record_utilisation): `readings`
    from `source`, spanning `window_seconds` up to `at`."""

    def __call__(self, source: UtilisationSource, readings: Sequence[PodUtilisation], window_seconds: float,
                 at: dt.datetime) -> object: ...


@dataclass(frozen=True)
class UtilisationPass:
    """What one run read: how many series Prometheus gave, and the readings handed on."""

    series: int
    readings: tuple[PodUtilisation, ...]


class PrometheusUtilisation:
    """The `utilisation` task: `pods` gives the governed pods' records by (namespace, name), None until listed."""

    def __init__(self, source: PrometheusSource, pods: Callable[[], Mapping[tuple[str, str], RecordedPod] | None],
                 sink: UtilisationSink) -> None:
        self.source = source
        self.query = utilisation_query(source.query)
        self._pods = pods
        self._sink = sink
        self._client = JsonClient(source.url, timeout=source.timeout_seconds, ssl_context=_tls(source.ca_file))
        self.outage = Outage(log, f"Prometheus at {source.url}", "queries")

    def run(self, now: dt.datetime) -> UtilisationPass | None:
        """One query, its readings handed to the sink; None when there was nothing to read or Prometheus failed."""
        pods = self._pods()
        if pods is None:
            return None  # the pod cache has not listed yet: no series could be matched
        try:
            answer = self._client.request("GET", "/api/v1/query", query={"query": self.query}, token=self._token(),
                                          max_bytes=MAX_ANSWER_BYTES)
            series = read_answer(answer.body, self.source.query) if answer.status == 200 else None
        except (Unreachable, TooLarge, AnswerError, OSError) as exc:
            self.outage.failed(exc, MEANWHILE)
            return None
        if series is None:
            self.outage.failed(f"HTTP {answer.status} {answer.reason}: {answer.message}", MEANWHILE)
            return None
        self.outage.succeeded("pods' GPU utilisation read again")
        readings = pod_readings(series, pods, self.source.query, now)
        unknown = sum(reading.utilisation_percent is None for reading in readings)
        metrics.UTILISATION_READINGS.labels("known").set(len(readings) - unknown)
        metrics.UTILISATION_READINGS.labels("unknown").set(unknown)
        self._sink(UtilisationSource.PROMETHEUS, readings, float(self.source.query.window_seconds), now)
        return UtilisationPass(len(series), tuple(readings))

    def _token(self) -> str | None:
        """The token, read at each query: a projected ServiceAccount token is rotated on disk."""
        if self.source.token_file is None:
            return None
        with open(self.source.token_file, "rb") as file:
            token = file.read(MAX_TOKEN_BYTES).strip()
        if not token:
            return None
        if not all(33 <= byte < 127 for byte in token):  # it goes into a header as it is
            raise OSError(f"{self.source.token_file} does not hold a token: not one word of visible ASCII")
        return token.decode("ascii")

    def close(self) -> None:
        self._client.close()


def _tls(ca_file: str | None) -> ssl.SSLContext | None:
    if ca_file is None:
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TIMEKEEPER_PROMETHEUS_CA_FILE={ca_file}: {getattr(exc, 'strerror', None) or exc}") from None
