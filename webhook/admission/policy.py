"""What the webhook decides for a pod: plain functions of the admission request, the config and budget states."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from gpusharing.contract import (
    ANNOTATION_ADMISSION_ID,
    ANNOTATION_BUDGET_STATE,
    ANNOTATION_DIALECT,
    ANNOTATION_FAIR_SHARE_BAND,
    ANNOTATION_FAIR_SHARE_REASON,
    ANNOTATION_GPU_MEMORY,
    ANNOTATION_GPU_MODEL,
    ANNOTATION_GPU_SHARE,
    ANNOTATION_IDLE_HOLD,
    ANNOTATION_PREFIX,
    ANNOTATION_SAFE_ADMISSION,
    TENANT_LABELS,
    WEBHOOK_ANNOTATIONS,
)
from gpusharing.decoded import as_list, as_mapping
from gpusharing.gpu.dra import ClaimLookup, ClaimSource, ClaimSpec, no_claims
from gpusharing.gpu.request import GpuRequest, InvalidGpuRequest, parse_gpu_request
from gpusharing.kube.owners import controller_of
from gpusharing.messages import shortened
from gpusharing.units.quantity import QuantityError, parse_whole_quantity
from gpusharing.units.share import format_share
from webhook.admission.fairshare import fair_share_band, named_node, queue_for_fair_share
from webhook.admission.guard import (
    add_billing_finalizer,
    foreign_timekeeper_token,
    guard_update,
    missing_billing_finalizer,
)
from webhook.admission.meter import (
    meter_container,
    meter_identity,
    meter_volume_names,
    meter_volumes,
    token_volume_name,
    volume_without_server_defaults,
)
from webhook.admission.patch import JsonPatch, pointer
from webhook.admission.review import AdmissionRequest, Decision
from webhook.admission.safe import SafeAdmission, safe_admission
from webhook.caches.budgets import NO_FAIR_SHARE, FairShareAdmission, NamespaceBudget
from webhook.caches.jobs import JobLookup, no_jobs
from webhook.caches.priorities import PriorityLookup, ResolvedPriority, no_priorities
from webhook.caches.reservations import Reserve, no_timekeeper
from webhook.config import WebhookConfig

MIRROR_POD_ANNOTATION = "kubernetes.io/config.mirror"

BudgetLookup = Callable[[str], NamespaceBudget]


def admit(
    request: AdmissionRequest,
    config: WebhookConfig,
    budget_of: BudgetLookup,
    mutate: bool,
    claims: ClaimLookup = no_claims,
    jobs: JobLookup = no_jobs,
    reserve: Reserve = no_timekeeper,
    disclose: bool = True,
    priorities: PriorityLookup = no_priorities,
    fair_share: FairShareAdmission = NO_FAIR_SHARE,
) -> Decision:
    """The decision for one admission request; `mutate` adds the patch (the /mutate endpoint). `claims` finds the
    specs of the resource claims a pod names, `jobs` the deadlines of Jobs and `priorities` what a PriorityClass
    resolves to (the webhook's in-memory indexes);
    `reserve` holds safe admission's reservations (the timekeeper's). `disclose` False: the answer says no figures
    of the namespace's budget (the caller is not known to be the API server). `fair_share`: the bands' classes and
    what this process admitted in them lately (docs/fair-share.md)."""
    pod = request.object
    if (
        not (request.is_pod or request.is_pod_subresource)
        or pod is None
        or request.namespace in config.exempt_namespaces
        or _is_mirror(pod)
    ):
        return Decision()
    if request.operation == "UPDATE":
        refused = guard_update(request, config)
        return Decision.deny(403, refused) if refused else _check_record_unchanged(request.old_object or {}, pod)
    if request.operation != "CREATE" or not request.is_pod:
        return Decision()
    def in_namespace(source: ClaimSource, _: str, name: str) -> ClaimSpec:
        return claims(source, request.namespace, name)  # the request's namespace: the pod's may not be set yet

    try:
        gpu = parse_gpu_request(pod, config.gpu_request, in_namespace)
    except InvalidGpuRequest as exc:
        return Decision.deny(422, f"invalid GPU request: {exc}")
    dialect = str(gpu.dialect) if gpu else "none"
    shape = _shape_problem(pod) if gpu else None
    if shape:
        return Decision.deny(400, f"not a pod the GPU-sharing webhook can patch: {shape}", dialect)
    record = _record(gpu) if gpu else {}
    # On reinvocation after another webhook changed the pod's GPU request, the meter injected for the earlier
    # record is ours too: /mutate replaces it, and /validate then holds the pod to the new one.
    earlier = _earlier_meter(pod, config) if mutate else None
    containers = _all_containers(pod)  # once: the checks of the meter and its injection read them all
    problem = _check_meter(pod, config, record, earlier, containers) or foreign_timekeeper_token(pod, config)
    if problem:
        return Decision.deny(403, problem, dialect)
    if gpu is None:
        foreign = _reserved_keys(pod)
        return (
            Decision.deny(403, f"{RESERVED} and this pod asks for no GPU: remove {_listed(foreign)}")
            if foreign
            else Decision()
        )
    problem = _check_priority_class(pod, config, fair_share.classes)
    if problem:
        return Decision.deny(403, problem, dialect)
    if not mutate:
        problem = _check_record_matches(pod, record) or missing_billing_finalizer(pod, config)
        return Decision.deny(403, problem, dialect) if problem else Decision(dialect=dialect)
    budget = budget_of(request.namespace)
    if fair_share.classes and as_mapping(pod.get("spec")).get("nodeName"):
        # Refused here, before safe admission reserves: the API server would refuse it gated, and say less clearly why.
        return Decision.deny(403, named_node(request.namespace), dialect)
    if budget.admission.checks_commitments:
        weight = config.gpu_request.catalogue.weight_of(gpu.model)
        safe = safe_admission(pod, request.namespace, float(gpu.share), weight, budget, jobs, reserve,
                              dt.datetime.now(dt.timezone.utc), request.uid, request.dry_run, disclose)
    else:  # what safe_admission answers an open namespace, without the clock, the weight and the share it would read
        safe = SafeAdmission()
    if safe.refuse:
        refusal = Decision.deny(403, safe.refuse, dialect)
        refusal.safe_admission = safe.outcome
        return refusal
    admitted = fair_share.admitted(request.namespace, request.uid) if budget.fair_share is not None else 0.0
    decision = _mutation(pod, config, record, budget, request.namespace, dialect, safe, disclose, priorities,
                         float(gpu.share), admitted, fair_share.processes, queued=bool(fair_share.classes),
                         containers=containers)
    decision.safe_admission = safe.outcome
    decision.warnings[:0] = gpu.warnings  # how the backend reads the pod, before the budget's word
    return decision


def _shape_problem(pod: dict[str, Any]) -> str | None:
    """What keeps the webhook's patch from applying to `pod` (a decoded Pod never has it; a raw body may)."""
    if not isinstance(pod.get("metadata"), dict):
        return "metadata must be an object"
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return "spec must be an object"
    for list_name in ("initContainers", "containers", "volumes"):
        if list_name in spec and not isinstance(spec[list_name], list):
            return f"spec.{list_name} must be a list"
    return None


