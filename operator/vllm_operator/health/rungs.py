"""The next rungs of each pool's remediation ladders, as the health policy reads them (`policy.LadderView`).

Apart from `health/loop.py` because it is pure (a Plan in, views out): re-planning after an engine exit — the
decision the operator takes from an exit code and a termination message — then runs on a bare Python with the
product's pure core, without the Prometheus client or the Kubernetes client that the loop's readers need
(benchmarks/gpu/replan.py on the GPU machine; `tests/unit/health/test_replan_imports.py`).
"""

from __future__ import annotations

from vllm_operator.api.plan import Plan
from vllm_operator.health import policy
from vllm_operator.planning import ladder


def ladder_views(the_plan: Plan, allow_lower_max_model_len: bool) -> dict[str, policy.LadderView]:
    views = {}
    for name, pool in the_plan.pools.items():
        if not pool.enabled:
            continue
        mem = ladder.next_step_down_level(the_plan, name)
        kv = ladder.next_kv_level(the_plan, name, allow_lower_max_model_len)
        views[name] = policy.LadderView(
            next_memory=(mem, ladder.describe_rung(the_plan, name, mem)) if mem is not None else None,
            next_kv=(kv, ladder.describe_kv_rung(the_plan, name, kv, allow_lower_max_model_len))
            if kv is not None else None,
            host_memory=not the_plan.accelerator.is_gpu)
    return views
