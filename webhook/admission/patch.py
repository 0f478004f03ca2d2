"""RFC 6902 JSON Patch, built directly from what the webhook decides (add and remove only)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def pointer(*tokens: str | int) -> str:
    """An RFC 6901 JSON pointer; '~' and '/' in keys are escaped (annotation keys contain '/')."""
    joined = _pointers.get(tokens)
    if joined is None:
        short = [not isinstance(t, str) or len(t) <= MAX_CACHED_TOKEN for t in tokens]
        joined = "".join(_cached(t) if fits else _escaped(t) for t, fits in zip(tokens, short))
        if all(short) and len(_pointers) < MAX_CACHED_POINTERS:
            _pointers[tokens] = joined
    return joined


# Keys a pod's author wrote reach here too (reserved annotations the webhook removes), unvalidated yet: only short
# ones are kept, so that the cache holds at most 4,096 x 317 characters (a valid annotation key's longest).
MAX_CACHED_TOKEN = 317


def _escaped(token: str | int) -> str:
    return "/" + str(token).replace("~", "~0").replace("/", "~1")


_cached = lru_cache(maxsize=4096)(_escaped)  # the webhook's own keys and container indexes, a dozen times per review
# Whole pointers too, as the webhook writes a dozen a review: joining their tokens cost more than the rest of a patch.
MAX_CACHED_POINTERS = 4096
_pointers: dict[tuple[str | int, ...], str] = {}


class JsonPatch:
    def __init__(self) -> None:
        self.operations: list[dict[str, Any]] = []

    def add(self, path: str, value: Any) -> None:
        self.operations.append({"op": "add", "path": path, "value": value})

    def remove(self, path: str) -> None:
        self.operations.append({"op": "remove", "path": path})

    def __bool__(self) -> bool:
        return bool(self.operations)
