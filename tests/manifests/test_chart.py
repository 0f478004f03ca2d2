"""The Helm chart, the installation's one source (manifests/ is rendered from it: tests/manifests/test_rendered.py):
Helm lints it, its schema refuses bad values, with cert-manager it renders what the manifests' hand-written
cert-manager component makes of them, and every object it renders for other values validates strictly and says what
those values promise."""

from __future__ import annotations

import base64
import configparser
import json
import os
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from gpusharing.gpu.catalogue import SHIPPED_CATALOGUE, catalogue_from, shipped_catalogue
from gpusharing.serving.certgen import StatementKey, statement_key_secret
from gpusharing.serving.certs import service_names
from nodeagent.config import NodeAgentConfig
from tests.helm import CHART, NAMESPACE, notes, render
from tests.kustomize import MANIFESTS, crds, installable_manifests, overlay
from tests.manifests.test_manifests import KUBERNETES_VERSION, find
from timekeeper.chargeback.prices import price_sheet_from
from timekeeper.config import prometheus_source, signing_keys

HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
CUSTOM_RESOURCES = ("cert-manager.io/", "monitoring.coreos.com/")
# What kustomize generates with a hash of it in the name, and the chart names with a hash too (the certgen's Job,
# by what it runs; the catalogue, by its content): the hashes differ, the names before them must not.
HASHED = re.compile(r"\b(gpusharing-(?:database|gpu-models|certgen))-[a-z0-9]{10}\b")
# The values every component's pods take, as a platform team sets them.
POD_VALUES = {
    "podAnnotations": {"example.com/team": "platform"},
    "podLabels": {"example.com/tier": "governance"},
    "nodeSelector": {"example.com/pool": "system"},
    "tolerations": [{"key": "example.com/system", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                ]
            }
        }
    },
    "priorityClassName": "system-cluster-critical",
    "podSecurityContext": {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": 10001,
    },
    "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"memory": "200Mi"}},
}
CATALOGUE = {"default": "NVIDIA H100 80GB HBM3", "models": [
    {"name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "billingWeight": 2},
    {"name": "NVIDIA L4", "memoryMiB": 23034, "billingWeight": 0.3},
]}

# Value combinations every rendering of which must validate; each says something a platform team would set.
COMBINATIONS = {
    "defaults": {},
    "cert-manager": {"certManager": {"enabled": True}},
    "cert-manager with a ClusterIssuer": {
        "certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "company-ca"}}
    },
    "cert-manager and a statement key of yours": {
        "certManager": {"enabled": True},
        "statements": {"existingSecret": "finance-statement-key"},
    },
    "external database": {"database": {"bundled": False, "external": {"secretName": "gpusharing-database-url"}}},
    "service monitors": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "grafanaDashboard": {"enabled": True},
        }
    },
    "the API server's client certificate": {
        "webhook": {"clientAuth": {"mode": "certificate"}},
        "networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/24", "fd00::/64"]},
    },
    "the API server's token": {
        "webhook": {"clientAuth": {"mode": "token"}},
        "priorityClasses": {"allowed": ["research-high"]},
    },
    "GPU utilisation from Prometheus": {
        "controller": {
            "prometheusUtilisation": {
                "enabled": True,
                "url": "https://thanos-querier.openshift-monitoring.svc:9091",
                "caConfigMap": "openshift-service-ca.crt",
                "caKey": "service-ca.crt",
                "tokenSecret": "prometheus-reader",
                "perPodMetric": "DCGM_FI_DEV_GPU_UTIL",
                "exporterSelector": 'namespace="nvidia-gpu-operator"',
            }
        }
    },
    "everything changed": {
        "namespace": {"create": True},
        "image": {"repository": "registry.example.com/gpusharing", "tag": "0.2.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "webhook": {
            "replicas": 2,
            "failurePolicy": "Ignore",
            "exemptNamespaces": ["kube-system", "ml-sandbox"],
            "env": [{"name": "GPUSHARING_ALIYUN_MEM_UNIT", "value": "MiB"}],
        },
        "meter": {"image": "registry.example.com/gpusharing-meter:0.2.0", "mode": "container", "intervalSeconds": 10},
        "controller": {"replicas": 3, "env": [{"name": "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS", "value": "5"}]},
        "timekeeper": {
            "auth": "none",
            "staticTokensSecret": "admin-tokens",
            "defaultBudget": {"gpuMinutes": 0, "period": "weekly"},
            "metricsAuth": "token",
        },
        "database": {"password": "s3cretPassw0rd", "postgres": {"storageClassName": "fast", "storage": "50Gi"}},
        "priorityClasses": {
            "inBudget": {"name": "gpu-in-budget", "value": 500},
            "overBudget": {"name": "gpu-over-budget", "value": -500},
        },
        "networkPolicy": {"enabled": False},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "certgen": {"days": 730, "schedule": "0 4 * * 1"},
        "gpuModels": CATALOGUE,
        "budgetAdmin": {"create": False},
        "metrics": {"serviceMonitor": {"enabled": True, "timekeeperTokenSecret": "prometheus-timekeeper-token"}},
    },
    "conventional values": {
        "podAnnotations": {"example.com/owner": "sre"},
        "podLabels": {"example.com/cost-center": "ml"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "example.com/dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
        ],
        "webhook": POD_VALUES,
        "timekeeper": POD_VALUES,
        "controller": POD_VALUES,
        "database": {"postgres": POD_VALUES},
        "certgen": POD_VALUES,
    },
    "node agent": {
        "nodeAgent": {
            "enabled": True,
            "runtimeClassName": "nvidia",
            "resourceNames": ["nvidia.com/gpu", "example.com/vgpu-*"],
            "intervalSeconds": 15,
            "priorityClassName": "system-node-critical",
        },
        "nodeSelector": {"example.com/pool": "system"},
    },
    "node agent in a namespace of yours": {
        "nodeAgent": {"enabled": True, "namespace": {"name": "gpu-agents", "create": False}}
    },
    "renamed": {
        "nameOverride": "gov",
        "fullnameOverride": "gpu-governance",
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
        },
    },
}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def normalized(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What may legitimately differ between the chart and kustomize (the cert-manager component's patches are
    kustomize's own, written by hand) taken out: Helm's labels, the hashes in
    generated names, the database Secret's data (a password each made) and Helm's keep policy on it."""
    text = HASHED.sub(r"\1", json.dumps(objects))
    result = {}
    for obj in json.loads(text):
        labels = obj["metadata"].get("labels", {})
        for label in HELM_LABELS:
            labels.pop(label, None)
        if obj["kind"] == "Secret" and obj["metadata"]["name"] == "gpusharing-database":
            obj["data"] = {name: "(generated)" for name in obj["data"]}
            obj["metadata"].pop("annotations", None)
        result[key(obj)] = obj
    return result


def test_helm_lints_the_chart_strictly_for_every_combination() -> None:
    for name, values in COMBINATIONS.items():
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
        assert report["errors"] == [], name
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], name


def assert_same_objects(chart: list[dict[str, Any]], manifests: list[dict[str, Any]]) -> None:
    rendered = normalized(chart)
    # helm install --create-namespace makes it
    expected = normalized([o for o in manifests + crds() if o["kind"] != "Namespace"])
    assert sorted(rendered) == sorted(expected)
    for identity, obj in expected.items():
        assert rendered[identity] == obj, identity


def test_with_cert_manager_the_chart_renders_the_manifests_cert_manager_component(tmp_path: Path) -> None:
    installable_manifests(tmp_path)
    component = overlay(
        tmp_path / "with-cert-manager", {"resources": ["../manifests"], "components": ["../manifests/cert-manager"]}
    )
    assert_same_objects(render(COMBINATIONS["cert-manager"]), component)
    # What is left of the certgen: its Job, run once for the statements' signing key.
    assert {(o["kind"], o["metadata"]["name"]) for o in component if "certgen" in o["metadata"]["name"]} == {
        (kind, "gpusharing-certgen") for kind in ("ServiceAccount", "Role", "RoleBinding", "Job")
    }


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_every_rendered_object_validates_strictly(combination: str) -> None:
    objects = render(COMBINATIONS[combination])
    assert len({key(o) for o in objects}) == len(objects), "two objects of one kind and name"
    for obj in objects:
        if obj["apiVersion"].startswith(CUSTOM_RESOURCES):
            continue  # custom resources, not in the Kubernetes schema: checked by the tests below
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        pod = workload["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_the_chart_and_its_image_have_the_packages_version() -> None:
    setup = configparser.ConfigParser()
    setup.read(CHART.parents[1] / "setup.cfg")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == setup["metadata"]["version"]


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
        ({"database": {"password": "has spaces;"}}, "/database/password"),
        ({"timekeeper": {"auth": "static"}}, "/timekeeper/auth"),
        ({"meter": {"mode": "sidecar"}}, "/meter/mode"),
        ({"webhook": {"exemptNamespaces": ["Kube_System"]}}, "/webhook/exemptNamespaces/0"),
        ({"certgen": {"days": 36500}}, "/certgen/days"),
        ({"fullnameOverride": "Governance"}, "/fullnameOverride"),
        ({"nameOverride": "a-name-longer-than-forty-characters-is-too-long"}, "/nameOverride"),
        ({"webhook": {"podLabels": {"tier": 1}}}, "/webhook/podLabels/tier"),
        ({"timekeeper": {"tolerations": {"key": "x"}}}, "/timekeeper/tolerations"),
        ({"certgen": {"priorityClassName": "Critical"}}, "/certgen/priorityClassName"),
        ({"gpuModels": {"default": "NVIDIA L4"}}, "/gpuModels"),
        ({"gpuPrices": {"currency": "usd", "prices": []}}, "/gpuPrices/currency"),
        ({"gpuPrices": {"currency": "USD"}}, "/gpuPrices"),
        (
            {"gpuModels": {"default": "x", "models": [{"name": "x", "memoryMiB": 1, "migComputeSlices": 3}]}},
            "/gpuModels/models/0/migComputeSlices",
        ),
        ({"tls": {"certManager": False}}, "additional properties 'tls' not allowed"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"meter": {"intervalSeconds": 0}}, "/meter/intervalSeconds"),
        ({"controller": {"replicas": 0}}, "/controller/replicas"),
        ({"controller": {"auth": "none"}}, "additional properties 'auth' not allowed"),
        ({"statements": {"keyName": "prod gpus"}}, "/statements/keyName"),
        ({"statements": {"keyName": "prod+gpus"}}, "/statements/keyName"),
        ({"statements": {"existingSecret": "Finance_Key"}}, "/statements/existingSecret"),
        ({"statements": {"enabled": "yes"}}, "/statements/enabled"),
    ],
)
def test_the_schema_refuses_bad_values_and_says_where(values: dict[str, Any], where: str) -> None:
    with helm.Chart.load(CHART) as chart:
        with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
            chart.validate_schema(values)


def test_an_external_database_needs_its_secret_and_guarded_metrics_a_token_for_prometheus() -> None:
    with pytest.raises(helm.HelmError, match="database.external.secretName is required"):
        render({"database": {"bundled": False}})
    with pytest.raises(helm.HelmError, match="metrics.serviceMonitor.timekeeperTokenSecret is required"):
        render({"timekeeper": {"metricsAuth": "token"}, "metrics": {"serviceMonitor": {"enabled": True}}})


def test_a_renamed_hami_resource_prefix_reaches_the_match_conditions() -> None:
    values = {"webhook": {"gpuResourcePrefixes": ["nvidia.com/", "example.com/gpu-"]}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (condition,) = find(render(values), kind, "gpusharing")["webhooks"][0]["matchConditions"]
        assert (
            "k.startsWith('example.com/gpu-')" in condition["expression"] and "hami.io/" not in condition["expression"]
        )


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def containers(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    spec = find(objects, "Deployment", name)["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) + spec["containers"])


def test_an_external_database_replaces_postgres() -> None:
    objects = render(COMBINATIONS["external database"])
    assert not [
        o for o in objects if "postgres" in o["metadata"]["name"] or o["metadata"]["name"] == "gpusharing-database"
    ]
    for container in containers(objects, "gpusharing-timekeeper"):
        env = env_of(container)
        assert env["TIMEKEEPER_DATABASE_URL"] == {"secretKeyRef": {"name": "gpusharing-database-url", "key": "url"}}
        assert "DATABASE_PASSWORD" not in env


def test_the_bundled_databases_password_is_generated_in_letters_and_digits() -> None:
    password = base64.b64decode(find(render(), "Secret", "gpusharing-database")["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}", password)
    given = render({"database": {"password": "s3cret"}})
    assert base64.b64decode(find(given, "Secret", "gpusharing-database")["data"]["password"]) == b"s3cret"


def test_a_cluster_issuer_replaces_the_charts_own_issuer() -> None:
    objects = render(COMBINATIONS["cert-manager with a ClusterIssuer"])
    assert not [o for o in objects if o["kind"] == "Issuer"]
    assert find(objects, "Certificate", "gpusharing-webhook")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer",
        "name": "company-ca",
    }


def certgen_args(container: dict[str, Any]) -> dict[str, str]:
    """The certgen container's `--option value` pairs."""
    args = container["args"]
    assert args[:3] == ["certs", "--format", "cluster"]
    return dict(zip(args[3::2], args[4::2]))


def test_by_default_the_certgen_makes_the_certificate_for_the_objects_the_chart_renders() -> None:
    objects = render()
    assert not [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]
    [job] = [o for o in objects if o["kind"] == "Job"]
    cron = find(objects, "CronJob", "gpusharing-certgen")
    assert cron["spec"]["jobTemplate"]["spec"] == job["spec"]  # the CronJob runs what the Job runs
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = certgen_args(container)
    assert (
        args["--namespace"] == "$(NAMESPACE)"
        and {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    )
    assert find(objects, "Service", args["--service"])
    assert find(objects, "ServiceAccount", args["--owner"])["metadata"]["name"] == pod["serviceAccountName"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = find(objects, kind, args["--webhook-configuration"])
        assert "annotations" not in configuration["metadata"]  # no cert-manager
        # the certgen's to set, kept across upgrades
        assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
        assert configuration["webhooks"][0]["clientConfig"]["service"]["name"] == args["--service"]
    webhook = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]
    (tls,) = [v for v in webhook["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == args["--secret"]
    assert [item["key"] for item in tls["secret"]["items"]] == ["tls.crt", "tls.key"]  # never the CA's key
    assert job["spec"]["backoffLimit"] > 0 and pod["restartPolicy"] == "Never"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_the_certgen_may_touch_its_secret_and_the_two_webhook_configurations_alone() -> None:
    objects = render()
    role = find(objects, "Role", "gpusharing-certgen")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},  # a create cannot be limited by name
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["gpusharing-webhook-tls"],
            "verbs": ["get", "update"],
        },
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts"],
            "resourceNames": ["gpusharing-certgen"],
            "verbs": ["get"],
        },
    ]
    assert find(objects, "ClusterRole", "gpusharing-certgen")["rules"] == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "resourceNames": ["gpusharing"],
            "verbs": ["get", "patch"],
        }
    ]
    bindings = [
        o
        for o in objects
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding") and o["metadata"]["name"] == "gpusharing-certgen"
    ]
    assert [(b["roleRef"]["kind"], b["subjects"]) for b in bindings] == [
        (kind, [{"kind": "ServiceAccount", "name": "gpusharing-certgen", "namespace": NAMESPACE}])
        for kind in ("Role", "ClusterRole")
    ]
    # With cert-manager, it makes the statements' signing key alone: a create, and nothing of the webhook's.
    with_cert_manager = render(COMBINATIONS["cert-manager"])
    assert find(with_cert_manager, "Role", "gpusharing-certgen")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}
    ]
    assert not [o for o in with_cert_manager if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "CronJob")
                and "certgen" in o["metadata"]["name"]]
    assert not [o for o in render(COMBINATIONS["cert-manager and a statement key of yours"])
                if "certgen" in o["metadata"]["name"]]


