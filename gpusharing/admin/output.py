"""What the admin commands print, as -o asks: the API's objects as JSON or YAML, else a table (-o wide: more
columns) from gpusharing.admin.tables, or a pod's explanation from gpusharing.admin.explain."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import yaml


def emit(args: argparse.Namespace, data: Any, table: Callable[[bool], str]) -> None:
    """The API's objects as -o json or yaml, else the table (wide with -o wide). The tables take the API's
    objects as they came (what -o json prints) and read a budget's status through the listing's contract
    (gpusharing.listing), which refuses an answer that is none with ListingError."""
    output = getattr(args, "output", None) or "table"  # never csv here: refused for every command but usage
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(table(output == "wide"))
