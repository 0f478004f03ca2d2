"""The metering sidecar the webhook injects into every GPU pod, and how to recognise it afterwards."""

from __future__ import annotations

import copy
from typing import Any

from gpusharing.contract import (
    METER_STATE_DIR,
    METER_TOKEN_DIR,
    METER_TOKEN_FILE,
    TIMEKEEPER_TOKEN_AUDIENCE,
    MeterEnv,
)
from webhook.config import MeterSpec


def token_volume_name(spec: MeterSpec) -> str:
    return f"{spec.name}-token"


def state_volume_name(spec: MeterSpec) -> str:
    return f"{spec.name}-state"


def meter_container(spec: MeterSpec, gpu_share: str, gpu_memory_mib: int) -> dict[str, Any]:
    """The meter container, small and unprivileged so LimitRanges, quotas and restricted PSA admit it."""
    container: dict[str, Any] = {
        "name": spec.name,
        "image": spec.image,
        "args": ["meter"],
        "env": [
            _field_env(MeterEnv.NAMESPACE, "metadata.namespace"),
            _field_env(MeterEnv.POD_NAME, "metadata.name"),
            _field_env(MeterEnv.POD_UID, "metadata.uid"),
            {"name": MeterEnv.GPU_SHARE, "value": gpu_share},
            {"name": MeterEnv.GPU_MEMORY_MIB, "value": str(gpu_memory_mib)},
            {"name": MeterEnv.TIMEKEEPER_URL, "value": spec.timekeeper_url},
            {"name": MeterEnv.TOKEN_PATH, "value": f"{METER_TOKEN_DIR}/{METER_TOKEN_FILE}"},
            {"name": MeterEnv.STATE_DIR, "value": METER_STATE_DIR},
        ],
        "resources": {
            "requests": {"cpu": spec.cpu_request, "memory": spec.memory_request},
            "limits": {"cpu": spec.cpu_limit, "memory": spec.memory_limit},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.run_as_user,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": token_volume_name(spec), "mountPath": METER_TOKEN_DIR, "readOnly": True},
            {"name": state_volume_name(spec), "mountPath": METER_STATE_DIR},
        ],
    }
    if spec.mode == "native":
        container["restartPolicy"] = "Always"
    return container


def meter_volumes(spec: MeterSpec) -> list[dict[str, Any]]:
    return [
        {
            "name": token_volume_name(spec),
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "audience": TIMEKEEPER_TOKEN_AUDIENCE,
                            "expirationSeconds": spec.token_expiration_seconds,
                            "path": METER_TOKEN_FILE,
                        }
                    }
                ]
            },
        },
        {"name": state_volume_name(spec), "emptyDir": {"sizeLimit": "1Mi"}},
    ]


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


# Fields the API server fills in when it defaults a pod after the webhook patched it.
_CONTAINER_DEFAULTS = {
    "terminationMessagePath": "/dev/termination-log",
    "terminationMessagePolicy": "File",
    "imagePullPolicy": None,  # any value: it follows from the image tag
}


def without_server_defaults(container: dict[str, Any]) -> dict[str, Any]:
    """The container as the webhook would have written it, so an injected meter can be recognised after defaulting."""
    result = copy.deepcopy(container)
    for key, default in _CONTAINER_DEFAULTS.items():
        if key in result and (default is None or result[key] == default):
            del result[key]
    for env in result.get("env") or []:
        field_ref = (env.get("valueFrom") or {}).get("fieldRef")
        if field_ref and field_ref.get("apiVersion") == "v1":
            del field_ref["apiVersion"]
    return result


def volume_without_server_defaults(volume: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(volume)
    projected = result.get("projected")
    if projected and projected.get("defaultMode") == 0o644:
        del projected["defaultMode"]
    return result
