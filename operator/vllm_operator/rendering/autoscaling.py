"""KEDA ScaledObjects: one per pool with `autoscaling` (docs/architecture.md, Autoscaling).

KEDA creates and drives the HPA of each ScaledObject and scales 0 <-> 1 itself, so the operator renders only the
ScaledObject and never writes the Deployment's replicas (handlers/childplan.py leaves them out of every apply).

Two Prometheus triggers, both summed over the pool (never `avg`: KEDA's Prometheus trigger is an AverageValue
metric, the HPA divides the sum by the replica count, so `target` is per replica):
- `load`: the pool's metric (waiting requests, KV cache usage or running requests) against `target`; it drives N.
  Its activation threshold is the target too, so waking and sleeping are `busy`'s decision (a KV cache that keeps a
  little usage while idle does not keep a pool awake).
- `busy`: the requests the routers hold for the pool (they exist while it has no pod) plus those waiting and
  running in its engines. Its activation threshold is 0, so KEDA wakes a pool at zero on the first held request and
  lets it sleep only after `idleSeconds` with nothing held, waiting or running; its target is the pool's batch size
  (max_num_seqs), so on its own it asks for one replica per full batch and never outbids `load`.
The HPA's scale-down stabilization window is `scaleDownStabilizationSeconds` (N -> 1); KEDA's cooldownPeriod is
`idleSeconds` (1 -> 0), and so is initialCooldownPeriod: a new pool starts with one replica (the rendered replicas
are max(minReplicas, 1)) and, with minReplicas 0, sleeps once it has been idle that long.
"""

from __future__ import annotations

from vllm_operator import constants, names
from vllm_operator.api.plan import AutoscalingPlan, Plan, PoolPlan
from vllm_operator.rendering import common

API_VERSION = "keda.sh/v1alpha1"
KIND = "ScaledObject"

_METRICS = {
    "num-requests-waiting": "num_requests_waiting",
    "kv-cache-usage": constants.METRIC_KV_USAGE,
    "num-requests-running": constants.METRIC_RUNNING,
}


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pool_matchers(plan: Plan, pool: str) -> str:
    return f"namespace={_quote(plan.namespace)},vllmdeployment={_quote(plan.name)},pool={_quote(pool)}"


def load_query(plan: Plan, pool: str, scaling: AutoscalingPlan) -> str:
    """The pool's metric summed over its pods (0 when it has none)."""
    metric = constants.metric_name(_METRICS[scaling.metric])
    return f"sum({{{metric},{_pool_matchers(plan, pool)}}}) or vector(0)"


def busy_query(plan: Plan, pool: str) -> str:
    """Held (router) + waiting + running (engines) requests of the pool: above 0 means the pool must be awake."""
    held = f"{constants.METRIC_ROUTER_HELD}{{{_pool_matchers(plan, pool)}}}"
    engines = f'{{__name__=~"vllm[:_]num_requests_(waiting|running)",{_pool_matchers(plan, pool)}}}'
    return f"(sum({held}) or vector(0)) + (sum({engines}) or vector(0))"


def _number(value: float) -> str:
    return f"{value:g}"


def scaled_object(plan: Plan, pool: PoolPlan, prometheus_url: str) -> common.Manifest:
    scaling = pool.autoscaling
    assert scaling is not None
    name = names.pool(plan.name, pool.name)
    trigger = {"type": "prometheus", "metricType": "AverageValue"}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": common.metadata(plan, name, common.pool_labels(plan, pool.name)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": scaling.polling_interval_seconds,
            "cooldownPeriod": scaling.idle_seconds,
            "initialCooldownPeriod": scaling.idle_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {
                "stabilizationWindowSeconds": scaling.scale_down_stabilization_seconds}}}},
            "triggers": [
                {**trigger, "name": "load", "metadata": {
                    "serverAddress": prometheus_url, "query": load_query(plan, pool.name, scaling),
                    "threshold": _number(scaling.target), "activationThreshold": _number(scaling.target)}},
                {**trigger, "name": "busy", "metadata": {
                    "serverAddress": prometheus_url, "query": busy_query(plan, pool.name),
                    "threshold": _number(pool.max_num_seqs), "activationThreshold": "0"}},
            ],
        },
    }


__all__ = ["API_VERSION", "KIND", "busy_query", "load_query", "scaled_object"]
