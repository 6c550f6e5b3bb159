"""The operator's own Prometheus metrics, on a registry owned by one operator instance (tests run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vllm_operator import constants

DEPLOYMENT_LABELS = ("vllmdeployment", "target_namespace", "pool")


class OperatorMetrics:
    """Counters named in the interfaces contract; label `target_namespace` survives the scrape's `namespace`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("vllm_operator_reconciles", "Reconciles by result (changed, unchanged, refused).",
                                  ["result"], registry=self.registry)
        self.reconcile_errors = Counter("vllm_operator_reconcile_errors", "Reconciles that raised.",
                                        registry=self.registry)
        self.reconcile_wait = Histogram(
            "vllm_operator_reconcile_wait_seconds", "Time a reconcile waited for a slot (--max-concurrent-reconciles).",
            buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600), registry=self.registry)
        self.reconciles_waiting = Gauge("vllm_operator_reconciles_waiting", "Reconciles waiting for a slot.",
                                        registry=self.registry)
        self.reconciles_running = Gauge("vllm_operator_reconciles_running", "Reconciles in flight.",
                                        registry=self.registry)
        self.health_checks = Counter("vllm_operator_health_checks", "Health checks run (one per VLLMDeployment per "
                                     "interval).", registry=self.registry)
        self.child_writes = Counter("vllm_operator_child_writes", "Child objects created, updated or deleted.",
                                    ["verb", "kind"], registry=self.registry)
        self.engine_restarts = Counter(
            constants.METRIC_ENGINE_RESTARTS, "Engine container terminations the operator observed, by reason.",
            [*DEPLOYMENT_LABELS, "reason"], registry=self.registry)
        self.actions = Counter("vllm_operator_actions", "Health-loop actions taken.", [*DEPLOYMENT_LABELS, "action"],
                               registry=self.registry)
        self.step_down_level = Gauge("vllm_operator_step_down_level", "Current step-down rung per pool.",
                                     DEPLOYMENT_LABELS, registry=self.registry)

        self.watches_current = Gauge(
            "vllm_operator_watches_current", "The operator's watches of its children (engine pods, Deployments, "
            "PDBs per scope) that are listed and current.", registry=self.registry)
        self.watches_wanted = Gauge("vllm_operator_watches_wanted", "Watches of its children the operator keeps.",
                                    registry=self.registry)
        self.health_api_lists = Counter(
            "vllm_operator_health_api_lists", "LISTs of children sent to the API server because no current watch "
            "covered them.", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
