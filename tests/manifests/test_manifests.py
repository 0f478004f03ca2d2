"""The cluster manifests: they build, validate strictly, and say what the deployment promises."""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from demo.apiserver import admission_review, api_server_pod, example_manifests, example_pod
from demo.processes import run_command
from gpusharing.contract import FAIR_SHARE_GATE, AdmissionMode, Shortfall
from gpusharing.gpu.catalogue import SHIPPED_CATALOGUE, catalogue_from
from gpusharing.idle.policy import FIELDS as IDLE_FIELDS
from gpusharing.idle.policy import IdleAction
from gpusharing.serving.certs import write_overlay
from gpusharing.statements.note import Signer, Verifier
from tests.gpusharing import test_backends as backends
from tests.gpusharing import test_dra as dra
from tests.gpusharing.test_request import INVALID
from tests.kustomize import KUBECTL, MANIFESTS, PASSWORD, crds, installable_manifests, kustomize, overlay

KUBERNETES_VERSION = "1.37.0"
SYSTEM_NAMESPACES = {"kube-system", "kube-public", "kube-node-lease", "gpusharing-system"}


@pytest.fixture(scope="module")
def installable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return installable_manifests(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="module")
def objects(installable: Path) -> list[dict[str, Any]]:
    return kustomize(installable)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def examples() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted((MANIFESTS / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def test_every_object_validates_strictly(objects: list[dict[str, Any]]) -> None:
    extra = examples() + crds()
    for obj in objects + extra:
        if obj["apiVersion"].startswith(("cert-manager.io/", "gpusharing.io/")):
            # custom resources, not in the Kubernetes schema: checked below (and gpusharing.io's by the e2e tier)
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_gpubudget_examples_match_their_crds_schema() -> None:
    """The CRDs' structural schema, as JSON Schema (their CEL rules run on the real API server: tests/e2e)."""
    from jsonschema import Draft4Validator

    definitions = {o["spec"]["names"]["kind"]: o for o in crds()}
    assert set(definitions) == {"GPUBudget", "ClusterGPUBudget"}
    found = [o for o in examples() if o["apiVersion"] == "gpusharing.io/v1alpha1"]
    assert {o["kind"] for o in found} == set(definitions)
    for obj in found:
        (version,) = definitions[obj["kind"]]["spec"]["versions"]
        assert version["served"] and version["storage"] and version["subresources"] == {"status": {}}
        Draft4Validator(version["schema"]["openAPIV3Schema"]).validate(obj)
        columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
        assert columns == [
            "Budget",
            "Used",
            "Remaining",
            "Percent",
            "Idle",
            "State",
            "Band",
            "Fair-share ratio",
            "Period End",
            "Age",
        ]
    assert definitions["GPUBudget"]["spec"]["names"]["shortNames"] == ["gb"]


def test_the_crds_are_apart_so_that_deleting_the_installation_deletes_no_budget(objects: list[dict[str, Any]]) -> None:
    assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    assert {o["kind"] for o in crds()} == {"CustomResourceDefinition"}


def test_the_crds_take_safe_admissions_settings_as_the_contract_names_them() -> None:
    from jsonschema import Draft4Validator

    for crd in crds():
        (version,) = crd["spec"]["versions"]
        schema = version["schema"]["openAPIV3Schema"]
        spec = schema["properties"]["spec"]["properties"]
        assert (spec["admission"]["enum"], spec["admission"]["default"]) == (list(AdmissionMode), AdmissionMode.OPEN)
        assert (spec["onShortfall"]["enum"], spec["onShortfall"]["default"]) == (list(Shortfall), Shortfall.DEMOTE)
        obj = {
            "apiVersion": "gpusharing.io/v1alpha1",
            "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "x.y"},
        }
        Draft4Validator(schema).validate(
            {**obj, "spec": {"gpuMinutes": 1, "admission": "strict", "onShortfall": "refuse"}}
        )
        for key, value in (("admission", "unsafe"), ("onShortfall", "evict"), ("admission", "Safe")):
            errors = Draft4Validator(schema).iter_errors({**obj, "spec": {"gpuMinutes": 1, key: value}})
            assert [error.message for error in errors] == [f"{value!r} is not one of {spec[key]['enum']}"]
        assert {"name": "Admission", "type": "string", "jsonPath": ".spec.admission", "priority": 1} in version[
            "additionalPrinterColumns"
        ]


CERTGEN = {
    ("ServiceAccount", "gpusharing-certgen"),
    ("Role", "gpusharing-certgen"),
    ("RoleBinding", "gpusharing-certgen"),
    ("ClusterRole", "gpusharing-certgen"),
    ("ClusterRoleBinding", "gpusharing-certgen"),
    ("Job", "gpusharing-certgen"),
    ("CronJob", "gpusharing-certgen"),
}


def test_the_certgen_makes_the_webhooks_certificate_without_cert_manager(objects: list[dict[str, Any]]) -> None:
    assert CERTGEN <= {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert not [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]
    job, cron = find(objects, "Job", "gpusharing-certgen"), find(objects, "CronJob", "gpusharing-certgen")
    assert cron["spec"]["jobTemplate"]["spec"] == job["spec"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[:3] == ["certs", "--format", "cluster"]
    options = dict(zip(args[3::2], args[4::2]))
    assert find(objects, "Service", options["--service"]) and find(objects, "ServiceAccount", options["--owner"])
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert find(objects, kind, options["--webhook-configuration"])
    volumes = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["volumes"]
    (tls,) = [v for v in volumes if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == options["--secret"] and [i["key"] for i in tls["secret"]["items"]] == [
        "tls.crt",
        "tls.key",
    ]
    assert granted_in(find(objects, "ClusterRole", "gpusharing-certgen")) == {
        ("admissionregistration.k8s.io", f"{kind}webhookconfigurations", verb, "gpusharing")
        for kind in ("mutating", "validating") for verb in ("get", "patch")
    }
    assert granted_in(find(objects, "Role", "gpusharing-certgen")) == {
        ("", "secrets", "create", None),  # a create cannot be limited by name; the namespace limits it
        ("", "secrets", "get", "gpusharing-webhook-tls"), ("", "secrets", "update", "gpusharing-webhook-tls"),
        ("", "serviceaccounts", "get", "gpusharing-certgen"),  # the Secret's owner: uninstalling deletes it
    }  # and the statements' signing key: a create alone, never a read of it
    controller = find(objects, "Deployment", "gpusharing-controller")["spec"]["template"]["spec"]
    (key,) = [v for v in controller["volumes"] if v["name"] == "statement-key"]
    assert {s["secret"]["name"] for s in key["projected"]["sources"]} == {options["--statement-key-secret"]}


def granted_in(role: dict[str, Any]) -> set[tuple[str, str, str, str | None]]:
    """(API group, resource, verb, name or None for any) of every permission a Role or ClusterRole grants."""
    return {
        (group, resource, verb, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", [None])
    }


def test_the_cert_manager_component_issues_the_certificate_in_place_of_the_certgen(installable: Path) -> None:
    objects = overlay(
        installable.parent / "with-cert-manager",
        {"resources": ["../manifests"], "components": ["../manifests/cert-manager"]},
    )
    # The certgen's Job is left to make the statements' signing key alone, with the right to create Secrets alone.
    assert CERTGEN & {(o["kind"], o["metadata"]["name"]) for o in objects} == CERTGEN - {
        ("ClusterRole", "gpusharing-certgen"), ("ClusterRoleBinding", "gpusharing-certgen"),
        ("CronJob", "gpusharing-certgen"),
    }
    (container,) = find(objects, "Job", "gpusharing-certgen")["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "certs", "--format", "cluster", "--namespace", "$(NAMESPACE)", "--no-certificate",
        "--statement-key-secret", "gpusharing-statement-key",
        "--statement-key-name", "gpusharing.io/kubernetes/statements",
    ]
    assert granted_in(find(objects, "Role", "gpusharing-certgen")) == {("", "secrets", "create", None)}
    certificate = find(objects, "Certificate", "gpusharing-webhook")
    assert certificate["spec"]["secretName"] == "gpusharing-webhook-tls"
    assert "gpusharing-webhook.gpusharing-system.svc" in certificate["spec"]["dnsNames"]
    assert find(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = find(objects, kind, "gpusharing")["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == "gpusharing-system/gpusharing-webhook"
    volumes = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "gpusharing-webhook-tls", "items": [
        {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}} in volumes


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_webhook_configurations(objects: list[dict[str, Any]], kind: str) -> None:
    (webhook,) = find(objects, kind, "gpusharing")["webhooks"]
    # Mutation reserves safe admission's commitments (never on a dry run); validation changes nothing.
    assert webhook["sideEffects"] == ("NoneOnDryRun" if kind.startswith("Mutating") else "None")
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["failurePolicy"] == "Fail"
    assert 1 <= webhook["timeoutSeconds"] <= 10
    assert "caBundle" not in webhook["clientConfig"]  # the certgen's (or cert-manager's) to set
    service = webhook["clientConfig"]["service"]
    assert (service["name"], service["namespace"]) == ("gpusharing-webhook", "gpusharing-system")
    (rule,) = webhook["rules"]
    if kind == "MutatingWebhookConfiguration":
        assert webhook["reinvocationPolicy"] == "IfNeeded"
        assert (service["path"], rule["operations"]) == ("/mutate", ["CREATE"])
        assert (rule["apiGroups"], rule["resources"]) == ([""], ["pods"])
    else:
        assert (service["path"], rule["operations"]) == ("/validate", ["CREATE", "UPDATE"])
        # What could reach into the meter: its ephemeral containers, its resources.
        assert (rule["apiGroups"], rule["resources"]) == ([""], ["pods", "pods/ephemeralcontainers", "pods/resize"])
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/metadata.name", "NotIn")
    assert set(expression["values"]) == SYSTEM_NAMESPACES


def match_conditions(objects: list[dict[str, Any]], kind: str) -> Any:
    (condition,) = find(objects, kind, "gpusharing")["webhooks"][0]["matchConditions"]
    environment = celpy.Environment()
    program = environment.program(environment.compile(condition["expression"]))

    def matches(pod: dict[str, Any], old: dict[str, Any] | None = None, sub_resource: str = "") -> bool:
        request = admission_review(pod, "UPDATE" if old else "CREATE", old=old, sub_resource=sub_resource)["request"]
        activation = {
            "object": celpy.json_to_cel(pod),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel(request),
        }
        return bool(program.evaluate(activation))

    return matches


NO_GPU = api_server_pod(
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "annotations": {"team": "web"}},
        "spec": {
            "containers": [
                {"name": "web", "image": "nginx:1.27", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
            ]
        },
    }
)
NO_RESOURCES = api_server_pod(
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare"},
        "spec": {"containers": [{"name": "bare", "image": "busybox:1.36"}]},
    }
)


def backend_pods() -> list[tuple[str, dict[str, Any]]]:
    """The pods of the backends' rule tables that the webhook bills or refuses: each must reach it."""
    pods: list[tuple[str, dict[str, Any]]] = []
    pods += [(name, p) for name, p, expected in backends.KAI_VALIDATOR if expected is not None]
    pods += [(name, backends.pod_of(spec)) for name, spec, _ in backends.HAMI_ADMISSION]
    for name, given, expected in backends.KAI_VALUES:
        if expected is not None:
            pods.append((name, backends.pod(backends.container("main"), annotations=given)))
    for table in (backends.HAMI_REQUESTS, backends.GPU_MANAGER):
        pods += [
            (row[0], backends.pod(backends.container("main", limits=row[1]))) for row in table if row[-1] is not None
        ]
    for name, limits, _, expected in backends.ALIYUN:
        if expected is not None:
            pods.append(
                (name, backends.pod(*[backends.container(f"c{i}", limits=each) for i, each in enumerate(limits)]))
            )
    for name, resource, _, _ in backends.MIG:
        pods.append((name, backends.pod(backends.container("main", limits={resource: "1"}))))
    for name, templates, _, _ in dra.CLAIMS:
        pods.append((name, dra.claiming(*templates)))
    return pods


@pytest.mark.parametrize("kind", ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"])
def test_match_conditions_let_every_gpu_pod_through_and_no_other(objects: list[dict[str, Any]], kind: str) -> None:
    matches = match_conditions(objects, kind)
    for name in example_manifests():
        assert matches(example_pod(name)), name
    for pod, _ in INVALID:  # every invalid request must reach the webhook to be refused
        assert matches(pod)
    for name, pod in backend_pods():
        assert matches(pod), name
    renamed = backends.pod(backends.container("main", limits={"hami.io/gpu": "1"}))
    assert matches(renamed)
    assert not matches(NO_GPU) and not matches(NO_RESOURCES)
    assert not matches(
        api_server_pod(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "amd"},
                "spec": {"containers": [{"name": "c", "image": "rocm", "resources": {"limits": {"amd.com/gpu": "1"}}}]},
            }
        )
    )
    impostor = api_server_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": {"containers": [{"name": "gpusharing-meter", "image": "evil:1"}]},
        }
    )
    assert matches(impostor)


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_validation_also_sees_pods_and_updates_carrying_the_record(objects: list[dict[str, Any]], where: str) -> None:
    """A pod that asks for no GPU but carries the record is refused there (the timekeeper would count it)."""
    matches = match_conditions(objects, "ValidatingWebhookConfiguration")
    recorded = api_server_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x", where: {"gpusharing.io/gpu-share": "0.5"}},
            "spec": NO_GPU["spec"],
        }
    )
    assert matches(recorded)
    assert matches(NO_GPU, old=recorded) and matches(recorded, old=NO_GPU)
    assert not matches(NO_GPU, old=NO_GPU)


def test_validation_also_sees_updates_of_pods_with_the_billing_finalizer_or_the_meter(
    objects: list[dict[str, Any]],
) -> None:
    matches = match_conditions(objects, "ValidatingWebhookConfiguration")
    finalized = api_server_pod(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "x", "finalizers": ["example.com/a", "gpusharing.io/billing"]},
            "spec": NO_GPU["spec"],
        }
    )
    assert matches(finalized) and matches(NO_GPU, old=finalized) and matches(finalized, old=NO_GPU)
    assert not matches(NO_GPU, old={**NO_GPU, "metadata": {**NO_GPU["metadata"], "finalizers": ["example.com/a"]}})
    for list_name in ("initContainers", "containers"):
        metered = copy.deepcopy(NO_GPU)
        metered["spec"].setdefault(list_name, []).insert(0, {"name": "gpusharing-meter", "image": "meter:1"})
        assert matches(NO_GPU, old=metered), list_name  # the meter removed
        # The object of an ephemeral containers' or a resize's review is the whole Pod.
        for sub_resource in ("ephemeralcontainers", "resize"):
            assert matches(metered, old=metered, sub_resource=sub_resource)


