"""gpusharing.compat, the same on every supported Python: a StrEnum member is its value wherever the code turns it into
text, and an ISO time in UTC written with `Z` is read."""

from __future__ import annotations

import datetime as dt
import json

from gpusharing.compat import StrEnum, from_iso


class Colour(StrEnum):
    RED = "red"


def test_a_member_is_its_value_as_text_in_formats_and_json() -> None:
    formatted = (str(Colour.RED), f"{Colour.RED}", f"{Colour.RED:>5}", "%s" % Colour.RED)  # noqa: UP031 (it is tested)
    assert formatted == ("red", "red", "  red", "red")
    assert (
        Colour.RED == "red" and Colour("red") is Colour.RED and json.dumps({Colour.RED: Colour.RED}) == '{"red": "red"}'
    )


def test_an_rfc_3339_time_in_utc_reads_as_every_python_reads_it() -> None:
    utc = dt.timezone.utc
    assert from_iso("2026-11-01T00:00:00Z") == dt.datetime(2026, 11, 1, tzinfo=utc)
    assert from_iso("2026-11-01T00:00:00.250000Z") == dt.datetime(2026, 11, 1, 0, 0, 0, 250000, tzinfo=utc)
    assert from_iso("2026-11-01T02:00:00+02:00") == dt.datetime(2026, 11, 1, tzinfo=utc)
    assert from_iso("2026-11-01T00:00:00").tzinfo is None