def _is_mirror(pod: dict[str, Any]) -> bool:
    return MIRROR_POD_ANNOTATION in _annotations(pod)


def _annotations(pod: dict[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(pod.get("metadata")).get("annotations"))


def _labels(pod: dict[str, Any]) -> Mapping[str, Any]:
    return as_mapping(as_mapping(pod.get("metadata")).get("labels"))


RESERVED = f"annotations and labels under {ANNOTATION_PREFIX} are the GPU-sharing webhook's record"


def _reserved_keys(pod: dict[str, Any], kept: frozenset[str] = frozenset()) -> list[str]:
    """The pod's annotations and labels under the webhook's prefix, but those in `kept` (annotations only)."""
    annotations = [f"annotation {k}" for k in _annotations(pod) if k.startswith(ANNOTATION_PREFIX) and k not in kept]
    return sorted(annotations) + sorted(f"label {k}" for k in _labels(pod) if _reserved_label(k))


def _reserved_label(key: object) -> bool:
    """A label under the prefix is the webhook's, but those a pod's author sets (TENANT_LABELS)."""
    return str(key).startswith(ANNOTATION_PREFIX) and key not in TENANT_LABELS


def _listed(keys: list[str], most: int = 5) -> str:
    """Keys a pod's author chose, quoted back within bounds (a pod may carry thousands)."""
    shown = ", ".join(shortened(key) for key in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _check_priority_class(pod: dict[str, Any], config: WebhookConfig, bands: tuple[str, ...] = ()) -> str | None:
    """A GPU pod's priority class is the webhook's: one of its two classes, or one an administrator allows. A fair-share
    band's class is the webhook's to give: a pod may carry it only as the webhook recorded it (its reinvocation, and
    /validate after it); a pod that names one itself is refused, as any other."""
    chosen = as_mapping(pod.get("spec")).get("priorityClassName")
    ours = (config.priority_class_in_budget, config.priority_class_over_budget)
    if chosen is None or chosen in ours or chosen in config.allowed_priority_classes:
        return None
    if chosen in bands and _annotations(pod).get(ANNOTATION_FAIR_SHARE_BAND) == chosen:
        return None
    return (f"GPU pods get their priority class from the GPU-sharing webhook ({ours[0]!r} in budget), not "
            f"{shortened(str(chosen))!r}: remove spec.priorityClassName, or ask an administrator to allow the class "
            "(GPUSHARING_ALLOWED_PRIORITY_CLASSES)")


# A share as the record writes it, kept: Decimal's rounding costs as much as the rest of the record, and pods ask for
# few distinct shares (each at most MAX_GPU_SHARE, which parse_gpu_request holds them to).
_share_text = lru_cache(maxsize=1024)(format_share)


def _record(gpu: GpuRequest) -> dict[str, str]:
    """The annotations that record the webhook's reading of the pod (budget state aside)."""
    return {
        ANNOTATION_GPU_SHARE: _share_text(gpu.share),
        ANNOTATION_DIALECT: str(gpu.dialect),
        ANNOTATION_GPU_MEMORY: str(gpu.memory_mib),
        ANNOTATION_GPU_MODEL: gpu.model,
    }


def _check_record_unchanged(old: dict[str, Any], new: dict[str, Any]) -> Decision:
    changed = []
    for kind, read in (("annotation", _annotations), ("label", _labels)):
        reserved = _reserved_label if kind == "label" else lambda k: str(k).startswith(ANNOTATION_PREFIX)
        before = {k: v for k, v in read(old).items() if reserved(k)}
        after = {k: v for k, v in read(new).items() if reserved(k)}
        changed += sorted(f"{kind} {k}" for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        return Decision.deny(403, f"{RESERVED} and cannot be changed: {_listed(changed)}")
    return Decision()


def _check_record_matches(pod: dict[str, Any], record: dict[str, str]) -> str | None:
    """At validation, a record annotation that is present must say what the pod asks for, and nothing else under the
    prefix may be there (the webhook removed it; another webhook after it may not add it)."""
    annotations = _annotations(pod)
    wrong = [
        f"{k}={annotations[k]!r} (the pod asks for {v!r})" for k, v in record.items() if annotations.get(k, v) != v
    ]
    wrong += _reserved_keys(pod, WEBHOOK_ANNOTATIONS)
    if wrong:
        return f"{RESERVED} and may not be set by hand: {_listed(wrong)}"
    return None


def _all_containers(pod: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    spec = as_mapping(pod.get("spec"))
    return [
        (list_name, index, container)
        for list_name in ("initContainers", "containers")
        for index, container in enumerate(as_list(spec.get(list_name)))
        if isinstance(container, dict)
    ]


def _meter_list(config: WebhookConfig) -> str:
    return "initContainers" if config.meter.mode == "native" else "containers"


def _earlier_meter(pod: dict[str, Any], config: WebhookConfig) -> dict[str, Any] | None:
    """The meter the webhook injected for the record annotations the pod carries, if it carries them."""
    annotations = _annotations(pod)
    share = annotations.get(ANNOTATION_GPU_SHARE)
    if not isinstance(share, str):  # as on every first review: no memory read (its refusal is an exception, slow)
        return None
    try:
        memory_mib = parse_whole_quantity(annotations.get(ANNOTATION_GPU_MEMORY))
    except QuantityError:
        return None
    return meter_container(config.meter, share, memory_mib)


def _check_meter(
    pod: dict[str, Any], config: WebhookConfig, record: dict[str, str], earlier: dict[str, Any] | None = None,
    containers: list[tuple[str, int, dict[str, Any]]] | None = None,
) -> str | None:
    """The meter's name and volumes are reserved: only exactly what the webhook injects may carry them. `containers`:
    the pod's, when they are listed already."""
    name = config.meter.name
    containers = _all_containers(pod) if containers is None else containers
    declared = [(list_name, c) for list_name, _, c in containers if c.get("name") == name]
    if declared:
        reserved = f"the container name {name!r} is reserved for the GPU metering sidecar that the webhook injects"
        if not record:
            return f"{reserved}; this pod asks for no GPU"
        expected = meter_container(config.meter, record[ANNOTATION_GPU_SHARE], int(record[ANNOTATION_GPU_MEMORY]))
        list_name, actual = declared[0]
        ours = [meter_identity(m, config.meter) for m in (expected, earlier) if m is not None]
        if len(declared) > 1 or list_name != _meter_list(config) or meter_identity(actual, config.meter) not in ours:
            return f"{reserved}; remove it from the pod (the webhook adds it)"
    own = meter_volume_names(config.meter)  # the volumes themselves made only when the pod has one of them
    for volume in as_list(as_mapping(pod.get("spec")).get("volumes")):
        volume_name = volume.get("name") if isinstance(volume, dict) else None
        if volume_name in own and volume_without_server_defaults(volume) != _meter_volume(config, volume_name):
            return f"the volume name {volume_name!r} is reserved for the GPU metering sidecar; rename the volume"
    token = token_volume_name(config.meter)
    for _, _, container in containers:
        mounts = as_list(container.get("volumeMounts"))
        if container.get("name") != name and any(as_mapping(m).get("name") == token for m in mounts):
            return (f"container {container.get('name')!r} mounts {token!r}, the metering sidecar's token, which only "
                    "the sidecar may mount")
    return None


def _meter_volume(config: WebhookConfig, name: str) -> dict[str, Any]:
    return next(volume for volume in meter_volumes(config.meter) if volume["name"] == name)


def _mutation(
    pod: dict[str, Any],
    config: WebhookConfig,
    record: dict[str, str],
    budget: NamespaceBudget,
    namespace: str,
    dialect: str,
    safe: SafeAdmission,
    disclose: bool,
    priorities: PriorityLookup,
    gpus: float = 0.0,
    admitted: float = 0.0,
    processes: int = 1,
    queued: bool = False,
    containers: list[tuple[str, int, dict[str, Any]]] | None = None,
) -> Decision:
    patch = JsonPatch()
    state = budget.state
    # Above a warning threshold (its own budget's or an ancestor's): every GPU pod admitted says so, and
    # `kubectl apply` prints it; its figures only to the API server.
    warnings: list[str] = [*(budget.warnings if disclose else ()), *safe.warnings]
    metadata = as_mapping(pod.get("metadata"))
    spec = as_mapping(pod.get("spec"))

    owner = controller_of(pod)
    held = budget.idle_holds.get(owner.uid) if owner is not None else None  # an idle pod of its owner was evicted
    wanted = {**record, ANNOTATION_BUDGET_STATE: str(state)}
    if held and owner is not None:
        wanted[ANNOTATION_IDLE_HOLD] = f"{owner.kind}/{owner.name}"
    if safe.admission_id:
        wanted[ANNOTATION_ADMISSION_ID] = safe.admission_id
    if safe.outcome:
        wanted[ANNOTATION_SAFE_ADMISSION] = safe.outcome
    current_class = spec.get("priorityClassName")
    out_of_budget = state.demoted or safe.short or held
    band = None
    if not out_of_budget and budget.fair_share is not None and current_class not in config.allowed_priority_classes:
        band, reason = fair_share_band(budget, gpus, admitted, processes)
        wanted[ANNOTATION_FAIR_SHARE_BAND] = band
        wanted[ANNOTATION_FAIR_SHARE_REASON] = reason
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        patch.add(pointer("metadata", "annotations"), wanted)
    else:
        for key in sorted(k for k in annotations if k.startswith(ANNOTATION_PREFIX) and k not in wanted):
            patch.remove(pointer("metadata", "annotations", key))  # only the webhook's own values stand
        for key, value in wanted.items():
            if annotations.get(key) != value:
                patch.add(pointer("metadata", "annotations", key), value)
    for key in sorted(k for k in _labels(pod) if _reserved_label(k)):
        patch.remove(pointer("metadata", "labels", key))

    if safe.deadline_seconds is not None:  # the Job's deadline, carried onto its pod
        patch.add(pointer("spec", "activeDeadlineSeconds"), safe.deadline_seconds)

    if out_of_budget:
        wanted_class = config.priority_class_over_budget
        why = safe.short or held or f"namespace {namespace!r} is over its GPU budget"
        warnings.append(
            f"{why}: the pod gets priority class {wanted_class!r} "
            "and may be preempted by pods of namespaces within budget"
            + (
                f" (its priority class {current_class!r} was replaced)"
                if current_class not in (None, wanted_class)
                else ""
            )
        )
    elif band is not None:
        wanted_class = band
    else:  # an administrator's allowed class stays; _check_priority_class has refused any other of the pod's own
        wanted_class = (
            current_class if current_class in config.allowed_priority_classes else config.priority_class_in_budget
        )
    unresolved = None
    if wanted_class != current_class:
        patch.add(pointer("spec", "priorityClassName"), wanted_class)
        unresolved = None if _resolve_priority(spec, priorities(wanted_class), patch) else wanted_class

    if queued:  # fair share is on: every GPU pod queues, out of budget, in an allowed class or not yet ranked too
        queue_for_fair_share(spec, patch)
    add_billing_finalizer(pod, config, patch)
    _inject_meter(pod, config, record, patch, _all_containers(pod) if containers is None else containers)
    return Decision(patch=patch.operations, warnings=warnings, dialect=dialect, unresolved_priority_class=unresolved,
                    fair_share_gpus=gpus if band is not None else None)


def _resolve_priority(spec: Mapping[str, Any], resolved: ResolvedPriority | None, patch: JsonPatch) -> bool:
    """The pod's priority and preemption policy for its new class, as the API server's Priority plugin would write
    them; that plugin runs again after a webhook changes a pod, and when it finds them so, it changes nothing and the
    API server does not call the webhook again. Without the class's figures (`resolved` None), they are removed for
    the plugin to resolve (a stale integer would get the pod refused); False then."""
    wanted = {} if resolved is None else {"priority": resolved.value, "preemptionPolicy": resolved.preemption_policy}
    for name in ("priority", "preemptionPolicy"):
        if name in wanted and spec.get(name) != wanted[name]:
            patch.add(pointer("spec", name), wanted[name])
        elif name not in wanted and name in spec:
            patch.remove(pointer("spec", name))
    return resolved is not None


def _inject_meter(
    pod: dict[str, Any], config: WebhookConfig, record: dict[str, str], patch: JsonPatch,
    containers: list[tuple[str, int, dict[str, Any]]],
) -> None:
    spec = as_mapping(pod.get("spec"))
    container = meter_container(config.meter, record[ANNOTATION_GPU_SHARE], int(record[ANNOTATION_GPU_MEMORY]))
    list_name = _meter_list(config)
    injected = [
        (index, c)
        for name, index, c in containers
        if name == list_name and c.get("name") == config.meter.name
    ]
    if injected:  # reinvocation: _check_meter has confirmed it is ours, for this record or an earlier one
        index, current = injected[0]
        if meter_identity(current, config.meter) != meter_identity(container, config.meter):
            patch.remove(pointer("spec", list_name, index))
            patch.add(pointer("spec", list_name, index), container)
        return
    if list_name not in spec:
        patch.add(pointer("spec", list_name), [container])
    elif list_name == "initContainers":
        # First, so that it meters the GPU time of the init containers after it too.
        patch.add(pointer("spec", list_name, 0), container)
    else:
        patch.add(pointer("spec", list_name, "-"), container)
    present = {v.get("name") for v in as_list(spec.get("volumes")) if isinstance(v, dict)}
    missing = [v for v in meter_volumes(config.meter) if v["name"] not in present]
    if "volumes" not in spec:
        patch.add(pointer("spec", "volumes"), missing)
    else:
        for volume in missing:
            patch.add(pointer("spec", "volumes", "-"), volume)
