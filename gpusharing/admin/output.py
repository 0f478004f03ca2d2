"""What the admin commands print, as -o asks: the API's objects as JSON or YAML, else a table (-o wide: more
columns). The command line imports what it prints from here: the tables (gpusharing.admin.tables) and a pod's
explanation (gpusharing.admin.explain)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import yaml

from gpusharing.admin.explain import Preemptor, format_explanation, idle_of, pod_record, preemptor, utilisation_source
from gpusharing.admin.tables import (
    format_changes,
    format_listing,
    format_pods,
    format_statuses,
    format_table,
    format_tree,
    format_usage,
)

__all__ = [
    "Preemptor", "emit", "format_changes", "format_explanation", "format_listing", "format_pods", "format_statuses",
    "format_table", "format_tree", "format_usage", "idle_of", "pod_record", "preemptor", "utilisation_source",
]


def emit(args: argparse.Namespace, data: Any, table: Callable[[bool], str]) -> None:
    """The API's objects as -o json or yaml, else the table (wide with -o wide). The tables below take the API's
    objects as they came (what -o json prints) and read a budget's status through the listing's contract
    (gpusharing.listing), which refuses an answer that is none with ListingError."""
    output = getattr(args, "output", None) or "table"  # never csv here: refused for every command but usage
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        print(table(output == "wide"))
