"""Spec builders for planner tests: a small valid spec, changed only where a test says so."""

from __future__ import annotations

import copy
from typing import Any

from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_spec
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.planning import RemediationState, plan

BASE: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workloadClass": "chat",
    "accelerator": {"type": "nvidia-h100-80gb"},
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def make_spec(**patch: Any) -> VLLMDeploymentSpec:
    return parse_spec(merge(BASE, patch))


def make_plan(state: RemediationState | None = None, engine_version: str | None = None, **patch: Any) -> Plan:
    return plan(make_spec(**patch), None, state or RemediationState(), name="demo", namespace="ns",
                engine_version=engine_version)


def arg(p: Plan, pool: str, flag: str) -> str | None:
    """Value of --flag in a pool's args ('' for a bare flag, None when absent)."""
    for item in p.pools[pool].engine_args:
        name, _, value = item.partition("=")
        if name == flag:
            return value
    return None
