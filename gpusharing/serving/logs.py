"""One logging setup for every role: a line per record on stderr, with a UTC timestamp, the level and the process.

GPUSHARING_LOG_LEVEL (debug, info, warning, error; default info) and GPUSHARING_LOG_FORMAT: `text` (default), or
`json`, one object per line for a log collector, carrying the fields a call passes in `extra` (namespace, pod,
decision, request_id, ...). gunicorn's own lines go through the same handler (gpusharing.serving.server).
Only the standard library: the meter loads this too.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from gpusharing.settings.env import env_choice

LEVEL_ENV = "GPUSHARING_LOG_LEVEL"
FORMAT_ENV = "GPUSHARING_LOG_FORMAT"
LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")

# Libraries' lines that say nothing to an operator at info (Alembic lists its plugins at every start).
QUIETER = {"alembic.runtime.plugins": logging.WARNING}

# What every LogRecord has; anything else on a record came from `extra` and is a structured field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`2026-11-23T09:22:01.123Z INFO [1234] webhook.app: message`"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record)} {record.levelname} [{record.process}] {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, pid, message, the record's structured fields, any exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        entry.update(_CONTEXT)
        entry.update({key: value for key, value in vars(record).items() if key not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


if TYPE_CHECKING:  # generic in typeshed, not at run time before Python 3.11
    _StreamHandler = logging.StreamHandler[TextIO]
else:
    _StreamHandler = logging.StreamHandler


class _Handler(_StreamHandler):
    """Ours, so that configuring again replaces it rather than adding a second. It writes to sys.stderr as it is at
    each line (as logging's last resort does), not as it was when configured: a test may have replaced it since."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


_CONTEXT: dict[str, str] = {}


def add_context(**fields: str) -> None:
    """Fields every JSON line of this process carries from now on (a record's own fields win): the meter's pod, so
    that each of its lines names the pod and namespace it meters."""
    _CONTEXT.update(fields)


def configure_logging(environ: Mapping[str, str] = os.environ) -> None:
    """Sets up the root logger from GPUSHARING_LOG_LEVEL and GPUSHARING_LOG_FORMAT; ConfigError when malformed."""
    level = env_choice(LEVEL_ENV, "info", LEVELS, environ)
    formatter = JsonFormatter() if env_choice(FORMAT_ENV, "text", FORMATS, environ) == "json" else TextFormatter()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(handler)
    handler = _Handler()
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name, quieter in QUIETER.items():
        logging.getLogger(name).setLevel(max(quieter, root.level))
