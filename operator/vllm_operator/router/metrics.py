"""The router's own Prometheus metrics.

Why the router counts for itself: vLLM's `vllm:request_success_total{finished_reason}` misses client disconnects and
knows nothing of pools, clamps or refusals; the health loop and the dashboards need those per pool. The label for
the finish reason is `finished_reason`, the same as vLLM's (docs/architecture.md, Labels), so one query shape covers
both.

One registry per router instance (no module-level metrics), so tests can run several routers in one process.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from typing import Any, Final

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from vllm_operator import constants

PREFIX: Final = constants.METRIC_ROUTER_PREFIX
# Router overhead is sub-millisecond; TTFT spans milliseconds to minutes.
OVERHEAD_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class _Value:
    """One time series: a plain float, no lock. The router updates its metrics only from its event-loop thread,
    and a scrape reads them there too; prometheus_client's values take a lock on every update, and with ~13 updates
    per request that was ~5 % of the router's CPU per request (benchmarks/router)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


class _Buckets:
    """One histogram series: a count per bucket (not cumulative until exposition) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family:
    """A metric with label names; `labels(*values)` gives the series (created on first use), and a family without
    label names is its own single series (`inc`, `dec`, `set`, `observe` on it)."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 buckets: tuple[float, ...] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = list(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self.series: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self.labels()  # exported as 0 from the start, as prometheus_client does

    def labels(self, *values: str) -> Any:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values!r}")
        found = self.series.get(values)
        if found is None:
            found = self.series[values] = _Buckets(self.bounds) if self.kind == "histogram" else _Value()
        return found

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def metric(self) -> Metric:
        family: Metric
        if self.kind == "counter":
            family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for values, series in self.series.items():
                family.add_metric(list(values), series.value)
        elif self.kind == "gauge":
            family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for values, series in self.series.items():
                family.add_metric(list(values), series.value)
        else:
            family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
            for values, series in self.series.items():
                cumulative, running = [], 0
                for bound, count in zip((*self.bounds, float("inf")), series.counts, strict=True):
                    running += count
                    cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
                family.add_metric(list(values), cumulative, sum_value=series.sum)
        return family


class _Counter(_Family):
    kind = "counter"


class _Gauge(_Family):
    kind = "gauge"


class _Histogram(_Family):
    kind = "histogram"


class _Collector(prom.registry.Collector):
    def __init__(self, families: list[_Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()


class RouterMetrics:
    """Every metric the router exports; see each description."""

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self.requests = _Counter(
            f"{PREFIX}_requests", "Requests answered, by pool (none = answered by the router), endpoint and status.",
            ["pool", "endpoint", "status"])
        self.finished = _Counter(
            f"{PREFIX}_finished", "Choices finished, by pool and finished_reason as parsed from the engine's "
            "responses (streamed ones included); abort = the client went away, error = the engine cut the stream.",
            ["pool", "finished_reason"])
        self.prompt_tokens = _Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens forwarded (engine usage when reported, else the router's count).",
            ["pool"])
        self.completion_tokens = _Counter(
            f"{PREFIX}_completion_tokens", "Completion tokens the engines reported in usage.", ["pool"])
        self.clamps = _Counter(
            f"{PREFIX}_clamps", "Requests whose max_tokens was lowered, by pool and the cap that did it "
            "(tier, pool, context).", ["pool", "cap"])
        self.refusals = _Counter(
            f"{PREFIX}_refusals", "Requests refused by the router before reaching an engine, by reason.",
            ["reason"])
        self.overhead = _Histogram(
            f"{PREFIX}_overhead_seconds", "Router time before forwarding (parse, auth, count, decide, rewrite).",
            buckets=OVERHEAD_BUCKETS)
        self.ttft = _Histogram(
            f"{PREFIX}_time_to_first_byte_seconds", "From request arrival to the engine's first body byte, through "
            "the router (TTFT for streamed requests).", ["pool"], buckets=LATENCY_BUCKETS)
        self.duration = _Histogram(
            f"{PREFIX}_request_duration_seconds", "Whole request through the router.", ["pool"],
            buckets=LATENCY_BUCKETS)
        self.upstream_errors = _Counter(
            f"{PREFIX}_upstream_errors", "Failures talking to engines, by pool and kind (connect, status_5xx, "
            "timeout_connect, timeout_first_byte, timeout_idle, timeout_total, disconnected).",
            ["pool", "kind"])
        self.ejections = _Counter(
            f"{PREFIX}_ejections", "Endpoints taken out of rotation, by pool and cause.", ["pool", "cause"])
        self.readmissions = _Counter(
            f"{PREFIX}_readmissions", "Ejected endpoints put back after a healthy /health.", ["pool"])
        self.health_checks = _Counter(
            f"{PREFIX}_health_checks", "GET /health polls of engine endpoints, by pool and result (ok, failed).",
            ["pool", "result"])
        self.failovers = _Counter(
            f"{PREFIX}_failovers", "Requests retried on another endpoint because one could not take them.",
            ["pool"])
        self.pool_fallbacks = _Counter(
            f"{PREFIX}_pool_fallbacks", "Short-pool requests sent to the long pool because the short pool had no "
            "healthy endpoint.")
        self.endpoints = _Gauge(
            f"{PREFIX}_endpoints", "Known endpoints by pool and state (healthy, ejected).", ["pool", "state"])
        self.in_flight = _Gauge(
            f"{PREFIX}_in_flight_requests", "Requests being forwarded, by pool.", ["pool"])
        self.held = _Gauge(
            constants.METRIC_ROUTER_HELD, "Requests held for a pool with no healthy endpoint while it wakes from zero "
            "replicas (KEDA's activation signal), by pool.", ["pool"])
        self.client_disconnects = _Counter(
            f"{PREFIX}_client_disconnects", "Clients that went away before the answer was complete.", ["pool"])
        self.token_counts = _Counter(
            f"{PREFIX}_prompt_counts", "How prompt lengths were obtained: bound (estimate far from any boundary), "
            "exact (tokenized), ids (token ids given), no-tokenizer (conservative estimate).", ["method"])
        self.tokenizer_missing = _Gauge(
            f"{PREFIX}_tokenizer_missing", "1 when the router has no tokenizer and estimates prompt lengths.")
        self.endpoints_discovered = _Gauge(
            f"{PREFIX}_discovery_synced", "1 once a pool's EndpointSlices have been listed (static lists: 1).",
            ["pool"])

        self.prefix_choices = _Counter(
            f"{PREFIX}_prefix_choices", "Replica choices of prefix pools, by pool and outcome: hit (the replica with "
            "the longest remembered prefix), spill (that replica was over the load bound), miss (no replica known "
            "to hold any of the prompt).", ["pool", "outcome"])
        self.prefix_index_blocks = _Gauge(
            f"{PREFIX}_prefix_index_blocks", "Prefix blocks the router remembers, by pool (bounded by "
            "pools.<pool>.prefix.indexBlocks).", ["pool"])
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.registry.register(_Collector([v for v in vars(self).values() if isinstance(v, _Family)]))

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached by the metric's identity."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def exposition(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
