"""Durations are read as Kubernetes writes them (Go's time.ParseDuration), within bounds, and written back short."""

import pytest

from gpusharing.units.duration import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("4h", 14400), ("90s", 90), ("1h30m", 5400), ("1h30m0s", 5400), ("2.5h", 9000), ("30m", 1800), ("0", 0), ("0s", 0),
     ("1500ms", 1.5), (".5h", 1800), ("1h0m0.5s", 3600.5), ("300000000000ns", 300), ("1µs", 1e-6)],
)
def test_durations_as_kubernetes_writes_them(text: str, seconds: float) -> None:
    assert parse_duration(text, "after") == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["4", "h", "4 h", "-4h", "4H", "4d", "1h 30m", "", "4h!", "1e3s", "١h", None, 4, True, "1" * 40 + "s"]
)
def test_not_a_duration(text: object) -> None:
    with pytest.raises(DurationError, match="after must be a duration as Kubernetes writes it, e.g. 4h"):
        parse_duration(text, "after")


def test_bounds_are_said_in_durations() -> None:
    with pytest.raises(DurationError, match="^after must be from 1s to 8760h, not 0s$"):
        parse_duration("0s", "after", low=1)
    with pytest.raises(DurationError, match="after must be from 0s to 8760h, not 9000h"):
        parse_duration("9000h", "after")


@pytest.mark.parametrize(
    ("seconds", "text"), [(14400, "4h"), (5400, "1h30m"), (90, "1m30s"), (0, "0s"), (3661, "1h1m1s"), (1.5, "1.5s")]
)
def test_written_back_short(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text, "x") == seconds
