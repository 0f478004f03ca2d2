"""Bodies from clients are read with bounds: nesting, number literals, non-finite numbers, duplicate keys."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusharing.serving.jsonbody import MAX_DEPTH, JsonBodyError, _read_checked, read_json


def nested(depth: int) -> str:
    return '{"a": [' * (depth // 2) + "1" + "]}" * (depth // 2)


def test_ordinary_json_is_read_as_json() -> None:
    assert read_json(b'{"a": [1, 2.5, "x", null, true], "b": {"c": -7}}') == {
        "a": [1, 2.5, "x", None, True],
        "b": {"c": -7},
    }
    assert read_json('{"seq": 4611686018427387904, "share": 1.7976931348623157e308}')["seq"] == 2**62


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"gpuSeconds": 5, "gpuSeconds": 1e6}', "the key 'gpuSeconds' appears twice in one object"),
        (b'{"a": {"b": 1, "b": 1}}', "the key 'b' appears twice in one object"),
        (b'{"n": ' + b"9" * 400 + b"}", "a number has more than 32 characters (" + "9" * 64 + "… (400 characters))"),
        (b'{"n": 1.' + b"0" * 40 + b"}", "a number has more than 32 characters"),
        (b'{"n": 1e999}', "1e999 is not a finite number"),
        (b'{"n": NaN}', "NaN is not a finite number"),
        (b'{"n": -Infinity}', "-Infinity is not a finite number"),
        (b"[" * 100_000 + b"]" * 100_000, f"the body is nested more than {MAX_DEPTH} levels deep"),
        (nested(MAX_DEPTH + 2).encode(), f"the body is nested more than {MAX_DEPTH} levels deep"),
        (b"{", "the body is not JSON: Expecting property name enclosed in double quotes"),
        (b'"\xff"', "the body is not JSON"),
    ],
)
def test_what_is_refused_and_why(body: bytes, message: str) -> None:
    with pytest.raises(JsonBodyError) as refused:
        read_json(body)
    assert message in str(refused.value)


def test_nesting_up_to_the_bound_is_read() -> None:
    assert read_json(nested(MAX_DEPTH)) is not None
    assert read_json("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(JsonBodyError):
        read_json("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))


# Any JSON text, as a client could write it: numbers of every length, strings with ':', quotes, escapes and
# surrogates, keys twice, brackets deep, whitespace around the separators, cut short.
STRINGS = st.text(alphabet=st.sampled_from(list('ab:"\\{[é\u2028\x01😀') + ["\ud800"]), max_size=6)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats(allow_nan=False) | STRINGS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=12,
)


@st.composite
def json_texts(draw: st.DrawFn) -> bytes:
    text = json.dumps(draw(VALUES), ensure_ascii=draw(st.booleans()))
    change = draw(st.integers(0, 6))
    if change == 0 and '{"' in text:  # a key twice
        at = text.index('{"') + 1
        text = text[:at] + '"a": 1, "a": 2, ' + text[at:]
    elif change == 1:
        text = text.replace(":", " :\t", draw(st.integers(0, 3))).replace(",", "\n,", draw(st.integers(0, 3)))
    elif change == 2:
        text = text.replace(":", "\\u003a", 1)
    elif change == 3:
        text = "[" * draw(st.integers(90, 110)) + text + "]" * draw(st.integers(90, 110))
    elif change == 4:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


def outcome(read: Any, body: bytes) -> tuple[str, str]:
    try:
        return "read", repr(read(body))  # repr: 1 and 1.0, 0.0 and -0.0 differ
    except JsonBodyError as refused:
        return "refused", str(refused)


@given(json_texts())
def test_the_fast_reading_is_pythons_reading(body: bytes) -> None:
    """msgspec's reading is kept only where it is Python's, bounds and all: the same value, or the same sentence."""
    assert outcome(read_json, body) == outcome(lambda data: _read_checked(data, MAX_DEPTH), body)
