"""Bodies from clients are read with bounds: nesting, number literals, non-finite numbers, duplicate keys."""

from __future__ import annotations

import pytest

from gpusharing.serving.jsonbody import MAX_DEPTH, JsonBodyError, read_json


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
