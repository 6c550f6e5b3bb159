"""kopf's "<handler> succeeded." lines of the handler that keeps the watched VLLMDeployments are dropped; others
stay."""

from __future__ import annotations

import logging

from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import RetriedRequestFilter, RoutineSuccessFilter, build_registry


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
    assert not quiet.filter(record(lines["watched-vllmdeployment"]))
    routine = ("watched-vllmdeployment",)
    kept = [line for handler_id, line in lines.items() if handler_id not in routine]
    assert kept, "the lifecycle handlers' lines exist and stay"
    assert all(quiet.filter(record(line)) for line in kept)


def test_failures_of_the_same_handlers_stay() -> None:
    quiet = RoutineSuccessFilter()
    assert quiet.filter(record("Handler 'watched-vllmdeployment' failed temporarily: boom", logging.ERROR))
    assert quiet.filter(record("Handler 'watched-vllmdeployment' succeeded.", logging.WARNING))


def test_a_retried_request_is_a_warning_and_the_one_that_gives_up_stays_an_error() -> None:
    """The exact texts of kopf's retry loop (kopf/_cogs/clients/api.py), as the operator pod logged them after
    `helm install` created the CRD: a 429 "storage is (re)initializing" retried once, then served."""
    downgrade = RetriedRequestFilter()
    retried = record("Request attempt #1/9 failed; will retry: GET https://10.0.0.1:6443/apis/vllm-operator.dev/"
                     "v1alpha1/namespaces/team/vllmdeployments -> APITooManyRequestsError('storage is "
                     "(re)initializing')", logging.ERROR)
    assert downgrade.filter(retried) and retried.levelno == logging.WARNING and retried.levelname == "WARNING"
    final = record("Request attempt #9/9 failed; escalating: GET https://10.0.0.1:6443/api -> "
                   "APIServerError('boom')", logging.ERROR)
    assert downgrade.filter(final) and final.levelno == logging.ERROR
    other = record("Handler 'reconcile' failed with an exception. Will retry.", logging.ERROR)
    assert downgrade.filter(other) and other.levelno == logging.ERROR
