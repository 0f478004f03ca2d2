"""Quoting what a client sent back to it, in refusals and log lines: cut short, so that an answer about a
10 MB value is not itself 10 MB."""

from __future__ import annotations

MAX_QUOTED = 64  # characters


def shortened(text: str, limit: int = MAX_QUOTED) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"
