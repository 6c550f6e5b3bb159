"""Prometheus Operator objects of one VLLMDeployment: a PodMonitor and a PrometheusRule (docs/architecture.md,
Monitoring objects).

They are rendered always (unless the plan's `monitoring` turns one off) and the handler drops them when the
`monitoring.coreos.com` CRDs are absent. The plan's `monitoring.labels` are added to both, so a Prometheus whose
`podMonitorSelector` / `ruleSelector` wants a label (e.g. `release: kube-prometheus-stack`) picks them up.

The PodMonitor scrapes `/metrics` on the `http` port of this deployment's engine and router pods, and on the engine
wrapper's `status` port (its start-up phases, `vllm_operator_engine_startup_*`; router pods have no such port and are
not scraped there), and relabels them to the label contract (docs/architecture.md, Labels): `namespace` and `pod` from
the target's metadata, `pool` from the pod's pool label (router pods have none), and `vllmdeployment` set to the
VLLMDeployment's name. The name is written as a literal rather than copied from the pod's deployment label because a
label value holds at most 63 characters: for a longer name the label carries a hash-suffixed short form, while the
health loop and the alerts select on the real name.
"""

from __future__ import annotations

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.rendering import alerts, common

METRICS_PATH = "/metrics"
SCRAPED_PORTS = ("http", constants.ENGINE_STATUS_PORT_NAME)
"""Named ports scraped on each selected pod: vLLM's (and the router's) own, and the engine wrapper's."""


def _meta_label(label: str) -> str:
    """Prometheus' Kubernetes SD meta label for a pod label (every character outside [a-zA-Z0-9_] becomes '_')."""
    return "__meta_kubernetes_pod_label_" + "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                                                    for c in label)


def _labels(plan: Plan) -> dict[str, str]:
    return {**plan.monitoring.labels, **common.base_labels(plan, constants.COMPONENT_MONITORING)}


def pod_monitor(plan: Plan) -> common.Manifest:
    relabelings = [
        {"action": "replace", "targetLabel": "vllmdeployment", "replacement": plan.name},
        {"action": "replace", "sourceLabels": [_meta_label(constants.LABEL_POOL)], "targetLabel": "pool"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"},
        {"action": "replace", "sourceLabels": [_meta_label(constants.LABEL_COMPONENT)], "targetLabel": "component"},
    ]
    selector = {
        "matchLabels": {constants.LABEL_NAME: constants.APP_NAME,
                        constants.LABEL_DEPLOYMENT: common.deployment_label(plan)},
        "matchExpressions": [{"key": constants.LABEL_COMPONENT, "operator": "In",
                              "values": [constants.COMPONENT_ENGINE, constants.COMPONENT_ROUTER]}],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": common.metadata(plan, names.monitoring(plan.name), _labels(plan)),
        "spec": {
            "selector": selector,
            "namespaceSelector": {"matchNames": [plan.namespace]},
            "podMetricsEndpoints": [{"port": port, "path": METRICS_PATH, "scheme": "http",
                                     "relabelings": relabelings} for port in SCRAPED_PORTS],
        },
    }


def prometheus_rule(plan: Plan, settings: HealthSettings | None = None) -> common.Manifest:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": common.metadata(plan, names.monitoring(plan.name), _labels(plan)),
        "spec": {"groups": alerts.alert_groups(plan, settings)},
    }
