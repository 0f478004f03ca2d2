"""JSON bodies from clients, read with a bound on the work each can cause (both services read theirs here).

Python's parser recurses once per level of nesting, turns a 400-digit literal into a 400-digit integer that
later arithmetic chokes on, reads NaN and Infinity, and lets the last of two equal keys silently win. Here:
nesting beyond MAX_DEPTH, a number literal longer than MAX_NUMBER_CHARACTERS, a number that is not finite and
a key given twice in one object are each refused with a sentence saying so. The body's size is bounded before
it is read, by each service (Flask's MAX_CONTENT_LENGTH).
"""

from __future__ import annotations

import json
import math
from typing import Any

from gpusharing.messages import shortened

MAX_DEPTH = 100  # a pod nests about 15 levels deep, its managedFields a dozen more
MAX_NUMBER_CHARACTERS = 32  # an int64 has 19 digits, a double needs 17 and an exponent


class JsonBodyError(ValueError):
    """The body is not JSON, or not JSON the services read; the message says why."""


def read_json(data: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """The value of a JSON document; raises JsonBodyError naming the first thing refused in it."""
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
