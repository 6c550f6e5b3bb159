"""The adapters ConfigMap: which LoRA adapters each pool's engines load, for the engine wrapper to follow.

Why a ConfigMap and not engine arguments: vLLM can load and unload adapters at run time, and the pod template (whose
hash rolls the engines) only names this ConfigMap. The kubelet refreshes a ConfigMap mounted as a directory (not
through subPath) in place, the wrapper sees the new file and loads what was added and unloads what was removed
(`engine/adapters.py`). One key per pool, `<pool>.json`:

    {"adapters": [{"name": "sql", "path": "/adapters/<claim>/<path>"},
                  {"name": "chat", "hfRepo": "org/repo", "hfRevision": "abc"}]}

Each adapter's source is the plan's (`Plan.adapters`). PVC-sourced adapters are read from `/adapters/<claimName>`
(`engine.adapter_volumes` mounts each claim once, read-only); Hub-sourced ones are downloaded by the wrapper into an
emptyDir at `/adapters/.hub` (the model's `/models` may be a read-only PVC).
"""

from __future__ import annotations

from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import AdapterPlan, Plan, PoolPlan
from vllm_operator.rendering import common


def lora_enabled(pool: PoolPlan) -> bool:
    """The plan turned LoRA on for this pool: it allocates adapter slots (read from the plan, never from argv)."""
    return pool.lora_slots > 0


def file_name(pool: str) -> str:
    return f"{pool}.json"


def entry(adapter: AdapterPlan) -> dict[str, Any]:
    if adapter.hf_repo is not None:
        out: dict[str, Any] = {"name": adapter.name, "hfRepo": adapter.hf_repo}
        if adapter.hf_revision:
            out["hfRevision"] = adapter.hf_revision
        return out
    return {"name": adapter.name, "path": adapter.path}


def pool_file(plan: Plan, pool: PoolPlan) -> str:
    by_name = {a.name: a for a in plan.adapters}
    return common.canonical_json({"adapters": [entry(by_name[n]) for n in pool.adapters]}) + "\n"


def config_map(plan: Plan) -> common.Manifest | None:
    """The ConfigMap, or None when no pool has LoRA on."""
    pools = [p for p in sorted(plan.pools.values(), key=lambda p: p.name) if p.enabled and lora_enabled(p)]
    if not pools:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(plan, names.adapters(plan.name), common.base_labels(plan,
                                                                                       constants.COMPONENT_ENGINE)),
        "data": {file_name(p.name): pool_file(plan, p) for p in pools},
    }
