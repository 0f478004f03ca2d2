"""gpusharing.compat: on every supported Python, a StrEnum member is its value wherever the code turns it into text."""

from __future__ import annotations

import json

from gpusharing.compat import StrEnum


class Colour(StrEnum):
    RED = "red"


def test_a_member_is_its_value_as_text_in_formats_and_json() -> None:
    assert (str(Colour.RED), f"{Colour.RED}", f"{Colour.RED:>5}", "%s" % Colour.RED) == ("red", "red", "  red", "red")
    assert Colour.RED == "red" and Colour("red") is Colour.RED and json.dumps({Colour.RED: Colour.RED}) == '{"red": "red"}'
