"""RFC 6902 JSON Patch, built directly from what the webhook decides (add and remove only)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def pointer(*tokens: str | int) -> str:
    """An RFC 6901 JSON pointer; '~' and '/' in keys are escaped (annotation keys contain '/')."""
    return "".join(map(_reference_token, tokens))


@lru_cache(maxsize=4096)  # the webhook's own keys and container indexes, a dozen times per review
def _reference_token(token: str | int) -> str:
    return "/" + str(token).replace("~", "~0").replace("/", "~1")


class JsonPatch:
    def __init__(self) -> None:
        self.operations: list[dict[str, Any]] = []

    def add(self, path: str, value: Any) -> None:
        self.operations.append({"op": "add", "path": path, "value": value})

    def remove(self, path: str) -> None:
        self.operations.append({"op": "remove", "path": path})

    def __bool__(self) -> bool:
        return bool(self.operations)
