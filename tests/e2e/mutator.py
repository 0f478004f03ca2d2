"""Another team's mutating webhook, called after the project's: it changes pods that carry its label.

`e2e.gpusharing.io/mutate: label` gets a label added; `e2e.gpusharing.io/mutate: gpu` gets its KAI `gpu-fraction`
halved. Each change is made once, so the API server's reinvocation settles.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from demo.jsonhttp import reply_json
from gpusharing.serving.certs import make_serving_certificate

LABEL = "e2e.gpusharing.io/mutate"
ADDED_LABEL = "e2e.gpusharing.io/touched"


def mutation(pod: dict[str, Any]) -> list[dict[str, Any]]:
    metadata = pod["metadata"]
    what = (metadata.get("labels") or {}).get(LABEL)
    if what == "label" and ADDED_LABEL not in metadata["labels"]:
        return [{"op": "add", "path": "/metadata/labels/" + ADDED_LABEL.replace("/", "~1"), "value": "yes"}]
    fraction = (metadata.get("annotations") or {}).get("gpu-fraction")
    if what == "gpu" and fraction == "0.5":
        return [{"op": "replace", "path": "/metadata/annotations/gpu-fraction", "value": str(Decimal(fraction) / 2)}]
    return []


class Mutator:
    def __init__(self, directory: Path):
        certificate = make_serving_certificate(["127.0.0.1"])
        paths = certificate.write(directory)
        self.ca_bundle = base64.b64encode(certificate.ca_pem).decode()
        self.calls = 0
        mutator = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                mutator.calls += 1
                response: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": True}
                patch = mutation(review["request"]["object"])
                if patch:
                    response.update(patchType="JSONPatch", patch=base64.b64encode(json.dumps(patch).encode()).decode())
                reply_json(
                    self, 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
                )

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(paths["cert"], paths["key"])
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/mutate"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def configuration(self) -> dict[str, Any]:
        """Named after the project's, so the API server calls it second; it sees only pods with its label."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-e2e-other-team"},
            "webhooks": [{
                "name": "mutate.other-team.example.com",
                "clientConfig": {"url": self.url, "caBundle": self.ca_bundle},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "timeoutSeconds": 5,
            }],
        }

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
