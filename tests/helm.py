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
# PyYAML's safe loader in C (libyaml) where the wheel has it: a render is parsed in a tenth of the pure-Python time.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The objects `helm template gpusharing charts/kube-gpusharing -n NAMESPACE` with `values` renders."""
    rendered = _render(values, namespace)
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for doc in yaml.load_all(text, SAFE_LOADER)
        if doc
    ]


def notes(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> str:
    """What `helm install` prints after installing (templates/NOTES.txt)."""
    return _render(values, namespace)[f"{CHART.name}/templates/NOTES.txt"]


def _render(values: dict[str, Any] | None, namespace: str) -> dict[str, str]:
    with helm.Chart.load(CHART) as chart:
        return dict(chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True))
