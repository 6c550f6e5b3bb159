"""The webhook's verdicts: the planner's refusals and warnings for the examples' impossible neighbours.

Named GPU types never read the cluster, so these run with a KubeApi that fails the test on any call; `auto`
against real nodes is tested on the real control plane.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_operator.handlers.admission import WEBHOOK_ID, AdmissionLogFilter, review
from vllm_operator.k8s import KubeError

CHAT = yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())


class NoCluster:
    """Any request fails: a verdict for a named GPU type must come from the planner alone."""

    def __getattr__(self, name: str) -> Any:
        async def call(*_: Any, **__: Any) -> Any:
            raise AssertionError(f"the webhook called the API ({name}) for a named GPU type")
        return call


class Forbidden:
    async def list(self, *_: Any, **__: Any) -> Any:
        raise KubeError(403, "Forbidden", "nodes is forbidden")


def chat(**spec: Any) -> dict[str, Any]:
    obj = copy.deepcopy(CHAT)
    for key, value in spec.items():
        obj["spec"][key] = value
    return obj


IMPOSSIBLE = {
    "128K on an L4": (chat(pools={"short": {"replicas": 2}, "long": {"replicas": 1, "maxModelLen": 131072}}),
                      "spec.pools.long"),
    "70B on one L4": (chat(model={**CHAT["spec"]["model"], "name": "meta-llama/Llama-3.1-70B-Instruct"}),
                      "spec."),
    "TP not dividing heads": (chat(accelerator={"type": "nvidia-l4-24gb", "count": 3}), "spec."),
    "tier cap above the long pool": (chat(routing={**CHAT["spec"]["routing"], "tiers": [
        {"name": "free", "defaultMaxTokens": 256, "maxTokens": 10_000_000}]}), "spec."),
}


@pytest.mark.parametrize("case", list(IMPOSSIBLE))
async def test_impossible_specs_are_refused_with_the_planners_message(case: str) -> None:
    obj, field = IMPOSSIBLE[case]
    verdict = await review(NoCluster(), "CREATE", obj, None)  # type: ignore[arg-type]
    assert not verdict.allowed, case
    assert verdict.message.startswith(field), verdict.message
    assert any(ch.isdigit() for ch in verdict.message), f"names the numbers: {verdict.message}"


async def test_the_example_is_allowed_with_the_planners_warnings() -> None:
    plain = await review(NoCluster(), "CREATE", chat(), None)  # type: ignore[arg-type]
    assert plain.allowed
    # The pools' own warnings reach kubectl too, as status.plan.warnings shows them (the example's pools each say
    # how few full-length sequences fit on an L4).
    assert any(w.startswith("pools.short:") and "sequences" in w for w in plain.warnings), plain.warnings
    assert any(w.startswith("pools.long:") for w in plain.warnings), plain.warnings
    # A tier whose default does not fit the short pool: allowed, and the planner's warning says why it matters.
    obj = chat(routing={**CHAT["spec"]["routing"], "tiers": [{"name": "free", "defaultMaxTokens": 1024,
                                                              "maxTokens": 1024}]})
    verdict = await review(NoCluster(), "CREATE", obj, None)  # type: ignore[arg-type]
    assert verdict.allowed, verdict.message
    assert any("free" in w for w in verdict.warnings), verdict.warnings


async def test_unchanged_spec_and_deleted_objects_are_never_judged() -> None:
    bad, _ = IMPOSSIBLE["128K on an L4"]
    assert (await review(NoCluster(), "UPDATE", bad, copy.deepcopy(bad))).allowed  # type: ignore[arg-type]
    deleting = copy.deepcopy(bad)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert (await review(NoCluster(), "UPDATE", deleting, chat())).allowed  # type: ignore[arg-type]
    edit = await review(NoCluster(), "UPDATE", bad, chat())  # type: ignore[arg-type]
    assert not edit.allowed, "an edit that makes a running deployment impossible is refused"


async def test_auto_is_allowed_with_a_warning_when_nodes_cannot_be_read() -> None:
    obj = chat(accelerator={"type": "auto", "count": 1})
    verdict = await review(Forbidden(), "CREATE", obj, None)  # type: ignore[arg-type]
    assert verdict.allowed
    assert verdict.warnings and "spec.accelerator.type" in verdict.warnings[0]


def test_kopfs_error_line_for_a_refusal_is_dropped() -> None:
    """kopf words it so (kopf/_core/actions/execution.py, 1.45): a refusal is logged once by us, as a WARNING."""
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, None, None)

    keep = AdmissionLogFilter().filter
    assert not keep(record(f"Webhook {WEBHOOK_ID!r} failed permanently: spec.pools.long: ..."))
    assert not keep(record(f"Webhook {WEBHOOK_ID!r} succeeded."))
    assert keep(record("Handler 'reconcile' failed permanently: boom"))


async def test_a_paused_deployment_is_allowed_with_a_warning_kubectl_prints() -> None:
    """Issue 42: both pools at replicas 0 is legal (a pause) and was accepted without a word."""
    verdict = await review(NoCluster(), "CREATE", chat(pools={"short": {"replicas": 0}, "long": {"replicas": 0}}),
                           None)  # type: ignore[arg-type]
    assert verdict.allowed, verdict.message
    assert any(w.startswith("pools: both pools are at replicas 0") for w in verdict.warnings), verdict.warnings
