"""The Helm chart: Helm lints it, its schema refuses bad values, it renders for the defaults the same objects as
`kubectl kustomize manifests/` (one source of truth: a change to manifests/ that the chart misses fails here), and
every object it renders for other values validates strictly and says what those values promise."""

from __future__ import annotations

import base64
import configparser
import datetime
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

from tests.helm import CHART, NAMESPACE, render
from tests.kustomize import MANIFESTS, installable_manifests, kustomize
from tests.manifests.test_manifests import KUBERNETES_VERSION, find

HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version")
CUSTOM_RESOURCES = ("cert-manager.io/", "monitoring.coreos.com/")

# Value combinations every rendering of which must validate; each says something a platform team would set.
COMBINATIONS = {
    "defaults": {},
    "without cert-manager": {"tls": {"certManager": False}},
    "cert-manager with a ClusterIssuer": {"tls": {"issuerRef": {"kind": "ClusterIssuer", "name": "company-ca"}}},
    "external database": {"database": {"bundled": False, "external": {"secretName": "gpusharing-database-url"}}},
    "service monitors": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                               "grafanaDashboard": {"enabled": True}}},
    "the API server's client certificate": {"webhook": {"clientAuth": {"mode": "certificate"}},
                                            "networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/24", "fd00::/64"]}},
    "the API server's token": {"webhook": {"clientAuth": {"mode": "token"}}, "priorityClasses": {"allowed": ["research-high"]}},
    "everything changed": {
        "namespace": {"create": True},
        "image": {"repository": "registry.example.com/gpusharing", "tag": "0.2.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "webhook": {"replicas": 2, "failurePolicy": "Ignore", "exemptNamespaces": ["kube-system", "ml-sandbox"],
                    "env": [{"name": "GPUSHARING_DEVICE_MEMORY_MIB", "value": "40960"}]},
        "meter": {"image": "registry.example.com/gpusharing-meter:0.2.0", "mode": "container"},
        "timekeeper": {"auth": "none", "staticTokensSecret": "admin-tokens", "defaultBudget": {"gpuMinutes": 0, "period": "weekly"},
                       "metricsAuth": "token"},
        "database": {"password": "s3cretPassw0rd", "postgres": {"storageClassName": "fast", "storage": "50Gi"}},
        "priorityClasses": {"inBudget": {"name": "gpu-in-budget", "value": 500}, "overBudget": {"name": "gpu-over-budget", "value": -500}},
        "networkPolicy": {"enabled": False},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "tls": {"certManager": False, "selfSignedDays": 730},
        "metrics": {"serviceMonitor": {"enabled": True, "timekeeperTokenSecret": "prometheus-timekeeper-token"}},
    },
}


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return kustomize(installable_manifests(tmp_path_factory.mktemp("install")))


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def normalized(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What may legitimately differ between the chart and kustomize taken out: Helm's labels, kustomize's hash
    suffix on the generated Secret's name, the Secret's data (a password each made) and Helm's keep policy."""
    text = re.sub(r"gpusharing-database-[a-z0-9]{10}\b", "gpusharing-database", json.dumps(objects))
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


def test_the_defaults_render_the_objects_of_the_manifests(manifests: list[dict[str, Any]]) -> None:
    chart = normalized(render())
    expected = normalized([o for o in manifests if o["kind"] != "Namespace"])  # helm install --create-namespace makes it
    assert sorted(chart) == sorted(expected)
    for identity, obj in expected.items():
        assert chart[identity] == obj, identity


def test_with_namespace_create_the_namespace_is_the_manifests_one(manifests: list[dict[str, Any]]) -> None:
    [namespace] = [o for o in render({"namespace": {"create": True}}) if o["kind"] == "Namespace"]
    assert normalized([namespace]) == normalized([find(manifests, "Namespace", NAMESPACE)])


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


@pytest.mark.parametrize(("values", "where"), [
    ({"webhook": {"failurePolicy": "Maybe"}}, "/webhook/failurePolicy"),
    ({"database": {"password": "has spaces;"}}, "/database/password"),
    ({"timekeeper": {"auth": "static"}}, "/timekeeper/auth"),
    ({"meter": {"mode": "sidecar"}}, "/meter/mode"),
    ({"webhook": {"exemptNamespaces": ["Kube_System"]}}, "/webhook/exemptNamespaces/0"),
    ({"tls": {"selfSignedDays": 36500}}, "/tls/selfSignedDays"),
    ({"replicas": 3}, "additional properties 'replicas' not allowed"),
])
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
        assert "k.startsWith('example.com/gpu-')" in condition["expression"] and "hami.io/" not in condition["expression"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def containers(objects: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    spec = find(objects, "Deployment", name)["spec"]["template"]["spec"]
    return list(spec.get("initContainers", []) + spec["containers"])


def test_an_external_database_replaces_postgres() -> None:
    objects = render(COMBINATIONS["external database"])
    assert not [o for o in objects if "postgres" in o["metadata"]["name"] or o["metadata"]["name"] == "gpusharing-database"]
    for container in containers(objects, "gpusharing-timekeeper"):
        env = env_of(container)
        assert env["TIMEKEEPER_DATABASE_URL"] == {"secretKeyRef": {"name": "gpusharing-database-url", "key": "url"}}
        assert "DATABASE_PASSWORD" not in env


def test_the_bundled_databases_password_is_generated_in_letters_and_digits() -> None:
    password = base64.b64decode(find(render(), "Secret", "gpusharing-database")["data"]["password"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}", password)
    given = render({"database": {"password": "s3cret"}})
    assert base64.b64decode(find(given, "Secret", "gpusharing-database")["data"]["password"]) == b"s3cret"


def test_without_cert_manager_the_chart_makes_a_ca_whose_certificate_the_webhook_serves() -> None:
    objects = render(COMBINATIONS["without cert-manager"])
    assert not [o for o in objects if o["apiVersion"].startswith("cert-manager.io/")]
    secret = find(objects, "Secret", "gpusharing-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    served = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    served.verify_directly_issued_by(ca)
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert f"gpusharing-webhook.{NAMESPACE}.svc" in names
    assert served.not_valid_after_utc - served.not_valid_before_utc >= datetime.timedelta(days=365)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = find(objects, kind, "gpusharing")
        assert "annotations" not in configuration["metadata"]
        assert configuration["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def test_a_cluster_issuer_replaces_the_charts_own_issuer() -> None:
    objects = render(COMBINATIONS["cert-manager with a ClusterIssuer"])
    assert not [o for o in objects if o["kind"] == "Issuer"]
    assert find(objects, "Certificate", "gpusharing-webhook")["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "company-ca"}


def test_service_monitors_scrape_the_services_ports_and_the_webhook_over_its_tls() -> None:
    objects = render(COMBINATIONS["service monitors"])
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"gpusharing-webhook", "gpusharing-timekeeper"}
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
    assert webhook["tlsConfig"]["serverName"] in find(objects, "Certificate", "gpusharing-webhook")["spec"]["dnsNames"]
    assert not [o for o in render() if o["kind"] == "ServiceMonitor"]


def test_changed_values_reach_every_place_that_must_agree() -> None:
    values = COMBINATIONS["everything changed"]
    objects = render(values)
    webhook, = containers(objects, "gpusharing-webhook")
    env = env_of(webhook)
    assert env["GPUSHARING_METER_IMAGE"] == "registry.example.com/gpusharing-meter:0.2.0"
    assert env["GPUSHARING_SIDECAR_MODE"] == "container"
    assert env["GPUSHARING_DEVICE_MEMORY_MIB"] == "40960"
    assert (env["GPUSHARING_PRIORITY_CLASS_IN_BUDGET"], env["GPUSHARING_PRIORITY_CLASS_OVER_BUDGET"]) == ("gpu-in-budget", "gpu-over-budget")
    assert {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "PriorityClass"} == {"gpu-in-budget": 500, "gpu-over-budget": -500}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        (hook,) = find(objects, kind, "gpusharing")["webhooks"]
        assert hook["failurePolicy"] == "Ignore"
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [*env["GPUSHARING_EXEMPT_NAMESPACES"].split(","), NAMESPACE]
    timekeeper = containers(objects, "gpusharing-timekeeper")
    tk_env = env_of(timekeeper[1])
    assert (tk_env["TIMEKEEPER_AUTH"], tk_env["TIMEKEEPER_DEFAULT_GPU_MINUTES"], tk_env["TIMEKEEPER_DEFAULT_PERIOD"]) == ("none", "0", "weekly")
    assert tk_env["TIMEKEEPER_STATIC_TOKENS_FILE"] == "/etc/gpusharing/static-tokens/tokens"
    assert tk_env["TIMEKEEPER_METRICS_AUTH"] == "token"
    scrape = find(objects, "ServiceMonitor", "gpusharing-timekeeper")["spec"]["endpoints"][0]
    assert scrape["authorization"] == {"type": "Bearer", "credentials": {"name": "prometheus-timekeeper-token", "key": "token"}}
    for container in [webhook, *timekeeper]:
        assert container["image"] == "registry.example.com/gpusharing:0.2.0" and container["imagePullPolicy"] == "Always"
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        spec = workload["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["tolerations"] == values["tolerations"]
    postgres = find(objects, "StatefulSet", "gpusharing-postgres")["spec"]["volumeClaimTemplates"][0]["spec"]
    assert (postgres["storageClassName"], postgres["resources"]["requests"]["storage"]) == ("fast", "50Gi")
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert find(objects, "Deployment", "gpusharing-webhook")["spec"]["replicas"] == 2


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
    assert json.loads(dashboard["data"]["gpusharing-budgets.json"]) == json.loads(expected_dashboard["data"]["gpusharing-budgets.json"])
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert not [o for o in render() if o["kind"] in ("PrometheusRule", "ConfigMap")]


def kustomize_monitoring(directory: Path) -> list[dict[str, Any]]:
    """The optional monitoring component of manifests/, as an overlay would include it."""
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "components": [os.path.relpath(MANIFESTS / "monitoring", directory)],  # kustomize takes no absolute path
    }))
    return kustomize(directory)


def value_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Every setting of values.yaml; a map that is itself one value (resources, labels, ...) counts as one."""
    paths = []
    for name, value in values.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value and name not in ("resources", "migrationResources", "labels", "issuerRef", "inBudget", "overBudget"):
            paths += value_paths(value, f"{path}.")
        else:
            paths.append(path)
    return paths


def test_the_documented_values_table_names_every_setting() -> None:
    operations = (CHART.parents[1] / "docs" / "operations.md").read_text()
    section = re.split(r"\n##+ ", operations.split("\n### Values\n", 1)[1], maxsplit=1)[0]
    documented = set(re.findall(r"^\| `([a-zA-Z.]+)`", section, re.MULTILINE))
    assert documented == set(value_paths(yaml.safe_load((CHART / "values.yaml").read_text())))


def secret_file(objects: list[dict[str, Any]], name: str, key: str) -> bytes:
    return base64.b64decode(find(objects, "Secret", name)["data"][key])


def test_with_client_certificates_the_webhook_answers_the_api_server_alone_and_the_control_plane_gets_its_files() -> None:
    objects = render(COMBINATIONS["the API server's client certificate"])
    webhook = find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]
    (container,) = webhook["containers"]
    assert env_of(container)["GPUSHARING_CLIENT_CA_FILE"] == "/etc/gpusharing/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/etc/gpusharing/client-ca", "readOnly": True} in container["volumeMounts"]
    assert {"name": "client-ca", "secret": {"secretName": "gpusharing-webhook-client-ca"}} in webhook["volumes"]
    # What the control plane's nodes need: the AdmissionConfiguration, and the kubeconfig it names for the webhook's
    # Service, whose client certificate the webhook's CA signed.
    admission = yaml.safe_load(secret_file(objects, "gpusharing-apiserver-admission", "admission-configuration.yaml"))
    assert [p["name"] for p in admission["plugins"]] == ["ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"]
    assert {p["configuration"]["kubeConfigFile"] for p in admission["plugins"]} == {"/etc/kubernetes/gpusharing/webhook-kubeconfig.yaml"}
    kubeconfig = yaml.safe_load(secret_file(objects, "gpusharing-apiserver-admission", "webhook-kubeconfig.yaml"))
    (user,) = kubeconfig["users"]
    assert user["name"] == f"gpusharing-webhook.{NAMESPACE}.svc"  # the name the API server looks its credentials up by
    client = x509.load_pem_x509_certificate(base64.b64decode(user["user"]["client-certificate-data"]))
    ca = x509.load_pem_x509_certificate(secret_file(objects, "gpusharing-webhook-client-ca", "ca.crt"))
    client.verify_directly_issued_by(ca)
    policy = find(objects, "NetworkPolicy", "webhook-from-api-server")["spec"]["ingress"]
    assert policy == [{"ports": [{"protocol": "TCP", "port": 8443}], "from": [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}]}]


def test_with_tokens_the_webhook_reviews_them_for_the_api_servers_service_account() -> None:
    objects = render(COMBINATIONS["the API server's token"])
    env = env_of(find(objects, "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0])
    assert env["GPUSHARING_CLIENT_TOKEN_USERS"] == f"system:serviceaccount:{NAMESPACE}:gpusharing-apiserver"
    assert env["GPUSHARING_ALLOWED_PRIORITY_CLASSES"] == "research-high"
    assert find(objects, "ServiceAccount", "gpusharing-apiserver")["automountServiceAccountToken"] is False
    rules = find(objects, "ClusterRole", "gpusharing-webhook")["rules"]
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in rules
    assert "GPUSHARING_CLIENT_TOKEN_USERS" not in env_of(find(render(), "Deployment", "gpusharing-webhook")["spec"]["template"]["spec"]["containers"][0])
