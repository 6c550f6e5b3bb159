"""The Helm chart, rendered by the real helm binary: lint, schema, manifests valid for Kubernetes, what they promise.

Each value set is a scenario platform teams run (cluster-wide, namespaced, with and without the node reader,
monitoring on). Every rendered built-in manifest goes through kubernetes-validate in strict mode (unknown fields are
errors) against the oldest Kubernetes the chart supports and the newest the validator knows; the PrometheusRule goes
through promtool, which is what Prometheus itself would run.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.helm import CHART_DIR, by_kind, render, run_helm, template, values_file
from tests.support.paths import CLASS_CRD_FILE, CRD_FILE

MONITORING_ON: dict[str, Any] = {
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "prometheusRule": {"enabled": True, "forMinutes": 5}},
    "dashboards": {"enabled": True, "namespace": "grafana"},
}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cluster-monitoring": {**MONITORING_ON, "operator": {"prometheusUrl": "http://prometheus-operated.mon:9090"}},
    "namespaced": {"watch": {"mode": "namespaced", "namespaces": ["team-a", "team-b"]}},
    "namespaced-no-node-reader": {"watch": {"mode": "namespaced", "namespaces": ["team-a"]},
                                  "rbac": {"nodeReader": False}},
    "namespaced-monitoring-tuned": {
        **MONITORING_ON,
        "watch": {"mode": "namespaced", "namespaces": ["llm"]},
        "operator": {"prometheusUrl": "https://prom.example:9090", "health": False, "verbose": True, "port": 9100,
                     "maxConcurrentReconciles": 8,
                     "env": [{"name": "TZ", "value": "UTC"}],
                     "imageRepository": "registry.example:5000/mirror/vllm-operator",
                     "workloadImagePullSecrets": ["mirror-pull", "mirror-pull-2"]},
        "image": {"repository": "registry.example/vllm-operator", "tag": "1.2.3", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"name": "llm-operator", "annotations": {"example.com/role": "x"}},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "podLabels": {"team": "platform"},
        "fullnameOverride": "llm-op",
    },
    "weights-cache-tuned": {"weightsCache": {"hostPath": "/mnt/nvme/models", "maxSize": "2Ti"}},
    "weights-cache-off": {"weightsCache": {"hostPath": ""}},
    "no-rbac-no-sa": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "existing"},
                      "metrics": {"service": {"enabled": False}}},
}
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
BUILTIN_GROUPS = ("v1", "apps/v1", "rbac.authorization.k8s.io/v1", "policy/v1", "networking.k8s.io/v1")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return {name: render(tmp_path_factory.mktemp(name), values) for name, values in VALUE_SETS.items()}


def operator_container(docs: list[dict[str, Any]]) -> Mapping[str, Any]:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_helm_lint_passes(tmp_path: Path, name: str) -> None:
    proc = run_helm(["lint", "--strict", str(CHART_DIR), "-f", str(values_file(tmp_path, VALUE_SETS[name]))])
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS, ids=[f"k8s-{v}" for v in KUBE_VERSIONS])
@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_every_builtin_manifest_validates_strictly(rendered: dict[str, list[dict[str, Any]]], name: str,
                                                   version: str) -> None:
    docs = rendered[name]
    builtin = [d for d in docs if d["apiVersion"] in BUILTIN_GROUPS]
    assert builtin, "nothing rendered"
    for doc in builtin:
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError naming the field
    others = {d["kind"] for d in docs if d["apiVersion"] not in BUILTIN_GROUPS}
    assert others <= {"ServiceMonitor", "PrometheusRule", "ValidatingWebhookConfiguration", "VLLMWorkloadClass"}, others
    # matchConditions are GA since Kubernetes 1.30: the webhook configuration validates against the newest schema.
    for doc in by_kind(docs, "ValidatingWebhookConfiguration"):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_crd_ships_through_helm_crds_dir_unchanged(tmp_path: Path) -> None:
    shown = run_helm(["show", "crds", str(CHART_DIR)]).stdout
    assert [d for d in yaml.safe_load_all(shown) if d] == [yaml.safe_load(CRD_FILE.read_text()),
                                                          yaml.safe_load(CLASS_CRD_FILE.read_text())]
    docs = render(tmp_path, {}, include_crds=True)
    crds = by_kind(docs, "CustomResourceDefinition")
    assert len(crds) == 2
    for crd in crds:
        kubernetes_validate.validate(crd, kubernetes_validate.latest_version(), strict=True)
    assert not by_kind(render(tmp_path, {}), "CustomResourceDefinition"), "the CRD must come only from crds/"


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_operator_deployment_is_one_recreated_nonroot_readonly_replica(rendered: dict[str, list[dict[str, Any]]],
                                                                        name: str) -> None:
    docs = rendered[name]
    (deployment,) = by_kind(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = operator_container(docs)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]
    port, *webhook = container["ports"]
    assert [p["name"] for p in webhook] == ["webhook"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert pod["serviceAccountName"] == VALUE_SETS[name].get("serviceAccount", {}).get("name") or pod[
        "serviceAccountName"].endswith("vllm-operator")


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_operator_args_are_accepted_by_the_real_cli(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    from vllm_operator.handlers.run import parse_args  # the operator's own parser, not a copy of its options

    values = VALUE_SETS[name]
    container = operator_container(rendered[name])
    args = container["args"]
    assert args[:2] == ["run", "--standalone"]
    config = parse_args(args[1:])
    assert config.namespaces == tuple(values.get("watch", {}).get("namespaces", []))
    assert config.prometheus_url == (values.get("operator", {}).get("prometheusUrl") or None)
    assert config.health_enabled == values.get("operator", {}).get("health", True)
    assert config.http_port == container["ports"][0]["containerPort"] == values.get("operator", {}).get("port", 8080)
    assert config.images.repository == (values.get("operator", {}).get("imageRepository") or "ghcr.io/vllm-operator")
    assert config.images.pull_secrets == tuple(values.get("operator", {}).get("workloadImagePullSecrets", []))
    assert config.max_concurrent_reconciles == values.get("operator", {}).get("maxConcurrentReconciles", 4)
    cache = {"hostPath": "/var/lib/vllm-operator/models", "maxSize": "500Gi", **values.get("weightsCache", {})}
    assert config.node_cache.host_path == (cache["hostPath"] or None)
    assert config.node_cache.max_bytes == {"500Gi": 500 << 30, "2Ti": 2 << 40}[cache["maxSize"]]
    assert config.webhook is not None and config.webhook.port == container["ports"][1]["containerPort"] == 9443
    assert config.webhook.service == f"{values.get('fullnameOverride', 'vo-vllm-operator')}-webhook"


def test_image_repository_reaches_every_default_image(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The chart value becomes the operator flag, and the operator's plan and render then pull every default image
    from the mirror — what `vllm-operator render --image-repository` shows."""
    from tests.support.paths import EXAMPLES
    from vllm_operator.handlers.run import parse_args
    from vllm_operator.rendering.cli import load_documents, render_documents

    config = parse_args(operator_container(rendered["namespaced-monitoring-tuned"])["args"][1:])
    for example in ("chat", "cpu-dev"):
        objects, _ = render_documents(load_documents(str(EXAMPLES / f"{example}.yaml")),
                                      images=config.images)
        images = {c["image"] for o in objects if o["kind"] == "Deployment"
                  for c in o["spec"]["template"]["spec"]["containers"]}
        assert len(images) == 2 and all(i.startswith("registry.example:5000/mirror/vllm-operator/") for i in images)
        assert {json.dumps(o["spec"]["template"]["spec"]["imagePullSecrets"]) for o in objects
                if o["kind"] == "Deployment"} == {json.dumps([{"name": "mirror-pull"}, {"name": "mirror-pull-2"}])}