CONTROLLER = "system:serviceaccount:gpusharing-system:gpusharing-controller"


def fair_share_gate_policy(objects: list[dict[str, Any]]) -> Any:
    """Whether the fair-share gate's policy refuses an UPDATE of `old` into `new` sent by `username`, as the API
    server evaluates it: its match condition, then its validation (the CEL through cel-python)."""
    policy = find(objects, "ValidatingAdmissionPolicy", "gpusharing-fair-share-gate")["spec"]
    environment = celpy.Environment()
    (condition,) = policy["matchConditions"]
    (validation,) = policy["validations"]
    selects, allows = (
        environment.program(environment.compile(expression))
        for expression in (condition["expression"], validation["expression"])
    )

    def refuses(old: dict[str, Any], new: dict[str, Any], username: str, groups: tuple[str, ...] = ()) -> bool:
        request = admission_review(new, "UPDATE", old=old, user={"username": username, "groups": list(groups)})[
            "request"]
        activation = {
            "object": celpy.json_to_cel(new),
            "oldObject": celpy.json_to_cel(old),
            "request": celpy.json_to_cel(request),
        }
        return bool(selects.evaluate(activation)) and not bool(allows.evaluate(activation))

    return refuses


def gated(*gates: str) -> dict[str, Any]:
    pod = copy.deepcopy(NO_GPU)
    if gates:
        pod["spec"]["schedulingGates"] = [{"name": gate} for gate in gates]
    return pod


