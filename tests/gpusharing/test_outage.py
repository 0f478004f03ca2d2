"""An outage is two log lines, its start and its end; the attempts between them are at debug."""

from __future__ import annotations

import logging

import pytest

from gpusharing.outage import Outage, format_duration

log = logging.getLogger("tests.outage")


def test_an_outage_is_a_line_when_it_starts_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    outage = Outage(log, "the thing at http://x", "polls", clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="tests.outage")
    outage.succeeded("all well")  # no outage: nothing to say
    for reason in ("refused", "refused", "timed out"):
        now[0] += 30
        outage.failed(reason, "the last known stay in force")
    assert outage.ongoing
    now[0] += 15
    outage.succeeded("current again")
    outage.succeeded("current again")
    assert not outage.ongoing
    assert [(r.levelname, r.getMessage(), getattr(r, "outage", None)) for r in caplog.records] == [
        (
            "WARNING",
            "the thing at http://x is unavailable: refused; the last known stay in force (logged again when it is "
            "back)",
            "started",
        ),
        ("DEBUG", "the thing at http://x still unavailable (2 polls failed): refused", None),
        ("DEBUG", "the thing at http://x still unavailable (3 polls failed): timed out", None),
        ("INFO", "the thing at http://x is back after 1 min 15 s (3 polls failed): current again", "ended"),
    ]
    now[0] += 1
    outage.failed("refused", "again")  # the next outage is a new one
    assert caplog.records[-1].getMessage().startswith("the thing at http://x is unavailable: refused; again")


@pytest.mark.parametrize(("seconds", "said"), [
    (0.4, "0 s"), (59.4, "59 s"), (60, "1 min 00 s"), (133, "2 min 13 s"), (3599, "59 min 59 s"), (3600, "1 h 00 min"),
    (26 * 3600 + 125, "26 h 02 min"), (-3, "0 s"),
])
def test_durations_read_as_an_outage_is_read(seconds: float, said: str) -> None:
    assert format_duration(seconds) == said
