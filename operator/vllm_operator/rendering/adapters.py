"""The adapters ConfigMap: which LoRA adapters each pool's engines load, for the engine wrapper to follow.

Why a ConfigMap and not engine arguments: vLLM can load and unload adapters at run time, and the pod template (whose
hash rolls the engines) only names this ConfigMap. The kubelet refreshes a ConfigMap mounted as a directory (not
through subPath) in place, the wrapper sees the new file and loads what was added and unloads what was removed
(`engine/adapters.py`). One key per pool, `<pool>.json`:

    {"adapters": [{"name": "sql", "path": "/adapters/<claim>/<path>"},
                  {"name": "chat", "hfRepo": "org/repo", "hfRevision": "abc"}]}

PVC-sourced adapters are read from `/adapters/<claimName>` (`engine.adapter_claims` mounts each claim once,
read-only); Hub-sourced ones are downloaded by the wrapper into an emptyDir at `/adapters/.hub` (the model's `/models`
may be a read-only PVC).
"""

from __future__ import annotations

import posixpath
from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan, PoolPlan
from vllm_operator.api.spec import AdapterSpec, VLLMDeploymentSpec
from vllm_operator.rendering import common


def lora_enabled(pool: PoolPlan) -> bool:
    """The plan turned LoRA on for this pool (the planner adds --enable-lora exactly then)."""
    return "--enable-lora" in pool.engine_args


def file_name(pool: str) -> str:
    return f"{pool}.json"


def adapter_path(adapter: AdapterSpec) -> str:
    """The container path of a PVC-sourced adapter's directory."""
    assert adapter.source.pvc is not None
    pvc = adapter.source.pvc
    return posixpath.normpath(posixpath.join(constants.ADAPTERS_PVC_ROOT, pvc.claim_name, pvc.path.lstrip("/")))


def entry(adapter: AdapterSpec) -> dict[str, Any]:
    hub = adapter.source.hugging_face
    if hub is not None:
        out: dict[str, Any] = {"name": adapter.name, "hfRepo": hub.repo}
        if hub.revision:
            out["hfRevision"] = hub.revision
        return out
    return {"name": adapter.name, "path": adapter_path(adapter)}


def pool_file(pool: PoolPlan, spec: VLLMDeploymentSpec) -> str:
    by_name = {a.name: a for a in spec.adapters or []}
    return common.canonical_json({"adapters": [entry(by_name[n]) for n in pool.adapters]}) + "\n"


def config_map(plan: Plan, spec: VLLMDeploymentSpec) -> common.Manifest | None:
    """The ConfigMap, or None when no pool has LoRA on."""
    pools = [p for p in sorted(plan.pools.values(), key=lambda p: p.name) if p.enabled and lora_enabled(p)]
    if not pools:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(plan, names.adapters(plan.name), common.base_labels(plan,
                                                                                       constants.COMPONENT_ENGINE)),
        "data": {file_name(p.name): pool_file(p, spec) for p in pools},
    }
