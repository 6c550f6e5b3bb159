#!/usr/bin/env python3
"""The health loop's reaction to one engine exit, without Kubernetes: exit code + termination message → the next plan.

Why: on the GPU machine there is no API server, but the decision the operator takes after an engine dies is pure
code — `health.snapshot.pod_facts` reads the pod the kubelet would show (the wrapper's exit code in
`lastState.terminated`, its JSON line as the termination message), `health.diagnose` names the state,
`health.policy.decide` climbs the ladder, and the planner re-plans from the new status. This script feeds the real
exit code and message through exactly those functions and writes the plan the operator would roll out next, so the
restart on the GPU runs the arguments the operator would give it.

  python3 replan.py --deployment oom.yaml --pool long --exit-code 87 --termination-message TERM.log \\
                    --engine-version 0.26.0 --out-plan PLAN.json --out-decision DECISION.json

Exit codes: 0 a new rung was chosen (PLAN.json written), 3 the loop decided not to step down (DECISION.json says why),
2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vllm_operator import constants
from vllm_operator.api import remediation as settings_mod
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.health import diagnose, policy
from vllm_operator.health.rungs import ladder_views
from vllm_operator.health.snapshot import ENGINE_CONTAINER, PodFacts, PoolFacts, Snapshot, format_time, pod_facts
from vllm_operator.planning.cli_inputs import load_documents
from vllm_operator.planning.planner import RemediationState, plan


def engine_pod(name: str, deployment: str, pool: str, exit_code: int, message: str, now: float) -> dict[str, Any]:
    """The engine pod as the API server shows it after the kubelet restarted the container once."""
    return {
        "metadata": {"name": f"{deployment}-{pool}-0", "uid": f"uid-{name}", "labels": {constants.LABEL_POOL: pool},
                     "creationTimestamp": format_time(now - 600)},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{
                "name": ENGINE_CONTAINER, "restartCount": 1, "ready": False,
                "state": {"running": {"startedAt": format_time(now - 1)}},
                "lastState": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message,
                                             "finishedAt": format_time(now - 2)}},
            }],
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="replan.py", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--deployment", required=True, help="the VLLMDeployment YAML that was planned")
    ap.add_argument("--pool", required=True, choices=constants.POOLS)
    ap.add_argument("--exit-code", type=int, required=True, help="the engine wrapper's exit code")
    ap.add_argument("--termination-message", required=True, help="file the wrapper wrote")
    ap.add_argument("--engine-version", default=None)
    ap.add_argument("--out-plan", required=True)
    ap.add_argument("--out-decision", required=True)
    args = ap.parse_args(argv)
    try:
        resource = parse_resource(load_documents(args.deployment)[0])
        message = Path(args.termination_message).read_text() if Path(args.termination_message).exists() else ""
    except (SpecError, OSError) as err:
        print(f"replan.py: {err}", file=sys.stderr)
        return 2
    meta, spec = resource.metadata, resource.spec
    before = plan(spec, None, RemediationState(), name=meta.name, namespace=meta.namespace,
                  engine_version=args.engine_version)
    settings = settings_mod.resolve(spec.remediation)
    now = time.time()
    pod: PodFacts = pod_facts(engine_pod(meta.name, meta.name, args.pool, args.exit_code, message, now))
    pools = {name: PoolFacts(name, p.replicas) for name, p in before.pools.items() if p.enabled}
    snap = Snapshot(namespace=meta.namespace, deployment=meta.name, taken_at=now, pools=pools, pods=(pod,),
                    metrics=None)
    diag = diagnose.diagnose(snap, settings)
    decision = policy.decide(diag, None, settings, ladder_views(before, settings.allow_lower_max_model_len),
                             metrics_configured=False)
    status = decision.status
    after = plan(spec, None, RemediationState.from_status(status), name=meta.name, namespace=meta.namespace,
                 engine_version=args.engine_version)
    pool_status = getattr(status.pools, args.pool) if status.pools else None
    record = {
        "termination": {"exitCode": args.exit_code, "message": message.strip()},
        "diagnosis": {"pool": args.pool, "state": diag.pools[args.pool].state.value,
                      "message": diag.pools[args.pool].message},
        "rungChanges": [{"pool": c.pool, "ladder": c.ladder, "from": c.from_level, "to": c.to_level,
                         "rung": c.description} for c in decision.rung_changes],
        "events": [{"type": e.type, "reason": e.reason, "message": e.message} for e in decision.events],
        "stepDown": pool_status.step_down.model_dump(mode="json", by_alias=True) if pool_status else None,
        "before": {k: getattr(before.pools[args.pool], k) for k in
                   ("gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype")},
        "after": {k: getattr(after.pools[args.pool], k) for k in
                  ("gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "kv_cache_dtype")},
        "afterEngineArgs": after.pools[args.pool].engine_args,
    }
    Path(args.out_decision).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    if not decision.rung_changes:
        return 3
    Path(args.out_plan).write_text(json.dumps(after.to_wire(), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