def test_only_the_controller_may_release_a_pod_from_the_fair_share_queue(objects: list[dict[str, Any]]) -> None:
    """A tenant controls its pods: without the policy, it could remove the gate and skip the queue."""
    policy = find(objects, "ValidatingAdmissionPolicy", "gpusharing-fair-share-gate")
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    assert "only the GPU-sharing controller" in policy["spec"]["validations"][0]["message"]
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "gpusharing-fair-share-gate")["spec"]
    assert (binding["policyName"], binding["validationActions"]) == ("gpusharing-fair-share-gate", ["Deny"])
    refuses = fair_share_gate_policy(objects)
    tenant = "system:serviceaccount:ml-team:default"
    fair_share, other = FAIR_SHARE_GATE, "example.com/quota"  # the webhook's gate, as the policy names it
    for old, new in ((gated(fair_share), gated()), (gated(other, fair_share), gated(other))):
        assert refuses(old, new, tenant) and refuses(old, new, "system:serviceaccount:ml-team:gpusharing-controller")
        assert not refuses(old, new, CONTROLLER)
        # a cluster admin, for pods whose controller is gone; a tenant's own groups are no such thing
        assert not refuses(old, new, "kubernetes-admin", ("system:masters", "system:authenticated"))
        assert refuses(old, new, tenant, ("system:serviceaccounts", "system:serviceaccounts:ml-team"))
    # Any other change of gates or of the pod is not the policy's: the gate stays, or was never there.
    assert not refuses(gated(other, fair_share), gated(fair_share), tenant)
    assert not refuses(gated(fair_share), gated(fair_share), tenant)
    assert not refuses(gated(other), gated(), tenant) and not refuses(gated(), gated(), tenant)


