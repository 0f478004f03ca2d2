"""`make demo`: the webhook on loopback over TLS, fed the example pods as the API server sends them."""

from __future__ import annotations

import base64
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import jsonpatch
import requests

from demo.apiserver import admission_review, example_manifests, example_pod
from demo.processes import Service, free_port
from gpusharing.certs import make_serving_certificate

NAMESPACE = "ml-team"


def invalid_examples() -> dict[str, dict[str, Any]]:
    """Mistakes the webhook catches at admission instead of at the node."""
    vcuda = example_pod("vcuda-fraction.yaml", NAMESPACE)
    for kind in ("limits", "requests"):
        vcuda["spec"]["containers"][0]["resources"][kind]["tencent.com/vcuda-core"] = "150"
    kai = example_pod("kai-fraction.yaml", NAMESPACE)
    kai["metadata"]["annotations"]["gpu-fraction"] = "1.5"
    mixed = example_pod("hami-fraction.yaml", NAMESPACE)
    mixed["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    return {"(invalid) vcuda-core 150": vcuda, "(invalid) gpu-fraction 1.5": kai, "(invalid) KAI + HAMi": mixed}


class Table:
    COLUMNS = ("pod", "decision", "dialect", "share", "priority class", "sidecar")

    def __init__(self) -> None:
        self.widths = (34, 8, 15, 6, 22, 14)
        print("  ".join(c.ljust(w) for c, w in zip(self.COLUMNS, self.widths)))
        print("  ".join("-" * w for w in self.widths))

    def row(self, name: str, response: dict[str, Any], pod: dict[str, Any]) -> None:
        if not response["allowed"]:
            print(f"{name[:34]:34}  {'DENIED':8}  {response['status']['message']}")
            return
        patched = jsonpatch.apply_patch(copy.deepcopy(pod), _patch(response))
        annotations = patched["metadata"].get("annotations", {})
        sidecars = [c for c in patched["spec"].get("initContainers", []) if c["name"] == "gpusharing-meter"]
        cells = (
            name,
            "allowed",
            annotations.get("gpusharing.io/dialect", "-"),
            annotations.get("gpusharing.io/gpu-share", "-"),
            patched["spec"].get("priorityClassName", "-"),
            "native sidecar" if sidecars else "-",
        )
        print("  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, self.widths)))
        for warning in response.get("warnings", []):
            print(f"{'':34}  warning: {warning}")


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else []


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="gpusharing-demo-") as directory:
        print("==> generating a CA and a serving certificate for 127.0.0.1")
        paths = make_serving_certificate(["127.0.0.1", "localhost"]).write(Path(directory))
        port = free_port()
        webhook = Service(
            "webhook",
            ["webhook", "serve", "--host", "127.0.0.1", "--port", str(port), "--cert", str(paths["cert"]), "--key", str(paths["key"])],
            f"https://127.0.0.1:{port}/readyz",
            verify=str(paths["ca"]),
        )
        with webhook:
            print(f"==> webhook serving https://127.0.0.1:{port} (gunicorn, TLS)")
            print(f"==> sending the example pods of examples/ as the API server would (namespace {NAMESPACE})\n")
            session = requests.Session()
            session.trust_env = False
            session.verify = str(paths["ca"])
            table = Table()
            pods = {name: example_pod(name, NAMESPACE) for name in example_manifests()} | invalid_examples()
            for name, pod in pods.items():
                answer = session.post(f"https://127.0.0.1:{port}/mutate", json=admission_review(pod), timeout=10)
                answer.raise_for_status()
                table.row(name, answer.json()["response"], pod)
        print("\n==> done; everything stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
