"""The alert rules of one VLLMDeployment (issue 7, section Alerts), as Prometheus rule groups.

Self-contained on purpose: the health loop's owner refines these expressions and tests them with `promtool test
rules`; `monitoring.prometheus_rule` only wraps `alert_groups(plan)` in a PrometheusRule.

Series come from two places, with the label contract (docs/architecture.md, Labels):
- engine metrics, scraped by this deployment's PodMonitor, which adds `namespace`, `pod`, `vllmdeployment` and `pool`
  (router targets are scraped too but carry no `pool` label, so `pool!=""` keeps to the engines). vLLM's metric names
  contain a colon, which Prometheus may store as an underscore when the scrape negotiates OpenMetrics, so every vLLM
  metric is selected as `{__name__=~"vllm:foo|vllm_foo"}`.
- the operator's `vllm_operator_engine_restarts_total{vllmdeployment, target_namespace, pool, reason}`, scraped from the
  operator's own pod (its `namespace` label is the operator's namespace, hence `target_namespace`).

Dependency on kube-state-metrics (optional, documented): the OOM alert also reads
`kube_pod_container_status_restarts_total`, `kube_pod_container_status_last_terminated_reason` (reason OOMKilled: the
kernel killed the container) and `kube_pod_container_status_last_terminated_exitcode` (kube-state-metrics 2.10 and
later; exit code 87 is the engine wrapper's EngineOOM, which the kubelet itself only reports as `Error`). With it, OOM
restarts are caught even while the operator is down; without it that half of the expression is simply empty and the
operator's counter alone carries the alert. The kube-state-metrics half counts every restart of an engine container
whose *last* termination was an OOM within the window — an approximation (kube-state-metrics has no per-termination
history), exact when the OOMs are what restarts the engine.

The no-progress alert requires requests running for the whole stall window (`min_over_time`), so an idle engine
that just received a request is not a stall; it is the same rule the health loop's Stalled diagnosis uses, and it
fires as soon as the window is covered (no extra `for`).

The unresponsive-engine alert reads the engine wrapper's own verdict (`vllm_operator_engine_unresponsive`: its
one-token probes of an idle engine failed several times in a row), the series the health loop's EngineUnresponsive
diagnosis reads; the wrapper already waited for repeated failures, so there is no extra `for`.

The KV-usage alert is the health loop's KVPressure rule too: the pod's usage averaged over `windowSeconds` at
`kvUsagePressure` or above, with no extra `for`. An instant sample held for ten minutes (what it was before) fired
on a cache that sat just above the threshold between scrapes and ignored the window the loop judges by.
"""

from __future__ import annotations

from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.api.signals import Signals, duration, quote

RESTARTS_METRIC = f"{constants.METRIC_ENGINE_RESTARTS}_total"
OOM_REASONS = ("OOMKilled", "EngineOOM")
SCRAPE_DOWN_FOR = "30s"
LENGTH_FOR = "10m"
ENGINE_CONTAINER = "engine"
ENGINE_LABELS = "namespace, vllmdeployment, pool"
POD_LABELS = "namespace, vllmdeployment, pool, pod"
RESTART_LABELS = "target_namespace, vllmdeployment, pool"


def _regex_literal(text: str) -> str:
    """A DNS name as a PromQL regex literal: only '.' is special there (escaped as `\\.` inside a PromQL string)."""
    return text.replace(".", "\\\\.")


def oom_restarts_expr(plan: Plan, count: int, window_s: float) -> str:
    """`count` or more OOM restarts of a pool within the window: the rule the health loop steps a pool down by."""
    reasons = "|".join(OOM_REASONS)
    window = duration(window_s)
    ns, dep, engine = quote(plan.namespace), quote(plan.name), quote(ENGINE_CONTAINER)
    operator = (f"sum by ({RESTART_LABELS}) (increase({RESTARTS_METRIC}{{target_namespace={ns},"
                f"vllmdeployment={dep},reason=~{quote(reasons)}}}[{window}])) >= {count}")
    per_pool = []
    for pool in sorted(p.name for p in plan.pools.values() if p.enabled):
        pods = _regex_literal(names.pool(plan.name, pool)) + "-[a-z0-9]+-[a-z0-9]+"
        per_pool.append(
            f'label_replace(increase(kube_pod_container_status_restarts_total{{namespace={ns},'
            f'container={engine},pod=~"{pods}"}}[{window}]) and on (namespace, pod, container) '
            f'((kube_pod_container_status_last_terminated_reason{{namespace={ns},'
            f'container={engine},reason="OOMKilled"}} == 1) or on (namespace, pod, container) '
            f'(kube_pod_container_status_last_terminated_exitcode{{namespace={ns},'
            f'container={engine}}} == {constants.EXIT_ENGINE_OOM})), "pool", {quote(pool)}, "", "")')
    if not per_pool:
        return operator
    kube_state = (f'sum by ({RESTART_LABELS}) (label_replace(label_replace({" or ".join(per_pool)}, '
                  f'"vllmdeployment", {dep}, "", ""), "target_namespace", "$1", "namespace", "(.*)")) '
                  f">= {count}")
    return f"({operator}) or ({kube_state})"


