"""Operator-wide settings from the command line, handed to handlers through kopf's memo (no globals)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator.handlers.webhook import WebhookConfig
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.planning.weights_cache import DEFAULT_NODE_CACHE, NodeCache


@dataclass(frozen=True)
class OperatorConfig:
    """How this operator process runs."""

    namespaces: tuple[str, ...] = ()  # empty = all namespaces (cluster-wide)
    prometheus_url: str | None = None  # unset = metric-based diagnoses off, MetricsAvailable=False says so
    health_enabled: bool = True
    http_host: str = "0.0.0.0"  # /healthz and /metrics must be reachable by the kubelet and Prometheus
    http_port: int = 8080  # 0 = do not serve /healthz and /metrics (tests)
    health_interval_override: float | None = None  # seconds; tests shorten every deployment's interval
    status_refresh_delay: float = 2.0  # seconds a Deployment change waits for others to join its status write
    images: ImageDefaults = DEFAULT_IMAGES  # where default engine/router images come from (--image-repository)
    node_cache: NodeCache = DEFAULT_NODE_CACHE  # the node weights cache (--weights-cache-host-path, -max-size)
    webhook: WebhookConfig | None = None  # serve the validating admission webhook (--webhook-port)
    workload_classes: bool = True  # read VLLMWorkloadClasses (False: --no-workload-classes, built-ins only)
    class_rollout_timeout: float = 600.0  # seconds a class roll-out waits for one dependent before the next
    max_concurrent_reconciles: int = 4  # reconciles/health checks in flight at once, refreshes as many (queue.py)


DEFAULT_CONFIG = OperatorConfig()
"""What a reconcile or plan outside an operator run (tests, benchmarks) plans with."""
