"""The PromQL of each signal, defined once: the health loop queries it (`health/queries.py`) and the alert rules
threshold the same expression (`rendering/alerts.py`), so a rule and a diagnosis never disagree about what they read.

Here, not in either of them, because the two sit side by side in the layers (docs/architecture.md, Boundaries) and
import nothing of each other. Pure: strings in, strings out.

Every series is selected through the label contract (docs/architecture.md, Labels): `namespace` and
`vllmdeployment` of this VLLMDeployment, and `pool!=""`, which keeps to the engines (the router's targets are
scraped by the same PodMonitor but carry no pool). vLLM's metrics are matched by `__name__=~"vllm[:_]name"`, both
the `vllm:` and the OpenMetrics-escaped spelling. Values are quoted with PromQL's escapes (a `"` or `\\` in a name
would otherwise end the string); ranges are whole minutes where they are one, else whole seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator import constants


def quote(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def duration(seconds: float) -> str:
    """A PromQL range: whole minutes where it is one (`5m`), else whole seconds (`90s`); at least `1s`."""
    whole = max(1, round(seconds))
    return f"{whole // 60}m" if whole % 60 == 0 else f"{whole}s"


@dataclass(frozen=True)
class Signals:
    """The signals of one VLLMDeployment, aggregated `by` the given labels (the health loop: `pod, pool`; the alert
    rules keep `namespace` and `vllmdeployment` too, for their annotations and routing)."""

    namespace: str
    deployment: str
    by: str

    def matchers(self, **labels: str) -> list[str]:
        return [f"namespace={quote(self.namespace)}", f"vllmdeployment={quote(self.deployment)}", 'pool!=""',
                *(f"{k}={quote(v)}" for k, v in sorted(labels.items()))]

    def vllm(self, metric: str, **labels: str) -> str:
        """A vLLM series of this deployment's engines (either spelling of its name)."""
        return "{" + ", ".join([constants.metric_name(metric), *self.matchers(**labels)]) + "}"

    def plain(self, metric: str, **labels: str) -> str:
        """A series of a plain name (`up`, the engine wrapper's `vllm_operator_engine_…`)."""
        return metric + "{" + ", ".join(self.matchers(**labels)) + "}"

    def up(self) -> str:
        """1 while every endpoint of a pod (vLLM's and the wrapper's) answers its scrape, 0 once one does not."""
        return f"min by ({self.by}) ({self.plain('up')})"

    def running_min(self, stall_s: float) -> str:
        """The fewest requests running at any point of the stall window (above 0: busy for all of it)."""
        return (f"min by ({self.by}) (min_over_time({self.vllm(constants.METRIC_RUNNING)}"
                f"[{duration(stall_s)}]))")

    def generated(self, stall_s: float) -> str:
        """Tokens generated over the stall window (0 while busy: Stalled)."""
        return (f"sum by ({self.by}) (increase({self.vllm(constants.METRIC_GENERATION_TOKENS)}"
                f"[{duration(stall_s)}]))")

    def kv_usage_avg(self, window_s: float) -> str:
        """KV cache usage averaged over the window (at or above kvUsagePressure: KVPressure)."""
        return f"max by ({self.by}) (avg_over_time({self.vllm(constants.METRIC_KV_USAGE)}[{duration(window_s)}]))"

    def unresponsive(self) -> str:
        """1 while the engine wrapper's one-token probes of an idle engine keep failing although vLLM's /health
        answers (`engine/idleprobe.py`; at or above 1: EngineUnresponsive)."""
        return f"max by ({self.by}) ({self.plain(constants.METRIC_ENGINE_UNRESPONSIVE)})"

    def finished(self, window_s: float, reason: str | None = None) -> str:
        """Requests finished over the window (with `reason`: those that stopped for it; `length`: at max_tokens)."""
        labels = {"finished_reason": reason} if reason else {}
        return (f"sum by ({self.by}) (increase({self.vllm(constants.METRIC_REQUEST_SUCCESS, **labels)}"
                f"[{duration(window_s)}]))")


__all__ = ["Signals", "duration", "quote"]
