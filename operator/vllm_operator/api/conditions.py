"""Kubernetes-style condition lists: set one condition, keeping its transition time while its status holds.

Both status writers (the controller and the health loop) use these, so conditions keep one order (the contract's
list of types) and one rule for lastTransitionTime.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_operator import constants
from vllm_operator.api.status import Condition, ConditionStatus, VLLMDeploymentStatus

MESSAGE_MAX = 4000


def set_condition(conditions: Iterable[Condition], type_: str, status: bool | ConditionStatus, reason: str,
                  message: str, *, generation: int | None, now: str) -> list[Condition]:
    """Conditions with `type_` set; lastTransitionTime moves only when the status value changes."""
    value = status if isinstance(status, ConditionStatus) else (
        ConditionStatus.TRUE if status else ConditionStatus.FALSE)
    out: list[Condition] = []
    since = now
    for cond in conditions:
        if cond.type == type_:
            since = cond.last_transition_time or now if cond.status == value else now
        else:
            out.append(cond)
    out.append(Condition(type=type_, status=value, reason=reason, message=message[:MESSAGE_MAX],
                         last_transition_time=since, observed_generation=generation))
    order = {t: i for i, t in enumerate(constants.CONDITION_TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


def get_condition(status: VLLMDeploymentStatus | None, type_: str) -> Condition | None:
    for cond in status.conditions if status else []:
        if cond.type == type_:
            return cond
    return None
