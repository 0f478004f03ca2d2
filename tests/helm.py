"""The Helm chart as Helm renders it, for the chart tests and the end-to-end tier.

Rendered by Helm's own Go SDK (helm-python-sdk binds it through a C library; no `helm` binary is needed): the
same engine as `helm template`, with `lookup` answering nothing as it does there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "kube-gpusharing"
RELEASE, NAMESPACE = "gpusharing", "gpusharing-system"


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects `helm template gpusharing charts/kube-gpusharing -n NAMESPACE` with `values` renders."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    return [doc for path, text in sorted(rendered.items()) if path.endswith(".yaml") for doc in yaml.safe_load_all(text) if doc]
