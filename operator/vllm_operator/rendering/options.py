"""Cluster-wide rendering settings that are not part of any one VLLMDeployment.

Where Prometheus runs is a property of the cluster, not of a deployment, so the NetworkPolicy's metrics-scraper peer is
an operator setting: `render(plan, options=RenderOptions(...))`, `vllm-operator render --scraper-pod-labels
... --scraper-namespace-labels ...`. The default admits pods labelled `app.kubernetes.io/name: prometheus` in any
namespace, which is how the Prometheus Operator (and kube-prometheus-stack) labels its Prometheus pods. So is the
Prometheus the autoscaling triggers query (`--prometheus-url`). (The registry the default images come from is a
setting too, `images.py`, but the planner applies it: the plan names every image.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SCRAPER_POD_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "prometheus"}


@dataclass(frozen=True)
class RenderOptions:
    """Settings the renderer takes from the operator's configuration."""

    scraper_pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SCRAPER_POD_LABELS))
    """Labels of the metrics scraper's pods; empty = every pod of the selected namespaces."""
    scraper_namespace_labels: Mapping[str, str] | None = None
    """Labels of the namespaces the scraper runs in; None = any namespace."""
    prometheus_url: str | None = None
    """The Prometheus the ScaledObjects' triggers query (the operator's --prometheus-url, the health loop's); None:
    pools with autoscaling get no ScaledObject, and the reconcile says so in the AutoscalerReady condition."""

    def scraper_peer(self) -> dict[str, Any]:
        """The NetworkPolicyPeer that admits the metrics scraper."""
        peer: dict[str, Any] = {"podSelector": {"matchLabels": dict(self.scraper_pod_labels)}
                                if self.scraper_pod_labels else {}}
        peer["namespaceSelector"] = ({"matchLabels": dict(self.scraper_namespace_labels)}
                                     if self.scraper_namespace_labels else {})
        return peer
