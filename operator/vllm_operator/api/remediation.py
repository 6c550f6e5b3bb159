"""What `spec.remediation` means once its defaults are filled in: the health loop's knobs and the alert thresholds.

One resolution for both readers, so an alert and the loop never disagree on a threshold (the OOM alert counts
`oomCount` OOMs within `oomWindowSeconds`, exactly as the step-down does). It sits in `api`, the lowest layer,
because the renderer (alert rules) and the health loop (diagnose, policy) both read it and neither may import the
other. Every window and threshold is configurable (seconds in tests, minutes in production); the defaults live in the
contract module (`constants.DEFAULT_*`).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_operator.api.spec import RemediationSpec, RemediationThresholds
from vllm_operator.constants import (
    DEFAULT_BUDGET_WINDOW_S,
    DEFAULT_INTERVAL_S,
    DEFAULT_KV_PRESSURE,
    DEFAULT_LENGTH_SHARE_ALERT,
    DEFAULT_LENGTH_SHARE_WATCH,
    DEFAULT_OOM_COUNT,
    DEFAULT_OOM_WINDOW_S,
    DEFAULT_RESTART_BUDGET,
    DEFAULT_STALL_S,
    DEFAULT_WINDOW_S,
    MIN_FINISHED_FOR_SHARE,
)


@dataclass(frozen=True)
class HealthSettings:
    """Resolved remediation settings (all durations in seconds)."""

    enabled: bool = True
    interval_s: float = DEFAULT_INTERVAL_S
    window_s: float = DEFAULT_WINDOW_S
    stall_s: float = DEFAULT_STALL_S
    length_share_watch: float = DEFAULT_LENGTH_SHARE_WATCH
    length_share_alert: float = DEFAULT_LENGTH_SHARE_ALERT
    kv_pressure: float = DEFAULT_KV_PRESSURE
    oom_count: int = DEFAULT_OOM_COUNT
    oom_window_s: float = DEFAULT_OOM_WINDOW_S
    restart_budget: int = DEFAULT_RESTART_BUDGET
    budget_window_s: float = DEFAULT_BUDGET_WINDOW_S
    step_down: bool = True
    step_up_after_s: float | None = None
    allow_lower_max_model_len: bool = False
    reset_token: str | None = None
    min_finished: int = MIN_FINISHED_FOR_SHARE

    @property
    def stale_after_s(self) -> float:
        """Metric samples older than this are stale: no decision rests on them."""
        return max(15.0, 2.0 * self.interval_s)


def default_thresholds() -> RemediationThresholds:
    """The operator's detection thresholds with every field set (what the built-in workload classes show)."""
    return RemediationThresholds(
        length_share_warn=DEFAULT_LENGTH_SHARE_WATCH, length_share_alert=DEFAULT_LENGTH_SHARE_ALERT,
        kv_usage_pressure=DEFAULT_KV_PRESSURE, stall_seconds=DEFAULT_STALL_S, window_seconds=DEFAULT_WINDOW_S,
        oom_count=DEFAULT_OOM_COUNT, oom_window_seconds=DEFAULT_OOM_WINDOW_S)


def merge_thresholds(own: RemediationThresholds | None, klass: RemediationThresholds | None
                     ) -> RemediationThresholds | None:
    """The thresholds in effect: the VLLMDeployment's own fields over its workload class's, field by field (a
    deployment that sets only stallSeconds keeps the class's windowSeconds). None when neither sets any."""
    if own is None or klass is None:
        return own if own is not None else klass
    return klass.model_copy(update=own.model_dump(exclude_none=True))


def resolve(spec: RemediationSpec | None, *, thresholds: RemediationThresholds | None = None,
            interval_override: float | None = None) -> HealthSettings:
    """Defaults filled in; `thresholds` (the plan's, class merged in) replaces the spec's own when given;
    `interval_override` (operator flag, tests) replaces every deployment's interval."""
    r = spec or RemediationSpec()
    t = thresholds if thresholds is not None else r.thresholds
    interval = interval_override if interval_override is not None else (r.interval_seconds or DEFAULT_INTERVAL_S)

    def pick(value: float | int | None, default: float | int) -> float:
        return float(default if value is None else value)

    return HealthSettings(
        enabled=r.enabled is not False,
        interval_s=float(interval),
        window_s=pick(t.window_seconds if t else None, DEFAULT_WINDOW_S),
        stall_s=pick(t.stall_seconds if t else None, DEFAULT_STALL_S),
        length_share_watch=pick(t.length_share_warn if t else None, DEFAULT_LENGTH_SHARE_WATCH),
        length_share_alert=pick(t.length_share_alert if t else None, DEFAULT_LENGTH_SHARE_ALERT),
        kv_pressure=pick(t.kv_usage_pressure if t else None, DEFAULT_KV_PRESSURE),
        oom_count=int(pick(t.oom_count if t else None, DEFAULT_OOM_COUNT)),
        oom_window_s=pick(t.oom_window_seconds if t else None, DEFAULT_OOM_WINDOW_S),
        restart_budget=int(pick(r.restart_budget, DEFAULT_RESTART_BUDGET)),
        budget_window_s=pick(r.budget_window_seconds, DEFAULT_BUDGET_WINDOW_S),
        step_down=r.step_down is not False,
        step_up_after_s=None if r.step_up_after_seconds is None else float(r.step_up_after_seconds),
        allow_lower_max_model_len=bool(r.allow_lower_max_model_len),
        reset_token=r.reset_token,
    )