def test_priority_classes_demote_without_preempting(objects: list[dict[str, Any]]) -> None:
    in_budget = find(objects, "PriorityClass", "gpusharing-in-budget")
    over_budget = find(objects, "PriorityClass", "gpusharing-over-budget")
    assert over_budget["preemptionPolicy"] == "Never"
    assert over_budget["value"] < 0 < in_budget["value"]
    assert not over_budget.get("globalDefault") and not in_budget.get("globalDefault")


def test_webhook_deployment_is_highly_available(objects: list[dict[str, Any]]) -> None:
    deployment = find(objects, "Deployment", "gpusharing-webhook")
    spec = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 3
    assert spec["affinity"]["podAntiAffinity"]
    (container,) = spec["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "cpu" in container["resources"]["requests"] and "cpu" not in container["resources"].get("limits", {})
    budget = find(objects, "PodDisruptionBudget", "gpusharing-webhook")
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_containers_run_unprivileged(objects: list[dict[str, Any]]) -> None:
    workloads = [
        (o["metadata"]["name"], o["spec"]) for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")
    ]
    workloads += [(o["metadata"]["name"], o["spec"]["jobTemplate"]["spec"]) for o in objects if o["kind"] == "CronJob"]
    assert len(workloads) == 6  # webhook, timekeeper, controller, postgres, the certgen's Job and CronJob
    for name, spec in workloads:
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
            if container["image"].startswith("ghcr.io/kube-gpusharing/"):
                assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_timekeeper_runs_migrations_before_serving(objects: list[dict[str, Any]]) -> None:
    deployment = find(objects, "Deployment", "gpusharing-timekeeper")
    assert deployment["spec"]["replicas"] == 2
    spec = deployment["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["args"] == ["db", "upgrade"]
    assert spec["containers"][0]["args"] == ["timekeeper", "serve"]
    assert find(objects, "StatefulSet", "gpusharing-postgres")["spec"]["volumeClaimTemplates"]


def granted(objects: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every permission a ClusterRole grants."""
    return {(group, resource, verb) for group, resource, verb, _ in granted_in(find(objects, "ClusterRole", role))}


def test_controller_does_the_cluster_work_under_a_lease_with_the_timekeepers_database(
    objects: list[dict[str, Any]],
) -> None:
    deployment = find(objects, "Deployment", "gpusharing-controller")
    assert deployment["spec"]["replicas"] == 2
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpusharing-controller"
    (container,) = spec["containers"]
    assert container["args"] == ["timekeeper", "controller"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 8081}]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/livez")):
        assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}
    env = {e["name"]: e for e in container["env"]}
    assert env["TIMEKEEPER_LEASE_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    timekeeper = find(objects, "Deployment", "gpusharing-timekeeper")["spec"]["template"]["spec"]
    tk_env = {e["name"]: e for e in timekeeper["containers"][0]["env"]}
    shared = (
        "DATABASE_PASSWORD",
        "TIMEKEEPER_DATABASE_URL",
        "GPUSHARING_GPU_MODELS_FILE",
        "GPUSHARING_METER_INTERVAL_SECONDS",
    )
    assert {name: env[name] for name in shared} == {name: tk_env[name] for name in shared}
    assert "TIMEKEEPER_LEASE_NAMESPACE" not in tk_env  # the Lease is the controller's alone
    assert container["securityContext"] == timekeeper["containers"][0]["securityContext"]
    assert spec["securityContext"] == timekeeper["securityContext"]
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    budget = find(objects, "PodDisruptionBudget", "gpusharing-controller")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    service = find(objects, "Service", "gpusharing-controller")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics"}]


def test_the_meters_interval_is_one_setting_of_the_webhook_the_timekeeper_and_the_controller(
    objects: list[dict[str, Any]],
) -> None:
    for name in ("gpusharing-webhook", "gpusharing-timekeeper", "gpusharing-controller"):
        (container,) = find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert {"name": "GPUSHARING_METER_INTERVAL_SECONDS", "value": "30"} in container["env"], name


def test_rbac_is_least_privilege(objects: list[dict[str, Any]]) -> None:
    # The web timekeeper: the API's callers, the reporting pod's terms, a node agent's node and the pods bound to it;
    # it follows no pods (the controller publishes safe admission's commitments).
    assert granted(objects, "gpusharing-timekeeper") == {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
        ("", "pods", "get"),  # a reporting pod's admitted terms; a node agent's pod, the node it runs on
        ("", "pods", "list"),  # the pods bound to a node agent's node (field selector spec.nodeName), never watched
        ("", "nodes", "get"),  # a reporting pod's node: the GPU model it is billed on
    }
    # The controller: the cluster work.
    assert granted(objects, "gpusharing-controller") == {
        ("", "pods", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),  # billing: what ran; safe admission: what the deadlines commit
        ("", "pods", "patch"),  # the billing finalizer, removed once a pod's bill is closed
        ("", "pods/eviction", "create"),
        ("", "nodes", "list"),  # a bound pod is billed on its node's GPU model; fair share divides the nodes' GPUs
        ("", "nodes", "watch"),
        # DRA pods' bills
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
        ("", "events", "create"),
        ("", "namespaces", "get"),
        ("apps", "replicasets", "get"),  # idle pods' Events on the Deployment that owns their ReplicaSet
        *{
            ("gpusharing.io", resource, verb)
            for resource in ("gpubudgets", "clustergpubudgets")
            for verb in ("get", "list", "watch")
        },
        *{
            ("gpusharing.io", f"{resource}/status", verb)
            for resource in ("gpubudgets", "clustergpubudgets")
            for verb in ("update", "patch")
        },
    }
    election = find(objects, "Role", "gpusharing-controller-leader-election")
    assert election["metadata"]["namespace"] == "gpusharing-system"
    assert election["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    bindings = {
        (o["kind"], o["roleRef"]["name"], s["name"])
        for o in objects
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in o["subjects"]
    }
    assert {(kind, role) for kind, role, subject in bindings if subject == "gpusharing-timekeeper"} == {
        ("ClusterRoleBinding", "gpusharing-timekeeper")
    }
    assert {(kind, role) for kind, role, subject in bindings if subject == "gpusharing-controller"} == {
        ("ClusterRoleBinding", "gpusharing-controller"), ("RoleBinding", "gpusharing-controller-leader-election")}
    viewer = find(objects, "ClusterRole", "gpusharing-gpubudget-viewer")
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {verb for rule in viewer["rules"] for verb in rule["verbs"]} == {"get", "list", "watch"}  # never more
    assert granted(objects, "gpusharing-webhook") == {
        *{("resource.k8s.io", r, v) for r in ("resourceclaimtemplates", "resourceclaims") for v in ("list", "watch")},
        ("batch", "jobs", "list"), ("batch", "jobs", "watch"),  # Jobs' deadlines, carried onto their pods
        # PriorityClasses' values, written into GPU pods as the Priority plugin would (one /mutate call per pod)
        ("scheduling.k8s.io", "priorityclasses", "list"), ("scheduling.k8s.io", "priorityclasses", "watch"),
        ("gpusharing.io", "gpubudgets", "list"),  # the timekeeper's listing of every namespace's budget state
        ("gpusharing.io", "reservations", "create"),  # safe admission's reservations, made by the timekeeper
    }
    bindings = {
        (o["roleRef"]["name"], s["name"])
        for o in objects
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in o["subjects"]
    }
    assert {role for role, subject in bindings if subject == "gpusharing-webhook"} == {"gpusharing-webhook"}
    # No token by default; the webhook's own container gets the API's and the timekeeper's, projected.
    assert find(objects, "ServiceAccount", "gpusharing-webhook")["automountServiceAccountToken"] is False
    pod = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (api_token,) = [v for v in pod["volumes"] if v["name"] == "kube-api-token"]
    (token_source,) = [
        s["serviceAccountToken"] for s in api_token["projected"]["sources"] if "serviceAccountToken" in s
    ]
    assert "audience" not in token_source and token_source["expirationSeconds"] <= 3600


def test_network_policy_opens_only_the_timekeeper_port_and_the_controllers_metrics_to_all_pods(
    objects: list[dict[str, Any]],
) -> None:
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    deny = next(p for p in policies if p["spec"]["podSelector"] == {})
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    from_everywhere = [
        p
        for p in policies
        if any(
            source.get("namespaceSelector") == {}
            for rule in p["spec"].get("ingress", [])
            for source in rule.get("from", [])
        )
    ]
    assert {
        (p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"], p["spec"]["ingress"][0]["ports"][0]["port"])
        for p in from_everywhere
    } == {("gpusharing-timekeeper", 8080), ("gpusharing-controller", 8081)}
    (database,) = [p for p in policies if p["metadata"]["name"] == "postgres-from-timekeeper"]
    assert [
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in database["spec"]["ingress"][0]["from"]
    ] == ["gpusharing-timekeeper", "gpusharing-controller"]


def database_password(objects: list[dict[str, Any]]) -> str:
    [secret] = [
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].startswith("gpusharing-database-")
    ]
    return base64.b64decode(secret["data"]["password"]).decode()


def test_the_database_password_is_generated_from_database_env_and_reaches_postgres_and_the_timekeeper(
    objects: list[dict[str, Any]]
) -> None:
    assert database_password(objects) == PASSWORD
    [secret] = [
        o["metadata"]["name"]
        for o in objects
        if o["kind"] == "Secret" and o["metadata"]["name"].startswith("gpusharing-database")
    ]
    postgres = find(objects, "StatefulSet", "gpusharing-postgres")["spec"]["template"]["spec"]["containers"][0]
    assert {
        "name": "POSTGRES_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": secret, "key": "password"}},
    } in postgres["env"]
    timekeeper = find(objects, "Deployment", "gpusharing-timekeeper")["spec"]["template"]["spec"]
    controller = find(objects, "Deployment", "gpusharing-controller")["spec"]["template"]["spec"]
    for container in (timekeeper["initContainers"][0], timekeeper["containers"][0], controller["containers"][0]):
        names = [e["name"] for e in container["env"]]
        # Kubernetes expands $(VAR) only from variables defined before.
        assert names.index("DATABASE_PASSWORD") < names.index("TIMEKEEPER_DATABASE_URL")
        assert container["env"][names.index("DATABASE_PASSWORD")]["valueFrom"]["secretKeyRef"] == {
            "name": secret,
            "key": "password",
        }
        url = container["env"][names.index("TIMEKEEPER_DATABASE_URL")]["value"]
        assert url.startswith("postgresql+psycopg://gpusharing:$(DATABASE_PASSWORD)@gpusharing-postgres.")
    in_base = [
        doc for path in (MANIFESTS / "base").glob("*.yaml") for doc in yaml.safe_load_all(path.read_text()) if doc
    ]
    assert not [doc for doc in in_base if doc.get("kind") == "Secret"]  # no password in git to edit by hand


def test_without_database_env_kustomize_names_the_file_to_write(tmp_path: Path) -> None:
    shutil.copytree(MANIFESTS, tmp_path / "manifests", ignore=shutil.ignore_patterns("local-certs", "database.env"))
    rendered = subprocess.run([KUBECTL, "kustomize", str(tmp_path / "manifests")], capture_output=True, text=True)
    assert rendered.returncode != 0 and "database.env" in rendered.stderr


def test_an_overlays_images_override_reaches_the_meter_image_and_the_certgen(installable: Path) -> None:
    objects = overlay(
        installable.parent / "registry-overlay",
        {
            "resources": ["../manifests"],
            "images": [
                {
                    "name": "ghcr.io/kube-gpusharing/gpusharing",
                    "newName": "registry.example.com/gpusharing",
                    "newTag": "0.2.0",
                }
            ],
        },
    )
    templates = [o["spec"]["template"] for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")]
    templates += [o["spec"]["jobTemplate"]["spec"]["template"] for o in objects if o["kind"] == "CronJob"]
    ours = [
        c
        for t in templates
        for c in t["spec"].get("initContainers", []) + t["spec"]["containers"]
        if "gpusharing" in c["image"]
    ]
    assert len(ours) == 6 and {c["image"] for c in ours} == {"registry.example.com/gpusharing:0.2.0"}
    webhook = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "GPUSHARING_METER_IMAGE", "value": "registry.example.com/gpusharing:0.2.0"} in webhook["env"]
    timekeeper = find(objects, "Deployment", "gpusharing-timekeeper")["spec"]["template"]["spec"]["containers"][0]
    assert [e for e in timekeeper["env"] if e["name"] == "TIMEKEEPER_DATABASE_URL"][0]["value"].startswith(
        "postgresql+psycopg://"
    )


def test_certs_overlay_for_clusters_without_cert_manager(tmp_path: Path) -> None:
    overlay = write_overlay("gpusharing-system", MANIFESTS / "base", tmp_path / "local-certs")
    password = (overlay / "database.env").read_text()
    assert re.fullmatch(r"password=[0-9a-f]{48}\n", password) and (overlay / "database.env").stat().st_mode & 0o077 == 0
    key = (overlay / "statement.key").read_text()
    assert (overlay / "statement.key").stat().st_mode & 0o077 == 0
    assert write_overlay("gpusharing-system", MANIFESTS / "base", tmp_path / "local-certs") == overlay
    assert (overlay / "database.env").read_text() == password  # kept: PostgreSQL keeps the one it started with
    assert (overlay / "statement.key").read_text() == key  # kept: the statements' chain goes on with its key
    objects = kustomize(overlay)
    assert database_password(objects) == password.strip().split("=", 1)[1]
    # The statements' signing key, generated into the Secret the controller mounts (kustomize names it by a hash).
    controller = find(objects, "Deployment", "gpusharing-controller")["spec"]["template"]["spec"]
    (volume,) = [v for v in controller["volumes"] if v["name"] == "statement-key"]
    (name,) = {source["secret"]["name"] for source in volume["projected"]["sources"]}
    data = {k: base64.b64decode(v).decode() for k, v in find(objects, "Secret", name)["data"].items()}
    assert data == {"key": key, "verifier": (overlay / "statement.pub").read_text()}
    assert Signer.from_text(key.strip()).verifier == Verifier.from_text(data["verifier"].strip())
    secret = find(objects, "Secret", "gpusharing-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert find(objects, kind, "gpusharing")["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_the_documented_admin_token_comes_from_a_service_account_the_installation_binds_to_the_budget_admin_role(
    objects: list[dict[str, Any]]
) -> None:
    documents = [MANIFESTS.parent / "README.md", *sorted((MANIFESTS.parent / "docs").rglob("*.md"))]
    text = "\n".join(document.read_text() for document in documents)
    accounts = set(
        re.findall(r"kubectl -n gpusharing-system create token ([a-z0-9-]+) --audience gpusharing-timekeeper", text)
    )
    assert accounts, "neither the README nor docs/ shows an admin token"
    created = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "ServiceAccount"}
    bound = {
        (s["namespace"], s["name"])
        for o in objects
        if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "gpusharing-budget-admin"
        for s in o["subjects"]
        if s["kind"] == "ServiceAccount"
    }
    for account in accounts:
        assert ("gpusharing-system", account) in created & bound, account


def test_uninstalling_leaves_nothing_behind(objects: list[dict[str, Any]]) -> None:
    """`kubectl delete -k manifests/` deletes what the installation made: every binding's subjects come with it (a
    ClusterRoleBinding applied apart, as the budget admin's was, outlived the namespace), the examples hold no RBAC to
    apply apart, and the Secret the certgen makes is owned by its ServiceAccount (the garbage collector deletes it)."""
    names = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        for subject in binding["subjects"]:
            assert ("ServiceAccount", subject["namespace"], subject["name"]) in names, binding["metadata"]["name"]
    assert not [o for o in examples() if o["apiVersion"].startswith("rbac.") or o["kind"] == "ServiceAccount"]
    (container,) = find(objects, "Job", "gpusharing-certgen")["spec"]["template"]["spec"]["containers"]
    owner = container["args"][container["args"].index("--owner") + 1]
    assert ("ServiceAccount", "gpusharing-system", owner) in names


def test_the_gpu_model_catalogue_is_the_shipped_one_mounted_by_both_and_an_overlay_replaces_it(
    installable: Path,
) -> None:
    assert (MANIFESTS / "base" / "gpu-models.yaml").read_bytes() == SHIPPED_CATALOGUE.read_bytes()
    mine = "default: NVIDIA L4\nmodels:\n- {name: NVIDIA L4, memoryMiB: 23034, billingWeight: 0.3}\n"
    replaced = overlay(
        installable.parent / "my-models",
        {
            "resources": ["../manifests"],
            "configMapGenerator": [
                {
                    "name": "gpusharing-gpu-models",
                    "namespace": "gpusharing-system",
                    "behavior": "replace",
                    "files": ["gpu-models.yaml=my-models.yaml"],
                }
            ],
        },
        files={"my-models.yaml": mine},
    )
    for objects, content in ((kustomize(installable), SHIPPED_CATALOGUE.read_text()), (replaced, mine)):
        [config_map] = [
            o
            for o in objects
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("gpusharing-gpu-models-")
        ]
        assert config_map["data"] == {"gpu-models.yaml": content}
        catalogue_from(yaml.safe_load(content), "the catalogue")
        for name in ("gpusharing-webhook", "gpusharing-timekeeper", "gpusharing-controller"):
            pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
            assert {"name": "gpu-models", "configMap": {"name": config_map["metadata"]["name"]}} in pod["volumes"]
            (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "gpu-models"]
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["GPUSHARING_GPU_MODELS_FILE"] == f"{mount['mountPath']}/gpu-models.yaml"
    names = {
        o["metadata"]["name"]
        for objects in (kustomize(installable), replaced)
        for o in objects
        if o["kind"] == "ConfigMap"
    }
    assert len(names) == 2  # another name for another catalogue: both Deployments roll


def test_the_webhooks_settings_agree_with_its_configurations_and_priority_classes(
    objects: list[dict[str, Any]],
) -> None:
    env = {
        e["name"]: e.get("value")
        for e in find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (expression,) = find(objects, kind, "gpusharing")["webhooks"][0]["namespaceSelector"]["matchExpressions"]
        assert expression["values"] == [*env["GPUSHARING_EXEMPT_NAMESPACES"].split(","), "gpusharing-system"]
    for variable in ("GPUSHARING_PRIORITY_CLASS_IN_BUDGET", "GPUSHARING_PRIORITY_CLASS_OVER_BUDGET"):
        assert find(objects, "PriorityClass", env[variable])


def test_the_client_auth_component_makes_the_webhook_answer_the_api_servers_certificate_alone(tmp_path: Path) -> None:
    installed = installable_manifests(tmp_path)
    assert run_command("certs", "--format", "client-auth", "--output", str(installed / "client-auth")).returncode == 0
    with (installed / "kustomization.yaml").open("a") as kustomization:
        kustomization.write("components:\n- client-auth\n")
    objects = kustomize(installed)
    (secret,) = [
        o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"].startswith("gpusharing-webhook-client-ca")
    ]
    assert base64.b64decode(secret["data"]["ca.crt"]) == (installed / "client-auth" / "ca.crt").read_bytes()
    pod = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "GPUSHARING_CLIENT_CA_FILE", "value": "/etc/gpusharing/client-ca/ca.crt"} in container["env"]
    assert {"name": "client-ca", "mountPath": "/etc/gpusharing/client-ca", "readOnly": True} in container[
        "volumeMounts"
    ]
    # The Secret's hashed name, so that a new CA rolls the webhook.
    assert {"name": "client-ca", "secret": {"secretName": secret["metadata"]["name"]}} in pod["volumes"]
    apiserver = installed / "client-auth" / "apiserver"
    admission = yaml.safe_load((apiserver / "admission-configuration.yaml").read_text())
    assert {p["configuration"]["kubeConfigFile"] for p in admission["plugins"]} == {
        "/etc/kubernetes/gpusharing/webhook-kubeconfig.yaml"
    }
    # the client key: for the control plane alone
    assert (apiserver / "webhook-kubeconfig.yaml").stat().st_mode & 0o077 == 0


def test_the_crds_take_an_idle_policy_as_the_api_does() -> None:
    """The structural schema of spec.idle, as JSON Schema (its CEL rules on durations run on the real API server)."""
    from jsonschema import Draft4Validator

    for crd in crds():
        (version,) = crd["spec"]["versions"]
        schema = version["schema"]["openAPIV3Schema"]
        idle = schema["properties"]["spec"]["properties"]["idle"]
        assert set(idle["properties"]) == set(IDLE_FIELDS) and idle["required"] == ["after"]
        actions = [str(action) for action in IdleAction]
        assert idle["properties"]["action"]["enum"] == actions
        obj = {
            "apiVersion": "gpusharing.io/v1alpha1",
            "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "x.y"},
        }
        policy = {"after": "4h", "action": "evict", "warnBefore": "30m", "utilisationPercent": 0.5, "minAge": "1h"}
        Draft4Validator(schema).validate({**obj, "spec": {"gpuMinutes": 1, "idle": policy}})
        errors = Draft4Validator(schema).iter_errors({**obj, "spec": {"gpuMinutes": 1, "idle": {"action": "kill"}}})
        assert sorted(error.message for error in errors) == [
            "'after' is a required property",
            f"'kill' is not one of {actions}",
        ]
        assert {"name": "Idle", "type": "number", "jsonPath": ".status.idleGpuHours",
                "description": "GPU-hours idle this period"} in version["additionalPrinterColumns"]
