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
        views[name] = policy.LadderView(
            next_memory=ladder.next_rung(the_plan, name),
            next_kv=ladder.next_rung(the_plan, name, kv=True, allow_lower_max_model_len=allow_lower_max_model_len),
            host_memory=not the_plan.accelerator.is_gpu)
    return views