def test_image_defaults_to_app_version(rendered: dict[str, list[dict[str, Any]]]) -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert operator_container(rendered["defaults"])["image"] == f"ghcr.io/vllm-operator/operator:{chart['appVersion']}"
    tuned = operator_container(rendered["namespaced-monitoring-tuned"])
    assert tuned["image"] == "registry.example/vllm-operator:1.2.3"


def rules_of(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(doc.get("rules") or [])


def is_webhook_rbac(doc: Mapping[str, Any]) -> bool:
    return doc["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding") and \
        doc["metadata"]["name"].endswith("-webhook")


def without_webhook(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The controller's RBAC (the webhook's own objects are checked by test_webhook_rbac_is_one_secret_...)."""
    return [d for d in docs if not is_webhook_rbac(d)]


@pytest.mark.parametrize("name", ["defaults", "namespaced"])
def test_webhook_rbac_is_one_secret_and_one_configuration_by_name(rendered: dict[str, list[dict[str, Any]]],
                                                                  name: str) -> None:
    docs = rendered[name]
    (config,) = by_kind(docs, "ValidatingWebhookConfiguration")
    (role,) = [d for d in by_kind(docs, "Role") if is_webhook_rbac(d)]
    (cluster_role,) = [d for d in by_kind(docs, "ClusterRole") if is_webhook_rbac(d)]
    assert role["metadata"]["namespace"] == "vllm-system"
    assert rules_of(role) == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["vo-vllm-operator-webhook-ca"],
         "verbs": ["get", "patch"]}]
    assert rules_of(cluster_role) == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
         "resourceNames": [config["metadata"]["name"]], "verbs": ["get", "patch"]}]
    (webhook,) = config["webhooks"]
    assert webhook["failurePolicy"] == "Ignore" and webhook["timeoutSeconds"] <= 10
    assert "caBundle" not in webhook["clientConfig"], "the operator owns the caBundle; helm must not reset it"
    assert webhook["clientConfig"]["service"]["path"] == "/validate-plan"
    assert {c["name"] for c in webhook["matchConditions"]} == {"not-being-deleted", "spec-changed"}
    args = operator_container(docs)["args"]
    assert f"--webhook-configuration={config['metadata']['name']}" in args
    assert "--webhook-ca-secret=vo-vllm-operator-webhook-ca" in args


def test_cert_manager_mode_mounts_the_certificate_and_holds_no_webhook_rbac(tmp_path: Path) -> None:
    docs = render(tmp_path, {"webhook": {"certManager": {"enabled": True}, "failurePolicy": "Fail"}})
    assert not [d for d in docs if is_webhook_rbac(d)]
    (config,) = by_kind(docs, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "vllm-system/vo-vllm-operator-webhook"
    assert config["webhooks"][0]["failurePolicy"] == "Fail"
    certificates = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert certificates["vo-vllm-operator-webhook"]["spec"]["dnsNames"][0] == "vo-vllm-operator-webhook.vllm-system.svc"
    assert "--webhook-cert-dir=/etc/vllm-operator/webhook-tls" in operator_container(docs)["args"]


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_rbac_has_no_wildcards_and_no_secrets(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    for doc in rendered[name]:
        for rule in rules_of(doc):
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{doc['kind']} {doc['metadata']['name']}: wildcard in {key}"
            if not is_webhook_rbac(doc):
                assert "secrets" not in rule["resources"]
            assert not {"bind", "escalate", "impersonate"} & set(rule["verbs"])


def test_cluster_mode_is_one_clusterrole_bound_to_the_service_account(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = without_webhook(rendered["defaults"])
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    (role,) = by_kind(docs, "ClusterRole")
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    (sa,) = by_kind(docs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "vllm-system"}]
    resources = {r for rule in rules_of(role) for r in rule["resources"]}
    assert {"nodes", "customresourcedefinitions", "vllmdeployments", "endpointslices"} <= resources


@pytest.mark.parametrize("name", ["namespaced", "namespaced-no-node-reader"])
def test_namespaced_mode_is_a_role_per_namespace(rendered: dict[str, list[dict[str, Any]]], name: str) -> None:
    docs = without_webhook(rendered[name])
    namespaces = VALUE_SETS[name]["watch"]["namespaces"]
    roles, bindings = by_kind(docs, "Role"), by_kind(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == "vllm-system"
    cluster_roles = {r["metadata"]["name"].removeprefix("vo-vllm-operator-"): r for r in by_kind(docs, "ClusterRole")}
    assert rules_of(cluster_roles.pop("discovery")) == [
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}], "kopf's observers, read-only"
    if VALUE_SETS[name].get("rbac", {}).get("nodeReader", True):
        assert rules_of(cluster_roles.pop("node-reader")) == [{"apiGroups": [""], "resources": ["nodes"],
                                                               "verbs": ["list"]}]
    assert rules_of(cluster_roles.pop("class-reader")) == [{"apiGroups": ["vllm-operator.dev"],
                                                            "resources": ["vllmworkloadclasses"],
                                                            "verbs": ["list", "watch"]}]
    assert not cluster_roles, "no other cluster-wide access"
    assert len(by_kind(docs, "ClusterRoleBinding")) == len(by_kind(docs, "ClusterRole"))
    (role,) = by_kind(docs, "Role")[:1]
    cluster_rules = [r for r in rules_of(by_kind(without_webhook(rendered["defaults"]), "ClusterRole")[0])
                     if not {"nodes", "customresourcedefinitions", "vllmworkloadclasses"} & set(r["resources"])]
    assert rules_of(role) == cluster_rules, "a namespaced Role grants exactly the cluster mode's namespaced rules"


def test_without_the_class_reader_the_operator_is_told_so(tmp_path: Path) -> None:
    values = {"watch": {"mode": "namespaced", "namespaces": ["team-a"]}, "rbac": {"workloadClassReader": False},
              "workloadClasses": {"builtins": False}}
    docs = render(tmp_path, values)
    assert not [r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("-class-reader")]
    assert not by_kind(docs, "VLLMWorkloadClass")
    (deployment,) = by_kind(docs, "Deployment")
    assert "--no-workload-classes" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    builtins = by_kind(render(tmp_path, {}), "VLLMWorkloadClass")
    assert sorted(d["metadata"]["name"] for d in builtins) == ["chat", "long-doc", "multi-turn", "rag"]


def test_no_rbac_and_existing_service_account(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["no-rbac-no-sa"]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "ValidatingWebhookConfiguration",
                                         "VLLMWorkloadClass"}
    assert by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_service_monitor_selects_the_metrics_service(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["cluster-monitoring"]
    (monitor,) = by_kind(docs, "ServiceMonitor")
    (service,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    labels = service["metadata"]["labels"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    (deployment,) = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())


@pytest.mark.parametrize("name", ["cluster-monitoring", "namespaced-monitoring-tuned"])
def test_prometheus_rule_passes_promtool(rendered: dict[str, list[dict[str, Any]]], tmp_path: Path,
                                         name: str) -> None:
    (rule,) = by_kind(rendered[name], "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 4 rules found" in proc.stdout
    (service,) = [s for s in by_kind(rendered[name], "Service") if s["metadata"]["name"].endswith("-metrics")]
    for item in rule["spec"]["groups"][0]["rules"]:
        assert f'job="{service["metadata"]["name"]}"' in item["expr"], item["alert"]


def test_dashboard_configmap_carries_the_dashboard_file(rendered: dict[str, list[dict[str, Any]]]) -> None:
    (cm,) = by_kind(rendered["cluster-monitoring"], "ConfigMap")
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(cm["data"]["vllm-deployment.json"])
    assert shipped == json.loads((CHART_DIR / "dashboards" / "vllm-deployment.json").read_text())
    assert not by_kind(rendered["defaults"], "ConfigMap"), "the dashboard is opt-in"


TYPOS = {
    "watch.namespace": ({"watch": {"mode": "namespaced", "namespace": ["a"], "namespaces": ["a"]}}, "'namespace'"),
    "operator.prometheusURL": ({"operator": {"prometheusURL": "http://p:9090"}}, "'prometheusURL'"),
    "serviceMonitor.enable": ({"metrics": {"serviceMonitor": {"enable": True}}}, "'enable'"),
    "top-level replicas": ({"replicas": 2}, "'replicas'"),
    "resources.limit": ({"resources": {"limit": {"memory": "1Gi"}}}, "'limit'"),
    "watch.mode value": ({"watch": {"mode": "all", "namespaces": []}}, "/watch/mode"),
    "namespaced without namespaces": ({"watch": {"mode": "namespaced", "namespaces": []}}, "/watch/namespaces"),
    "cluster with namespaces": ({"watch": {"mode": "cluster", "namespaces": ["a"]}}, "/watch/namespaces"),
    "namespace not a DNS label": ({"watch": {"mode": "namespaced", "namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
    "prometheusUrl without scheme": ({"operator": {"prometheusUrl": "prom:9090"}}, "/operator/prometheusUrl"),
    "port as string": ({"operator": {"port": "8080"}}, "/operator/port"),
    "operator.imageRegistry": ({"operator": {"imageRegistry": "mirror.example"}}, "'imageRegistry'"),
    "imageRepository with a tag": ({"operator": {"imageRepository": "mirror.example/vllm-operator:1.0"}},
                                   "/operator/imageRepository"),
    "imageRepository ending in /": ({"operator": {"imageRepository": "mirror.example/"}},
                                    "/operator/imageRepository"),
    "workloadImagePullSecrets as objects": ({"operator": {"workloadImagePullSecrets": [{"name": "x"}]}},
                                            "/operator/workloadImagePullSecrets/0"),
    "maxConcurrentReconciles 0": ({"operator": {"maxConcurrentReconciles": 0}}, "/operator/maxConcurrentReconciles"),
    "weightsCache.hostPath relative": ({"weightsCache": {"hostPath": "models"}}, "/weightsCache/hostPath"),
    "weightsCache.maxSize words": ({"weightsCache": {"maxSize": "lots"}}, "/weightsCache/maxSize"),
    "weightsCache.size": ({"weightsCache": {"size": "1Ti"}}, "'size'"),
}


@pytest.mark.parametrize("values,needle", list(TYPOS.values()), ids=list(TYPOS))
def test_values_schema_rejects_typos_naming_the_field(tmp_path: Path, values: dict[str, Any], needle: str) -> None:
    proc = template(tmp_path, values, check=False)
    assert proc.returncode != 0, f"accepted: {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert needle in proc.stderr, proc.stderr


def test_service_monitor_without_service_is_refused(tmp_path: Path) -> None:
    proc = template(tmp_path, {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
                    check=False)
    assert proc.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in proc.stderr


@pytest.mark.parametrize("name", ["defaults", "namespaced-no-node-reader"])
def test_notes_say_where_auto_stands(tmp_path: Path, name: str) -> None:
    proc = run_helm(["install", "vo", str(CHART_DIR), "--dry-run=client", "--namespace", "vllm-system",
                     "-f", str(values_file(tmp_path, VALUE_SETS[name]))])
    assert "kubectl apply --server-side -f" in proc.stdout
    if name == "namespaced-no-node-reader":
        assert "accelerator.type: auto is refused" in proc.stdout
    else:
        assert "every namespace" in proc.stdout


def test_operator_pod_runs_as_the_images_user_and_group(tmp_path: Path) -> None:
    """A real kubelet runs an image's `USER 65532:65532` with gid 0 unless the pod sets runAsGroup (the process node
    never ran images' users at all): the chart sets both, matching the operator image's USER."""
    pod = by_kind(render(tmp_path, {}), "Deployment")[0]["spec"]["template"]["spec"]
    dockerfile = (Path(__file__).resolve().parents[3] / "images" / "operator.Dockerfile").read_text()
    user = next(line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER "))
    uid, gid = (int(x) for x in user.split(":"))
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert pod["securityContext"]["runAsNonRoot"] is True
