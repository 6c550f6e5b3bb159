"""render(plan): the object set, determinism, the label/annotation contract, GPU vs CPU pools, names, the router
config hash, policy and monitoring objects — on hand-built plans (tests/unit/rendering/plans.py)."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.rendering.plans import cpu_case, gpu_case, make_plan, planned, spec_from, with_spec
from vllm_operator import constants, names
from vllm_operator.api import remediation
from vllm_operator.api.plan import Plan
from vllm_operator.api.router_config import Timeouts, TokenizerConfig
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.planning import pods
from vllm_operator.rendering import RenderOptions, alerts, common, engine, render

Case = Callable[[], tuple[Plan, VLLMDeploymentSpec]]
CASES = [pytest.param(gpu_case, id="gpu-l4-hub"), pytest.param(cpu_case, id="cpu-pvc")]
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def by_kind(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def engine_container(obj: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize("case", CASES)
def test_object_set(case: Case) -> None:
    plan, _ = case()
    got = [(o["kind"], o["metadata"]["name"]) for o in render(plan)]
    n = plan.name
    assert got == [
        ("ServiceAccount", f"{n}-router"), ("Role", f"{n}-router"), ("RoleBinding", f"{n}-router"),
        ("ConfigMap", f"{n}-router"), ("NetworkPolicy", f"{n}-engines"),
        ("Service", f"{n}-long"), ("Service", f"{n}-router"), ("Service", f"{n}-short"),
        ("PodDisruptionBudget", f"{n}-long"), ("PodDisruptionBudget", f"{n}-router"),
        ("PodDisruptionBudget", f"{n}-short"),
        ("Deployment", f"{n}-long"), ("Deployment", f"{n}-router"), ("Deployment", f"{n}-short"),
        ("PodMonitor", f"{n}-vllm-operator"), ("PrometheusRule", f"{n}-vllm-operator"),
    ]


@pytest.mark.parametrize("case", CASES)
def test_deterministic_and_key_order_normalised(case: Case) -> None:
    plan, _ = case()
    first, second = render(plan), render(copy.deepcopy(plan))
    assert first == second
    # Same dict order too (json.dumps without sort_keys sees insertion order).
    assert json.dumps(first) == json.dumps(second)

    def keys_sorted(value: Any) -> bool:
        if isinstance(value, dict):
            return list(value) == sorted(value) and all(keys_sorted(v) for v in value.values())
        if isinstance(value, list):
            return all(keys_sorted(v) for v in value)
        return True

    assert all(keys_sorted(o) for o in first)
    assert [common.sort_key(o) for o in first] == sorted(common.sort_key(o) for o in first)


@pytest.mark.parametrize("case", CASES)
def test_label_and_annotation_contract(case: Case) -> None:
    plan, _ = case()
    for obj in render(plan):
        meta = obj["metadata"]
        where = f"{obj['kind']} {meta['name']}"
        assert meta["namespace"] == plan.namespace, where
        assert "ownerReferences" not in meta, where
        labels = meta["labels"]
        assert labels[constants.LABEL_NAME] == constants.APP_NAME, where
        assert labels[constants.LABEL_INSTANCE] == plan.name, where
        assert labels[constants.LABEL_DEPLOYMENT] == plan.name, where
        assert labels[constants.LABEL_MANAGED_BY] == constants.APP_NAME, where
        assert labels[constants.LABEL_COMPONENT] in {constants.COMPONENT_ENGINE, constants.COMPONENT_ROUTER,
                                                     constants.COMPONENT_MONITORING}, where
        # The spec hash is the hash of the object's own content without the hash annotation.
        stripped = copy.deepcopy(obj)
        digest = stripped["metadata"]["annotations"].pop(constants.ANNOTATION_SPEC_HASH)
        if not stripped["metadata"]["annotations"]:
            del stripped["metadata"]["annotations"]
        assert digest == common.content_hash(stripped), where
        if obj["kind"] in {"Deployment", "Service", "PodDisruptionBudget"} and \
                labels[constants.LABEL_COMPONENT] == constants.COMPONENT_ENGINE:
            assert labels[constants.LABEL_POOL] in constants.POOLS, where


def test_spec_hashes_differ_between_objects_and_follow_content() -> None:
    plan, _ = gpu_case()
    objs = render(plan)
    hashes = [o["metadata"]["annotations"][constants.ANNOTATION_SPEC_HASH] for o in objs]
    assert len(set(hashes)) == len(hashes)
    more = plan.model_copy(update={"pools": {**plan.pools, "short": plan.pools["short"].model_copy(
        update={"replicas": 5})}})
    changed = {o["metadata"]["name"] for o in render(more)
               if o["metadata"]["annotations"][constants.ANNOTATION_SPEC_HASH] not in hashes}
    assert changed == {"chat-short"}  # only the short pool's Deployment


@pytest.mark.parametrize("case", CASES)
def test_engine_pod_contract(case: Case) -> None:
    plan, _ = case()
    deployments = by_kind(render(plan), "Deployment")
    for pool in plan.pools.values():
        dep = deployments[names.pool(plan.name, pool.name)]
        pod = dep["spec"]["template"]["spec"]
        c = engine_container(dep)
        assert c["command"] == ["vllm-operator", "engine", "--", "vllm", "serve", pool.model]
        assert c["args"] == pool.engine_args  # the plan's order, untouched
        assert c["env"][0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                                            "fieldPath": "status.podIP"}}}
        rest = [e["name"] for e in c["env"][1:]]
        assert rest == sorted(rest) and len(set(rest)) == len(rest)
        assert all(e["value"] == v for e in c["env"] for k, v in pool.env.items() if e["name"] == k)
        assert pod["enableServiceLinks"] is False
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert c["terminationMessagePath"] == "/dev/termination-log"
        assert c["ports"] == [{"containerPort": constants.ENGINE_PORT, "name": "http", "protocol": "TCP"},
                              {"containerPort": constants.ENGINE_STATUS_PORT, "name": "status", "protocol": "TCP"}]
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "http", "scheme": "HTTP"}
        # The startup probe asks the wrapper, which stops a stalled start itself: its budget is only a backstop and
        # outlasts every phase's limit put together (a slow start that still moves is never killed by the kubelet).
        assert c["startupProbe"]["httpGet"] == {"path": "/startup", "port": "status", "scheme": "HTTP"}
        ready, live = c["readinessProbe"], c["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > ready["periodSeconds"] * ready["failureThreshold"]
        assert live["timeoutSeconds"] >= ready["timeoutSeconds"]
        budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
        assert budget >= sum(constants.STARTUP_PHASE_LIMITS_S.values())
        assert dep["spec"]["progressDeadlineSeconds"] > budget
        assert dep["spec"]["replicas"] == pool.replicas
        labels = dep["spec"]["template"]["metadata"]["labels"]
        low, high = pool.prompt_range
        assert labels[constants.LABEL_CONTEXT_RANGE] == f"{low}-{high}"
        assert labels[constants.LABEL_POOL] == pool.name
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        shm = next(v for v in pod["volumes"] if v["name"] == engine.SHM_VOLUME)
        assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
        assert {"mountPath": "/dev/shm", "name": engine.SHM_VOLUME} in c["volumeMounts"]
        assert any(m["mountPath"] == constants.MODELS_MOUNT for m in c["volumeMounts"])


def test_gpu_pool_specifics() -> None:
    plan, spec = gpu_case()
    objs = render(plan)
    for pool in ("short", "long"):
        dep = by_kind(objs, "Deployment")[f"chat-{pool}"]
        pod = dep["spec"]["template"]["spec"]
        c = engine_container(dep)
        assert c["resources"]["limits"][constants.GPU_RESOURCE] == "1"
        assert constants.GPU_RESOURCE not in c["resources"].get("requests", {})
        assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                           "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        assert "nodeSelector" not in pod
        assert pod["affinity"] == engine.gpu_affinity(plan.pools[pool])
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        product = {"key": constants.GFD_PRODUCT, "operator": "In", "values": ["NVIDIA-L4"]}
        assert terms == [
            {"matchExpressions": [product, {"key": constants.GFD_REPLICAS, "operator": "DoesNotExist"}]},
            {"matchExpressions": [product, {"key": constants.GFD_REPLICAS, "operator": "In", "values": ["1"]}]}]
        assert pods.GPU_TOLERATION.to_wire() in pod["tolerations"]
        # Hub source: the model cache is an emptyDir, the token comes from its Secret, and startup allows a download.
        assert {"emptyDir": {}, "name": engine.MODEL_VOLUME} in pod["volumes"]
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"key": "token", "name": "hf-token"}}} in c["env"]
        hf_home = next(e["value"] for e in c["env"] if e["name"] == "HF_HOME")
        assert hf_home.startswith(constants.MODELS_MOUNT + "/")
        # 6600 s of phase limits + the 8B weights (~15 GiB) at 10 MiB/s, in 2 s periods
        weights = plan.pools[pool].kv.breakdown.weights_bytes
        assert c["startupProbe"]["periodSeconds"] == 2
        assert c["startupProbe"]["failureThreshold"] == math.ceil((6600 + weights / (10 * 2**20)) / 2)
        assert next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "2Gi"
        assert pod["imagePullSecrets"] if spec.engine and spec.engine.image_pull_secrets else \
            "imagePullSecrets" not in pod


def test_cpu_pool_specifics() -> None:
    plan, _ = cpu_case()
    objs = render(plan)
    for pool in ("short", "long"):
        dep = by_kind(objs, "Deployment")[f"cpu-dev-{pool}"]
        pod = dep["spec"]["template"]["spec"]
        c = engine_container(dep)
        assert constants.GPU_RESOURCE not in json.dumps(c["resources"])
        assert c["resources"]["limits"]["memory"] == "4Gi"
        assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        assert "nodeSelector" not in pod and "tolerations" not in pod and "affinity" not in pod
        # PVC source: read-only volume and mount, no Hub token, no download allowance.
        assert {"name": engine.MODEL_VOLUME, "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} \
            in pod["volumes"]
        assert {"mountPath": "/models", "name": engine.MODEL_VOLUME, "readOnly": True} in c["volumeMounts"]
        assert not any(e["name"] == "HF_TOKEN" for e in c["env"])
        # /models is the read-only claim: no HF_HOME into it (the image's own, under its writable HOME, stays).
        assert not any(e["name"] == "HF_HOME" for e in c["env"])
        assert {"name": "HF_HUB_OFFLINE", "value": "1"} in c["env"]
        assert c["startupProbe"]["failureThreshold"] == 3300  # phase limits only (6600 s): no download from a PVC
        assert next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] == "1Gi"


@pytest.mark.parametrize("rung", [{"step_down_level": 1}, {"kv_level": 1}, {"ladder_moved": True}],
                         ids=["step-down", "kv-rung", "back-on-rung-0"])
def test_a_cpu_pool_moved_on_its_ladder_replaces_its_failing_pod_instead_of_surging(rung: dict[str, Any]) -> None:
    """A rung is taken because the pool's pods crash-loop (OOM, KV cache too small): a surge pod beside the failing
    one may find no node, and `maxUnavailable: 0` would keep the failing pod until the rollout deadline. Back on rung
    0 after a move (a reset, a step back up) the pool still replaces first: the rung-0 pod needs more room than the
    rung's pod beside it (on real kubelets the reset's surge pod stayed Pending for good). The other pool, never
    moved, keeps its surge."""
    plan, _ = cpu_case()
    moved = plan.model_copy(update={"pools": {**plan.pools, "short": plan.pools["short"].model_copy(update=rung)}})
    deps = by_kind(render(moved), "Deployment")
    assert deps["cpu-dev-short"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert deps["cpu-dev-long"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_spec_extras_reach_the_engine_pods() -> None:
    spec = spec_from({
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "workloadClass": "chat",
        "accelerator": {"type": "nvidia-l4-24gb"},
        "engine": {"imagePullSecrets": [{"name": "regcred"}], "imagePullPolicy": "IfNotPresent"},
        "pools": {"short": {
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
            "env": [{"name": "EXTRA", "value": "1"}, {"name": "SECRET_ONE", "secretKeyRef": {"name": "s", "key": "k"}}],
            "resources": {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "48Gi"}},
            "nodeSelector": {"topology.kubernetes.io/zone": "a"}}},
    })
    plan = planned(spec)
    dep = by_kind(render(plan), "Deployment")["chat-short"]
    pod, c = dep["spec"]["template"]["spec"], engine_container(dep)
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert c["imagePullPolicy"] == "IfNotPresent"
    assert {"effect": "NoSchedule", "key": "dedicated", "operator": "Equal", "value": "llm"} in pod["tolerations"]
    assert {"name": "EXTRA", "value": "1"} in c["env"]
    assert {"name": "SECRET_ONE", "valueFrom": {"secretKeyRef": {"key": "k", "name": "s"}}} in c["env"]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "32Gi"},
                              "limits": {"memory": "48Gi", constants.GPU_RESOURCE: "1"}}
    assert pod["nodeSelector"] == {"topology.kubernetes.io/zone": "a"}
    router_pod = by_kind(render(plan), "Deployment")["chat-router"]["spec"]["template"]["spec"]
    assert router_pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_headless_pool_services() -> None:
    plan, _ = gpu_case()
    services = by_kind(render(plan), "Service")
    for pool in ("short", "long"):
        svc = services[f"chat-{pool}"]["spec"]
        assert svc["clusterIP"] == "None" and svc["publishNotReadyAddresses"] is False
        assert svc["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP", "targetPort": "http"}]
        assert svc["selector"] == common.engine_selector(plan, pool)
        ref = getattr(plan.router.pools, pool).service
        assert ref is not None and ref.name == f"chat-{pool}" and ref.port == 8000  # what the router watches
    assert services["chat-router"]["spec"]["ports"][0]["port"] == 80


def test_disabled_pool_has_no_objects() -> None:
    _, spec = gpu_case()
    objs = render(with_spec(make_plan(long_enabled=False), spec))
    assert not [o for o in objs if o["metadata"]["name"] == "chat-long"]
    assert by_kind(objs, "Deployment").keys() == {"chat-short", "chat-router"}


LONG_NAME = "a-very-long-vllmdeployment-name-" + "x" * 200


@pytest.mark.parametrize("name", [pytest.param(LONG_NAME, id="253-chars"), pytest.param("vllm", id="named-vllm"),
                                  pytest.param("chat", id="short")])
def test_names_fit_and_no_service_is_named_vllm(name: str) -> None:
    _, spec = gpu_case()
    objs = render(with_spec(make_plan(name=name), spec))
    seen = set()
    for obj in objs:
        meta = obj["metadata"]
        assert len(meta["name"]) <= 63 and DNS_LABEL.match(meta["name"]), meta["name"]
        seen.add((obj["kind"], meta["name"]))
        for labels in (meta["labels"], obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})):
            for value in labels.values():
                assert len(value) <= 63 and LABEL_VALUE.match(value), value
    assert len(seen) == len(objs)
    assert "vllm" not in {o["metadata"]["name"] for o in objs if o["kind"] == "Service"}
    # The PodMonitor still labels series with the real (untruncated) name.
    relabel = by_kind(objs, "PodMonitor")[names.monitoring(name)]["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"action": "replace", "replacement": name, "targetLabel": "vllmdeployment"} in relabel


def test_router_config_change_rolls_router_only() -> None:
    plan, _ = gpu_case()
    before = render(plan)
    router = plan.router.model_copy(update={"timeouts": Timeouts(connect_seconds=2, first_byte_seconds=90,
                                                                 idle_seconds=30, total_seconds=600)})
    after = render(plan.model_copy(update={"router": router}))

    def pod_hash(objs: list[dict[str, Any]]) -> str:
        tmpl = by_kind(objs, "Deployment")["chat-router"]["spec"]["template"]["metadata"]
        return str(tmpl["annotations"][constants.ANNOTATION_CONFIG_HASH])

    assert pod_hash(before) != pod_hash(after)
    changed = {(b["kind"], b["metadata"]["name"]) for b, a in zip(before, after, strict=True) if a != b}
    assert changed == {("ConfigMap", "chat-router"), ("Deployment", "chat-router")}


def test_router_objects() -> None:
    plan, _ = gpu_case()
    objs = render(plan)
    cm = by_kind(objs, "ConfigMap")["chat-router"]
    text = cm["data"][constants.ROUTER_CONFIG_KEY]
    assert json.loads(text) == plan.router.to_wire()
    assert text == json.dumps(plan.router.to_wire(), sort_keys=True, indent=2) + "\n"
    dep = by_kind(objs, "Deployment")["chat-router"]
    tmpl = dep["spec"]["template"]
    assert tmpl["metadata"]["annotations"][constants.ANNOTATION_CONFIG_HASH] == common.content_hash(text)
    assert dep["spec"]["replicas"] == 2
    c = tmpl["spec"]["containers"][0]
    assert c["image"] == "ghcr.io/vllm-operator/router:0.1.0"
    assert c["command"] == ["vllm-operator", "router", "--config", "/etc/vllm-operator/router/router.json"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert tmpl["spec"]["securityContext"]["runAsNonRoot"] is True
    assert tmpl["spec"]["serviceAccountName"] == "chat-router"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health" and c["ports"][0]["containerPort"] == 8080
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in tmpl["spec"]["volumes"]}
    assert mounts["config"] == "/etc/vllm-operator/router"
    assert mounts["api-keys"] == plan.router.api_keys_dir
    assert vols["api-keys"]["secret"]["secretName"] == "chat-api-keys"
    assert mounts["hf-token"] == "/etc/vllm-operator/hf-token"
    assert vols["hf-token"]["secret"] == {"secretName": "hf-token", "items": [{"key": "token", "path": "token"}]}
    assert "tokenizer" not in vols
    role = by_kind(objs, "Role")["chat-router"]
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    binding = by_kind(objs, "RoleBinding")["chat-router"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-router", "namespace": "ml"}]
    assert by_kind(objs, "PodDisruptionBudget")["chat-router"]["spec"]["minAvailable"] == 1


def test_router_tokenizer_config_map_and_single_replica() -> None:
    plan = make_plan(tokenizer=TokenizerConfig(path="/etc/vllm-operator/tokenizer"))
    spec = spec_from({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct",
                                "tokenizer": {"configMap": {"name": "llama-tokenizer"}}},
                      "workloadClass": "chat", "accelerator": {"type": "nvidia-l4-24gb"},
                      "router": {"replicas": 1, "image": "example.com/router:dev",
                                 "resources": {"requests": {"cpu": "1"}}}})
    objs = render(with_spec(plan, spec))
    dep = by_kind(objs, "Deployment")["chat-router"]
    tmpl = dep["spec"]["template"]["spec"]
    c = tmpl["containers"][0]
    assert dep["spec"]["replicas"] == 1 and c["image"] == "example.com/router:dev"
    assert c["resources"]["requests"] == {"cpu": "1"}
    assert {"configMap": {"name": "llama-tokenizer"}, "name": "tokenizer"} in tmpl["volumes"]
    assert {"mountPath": "/etc/vllm-operator/tokenizer", "name": "tokenizer", "readOnly": True} in c["volumeMounts"]
    assert "api-keys" not in {v["name"] for v in tmpl["volumes"]}
    assert by_kind(objs, "PodDisruptionBudget")["chat-router"]["spec"]["maxUnavailable"] == 1


def test_pool_pdbs_allow_one_down() -> None:
    plan, _ = gpu_case()
    pdbs = by_kind(render(plan), "PodDisruptionBudget")
    for pool in ("short", "long"):
        assert pdbs[f"chat-{pool}"]["spec"] == {"maxUnavailable": 1, "selector": {
            "matchLabels": common.engine_selector(plan, pool)}}


@pytest.mark.parametrize(("options", "peer"), [
    pytest.param(None, {"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}, id="default-prometheus-any-namespace"),
    pytest.param(RenderOptions(scraper_pod_labels={"app": "vmagent"},
                               scraper_namespace_labels={"kubernetes.io/metadata.name": "monitoring"}),
                 {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app": "vmagent"}}}, id="configured"),
])
def test_network_policy(options: RenderOptions | None, peer: dict[str, Any]) -> None:
    plan, _ = gpu_case()
    policy = by_kind(render(plan, options=options), "NetworkPolicy")["chat-engines"]["spec"]
    assert policy["podSelector"] == {"matchLabels": common.engine_selector(plan)}
    assert policy["policyTypes"] == ["Ingress"]
    port = [{"port": 8000, "protocol": "TCP"}]
    assert policy["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": common.router_selector(plan)}}], "ports": port},
        {"from": [peer], "ports": [*port, {"port": 8001, "protocol": "TCP"}]},  # + the wrapper's start-up metrics
    ]


@pytest.mark.parametrize(("monitoring", "kinds"), [
    pytest.param(None, {"PodMonitor", "PrometheusRule"}, id="default-both"),
    pytest.param({"podMonitor": False}, {"PrometheusRule"}, id="no-podmonitor"),
    pytest.param({"prometheusRule": False}, {"PodMonitor"}, id="no-rule"),
    pytest.param({"podMonitor": False, "prometheusRule": False}, set(), id="neither"),
])
def test_monitoring_flags(monitoring: dict[str, Any] | None, kinds: set[str]) -> None:
    plan, _ = gpu_case()
    body: dict[str, Any] = {"model": {"name": "m"}, "workloadClass": "chat", "accelerator": {"type": "nvidia-l4-24gb"}}
    if monitoring is not None:
        body["monitoring"] = {**monitoring, "labels": {"release": "kube-prometheus-stack"}}
    objs = render(with_spec(plan, spec_from(body)))
    got = {o["kind"] for o in objs if o["apiVersion"] == "monitoring.coreos.com/v1"}
    assert got == kinds
    for obj in objs:
        if obj["apiVersion"] == "monitoring.coreos.com/v1" and monitoring is not None:
            assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_relabels_to_the_label_contract() -> None:
    plan, _ = gpu_case()
    pm = by_kind(render(plan), "PodMonitor")["chat-vllm-operator"]["spec"]
    assert pm["namespaceSelector"] == {"matchNames": ["ml"]}
    endpoints = pm["podMetricsEndpoints"]
    assert [(e["port"], e["path"]) for e in endpoints] == [("http", "/metrics"), ("status", "/metrics")]
    assert endpoints[0]["relabelings"] == endpoints[1]["relabelings"]
    endpoint = endpoints[0]
    targets = {r["targetLabel"]: r.get("sourceLabels", r.get("replacement")) for r in endpoint["relabelings"]}
    assert targets["vllmdeployment"] == "chat"
    assert targets["pool"] == ["__meta_kubernetes_pod_label_vllm_operator_dev_pool"]
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]


def test_prometheus_rule_has_the_six_alerts() -> None:
    plan, _ = gpu_case()
    rule = by_kind(render(plan), "PrometheusRule")["chat-vllm-operator"]["spec"]
    assert rule["groups"] == alerts.alert_groups(plan)
    got = {r["alert"]: r for r in rule["groups"][0]["rules"]}
    assert {a: r["labels"]["severity"] for a, r in got.items()} == {
        "VLLMEngineOOMRestarts": "warning", "VLLMEngineScrapeDown": "critical", "VLLMLengthShareHigh": "warning",
        "VLLMNoTokenProgress": "critical", "VLLMKVCacheUsageHigh": "info", "VLLMEngineUnresponsive": "critical"}
    assert "vllm_operator_engine_unresponsive{" in got["VLLMEngineUnresponsive"]["expr"]
    assert "for" not in got["VLLMEngineUnresponsive"]
    for name, metric in [("VLLMLengthShareHigh", "request_success_total"),
                         ("VLLMNoTokenProgress", "generation_tokens_total"),
                         ("VLLMNoTokenProgress", "num_requests_running"),
                         ("VLLMKVCacheUsageHigh", "kv_cache_usage_perc")]:
        matcher = constants.metric_name(metric)
        assert matcher in got[name]["expr"]
        pattern = re.fullmatch(r'__name__=~"(.*)"', matcher)
        assert pattern and all(re.fullmatch(pattern[1], f"vllm{sep}{metric}") for sep in ":_"), "both spellings"
    assert "vllm_operator_engine_restarts_total" in got["VLLMEngineOOMRestarts"]["expr"]
    assert "kube_pod_container_status_last_terminated_reason" in got["VLLMEngineOOMRestarts"]["expr"]
    assert (got["VLLMEngineScrapeDown"]["for"], got["VLLMLengthShareHigh"]["for"]) == ("30s", "10m")
    # KV usage: the health loop's rule (the mean over windowSeconds), so no `for` on top of the window.
    assert "for" not in got["VLLMKVCacheUsageHigh"] and "avg_over_time(" in got["VLLMKVCacheUsageHigh"]["expr"]
    for r in got.values():
        assert 'vllmdeployment="chat"' in r["expr"] and r["annotations"]["summary"]


def test_alert_thresholds_follow_the_spec() -> None:
    plan, _ = gpu_case()
    spec = spec_from({"model": {"name": "m"}, "workloadClass": "chat", "accelerator": {"type": "nvidia-l4-24gb"},
                      "remediation": {"thresholds": {"lengthShareAlert": 0.3, "kvUsagePressure": 0.9,
                                                     "stallSeconds": 300, "windowSeconds": 1200, "oomCount": 4,
                                                     "oomWindowSeconds": 1800}}})
    rules = {r["alert"]: r for r in by_kind(render(with_spec(plan, spec)), "PrometheusRule")["chat-vllm-operator"]
             ["spec"]["groups"][0]["rules"]}
    assert rules["VLLMLengthShareHigh"]["expr"].endswith("> 0.3")
    assert "[20m]" in rules["VLLMLengthShareHigh"]["expr"]
    assert rules["VLLMKVCacheUsageHigh"]["expr"].endswith("[20m])) >= 0.9")
    assert "[5m]" in rules["VLLMNoTokenProgress"]["expr"]
    oom = rules["VLLMEngineOOMRestarts"]
    assert oom["expr"].count("[30m]") == 3 and oom["expr"].count(">= 4") == 2, oom["expr"]
    assert "4 or more times in 30m" in oom["annotations"]["summary"]


def test_the_oom_alert_counts_what_the_step_down_counts() -> None:
    """Default remediation: oomCount (2) OOMs within oomWindowSeconds (900 s), the health loop's own rule; before
    issue 20 the alert fired on more than 2 in 5 minutes and ignored both fields."""
    plan, spec = gpu_case()
    settings = remediation.resolve(spec.remediation)
    oom = {r["alert"]: r for r in alerts.alert_groups(plan, settings)[0]["rules"]}["VLLMEngineOOMRestarts"]
    assert (settings.oom_count, settings.oom_window_s) == (2, 900)
    assert oom["expr"].count("[15m]") == 3 and oom["expr"].count(">= 2") == 2, oom["expr"]