def controller_pod(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The controller's pod spec and its container."""
    pod = find(objects, "Deployment", "gpusharing-controller")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def statement_key_volume(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    pod, _ = controller_pod(objects)
    return next((v for v in pod["volumes"] if v["name"] == "statement-key"), None)


def test_the_certgen_makes_the_statement_key_the_controller_reads(tmp_path: Path) -> None:
    """The Secret the certgen makes is the one the controller mounts, read-only, where its settings say: the key
    required (its pods wait for it), the previous key optional (there only while a rotation hands over), the
    verifier key, public, not mounted; and what the certgen puts in it is what the controller's settings read."""
    objects = render()
    [job] = [o for o in objects if o["kind"] == "Job"]
    args = certgen_args(job["spec"]["template"]["spec"]["containers"][0])
    assert (args["--statement-key-secret"], args["--statement-key-name"]) == (
        "gpusharing-statement-key",
        "gpusharing.io/kubernetes/statements",  # the statements' origin, TIMEKEEPER_CLUSTER_NAME's
    )
    assert statement_key_volume(objects) == {
        "name": "statement-key",
        "projected": {
            "sources": [
                {"secret": {"name": "gpusharing-statement-key", "items": [{"key": "key", "path": "key"}]}},
                {
                    "secret": {
                        "name": "gpusharing-statement-key",
                        "items": [{"key": "previous-key", "path": "previous-key"}],
                        "optional": True,
                    }
                },
            ]
        },
    }
    _, container = controller_pod(objects)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "statement-key"]
    assert mount == {"name": "statement-key", "mountPath": "/etc/gpusharing/statement-key", "readOnly": True}
    env = env_of(container)
    assert env["TIMEKEEPER_STATEMENT_KEY_FILE"] == "/etc/gpusharing/statement-key/key"
    assert env["TIMEKEEPER_STATEMENT_PREVIOUS_KEY_FILE"] == "/etc/gpusharing/statement-key/previous-key"
    # The files as the kubelet projects the Secret the certgen makes: the key, and no previous key.
    data = statement_key_secret(NAMESPACE, StatementKey(args["--statement-key-secret"], args["--statement-key-name"]))
    mounted = tmp_path / "statement-key"
    mounted.mkdir()
    (mounted / "key").write_bytes(base64.b64decode(data["data"]["key"]))
    settings = {name: str(mounted / Path(value).name) for name, value in env.items() if "STATEMENT" in name}
    keys = signing_keys(settings)
    assert keys is not None and keys.previous is None
    assert f"{keys.current.verifier.text}\n".encode() == base64.b64decode(data["data"]["verifier"])
    # The web replicas sign nothing: the private key is the controller's alone.
    for timekeeper in containers(objects, "gpusharing-timekeeper"):
        assert not [name for name in env_of(timekeeper) if "STATEMENT" in name]
        assert not [m for m in timekeeper.get("volumeMounts", []) if m["name"] == "statement-key"]


def test_the_statement_keys_name_follows_the_cluster_and_a_name_given_wins() -> None:
    def key_name(values: dict[str, Any]) -> str:
        [job] = [o for o in render(values) if o["kind"] == "Job"]
        return certgen_args(job["spec"]["template"]["spec"]["containers"][0])["--statement-key-name"]

    assert key_name({"chargeback": {"clusterName": "prod-eu"}}) == "gpusharing.io/prod-eu/statements"
    assert key_name({"statements": {"keyName": "finance.example.com/gpu-statements"}}) == (
        "finance.example.com/gpu-statements"
    )


def test_a_statement_key_of_yours_is_mounted_and_none_made_and_statements_off_mount_none() -> None:
    objects = render({"statements": {"existingSecret": "finance-statement-key"}})
    volume = statement_key_volume(objects)
    assert volume is not None
    assert {source["secret"]["name"] for source in volume["projected"]["sources"]} == {"finance-statement-key"}
    [job] = [o for o in objects if o["kind"] == "Job"]
    assert not [a for a in job["spec"]["template"]["spec"]["containers"][0]["args"] if a.startswith("--statement")]
    # Nothing changed for the certgen: its Job is the one it was before statements, and is not run again.
    assert job["metadata"]["name"] == next(
        o["metadata"]["name"] for o in render({"statements": {"enabled": False}}) if o["kind"] == "Job"
    )
    objects = render({"statements": {"enabled": False}})
    _, container = controller_pod(objects)
    assert statement_key_volume(objects) is None and not [n for n in env_of(container) if "STATEMENT" in n]


def test_a_changed_certgen_is_a_new_job_and_an_unchanged_one_the_same() -> None:
    """A Job's pod cannot change: the chart names it by what it runs, so an upgrade that changes it makes a new one."""
    def job_name(values: dict[str, Any]) -> str:
        [job] = [o for o in render(values) if o["kind"] == "Job"]
        return str(job["metadata"]["name"])

    assert job_name({}) == job_name({}) and HASHED.fullmatch(job_name({}))
    assert job_name({"image": {"tag": "0.2.0"}}) != job_name({})
    assert job_name({"certgen": {"days": 90}}) != job_name({})


def test_every_pod_takes_the_conventional_values_its_component_and_the_release_give() -> None:
    values = COMBINATIONS["conventional values"]
    objects = render(values)
    templates = pod_templates(objects)
    assert len(templates) == 6  # webhook, timekeeper, controller, postgres, the certgen's Job and CronJob
    for name, pod in templates:
        metadata, spec = pod["metadata"], pod["spec"]
        assert metadata["annotations"] == {**values["podAnnotations"], **POD_VALUES["podAnnotations"]}, name
        assert metadata["labels"].items() >= {**values["podLabels"], **POD_VALUES["podLabels"]}.items(), name
        assert spec["nodeSelector"] == {**values["nodeSelector"], **POD_VALUES["nodeSelector"]}, name
        assert spec["tolerations"] == values["tolerations"] + POD_VALUES["tolerations"], name
        assert spec["affinity"] == POD_VALUES["affinity"], name  # in place of the default spread
        assert spec["priorityClassName"] == "system-cluster-critical", name
        # Helm merges given maps into the defaults (a key set to null goes): the postgres image's fsGroup stays.
        assert spec["securityContext"].items() >= POD_VALUES["podSecurityContext"].items(), name
        main = spec["containers"][0]
        assert main["securityContext"].items() >= POD_VALUES["securityContext"].items(), name
        assert main["resources"] == POD_VALUES["resources"], name
    (migrate,) = find(objects, "Deployment", "gpusharing-timekeeper")["spec"]["template"]["spec"]["initContainers"]
    assert migrate["securityContext"]["runAsUser"] == 10001


def test_pod_labels_never_change_a_selector() -> None:
    objects = render(
        {"webhook": {"podLabels": {"app.kubernetes.io/name": "mine", "team": "a"}}, "podLabels": {"team": "b"}}
    )
    deployment = find(objects, "Deployment", "gpusharing-webhook")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items() and labels["team"] == "a"


def test_the_defaults_spread_the_webhook_the_timekeeper_and_the_controller_over_nodes() -> None:
    for name in ("gpusharing-webhook", "gpusharing-timekeeper", "gpusharing-controller"):
        deployment = find(render(), "Deployment", name)
        (term,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_name_overrides_rename_every_object_and_every_reference_to_it() -> None:
    objects = render(COMBINATIONS["renamed"])
    # named by the API group, the values, the role
    fixed = {"CustomResourceDefinition", "PriorityClass", "NetworkPolicy"}
    for obj in objects:
        if obj["kind"] not in fixed:
            assert obj["metadata"]["name"].startswith("gpu-governance"), (obj["kind"], obj["metadata"]["name"])
    # the tokens' audience is the contract's
    text = json.dumps(objects).replace('"audience": "gpusharing-timekeeper"', "")
    assert not re.findall(
        r"(?<![\w.-])gpusharing-(?:webhook|timekeeper|controller|postgres|database|certgen|budget-admin|gpu-models"
        r"|dashboard)\b",
        text,
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for _, pod in pod_templates(objects):
        assert ("ServiceAccount", pod["spec"].get("serviceAccountName", "default")) in names | {
            ("ServiceAccount", "default")
        }
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"].startswith("gov-")  # nameOverride: the labels
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in names
        assert all(("ServiceAccount", s["name"]) in names for s in binding["subjects"])
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
        assert [s for s in objects if s["kind"] == "Service" and s["spec"]["selector"] == selector]
    webhook = containers(objects, "gpu-governance-webhook")[0]
    assert env_of(webhook)["GPUSHARING_TIMEKEEPER_URL"] == f"http://gpu-governance-timekeeper.{NAMESPACE}.svc:8080"
    (job,) = [o for o in objects if o["kind"] == "Job"]
    args = certgen_args(job["spec"]["template"]["spec"]["containers"][0])
    assert (args["--service"], args["--secret"], args["--webhook-configuration"], args["--owner"]) == (
        "gpu-governance-webhook", "gpu-governance-webhook-tls", "gpu-governance", "gpu-governance-certgen")
    assert find(objects, "ClusterRole", "gpu-governance-certgen")["rules"][0]["resourceNames"] == ["gpu-governance"]
    rule = find(objects, "PrometheusRule", "gpu-governance")
    expressions = [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert 'absent(up{job="gpu-governance-webhook"} == 1)' in expressions  # the Services' names are the scrape jobs


def test_the_gpu_model_catalogue_is_the_shipped_one_unless_the_values_give_one() -> None:
    [shipped] = [o for o in render() if o["kind"] == "ConfigMap"]
    assert shipped["data"]["gpu-models.yaml"] == SHIPPED_CATALOGUE.read_text()
    objects = render({"gpuModels": CATALOGUE})
    [given] = [o for o in objects if o["kind"] == "ConfigMap"]
    assert yaml.safe_load(given["data"]["gpu-models.yaml"]) == CATALOGUE
    catalogue_from(yaml.safe_load(given["data"]["gpu-models.yaml"]), "the rendered catalogue")  # the services take it
    assert given["metadata"]["name"] != shipped["metadata"]["name"]  # a new name: both Deployments roll
    for name in ("gpusharing-webhook", "gpusharing-timekeeper", "gpusharing-controller"):
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        assert {"name": "gpu-models", "configMap": {"name": given["metadata"]["name"]}} in pod["volumes"]
        container = pod["containers"][0]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "gpu-models"]
        assert env_of(container)["GPUSHARING_GPU_MODELS_FILE"] == f"{mount['mountPath']}/gpu-models.yaml"


PRICES = {"currency": "USD", "prices": [{"model": "NVIDIA L4", "from": "2026-01-01", "listPerGpuHour": "0.80",
                                        "contractedPerGpuHour": "0.55"}]}


def test_a_price_sheet_is_rendered_beside_the_catalogue_for_the_timekeeper_and_its_controller_to_read() -> None:
    [plain] = [o for o in render() if o["kind"] == "ConfigMap"]
    assert "gpu-prices.yaml" not in plain["data"]
    objects = render({"gpuPrices": PRICES})
    [priced] = [o for o in objects if o["kind"] == "ConfigMap"]
    assert priced["metadata"]["name"] != plain["metadata"]["name"]  # a new sheet rolls what mounts it
    for name in ("gpusharing-timekeeper", "gpusharing-controller"):
        container = find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        env = env_of(container)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "gpu-models"]
        assert env["TIMEKEEPER_GPU_PRICES_FILE"] == f"{mount['mountPath']}/gpu-prices.yaml"
    assert "TIMEKEEPER_GPU_PRICES_FILE" not in env_of(
        find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0])
    rendered = yaml.safe_load(priced["data"]["gpu-prices.yaml"])
    assert price_sheet_from(rendered, "the rendered sheet", shipped_catalogue()).to_json() == {
        "currency": "USD", "prices": [{**PRICES["prices"][0], "listPerGpuHour": "0.8"}]}  # as the timekeeper reads it


def test_the_prometheus_utilisation_values_give_the_controller_a_source_it_reads_from_its_mounts() -> None:
    objects = render(COMBINATIONS["GPU utilisation from Prometheus"])
    pod = find(objects, "Deployment", "gpusharing-controller")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = env_of(container)
    source = prometheus_source(env, float(env["TIMEKEEPER_UTILISATION_INTERVAL_SECONDS"]))  # as the controller reads it
    assert (env["TIMEKEEPER_UTILISATION_SOURCE"], source.url) == (
        "prometheus",
        "https://thanos-querier.openshift-monitoring.svc:9091",
    )
    assert (source.query.per_pod_metric, source.query.window_seconds) == ("DCGM_FI_DEV_GPU_UTIL", 120)
    assert source.query.selector == 'namespace="nvidia-gpu-operator"'
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert source.ca_file == f"{mounts['prometheus-ca']}/service-ca.crt"
    assert volumes["prometheus-ca"]["configMap"] == {
        "name": "openshift-service-ca.crt",
        "items": [{"key": "service-ca.crt", "path": "service-ca.crt"}],
    }
    assert source.token_file == f"{mounts['prometheus-token']}/token"
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prometheus-reader"
    own = env_of(
        containers(
            render(
                {
                    "controller": {
                        "prometheusUtilisation": {
                            "enabled": True,
                            "url": "http://prometheus:9090",
                            "serviceAccountToken": True,
                        }
                    }
                }
            ),
            "gpusharing-controller",
        )[0]
    )
    assert own["TIMEKEEPER_PROMETHEUS_TOKEN_FILE"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    # the meters' by default
    assert "TIMEKEEPER_UTILISATION_SOURCE" not in env_of(containers(render(), "gpusharing-controller")[0])
    with pytest.raises(
        helm.HelmError, match="controller.prometheusUtilisation.enabled needs controller.prometheusUtilisation.url"
    ):
        render({"controller": {"prometheusUtilisation": {"enabled": True}}})


@pytest.mark.parametrize("component", ["webhook", "timekeeper", "controller"])
def test_the_setting_the_catalogue_replaces_is_refused_with_what_to_give_instead(component: str) -> None:
    with pytest.raises(
        helm.HelmError,
        match=f"{component}.env sets GPUSHARING_DEVICE_MEMORY_MIB, which the GPU-model catalogue replaces: give "
            f"gpuModels",
    ):
        render({component: {"env": [{"name": "GPUSHARING_DEVICE_MEMORY_MIB", "value": "40960"}]}})


@pytest.mark.parametrize("fair_share", [False, True])
def test_the_fair_share_gate_policy_names_the_controller_s_service_account_of_the_release_namespace(
    fair_share: bool,
) -> None:
    """Rendered whatever fairShare.enabled says (a pod gated while it was on stays the controller's to release), for
    the ServiceAccount the controller's pods run as, in the namespace the release is installed in."""
    objects = render({**COMBINATIONS["renamed"], "fairShare": {"enabled": fair_share}}, namespace="gpu-governance")
    policy = find(objects, "ValidatingAdmissionPolicy", "gpu-governance-fair-share-gate")["spec"]
    (validation,) = policy["validations"]
    account = find(objects, "Deployment", "gpu-governance-controller")["spec"]["template"]["spec"]["serviceAccountName"]
    assert find(objects, "ServiceAccount", account)["metadata"]["namespace"] == "gpu-governance"
    assert validation["expression"] == (f"request.userInfo.username == 'system:serviceaccount:gpu-governance:{account}'"
                                        " || 'system:masters' in request.userInfo.groups")
    assert f"(system:serviceaccount:gpu-governance:{account})" in validation["message"]
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "gpu-governance-fair-share-gate")["spec"]
    assert (binding["policyName"], binding["validationActions"]) == ("gpu-governance-fair-share-gate", ["Deny"])


def test_the_crds_are_kept_on_uninstall() -> None:
    definitions = [o for o in render() if o["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in definitions} == {
        "gpubudgets.gpusharing.io",
        "clustergpubudgets.gpusharing.io",
    }
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in definitions)


@pytest.mark.parametrize("combination", [
    "defaults", "cert-manager", "cert-manager and a statement key of yours", "everything changed", "renamed",
])
def test_the_notes_name_only_what_the_release_has(combination: str) -> None:
    values = COMBINATIONS[combination]
    text, objects = notes(values), render(values)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for deployment in re.findall(r"deploy/([a-z0-9-]+)", text):
        assert ("Deployment", deployment) in names
    for account in re.findall(rf"ServiceAccount {NAMESPACE}/([a-z0-9-]+)", text):
        assert ("ServiceAccount", account) in names
    for role in re.findall(r"ClusterRole ([a-z0-9-]+)", text):
        assert ("ClusterRole", role) in names
    for label in re.findall(r"-l app.kubernetes.io/name=([a-z0-9-]+)", text):
        assert [t for _, t in pod_templates(objects) if t["metadata"]["labels"]["app.kubernetes.io/name"] == label]
    assert ("budget-admin" in text) == values.get("budgetAdmin", {}).get(
        "create", True
    ) or combination == "everything changed"


def test_service_monitors_scrape_the_services_ports_and_the_webhook_over_its_tls() -> None:
    objects = render(COMBINATIONS["service monitors"])
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {
        "gpusharing-webhook",
        "gpusharing-timekeeper",
        "gpusharing-controller",
    }
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        service = find(objects, "Service", monitor["metadata"]["name"])
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    webhook = find(objects, "ServiceMonitor", "gpusharing-webhook")["spec"]["endpoints"][0]
    assert webhook["scheme"] == "https"
    assert webhook["tlsConfig"]["ca"]["secret"] == {"name": "gpusharing-webhook-tls", "key": "ca.crt"}
    assert webhook["tlsConfig"]["serverName"] == service_names(NAMESPACE)[0]  # what the certgen certifies first
    assert not [o for o in render() if o["kind"] == "ServiceMonitor"]


def test_changed_values_reach_every_place_that_must_agree() -> None:
    values = COMBINATIONS["everything changed"]
    objects = render(values)
    webhook, = containers(objects, "gpusharing-webhook")
    env = env_of(webhook)
    assert env["GPUSHARING_METER_IMAGE"] == "registry.example.com/gpusharing-meter:0.2.0"
    assert env["GPUSHARING_SIDECAR_MODE"] == "container"
    assert env["GPUSHARING_ALIYUN_MEM_UNIT"] == "MiB"
    assert (env["GPUSHARING_PRIORITY_CLASS_IN_BUDGET"], env["GPUSHARING_PRIORITY_CLASS_OVER_BUDGET"]) == (
        "gpu-in-budget",
        "gpu-over-budget",
    )
    assert {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "PriorityClass"} == {
        "gpu-in-budget": 500,
        "gpu-over-budget": -500,
    }
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = find(objects, kind, "gpusharing")["webhooks"]
        assert hook["failurePolicy"] == "Ignore"
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
            *env["GPUSHARING_EXEMPT_NAMESPACES"].split(","),
            NAMESPACE,
        ]
    timekeeper = containers(objects, "gpusharing-timekeeper")
    tk_env = env_of(timekeeper[1])
    (controller,) = containers(objects, "gpusharing-controller")
    ct_env = env_of(controller)
    assert (
        env["GPUSHARING_METER_INTERVAL_SECONDS"]
        == tk_env["GPUSHARING_METER_INTERVAL_SECONDS"]
        == ct_env["GPUSHARING_METER_INTERVAL_SECONDS"]
        == "10"
    )
    # the same budgets
    assert (ct_env["TIMEKEEPER_DEFAULT_GPU_MINUTES"], ct_env["TIMEKEEPER_DEFAULT_PERIOD"]) == ("0", "weekly")
    assert (
        ct_env["TIMEKEEPER_DEMOTION_INTERVAL_SECONDS"] == "5" and "TIMEKEEPER_DEMOTION_INTERVAL_SECONDS" not in tk_env
    )
    assert find(objects, "Deployment", "gpusharing-controller")["spec"]["replicas"] == 3
    assert (
        tk_env["TIMEKEEPER_AUTH"],
        tk_env["TIMEKEEPER_DEFAULT_GPU_MINUTES"],
        tk_env["TIMEKEEPER_DEFAULT_PERIOD"],
    ) == ("none", "0", "weekly")
    assert tk_env["TIMEKEEPER_STATIC_TOKENS_FILE"] == "/etc/gpusharing/static-tokens/tokens"
    assert tk_env["TIMEKEEPER_METRICS_AUTH"] == "token"
    scrape = find(objects, "ServiceMonitor", "gpusharing-timekeeper")["spec"]["endpoints"][0]
    assert scrape["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "prometheus-timekeeper-token", "key": "token"},
    }
    for container in [webhook, *timekeeper, controller]:
        assert (
            container["image"] == "registry.example.com/gpusharing:0.2.0" and container["imagePullPolicy"] == "Always"
        )
    for name, pod in pod_templates(objects):
        spec = pod["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["tolerations"] == values["tolerations"], name
        assert spec["nodeSelector"] == values["nodeSelector"], name
    postgres = find(objects, "StatefulSet", "gpusharing-postgres")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert (postgres["storageClassName"], postgres["resources"]["requests"]["storage"]) == ("fast", "50Gi")
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert find(objects, "Deployment", "gpusharing-webhook")["spec"]["replicas"] == 2
    certgen = find(objects, "CronJob", "gpusharing-certgen")
    assert certgen["spec"]["schedule"] == "0 4 * * 1"
    (job_container,) = certgen["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert job_container["args"][job_container["args"].index("--days") + 1] == "730"
    assert (
        job_container["image"] == "registry.example.com/gpusharing:0.2.0"
        and job_container["imagePullPolicy"] == "Always"
    )
    # budgetAdmin.create false: the ClusterRole to bind people to, and no ServiceAccount of it.
    assert find(objects, "ClusterRole", "gpusharing-budget-admin")
    assert not [
        o
        for o in objects
        if o["kind"] in ("ServiceAccount", "ClusterRoleBinding") and o["metadata"]["name"] == "gpusharing-budget-admin"
    ]


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod template) of every workload: Deployments, the StatefulSet, the certgen's Job and CronJob."""
    templates = []
    for obj in objects:
        spec = obj.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if obj["kind"] in ("Deployment", "StatefulSet", "Job", "CronJob"):
            templates.append((f"{obj['kind']}/{obj['metadata']['name']}", template))
    return templates


def test_the_grace_periods_outlast_the_pre_stop_sleep_and_gunicorns_graceful_timeout() -> None:
    from gpusharing.serving.server import GRACEFUL_TIMEOUT_SECONDS

    for name in ("gpusharing-webhook", "gpusharing-timekeeper"):
        spec = find(render(), "Deployment", name)["spec"]["template"]["spec"]
        sleep = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert spec["terminationGracePeriodSeconds"] > sleep + GRACEFUL_TIMEOUT_SECONDS


def test_the_alerts_and_the_dashboard_are_those_of_the_monitoring_component(tmp_path: Path) -> None:
    objects = render(COMBINATIONS["monitoring"])
    component = kustomize_monitoring(tmp_path)
    rule, expected_rule = (find(o, "PrometheusRule", "gpusharing") for o in (objects, component))
    assert rule["spec"] == expected_rule["spec"] and rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboard, expected_dashboard = (find(o, "ConfigMap", "gpusharing-dashboard") for o in (objects, component))
    assert json.loads(dashboard["data"]["gpusharing-budgets.json"]) == json.loads(
        expected_dashboard["data"]["gpusharing-budgets.json"]
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not [o for o in render() if o["kind"] == "PrometheusRule" or o["metadata"]["name"] == "gpusharing-dashboard"]


def kustomize_monitoring(directory: Path) -> list[dict[str, Any]]:
    """The optional monitoring component of manifests/, as an overlay would include it."""
    return overlay(directory, {"components": [os.path.relpath(MANIFESTS / "monitoring", directory)]})


ONE_VALUE = (
    "resources",
    "migrationResources",
    "labels",
    "issuerRef",
    "inBudget",
    "overBudget",
    "podAnnotations",
    "podLabels",
    "nodeSelector",
    "affinity",
    "podSecurityContext",
    "securityContext",
    "gpuModels",
)


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every setting of values.yaml; a map that is itself one value (resources, labels, ...) counts as one."""
    paths = []
    for name, value in values.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value and name not in ONE_VALUE:
            paths += value_paths(value, f"{path}.")
        else:
            paths.append(path)
    return paths


def test_the_documented_values_table_names_every_setting() -> None:
    operations = (CHART.parents[1] / "docs" / "operations.md").read_text()
    section = re.split(r"\n##+ ", operations.split("\n### Values\n", 1)[1], maxsplit=1)[0]
    # A row may name the same key of several components: `webhook.affinity`, `timekeeper.affinity`, ...
    first_cells = re.findall(r"^\| (`[^|]*`) \|", section, re.MULTILINE)
    documented = {path for cell in first_cells for path in re.findall(r"`([a-zA-Z.]+)`", cell)}
    assert documented == set(value_paths(yaml.safe_load((CHART / "values.yaml").read_text())))


def secret_file(objects: list[dict[str, Any]], name: str, key: str) -> bytes:
    return base64.b64decode(find(objects, "Secret", name)["data"][key])


def test_with_client_certificates_the_webhook_answers_the_api_server_alone_and_the_control_plane_gets_its_files() -> (
    None
):
    objects = render(COMBINATIONS["the API server's client certificate"])
    webhook = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]
    (container,) = webhook["containers"]
    assert env_of(container)["GPUSHARING_CLIENT_CA_FILE"] == "/etc/gpusharing/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/etc/gpusharing/client-ca", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "client-ca", "secret": {"secretName": "gpusharing-webhook-client-ca"}} in webhook["volumes"]
    # What the control plane's nodes need: the AdmissionConfiguration, and the kubeconfig it names for the webhook's
    # Service, whose client certificate the webhook's CA signed.
    admission = yaml.safe_load(secret_file(objects, "gpusharing-apiserver-admission", "admission-configuration.yaml"))
    assert [p["name"] for p in admission["plugins"]] == ["ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"]
    assert {p["configuration"]["kubeConfigFile"] for p in admission["plugins"]} == {
        "/etc/kubernetes/gpusharing/webhook-kubeconfig.yaml"
    }
    kubeconfig = yaml.safe_load(secret_file(objects, "gpusharing-apiserver-admission", "webhook-kubeconfig.yaml"))
    (user,) = kubeconfig["users"]
    assert user["name"] == f"gpusharing-webhook.{NAMESPACE}.svc"  # the name the API server looks its credentials up by
    client = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
    ca = x509.load_pem_x509_certificate(secret_file(objects, "gpusharing-webhook-client-ca", "ca.crt"))
    client.verify_directly_issued_by(ca)
    policy = find(objects, "NetworkPolicy", "webhook-from-api-server")["spec"]["ingress"]
    assert policy == [
        {
            "ports": [{"protocol": "TCP", "port": 8443}],
            "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
        }
    ]


def test_with_tokens_the_webhook_reviews_them_for_the_api_servers_service_account() -> None:
    objects = render(COMBINATIONS["the API server's token"])
    env = env_of(find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0])
    assert env["GPUSHARING_CLIENT_TOKEN_USERS"] == f"system:serviceaccount:{NAMESPACE}:gpusharing-apiserver"
    assert env["GPUSHARING_ALLOWED_PRIORITY_CLASSES"] == "research-high"
    assert find(objects, "ServiceAccount", "gpusharing-apiserver")["automountServiceAccountToken"] is False
    rules = find(objects, "ClusterRole", "gpusharing-webhook")["rules"]
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in rules
    assert "GPUSHARING_CLIENT_TOKEN_USERS" not in env_of(
        find(render(), "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0]
    )


def node_agent(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The node agent's DaemonSet and its pod's spec."""
    daemonset = find(objects, "DaemonSet", "gpusharing-node-agent")
    return daemonset, daemonset["spec"]["template"]["spec"]


def test_the_node_agent_is_installed_only_when_enabled() -> None:
    assert not [o for o in render() if "node-agent" in o["metadata"]["name"]]


def test_the_node_agent_runs_on_gpu_nodes_in_a_namespace_of_its_own_with_what_it_reads_read_only() -> None:
    values = COMBINATIONS["node agent"]
    objects = render(values)
    daemonset, pod = node_agent(objects)
    namespace = find(objects, "Namespace", "gpusharing-node-agent")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"  # its hostPath volumes
    assert daemonset["metadata"]["namespace"] == "gpusharing-node-agent"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}  # GPU nodes, not the release's pool
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "system-node-critical"
    assert pod["hostPID"] is False and "hostNetwork" not in pod and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["args"] == ["node-agent"]
    assert not any("nvidia.com" in name for part in container["resources"].values() for name in part)  # asks for no GPU
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and "privileged" not in security
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["GPUSHARING_NODE_AGENT_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["GPUSHARING_NODE_AGENT_TIMEKEEPER_URL"] == f"http://gpusharing-timekeeper.{NAMESPACE}.svc:8080"
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    assert env["GPUSHARING_NODE_AGENT_RESOURCES"] == "nvidia.com/gpu,example.com/vgpu-*"
    # What it mounts is where its settings' defaults look, read-only; the host's paths are the kubelet's and /proc.
    config = NodeAgentConfig.from_env(
        {k: v for k, v in env.items() if isinstance(v, str)} | {"GPUSHARING_NODE_AGENT_NODE_NAME": "n"}
    )
    assert config.interval_seconds == 15
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all(m["readOnly"] for m in mounts.values())
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {host_paths[name]: mounts[name]["mountPath"] for name in host_paths} == {
        "/var/lib/kubelet/pod-resources": str(config.podresources_socket.parent),
        "/proc": str(config.proc_root),
        "/var/log/pods": str(config.pod_logs),
    }
    (token,) = [v["projected"]["sources"][0]["serviceAccountToken"] for v in pod["volumes"] if "projected" in v]
    assert token == {"audience": "gpusharing-timekeeper", "expirationSeconds": 3600, "path": config.token_path.name}
    assert mounts["timekeeper-token"]["mountPath"] == str(config.token_path.parent)
    # Its own ServiceAccount, bound to nothing: it asks the API server for nothing.
    account = find(objects, "ServiceAccount", "gpusharing-node-agent")
    assert (
        pod["serviceAccountName"] == account["metadata"]["name"]
        and account["metadata"]["namespace"] == "gpusharing-node-agent"
    )
    bound = [s for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in o["subjects"]]
    assert not [s for s in bound if s["name"] == "gpusharing-node-agent"]


def test_the_node_agent_may_go_into_a_namespace_made_beforehand() -> None:
    objects = render(COMBINATIONS["node agent in a namespace of yours"])
    daemonset, _ = node_agent(objects)
    assert daemonset["metadata"]["namespace"] == "gpu-agents"
    assert not [o for o in objects if o["kind"] == "Namespace"]


def test_the_node_agent_component_of_the_manifests_is_what_the_chart_renders(tmp_path: Path) -> None:
    component = overlay(
        tmp_path / "with-node-agent",
        {"components": [os.path.relpath(MANIFESTS / "node-agent", tmp_path / "with-node-agent")]},
    )
    chart = [o for o in render({"nodeAgent": {"enabled": True}}) if "node-agent" in o["metadata"]["name"]]
    assert normalized(chart) == normalized(component)
