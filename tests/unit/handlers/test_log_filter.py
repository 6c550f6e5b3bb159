"""kopf's "<handler> succeeded." lines for the health tick and owned-Deployment events are dropped; others stay."""

from __future__ import annotations

import logging

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import RoutineSuccessFilter, build_registry


def record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, message, None, None)


def kopf_success_lines() -> dict[str, str]:
    """The lines kopf writes after a successful run (`f"{handler} succeeded."`), from our registry's handlers."""
    registry = build_registry(OperatorConfig(http_port=0))
    handlers = [*registry._spawning.get_all_handlers(), *registry._watching.get_all_handlers(),
                *registry._changing.get_all_handlers()]
    return {h.id: f"{h} succeeded." for h in handlers}


def test_the_routine_successes_of_our_handlers_are_dropped() -> None:
    lines = kopf_success_lines()
    quiet = RoutineSuccessFilter()
    assert not quiet.filter(record(lines["health"]))
    assert not quiet.filter(record(lines["owned-deployment-changed"]))
    kept = [line for handler_id, line in lines.items() if handler_id not in ("health", "owned-deployment-changed")]
    assert kept, "the lifecycle handlers' lines exist and stay"
    assert all(quiet.filter(record(line)) for line in kept)


def test_failures_of_the_same_handlers_stay() -> None:
    quiet = RoutineSuccessFilter()
    assert quiet.filter(record("Timer 'health' failed temporarily: boom", logging.ERROR))
    assert quiet.filter(record("Timer 'health' succeeded.", logging.WARNING))
