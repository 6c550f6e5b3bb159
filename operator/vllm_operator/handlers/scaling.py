"""A pool's autoscaler in the status, without I/O: what KEDA's HPA (and, at zero, the ScaledObject) last decided, and
the wake of a pool from zero as two events (asked to wake; first replica Ready, with the time between).

Why both objects: while a pool sleeps at zero the HPA only says ScalingActive=False ("scaling is disabled since the
replica count of the target is zero"); KEDA's own decision is the ScaledObject's Active condition.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vllm_operator import constants
from vllm_operator.api.status import AutoscalerStatus, PoolStatus, VLLMDeploymentStatus

HPA_PREFIX = "keda-hpa-"
"""KEDA names the HPA of ScaledObject X `keda-hpa-X` (the ScaledObject sets no other name)."""


@dataclass(frozen=True)
class WakeEvent:
    reason: str
    message: str


def _condition(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond  # type: ignore[no-any-return]
    return None


def autoscaler_status(hpa: Mapping[str, Any] | None, scaled_object: Mapping[str, Any] | None) -> AutoscalerStatus:
    """The pool's AutoscalerStatus from its HPA and ScaledObject (either may be absent while KEDA creates them)."""
    status = (hpa or {}).get("status") or {}
    active = _condition(scaled_object, "Active")
    decision: str | None = None
    current = status.get("currentReplicas")
    if active is not None and active.get("status") == "False" and not current:
        decision = f"asleep at 0: {active.get('message') or active.get('reason') or 'no trigger is active'}"
    else:
        for type_ in ("ScalingLimited", "AbleToScale", "ScalingActive"):
            cond = _condition(hpa, type_)
            if cond is not None and (type_ != "ScalingLimited" or cond.get("status") == "True"):
                decision = f"{type_} {cond.get('reason', '')}: {cond.get('message', '')}".strip()
                break
    if decision is None and scaled_object is not None and hpa is None:
        decision = "waiting for KEDA to create the HPA"
    return AutoscalerStatus(
        desired_replicas=status.get("desiredReplicas"), current_replicas=current,
        active=None if active is None else active.get("status") == "True",
        last_scale_time=status.get("lastScaleTime"), decision=decision[:512] if decision else None)


def _seconds_between(start: str, end: str) -> float | None:
    try:
        a = datetime.datetime.fromisoformat(start.replace("Z", "+00:00"))
        b = datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (b - a).total_seconds()


def wake(pool: str, before: PoolStatus | None, after: PoolStatus, now: str) -> tuple[PoolStatus, list[WakeEvent]]:
    """`after` with `wokeAt` kept up to date, and the events of this step of a wake from zero: PoolWaking when the
    pool is asked for replicas while it has none Ready, PoolWoke when its first replica is Ready, with the time from
    PoolWaking to then (KEDA's Active condition carries no transition time to measure from)."""
    out = after.model_copy()
    was = before.desired_replicas if before is not None else None
    woke_at = before.woke_at if before is not None else None
    if out.desired_replicas == 0:
        out.woke_at = None
        return out, []
    events: list[WakeEvent] = []
    if was == 0 and (out.desired_replicas or 0) > 0 and woke_at is None:
        woke_at = now
        scaler = out.autoscaler.decision if out.autoscaler and out.autoscaler.decision else "its autoscaler"
        if out.ready_replicas == 0:
            events.append(WakeEvent("PoolWaking", f"Pool {pool} is waking from 0: {out.desired_replicas} "
                                                  f"replica(s) asked for ({scaler})"))
    if woke_at and out.ready_replicas > 0:
        took = _seconds_between(woke_at, now) if woke_at != now else None
        after_s = (f" {took:.0f} s after it was asked to wake" if took is not None
                   else " when the wake was first seen (within one status refresh)")
        events.append(WakeEvent("PoolWoke", f"Pool {pool} woke: its first replica is Ready{after_s}"))
        woke_at = None
    out.woke_at = woke_at
    return out, events


def with_autoscalers(prev: VLLMDeploymentStatus | None, status: VLLMDeploymentStatus,
                     autoscalers: Mapping[str, AutoscalerStatus], now: str
                     ) -> tuple[VLLMDeploymentStatus, list[WakeEvent]]:
    """`status` with each autoscaled pool's autoscaler decision and wake state; the wake events to post."""
    out = status.model_copy(deep=True)
    events: list[WakeEvent] = []
    if out.pools is None:
        return out, events
    for pool in constants.POOLS:
        entry = getattr(out.pools, pool)
        if entry is None:
            continue
        if pool not in autoscalers:
            entry.autoscaler, entry.woke_at = None, None
            continue
        entry.autoscaler = autoscalers[pool]
        before = getattr(prev.pools, pool) if prev is not None and prev.pools is not None else None
        entry, steps = wake(pool, before, entry, now)
        setattr(out.pools, pool, entry)
        events += steps
    return out, events


__all__ = ["HPA_PREFIX", "WakeEvent", "autoscaler_status", "wake", "with_autoscalers"]
