"""The router's own Prometheus metrics.

Why the router counts for itself: vLLM's `vllm:request_success_total{finished_reason}` misses client disconnects and
knows nothing of pools, clamps or refusals; the health loop and the dashboards need those per pool. The label for
the finish reason is `finished_reason`, the same as vLLM's (docs/architecture.md, Labels), so one query shape covers
both.

One registry per router instance (no module-level metrics), so tests can run several routers in one process.
"""

from __future__ import annotations

from typing import Any, Final

import prometheus_client as prom

from vllm_operator import constants

PREFIX: Final = constants.METRIC_ROUTER_PREFIX
# Router overhead is sub-millisecond; TTFT spans milliseconds to minutes.
OVERHEAD_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class RouterMetrics:
    """Every metric the router exports; see each description."""

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        r = self.registry
        self.requests = prom.Counter(
            f"{PREFIX}_requests", "Requests answered, by pool (none = answered by the router), endpoint and status.",
            ["pool", "endpoint", "status"], registry=r)
        self.finished = prom.Counter(
            f"{PREFIX}_finished", "Choices finished, by pool and finished_reason as parsed from the engine's "
            "responses (streamed ones included); abort = the client went away, error = the engine cut the stream.",
            ["pool", "finished_reason"], registry=r)
        self.prompt_tokens = prom.Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens forwarded (engine usage when reported, else the router's count).",
            ["pool"], registry=r)
        self.completion_tokens = prom.Counter(
            f"{PREFIX}_completion_tokens", "Completion tokens the engines reported in usage.", ["pool"], registry=r)
        self.clamps = prom.Counter(
            f"{PREFIX}_clamps", "Requests whose max_tokens was lowered, by pool and the cap that did it "
            "(tier, pool, context).", ["pool", "cap"], registry=r)
        self.refusals = prom.Counter(
            f"{PREFIX}_refusals", "Requests refused by the router before reaching an engine, by reason.",
            ["reason"], registry=r)
        self.overhead = prom.Histogram(
            f"{PREFIX}_overhead_seconds", "Router time before forwarding (parse, auth, count, decide, rewrite).",
            buckets=OVERHEAD_BUCKETS, registry=r)
        self.ttft = prom.Histogram(
            f"{PREFIX}_time_to_first_byte_seconds", "From request arrival to the engine's first body byte, through "
            "the router (TTFT for streamed requests).", ["pool"], buckets=LATENCY_BUCKETS, registry=r)
        self.duration = prom.Histogram(
            f"{PREFIX}_request_duration_seconds", "Whole request through the router.", ["pool"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_errors = prom.Counter(
            f"{PREFIX}_upstream_errors", "Failures talking to engines, by pool and kind (connect, status_5xx, "
            "timeout_connect, timeout_first_byte, timeout_idle, timeout_total, disconnected).",
            ["pool", "kind"], registry=r)
        self.ejections = prom.Counter(
            f"{PREFIX}_ejections", "Endpoints taken out of rotation, by pool and cause.", ["pool", "cause"],
            registry=r)
        self.readmissions = prom.Counter(
            f"{PREFIX}_readmissions", "Ejected endpoints put back after a healthy /health.", ["pool"], registry=r)
        self.health_checks = prom.Counter(
            f"{PREFIX}_health_checks", "GET /health polls of engine endpoints, by pool and result (ok, failed).",
            ["pool", "result"], registry=r)
        self.failovers = prom.Counter(
            f"{PREFIX}_failovers", "Requests retried on another endpoint because one could not take them.",
            ["pool"], registry=r)
        self.pool_fallbacks = prom.Counter(
            f"{PREFIX}_pool_fallbacks", "Short-pool requests sent to the long pool because the short pool had no "
            "healthy endpoint.", registry=r)
        self.endpoints = prom.Gauge(
            f"{PREFIX}_endpoints", "Known endpoints by pool and state (healthy, ejected).", ["pool", "state"],
            registry=r)
        self.in_flight = prom.Gauge(
            f"{PREFIX}_in_flight_requests", "Requests being forwarded, by pool.", ["pool"], registry=r)
        self.client_disconnects = prom.Counter(
            f"{PREFIX}_client_disconnects", "Clients that went away before the answer was complete.", ["pool"],
            registry=r)
        self.token_counts = prom.Counter(
            f"{PREFIX}_prompt_counts", "How prompt lengths were obtained: bound (estimate far from any boundary), "
            "exact (tokenized), ids (token ids given), no-tokenizer (conservative estimate).", ["method"], registry=r)
        self.tokenizer_missing = prom.Gauge(
            f"{PREFIX}_tokenizer_missing", "1 when the router has no tokenizer and estimates prompt lengths.",
            registry=r)
        self.endpoints_discovered = prom.Gauge(
            f"{PREFIX}_discovery_synced", "1 once a pool's EndpointSlices have been listed (static lists: 1).",
            ["pool"], registry=r)

        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: prometheus_client's lookup costs more than the increment itself."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def exposition(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
