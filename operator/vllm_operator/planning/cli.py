"""`vllm-operator plan`: plan a VLLMDeployment offline and show what the operator would run.

The CLI is the planner's only I/O shell (reading the file and an optional config.json); planning itself stays pure.
Exit codes are a contract for scripts and CI: 0 = planned (warnings may be printed), 2 = refused or unreadable
input, with one line on stderr naming the file, the field and the numbers — never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, Plan, PoolPlan
from vllm_operator.planning import catalog, kvcache
from vllm_operator.planning.cli_inputs import (
    Parser,
    Planned,
    UsageError,
    add_input_arguments,
    display_name,
    facts_block,
    facts_missing,
    input_file,
    plan_input,
)

PROG = "vllm-operator plan"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Plan a VLLMDeployment: engine args, KV budget, capacity, warnings.")
    add_input_arguments(p, "planned")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    return p


def _gib(n: float) -> str:
    return f"{n / catalog.GIB:.2f}"


def _cache_line(pool: PoolPlan) -> str:
    """Where the pool's Hub weights are cached (docs/weights-cache.md)."""
    c = pool.weights_cache
    assert c is not None
    where = f"node cache {c.host_path}" if c.host_path else f"claim {c.claim_name}"
    return f"{c.repo}@{c.revision or 'main'} fetched once into the {where} (limit {_gib(c.max_bytes)} GiB)"


def _pool_lines(pool: PoolPlan, acc: AcceleratorFacts) -> list[str]:
    state = "enabled" if pool.enabled else "disabled"
    lo, hi = pool.prompt_range
    lines = [f"pool {pool.name}: {state}, replicas {pool.replicas}"
             f"{' (external autoscaler)' if pool.external_autoscaler else ''}, prompts [{lo}, {hi}) tokens, "
             f"maxModelLen {pool.max_model_len}, maxTokens {pool.max_tokens}",
             f"  model  {pool.model}",
             *([f"  weights  {_cache_line(pool)}"] if pool.weights_cache is not None else []),
             f"  image  {pool.image}",
             "  args"]
    lines += [f"    {arg}" for arg in pool.engine_args]
    b, kv = pool.kv.breakdown, pool.kv
    per = " per GPU" if acc.is_gpu and acc.count > 1 else ""
    if acc.is_gpu:
        head = f"{_gib(b.device_bytes)} GiB x {b.utilization} = {_gib(b.device_bytes * b.utilization)} GiB"
    else:
        head = f"{_gib(b.device_bytes)} GiB pod memory"
    lines.append(f"  KV budget{per}: {head} - weights {_gib(b.weights_bytes)} - activations "
                 f"{_gib(b.activation_bytes)} - non-torch {_gib(b.non_torch_bytes)} - CUDA graphs "
                 f"{_gib(b.cuda_graph_bytes)} - margin {_gib(b.margin_bytes)} = {_gib(kv.budget_bytes)} GiB")
    lines.append(f"  KV cache: {kv.bytes_per_token / 1024:g} KiB/token ({pool.kv_cache_dtype}) -> "
                 f"{kv.planned_tokens:,} tokens (blocks of "
                 f"{kvcache.BLOCK_SIZE if acc.is_gpu else kvcache.CPU_BLOCK_SIZE})")
    lines.append(f"  capacity: {kv.concurrency_at_full_length:g} sequences at {pool.max_model_len} tokens, "
                 f"{kv.concurrency_at_typical_length:g} at a typical {kv.typical_sequence_tokens}; "
                 f"max_num_seqs {pool.max_num_seqs}, max_num_batched_tokens {pool.max_num_batched_tokens}")
    if pool.step_down_level or pool.kv_level:
        lines.append(f"  remediation: step-down level {pool.step_down_level}, KV level {pool.kv_level}")
    lines += [f"  warning: {w}" for w in pool.warnings]
    return lines


def format_table(p: Plan) -> str:
    acc = p.accelerator
    if acc.is_gpu:
        cc = f", cc {acc.compute_capability[0]}.{acc.compute_capability[1]}" if acc.compute_capability else ""
        device = f"{acc.type} x{acc.count} ({_gib(acc.memory_bytes)} GiB{cc})"
    else:
        device = f"cpu ({_gib(acc.memory_bytes)} GiB)"
    r = p.router
    tiers = ", ".join(f"{t.name} (default {t.default_max_tokens}, cap {t.max_tokens})" for t in r.tiers)
    t = r.timeouts
    lines = [f"VLLMDeployment {p.namespace}/{p.name}: class {p.workload_class}, {device}, vLLM {p.engine_version}, "
             f"plan {p.hash[:12]}",
             f"router: model {r.model}, threshold {r.prompt_length_threshold} prompt tokens, over-limit "
             f"{r.over_limit.value}, tiers {tiers}",
             f"  timeouts connect {t.connect_seconds:g}s, first byte {t.first_byte_seconds:g}s, idle "
             f"{t.idle_seconds:g}s, total {t.total_seconds:g}s; max body {r.max_body_bytes} bytes; auth "
             f"{'on' if r.api_keys_dir else 'off'}"]
    for pool in p.pools.values():
        lines += _pool_lines(pool, acc)
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)


def _facts_lines(item: Planned) -> list[str]:
    """spec.model.facts for a plan made with --model-config: the operator in the cluster has no such flag."""
    assert item.spec.model.facts is not None
    lines = [f"model facts: planned from --model-config; {item.plan.namespace}/{item.plan.name} does not carry "
             "them, so add this to the VLLMDeployment before applying it (the operator plans from the spec):"]
    lines += ["  " + line for line in facts_block(item.spec.model.facts).splitlines()]
    return lines


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        path = input_file(args)
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    try:
        planned = plan_input(path, args)
    except SpecError as err:
        print(f"{PROG}: {display_name(path)}: {err}".replace("\n", " "), file=sys.stderr)
        return 2
    if args.output == "json":
        wire = [item.plan.to_wire() for item in planned]
        text = json.dumps(wire[0] if len(wire) == 1 else wire, indent=2, sort_keys=True)
        for item in filter(facts_missing, planned):  # stdout stays the Plan; the reminder goes to the reader
            assert item.spec.model.facts is not None
            print(f"{PROG}: note: {item.plan.namespace}/{item.plan.name} was planned from --model-config; the "
                  f"operator needs spec.model.facts: {json.dumps(item.spec.model.facts.to_wire(), sort_keys=True)}",
                  file=sys.stderr)
    else:
        text = "\n\n".join("\n".join([format_table(item.plan), *(_facts_lines(item) if facts_missing(item) else [])])
                            for item in planned)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `plan ... | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
    return 0
