"""One logging setup for every role: timestamp, level and process on every line; text or JSON; a level setting."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest

from demo.processes import run_command
from gpusharing.serving.logs import JsonFormatter, TextFormatter, configure_logging
from gpusharing.settings.env import ConfigError


def record(message: str, *args: object, level: int = logging.INFO, **extra: object) -> logging.LogRecord:
    made = logging.getLogger("webhook.app").makeRecord(
        "webhook.app", level, __file__, 1, message, args, None, extra=extra
    )
    return made


def test_a_text_line_has_a_utc_timestamp_the_level_the_process_and_the_logger() -> None:
    line = TextFormatter().format(record("denied %s", "pod x", namespace="ml"))
    assert re.fullmatch(
        rf"\d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z INFO \[{os.getpid()}\] webhook\.app: denied pod x", line
    )


def test_a_json_line_carries_the_fields_the_call_passed() -> None:
    line = JsonFormatter().format(
        record("denied", namespace="ml", pod="train-0", decision="denied", request_id="uid-1")
    )
    entry = json.loads(line)
    assert entry.pop("time").endswith("Z")
    assert entry == {"level": "info", "logger": "webhook.app", "pid": os.getpid(), "message": "denied",
                     "namespace": "ml", "pod": "train-0", "decision": "denied", "request_id": "uid-1"}


def test_a_json_line_keeps_the_exception_on_its_one_line() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = logging.getLogger("x").makeRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonFormatter().format(failed)
    assert "\n" not in line and "RuntimeError: boom" in json.loads(line)["exception"]


def test_configuring_twice_leaves_one_handler_at_the_level_set() -> None:
    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        configure_logging({"GPUSHARING_LOG_LEVEL": "warning"})
        configure_logging({"GPUSHARING_LOG_LEVEL": "debug", "GPUSHARING_LOG_FORMAT": "json"})
        ours = [h for h in root.handlers if h not in before[0]]
        assert len(ours) == 1 and isinstance(ours[0].formatter, JsonFormatter) and root.level == logging.DEBUG
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"GPUSHARING_LOG_LEVEL": "loud"}, "GPUSHARING_LOG_LEVEL='loud' must be one of debug, info, warning, error"),
        ({"GPUSHARING_LOG_FORMAT": "xml"}, "GPUSHARING_LOG_FORMAT='xml' must be one of text, json"),
    ],
)
def test_a_malformed_setting_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        configure_logging(environ)
    assert str(caught.value) == message


def test_a_command_writes_json_lines_when_told(tmp_path: Path) -> None:
    result = run_command(
        "db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'tk.sqlite'}", env={"GPUSHARING_LOG_FORMAT": "json"}
    )
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert any(
        e["level"] == "info" and e["logger"].startswith("alembic") and "Running upgrade" in e["message"]
        for e in entries
    )


def test_a_malformed_log_setting_stops_any_command_with_one_line(tmp_path: Path) -> None:
    result = run_command("certs", "--format", "pem", "--output", str(tmp_path), env={"GPUSHARING_LOG_LEVEL": "loud"})
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == "gpusharing: GPUSHARING_LOG_LEVEL='loud' must be one of debug, info, warning, error\n"
