"""What keeps a GPU pod's bill beyond the reach of the pod's own users, once the pod is admitted.

The billing finalizer holds a deleted GPU pod until the timekeeper has closed its bill: the webhook adds it, and only
the timekeeper's controller (which closes bills) or a cluster admin may take it off. The meter, its volumes and its
token stay as the webhook injected them: no other volume may hold a token for the timekeeper, and no UPDATE of the pod
or of its ephemeral containers or resources may change, remove or reach into the meter. Plain functions of the pod, the
request and the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusharing.contract import ANNOTATION_GPU_SHARE, BILLING_FINALIZER, TIMEKEEPER_TOKEN_AUDIENCE
from gpusharing.decoded import as_list, as_mapping
from gpusharing.messages import shortened
from webhook.admission.meter import meter_identity, meter_volume_names, token_volume_name
from webhook.admission.patch import JsonPatch, pointer
from webhook.admission.review import AdmissionRequest
from webhook.config import CLUSTER_ADMINS, WebhookConfig


def add_billing_finalizer(pod: dict[str, Any], config: WebhookConfig, patch: JsonPatch) -> None:
    """Adds the billing finalizer to a pod being admitted, unless it carries it already (a reinvocation)."""
    if not config.billing_finalizer:
        return
    finalizers = as_mapping(pod.get("metadata")).get("finalizers")
    if not isinstance(finalizers, list):
        patch.add(pointer("metadata", "finalizers"), [BILLING_FINALIZER])
    elif BILLING_FINALIZER not in finalizers:
        patch.add(pointer("metadata", "finalizers", "-"), BILLING_FINALIZER)


def missing_billing_finalizer(pod: dict[str, Any], config: WebhookConfig) -> str | None:
    """At validation: a GPU pod must carry the billing finalizer (a later webhook may not have removed it)."""
    if config.billing_finalizer and BILLING_FINALIZER not in _finalizers(pod):
        return (
            f"a GPU pod must carry the finalizer {BILLING_FINALIZER}, which the GPU-sharing webhook adds so that the "
            "pod is billed to its end; another webhook removed it"
        )
    return None


def foreign_timekeeper_token(pod: dict[str, Any], config: WebhookConfig) -> str | None:
    """At creation: a token for the timekeeper's audience would let the workload report for its own pod. Only the
    meter's token volume may project one (`_check_meter` holds that volume to exactly what the webhook injects)."""
    own = token_volume_name(config.meter)
    for volume in as_list(as_mapping(pod.get("spec")).get("volumes")):
        name = as_mapping(volume).get("name")
        if name == own:
            continue
        for source in as_list(as_mapping(as_mapping(volume).get("projected")).get("sources")):
            if as_mapping(as_mapping(source).get("serviceAccountToken")).get("audience") == TIMEKEEPER_TOKEN_AUDIENCE:
                return (
                    f"volume {name!r} projects a ServiceAccount token for audience {TIMEKEEPER_TOKEN_AUDIENCE!r}, the "
                    "timekeeper's: only the GPU metering sidecar the webhook injects may hold one; remove the volume"
                )
    return None


def guard_update(request: AdmissionRequest, config: WebhookConfig) -> str | None:
    """Why an UPDATE of a pod, or of its ephemeral containers or resources, is refused; None: it changes nothing
    of the billing."""
    old, new = request.old_object or {}, request.object or {}
    return (
        _finalizer_removed(old, new, request, config)
        or _meter_changed(old, new, config)
        or _ephemeral_container_reaching_the_meter(old, new, config)
    )


def _finalizers(pod: dict[str, Any]) -> list[Any]:
    return as_list(as_mapping(pod.get("metadata")).get("finalizers"))


def _finalizer_removed(
    old: dict[str, Any], new: dict[str, Any], request: AdmissionRequest, config: WebhookConfig
) -> str | None:
    """On a pod the webhook governs (it carries the record, which no UPDATE may remove): elsewhere the finalizer was
    written by hand, and is the pod's users' to remove."""
    if (
        not config.billing_finalizer
        or BILLING_FINALIZER not in _finalizers(old)
        or BILLING_FINALIZER in _finalizers(new)
    ):
        return None
    if ANNOTATION_GPU_SHARE not in as_mapping(as_mapping(old.get("metadata")).get("annotations")):
        return None
    if request.username in config.billing_accounts or CLUSTER_ADMINS in request.groups:
        return None
    return (
        f"the finalizer {BILLING_FINALIZER} keeps this GPU pod until the timekeeper has closed its bill: only the "
        f"timekeeper's controller ({', '.join(sorted(config.billing_accounts))}) removes it, or a cluster admin (group "
        f"{CLUSTER_ADMINS}) when no timekeeper is left to; {request.username or 'an anonymous user'!r} may not"
    )


def _meter_changed(old: dict[str, Any], new: dict[str, Any], config: WebhookConfig) -> str | None:
    """The meter and its volumes as the webhook injected them: any change to them, removal included, is refused."""
    if _meter_of(old, config) != _meter_of(new, config):
        return (f"the GPU metering sidecar {config.meter.name!r} is injected by the GPU-sharing webhook and cannot be "
                "changed or removed (image, command, environment, resources, mounts, ...)")
    if _meter_volumes(old, config) != _meter_volumes(new, config):
        return ("the volumes of the GPU metering sidecar are injected by the GPU-sharing webhook and cannot be changed "
                "or removed")
    return None


def _meter_of(pod: dict[str, Any], config: WebhookConfig) -> list[tuple[str, dict[str, Any]]]:
    spec = as_mapping(pod.get("spec"))
    return [
        (list_name, meter_identity(container, config.meter))
        for list_name in ("initContainers", "containers")
        for container in as_list(spec.get(list_name))
        if isinstance(container, dict) and container.get("name") == config.meter.name
    ]


def _meter_volumes(pod: dict[str, Any], config: WebhookConfig) -> list[Any]:
    own = _meter_volume_names(config)
    return [v for v in as_list(as_mapping(pod.get("spec")).get("volumes")) if as_mapping(v).get("name") in own]


def _ephemeral_container_reaching_the_meter(
    old: dict[str, Any], new: dict[str, Any], config: WebhookConfig
) -> str | None:
    """An ephemeral container added to the pod may neither share the meter's processes (and so its token and its
    state) nor mount one of its volumes."""
    before = [as_mapping(c).get("name") for c in _ephemeral_containers(old)]
    own = _meter_volume_names(config)
    for container in _ephemeral_containers(new):
        name = container.get("name")
        if name in before:  # added earlier, and checked then: ephemeral containers cannot be changed
            continue
        if container.get("targetContainerName") == config.meter.name:
            return (
                f"ephemeral container {shortened(str(name))!r} targets the GPU metering sidecar {config.meter.name!r}, "
                "whose processes and token are out of the workload's reach; target one of the pod's own containers"
            )
        mounted = [
            m.get("name") for m in map(as_mapping, as_list(container.get("volumeMounts"))) if m.get("name") in own
        ]
        if mounted:
            return (f"ephemeral container {shortened(str(name))!r} mounts {mounted[0]!r}, a volume of the GPU metering "
                    "sidecar, which only the sidecar may mount")
    return None


def _meter_volume_names(config: WebhookConfig) -> list[str]:
    return sorted(meter_volume_names(config.meter))  # a list: a hostile name need not be hashable to be compared


def _ephemeral_containers(pod: dict[str, Any]) -> list[Mapping[str, Any]]:
    return [as_mapping(c) for c in as_list(as_mapping(pod.get("spec")).get("ephemeralContainers"))]
