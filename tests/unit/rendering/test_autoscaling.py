"""The KEDA ScaledObject of an autoscaled pool: what KEDA reads from it, and when none is rendered."""

from __future__ import annotations

from typing import Any

from tests.unit.planning.helpers import make_plan
from vllm_operator import constants, names
from vllm_operator.rendering import RenderOptions, autoscaling, render

PROM = "http://prometheus.monitoring:9090"
SPEC = {"pools": {"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 3, "target": 2,
                                           "scaleDownStabilizationSeconds": 30, "idleSeconds": 45}}}}


def rendered(prometheus_url: str | None = PROM, **patch: Any) -> list[dict[str, Any]]:
    merged = {**SPEC, **patch}
    return render(make_plan(**merged), options=RenderOptions(prometheus_url=prometheus_url))


def scaled_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "ScaledObject"]


def test_one_scaled_object_for_the_autoscaled_pool() -> None:
    objs = rendered()
    (so,) = scaled_objects(objs)
    name = names.pool("demo", "long")
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["metadata"]["name"] == name
    assert so["metadata"]["labels"][constants.LABEL_POOL] == "long"
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 3)
    assert spec["cooldownPeriod"] == spec["initialCooldownPeriod"] == 45
    assert spec["pollingInterval"] == constants.KEDA_POLLING_INTERVAL_S
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 30}
    load, busy = spec["triggers"]
    assert load["name"] == "load" and busy["name"] == "busy"
    for trigger in (load, busy):
        assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
        assert trigger["metadata"]["serverAddress"] == PROM
        assert "avg" not in trigger["metadata"]["query"] and "sum(" in trigger["metadata"]["query"]
    assert load["metadata"]["query"] == ('sum({__name__=~"vllm[:_]num_requests_waiting",namespace="ns",'
                                         'vllmdeployment="demo",pool="long"}) or vector(0)')
    assert load["metadata"]["threshold"] == "2"
    assert constants.METRIC_ROUTER_HELD in busy["metadata"]["query"]
    assert busy["metadata"]["activationThreshold"] == "0", "the first held request wakes the pool"


def test_scaled_object_comes_after_its_deployment() -> None:
    kinds = [o["kind"] for o in rendered()]
    assert kinds.index("ScaledObject") > max(i for i, k in enumerate(kinds) if k == "Deployment")


def test_kv_usage_query_is_summed_so_keda_divides_by_replicas() -> None:
    (so,) = scaled_objects(rendered(pools={"long": {"autoscaling": {"maxReplicas": 3, "metric": "kv-cache-usage",
                                                                     "target": 0.75}}}))
    load = so["spec"]["triggers"][0]["metadata"]
    assert load["query"].startswith('sum({__name__=~"vllm[:_]kv_cache_usage_perc"') and load["threshold"] == "0.75"


def test_no_scaled_object_without_prometheus_or_autoscaling() -> None:
    assert scaled_objects(rendered(prometheus_url=None)) == []
    plain = render(make_plan(), options=RenderOptions(prometheus_url=PROM))
    assert scaled_objects(plain) == []


def test_queries_quote_label_values() -> None:
    assert autoscaling._quote('a"b') == '"a\\"b"'


def test_render_cli_says_why_no_scaled_object(tmp_path: Any, capsys: Any) -> None:
    from vllm_operator.rendering.cli import main

    doc = tmp_path / "d.yaml"
    doc.write_text("apiVersion: vllm-operator.dev/v1alpha1\nkind: VLLMDeployment\n"
                   "metadata: {name: demo, namespace: ns}\nspec:\n  model: {name: meta-llama/Llama-3.1-8B-Instruct}\n"
                   "  workloadClass: chat\n"
                   "  accelerator: {type: nvidia-h100-80gb}\n  pools: {long: {autoscaling: {maxReplicas: 2}}}\n")
    assert main(["-f", str(doc)]) == 0
    out = capsys.readouterr()
    assert "kind: ScaledObject" not in out.out and "without --prometheus-url no KEDA ScaledObject" in out.err
    assert main(["-f", str(doc), "--prometheus-url", PROM]) == 0
    assert "kind: ScaledObject" in capsys.readouterr().out


def test_the_pools_polling_interval_is_keda_s() -> None:
    long = {**SPEC["pools"]["long"]["autoscaling"], "pollingIntervalSeconds": 5}
    (so,) = scaled_objects(rendered(pools={"long": {"autoscaling": long}}))
    assert so["spec"]["pollingInterval"] == 5
