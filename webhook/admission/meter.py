"""The metering sidecar the webhook injects into every GPU pod, and how to recognise it afterwards.

The meter needs no Kubernetes API access, so the workload's ServiceAccount token never reaches it: the webhook mounts
an empty read-only directory where that token would go, and the API server's ServiceAccount admission plugin leaves
a container alone that already mounts something there.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from gpusharing.contract import (
    METER_STATE_DIR,
    METER_TOKEN_DIR,
    METER_TOKEN_FILE,
    TIMEKEEPER_TOKEN_AUDIENCE,
    MeterEnv,
)
from gpusharing.decoded import as_list, as_mapping
from webhook.config import MeterSpec

# Where the ServiceAccount admission plugin mounts the workload's API token into every container that has no mount
# there.
SERVICE_ACCOUNT_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

# What makes the meter the meter: a container under the reserved name is ours only if all of these are exactly
# what the webhook injects. Other fields are the API server's (defaults such as terminationMessagePath,
# imagePullPolicy or resizePolicy) or another webhook's business.
GOVERNING_FIELDS = (
    "name", "image", "command", "args", "workingDir", "env", "envFrom", "resources", "securityContext", "restartPolicy",
    "lifecycle",
)


def token_volume_name(spec: MeterSpec) -> str:
    return f"{spec.name}-token"


def state_volume_name(spec: MeterSpec) -> str:
    return f"{spec.name}-state"


def no_api_volume_name(spec: MeterSpec) -> str:
    return f"{spec.name}-no-api-token"


@lru_cache(maxsize=16)  # per spec: each review's checks ask for them
def meter_volume_names(spec: MeterSpec) -> frozenset[str]:
    return frozenset((token_volume_name(spec), state_volume_name(spec), no_api_volume_name(spec)))


@lru_cache(maxsize=16)  # per spec (a webhook has one): the texts a meter is written from, made once
def _texts(spec: MeterSpec) -> tuple[str, str, str, str]:
    return token_volume_name(spec), state_volume_name(spec), no_api_volume_name(spec), seconds_text(
        spec.interval_seconds
    )


def meter_container(spec: MeterSpec, gpu_share: str, gpu_memory_mib: int) -> dict[str, Any]:
    """The meter container, small and unprivileged so LimitRanges, quotas and restricted PSA admit it (a new dict
    each time: the patch hands it on, and whoever applies the patch may change it)."""
    token, state, no_api, interval = _texts(spec)
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
            # The interval the timekeeper reckons by (GPUSHARING_METER_INTERVAL_SECONDS): fresh readings, silent meters.
            {"name": MeterEnv.INTERVAL, "value": interval},
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
            {"name": token, "mountPath": METER_TOKEN_DIR, "readOnly": True},
            {"name": state, "mountPath": METER_STATE_DIR},
            {"name": no_api, "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True},
        ],
    }
    if spec.mode == "native":
        container["restartPolicy"] = "Always"
    return container


def meter_volumes(spec: MeterSpec) -> list[dict[str, Any]]:
    token, state, no_api, _ = _texts(spec)
    return [
        {
            "name": token,
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
        {"name": state, "emptyDir": {"sizeLimit": "1Mi"}},
        {"name": no_api, "emptyDir": {"sizeLimit": "1Ki"}},
    ]


def seconds_text(seconds: float) -> str:
    """Seconds as an environment variable carries them, read back as the same float: `30`, `0.5`."""
    text = repr(float(seconds))
    return text[:-2] if text.endswith(".0") else text


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def meter_identity(container: dict[str, Any], spec: MeterSpec) -> dict[str, Any]:
    """What governs a meter container, in the form the webhook writes it: compare two of these to recognise ours.

    Mounts of the meter's own volumes count (and where they go); mounts others add, such as a token the API server
    adds despite the mount that keeps it out, do not.
    """
    identity = {key: copy.deepcopy(container[key]) for key in GOVERNING_FIELDS if key in container}
    for env in as_list(identity.get("env")):
        field_ref = as_mapping(as_mapping(as_mapping(env).get("valueFrom")).get("fieldRef"))
        if isinstance(field_ref, dict) and field_ref.get("apiVersion") == "v1":  # the API server's default
            del field_ref["apiVersion"]
    own = meter_volume_names(spec)
    mounts = [
        m for m in as_list(container.get("volumeMounts")) if as_mapping(m).get("name") in own or not isinstance(m, dict)
    ]
    identity["volumeMounts"] = sorted(mounts, key=lambda m: json.dumps(m, sort_keys=True, default=str))
    return identity


def volume_without_server_defaults(volume: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(volume)
    projected = result.get("projected")
    if projected and projected.get("defaultMode") == 0o644:
        del projected["defaultMode"]
    return result
