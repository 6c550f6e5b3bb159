"""Planning: from a VLLMDeployment spec to engine arguments, a KV budget, capacity figures and the router's config.

Pure code (no kopf, no Kubernetes client, no I/O): catalog (GPU and model facts), profiles (workload classes),
kvcache (the memory model), engine_args (version-gated flags), ladder (step-down rungs) and planner (`plan()`).
"""

from vllm_operator.planning.planner import PlanContext, PoolRemediation, RemediationState, plan, plan_for, resolve_class

__all__ = ["PlanContext", "PoolRemediation", "RemediationState", "plan", "plan_for", "resolve_class"]
