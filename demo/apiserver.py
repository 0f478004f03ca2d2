"""Pods and AdmissionReviews as the Kubernetes API server sends them to a webhook."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_manifests() -> dict[str, dict[str, Any]]:
    """The project's example manifests by file name."""
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yaml"))}


def example_pod(name: str, namespace: str = "ml-team") -> dict[str, Any]:
    """An example as the pod the API server would admit (a Job's pod template becomes a pod)."""
    manifest = example_manifests()[name]
    if manifest["kind"] == "Job":
        template = manifest["spec"]["template"]
        manifest = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                **copy.deepcopy(template.get("metadata") or {}),
                "generateName": f"{manifest['metadata']['name']}-",
            },
            "spec": copy.deepcopy(template["spec"]),
        }
    return api_server_pod(manifest, namespace)


def canonical_quantity(value: int | str) -> str:
    """The API server's canonical form of a whole quantity: 3000 is sent as "3k"."""
    if isinstance(value, str):
        return value
    suffixes = ["", "k", "M", "G", "T", "P", "E"]
    exponent = 0
    while value and value % 1000 == 0 and exponent < len(suffixes) - 1:
        value //= 1000
        exponent += 1
    return f"{value}{suffixes[exponent]}"


def api_server_pod(manifest: dict[str, Any], namespace: str = "ml-team") -> dict[str, Any]:
    """The pod after decoding and defaulting, as mutating webhooks receive it on CREATE."""
    pod = copy.deepcopy(manifest)
    metadata = pod.setdefault("metadata", {})
    metadata["namespace"] = namespace
    metadata.setdefault("creationTimestamp", None)
    spec = pod["spec"]
    for list_name in ("initContainers", "containers"):
        for container in spec.get(list_name) or []:
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = container.get("image", "")
            container.setdefault(
                "imagePullPolicy", "Always" if image.endswith(":latest") or ":" not in image else "IfNotPresent"
            )
            container.setdefault("resources", {})
            for kind in ("limits", "requests"):
                if kind in container["resources"]:
                    container["resources"][kind] = {
                        key: canonical_quantity(value) for key, value in container["resources"][kind].items()
                    }
            limits = container["resources"].get("limits")
            if limits:  # requests default to limits
                container["resources"]["requests"] = {**limits, **container["resources"].get("requests", {})}
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("enableServiceLinks", True)
    # Set by the Priority admission plugin, which runs before webhooks.
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault(
        "tolerations",
        [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
    )
    pod["status"] = {}
    return pod


def admission_review(
    pod: dict[str, Any] | None,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
    version: str = "v1",
    sub_resource: str = "",
    user: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The review of `operation` on `pod` (the pod itself, or its `sub_resource`, whose reviews carry the whole Pod),
    sent on behalf of `user` (userInfo; default: the Job controller)."""
    namespace = ((pod or old or {}).get("metadata") or {}).get("namespace", "ml-team")
    name = ((pod or old or {}).get("metadata") or {}).get("name", "")
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": user
        or {"username": "system:serviceaccount:kube-system:job-controller", "groups": ["system:serviceaccounts"]},
        "object": pod,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
        },
    }
    if sub_resource:
        request["subResource"] = request["requestSubResource"] = sub_resource
    return {"apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview", "request": request}


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """A copy of `document` with a webhook's JSON Patch applied as the API server applies it: RFC 6902's `add` and
    `remove`, the two operations the webhook writes (so that the demo needs nothing beyond the package)."""
    result = copy.deepcopy(document)
    for operation in operations:
        *parents, last = (token.replace("~1", "/").replace("~0", "~") for token in operation["path"].split("/")[1:])
        target = result
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if operation["op"] == "add" and isinstance(target, list):
            target.insert(len(target) if last == "-" else int(last), copy.deepcopy(operation["value"]))
        elif operation["op"] == "add":
            target[last] = copy.deepcopy(operation["value"])
        elif operation["op"] == "remove":
            del target[int(last) if isinstance(target, list) else last]
        else:
            raise ValueError(f"the demo applies add and remove, not {operation['op']}")
    return result
