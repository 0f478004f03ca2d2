"""JSON bodies from clients, read with a bound on the work each can cause (both services read theirs here).

Python's parser recurses once per level of nesting, turns a 400-digit literal into a 400-digit integer that
later arithmetic chokes on, reads NaN and Infinity, and lets the last of two equal keys silently win. Here:
nesting beyond MAX_DEPTH, a number literal longer than MAX_NUMBER_CHARACTERS, a number that is not finite and
a key given twice in one object are each refused with a sentence saying so. The body's size is bounded before
it is read, by each service (Flask's MAX_CONTENT_LENGTH; the webhook's review path, webhook.api.reviews).

A body is first read by msgspec's decoder (C, a sixth of the time), and kept only where that reading provably equals
Python's within the bounds; any other body (refused, or merely unusual) is read again by Python's parser with the
bounds checked as it goes, so that what is refused and every sentence saying why stay Python's.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec

from gpusharing.messages import shortened

MAX_DEPTH = 100  # a pod nests about 15 levels deep, its managedFields a dozen more
MAX_NUMBER_CHARACTERS = 32  # an int64 has 19 digits, a double needs 17 and an exponent


class JsonBodyError(ValueError):
    """The body is not JSON, or not JSON the services read; the message says why."""


# A number literal longer than MAX_NUMBER_CHARACTERS is a run of more characters that can make up a JSON number
# (in strings, such runs are rare and only send the body the slow way). Found as a run of '#' once every such
# character is one and every other a space: a search of the bytes in C, where a regular expression's character
# class took 40 µs a review.
_NUMBER_CHARACTERS = bytes.maketrans(
    bytes(range(256)), bytes(ord("#") if c in b"-+.eE0123456789" else ord(" ") for c in range(256))
)
_LONG_RUN = b"#" * (MAX_NUMBER_CHARACTERS + 1)
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def read_json(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON document; raises JsonBodyError naming the first thing refused in it."""
    if isinstance(data, bytes):
        value = _read_fast(data, max_depth)
        if value is not _SLOW:
            return value
    return _read_checked(data, max_depth)


_SLOW = object()  # _read_fast's answer for a body it leaves to Python's parser


def _read_fast(data: bytes, max_depth: int) -> Any:
    """The body's value as msgspec reads it, where that is provably what _read_checked returns; else _SLOW.

    msgspec accepts no JSON that Python's parser refuses (nor a BOM, UTF-16 or invalid UTF-8, which it leaves to it),
    refuses non-finite numbers, and reads every integer exactly; what it does not check is checked here, on the bytes:
    - a number literal too long: no run of number characters that long anywhere;
    - nesting: no more opening brackets than the bound allows levels, else the decoded value is walked;
    - a key given twice (msgspec keeps the last): every key is followed by one ':' outside strings, and every other
      ':' lies in a string, so the body and the value written back out hold as many ':' exactly when no pair was
      dropped; a ':' escaped as \\u003a would be counted on one side only, so a body with such an escape is left to
      Python's parser.
    """
    if _LONG_RUN in data.translate(_NUMBER_CHARACTERS) or b"\\u003a" in data or b"\\u003A" in data:
        return _SLOW
    try:
        value = _decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return _SLOW
    if data.count(b"[") + data.count(b"{") > max_depth and not _nested_within(value, max_depth):
        return _SLOW
    if data.count(b":") != _encode(value).count(b":"):
        return _SLOW
    return value


def _read_checked(data: bytes | str, max_depth: int) -> Any:
    """The value of a JSON document read by Python's parser, each bound checked as it reads; JsonBodyError naming the
    first thing refused in it."""
    try:
        value = json.loads(
            data,
            object_pairs_hook=_object_of_unique_keys,
            parse_int=_integer,
            parse_float=_float,
            parse_constant=_not_a_number,
        )
    except RecursionError:
        raise JsonBodyError(f"the body is nested more than {max_depth} levels deep") from None
    except JsonBodyError:
        raise
    except ValueError as exc:  # malformed JSON, or bytes that are not UTF-8
        raise JsonBodyError(f"the body is not JSON: {exc}") from None
    if not _nested_within(value, max_depth):
        raise JsonBodyError(f"the body is nested more than {max_depth} levels deep")
    return value


def _object_of_unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonBodyError(f"the key {shortened(key)!r} appears twice in one object")
            seen.add(key)
    return value


def _integer(text: str) -> int:
    return int(_short_number(text))


def _float(text: str) -> float:
    value = float(_short_number(text))
    if not math.isfinite(value):
        raise JsonBodyError(f"{text} is not a finite number")
    return value


def _short_number(text: str) -> str:
    if len(text) > MAX_NUMBER_CHARACTERS:
        raise JsonBodyError(f"a number has more than {MAX_NUMBER_CHARACTERS} characters ({shortened(text)})")
    return text


def _not_a_number(text: str) -> Any:
    raise JsonBodyError(f"{text} is not a finite number")


def _nested_within(value: Any, max_depth: int) -> bool:
    """Whether no object or array lies deeper than max_depth, the outermost at depth 1 (one pass per level)."""
    level = [value]
    for _ in range(max_depth + 1):
        level = [node for node in level if isinstance(node, (dict, list))]
        if not level:
            return True
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)]
    return False