def _rule(alert: str, expr: str, for_: str | None, severity: str, summary: str, description: str) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "alert": alert,
        "expr": expr,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "description": description},
    }
    if for_:
        rule["for"] = for_
    return rule


def alert_groups(plan: Plan, settings: HealthSettings | None = None) -> list[dict[str, Any]]:
    """The rule groups of one VLLMDeployment, with the thresholds the health loop uses (`remediation.resolve` of the
    spec's remediation; the defaults without one). Each expression is the health loop's signal (`api.signals`)
    thresholded: `up` for the scrape, Stalled, EngineUnresponsive, KVPressure, and its two finished-request counts
    divided for the length share."""
    s = settings or HealthSettings()
    signals = Signals(plan.namespace, plan.name, POD_LABELS)
    per_pool = Signals(plan.namespace, plan.name, ENGINE_LABELS)
    share, usage, stall = s.length_share_alert, s.kv_pressure, s.stall_s
    oom_count, oom_window, window = s.oom_count, duration(s.oom_window_s), duration(s.window_s)
    who = f"{plan.namespace}/{plan.name}"
    pool = "{{ $labels.pool }}"
    pod = "{{ $labels.pod }}"
    rules = [
        _rule("VLLMEngineOOMRestarts", oom_restarts_expr(plan, oom_count, s.oom_window_s), None, "warning",
              f"Engines of {who} pool {pool} restarted for out-of-memory {oom_count} or more times in {oom_window}",
              f"{{{{ $value | humanize }}}} OOM restarts (OOMKilled or EngineOOM) in {oom_window}. The operator steps "
              "the pool down its ladder after repeated OOMs; check status.pools.<pool>.stepDown."),
        _rule("VLLMEngineScrapeDown", f"{signals.up()} == 0", SCRAPE_DOWN_FOR, "critical",
              f"Engine {pod} of {who} pool {pool} cannot be scraped",
              f"Prometheus has failed to scrape /metrics of {pod} for {SCRAPE_DOWN_FOR}: the engine is down, hung or "
              "unreachable, and the health loop is blind to it."),
        _rule("VLLMLengthShareHigh", f"({per_pool.finished(s.window_s, 'length')} / {per_pool.finished(s.window_s)}) "
              f"> {share:g}", LENGTH_FOR, "warning",
              f"Over {share:.0%} of requests to {who} pool {pool} stop at max_tokens",
              f"{{{{ $value | humanizePercentage }}}} of finished requests ended with finished_reason=length over "
              f"{window}, for {LENGTH_FOR}: generations run into the cap (runaway output or caps too low)."),
        _rule("VLLMNoTokenProgress", f"({signals.running_min(stall)} > 0) and on ({POD_LABELS}) "
              f"({signals.generated(stall)} == 0)", None, "critical",
              f"Engine {pod} of {who} pool {pool} has requests running but generates no tokens",
              f"Requests were running on {pod} for the whole last {duration(stall)} and "
              "vllm:generation_tokens_total did not move: the engine is stalled (the operator deletes the pod "
              "within its restart budget)."),
        _rule("VLLMEngineUnresponsive", f"{signals.unresponsive()} >= 1", None, "critical",
              f"Engine {pod} of {who} pool {pool} answers /health but does not generate",
              f"The engine wrapper's one-token probes of the idle engine {pod} failed several times in a row "
              "while vLLM's /health answered 200: the engine core hangs (a zombie). The operator deletes the pod "
              "within its restart budget."),
        _rule("VLLMKVCacheUsageHigh", f"{signals.kv_usage_avg(s.window_s)} >= {usage:g}", None, "info",
              f"KV cache of {pod} ({who} pool {pool}) averaged {usage:.0%} or more over {window}",
              f"vllm:kv_cache_usage_perc averaged {{{{ $value | humanizePercentage }}}} over {window}: requests "
              "queue or get preempted; add replicas or lower max_num_seqs."),
    ]
    return [{"name": f"vllm-operator.{plan.namespace}.{plan.name}", "rules": rules}]
