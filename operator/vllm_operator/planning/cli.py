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
from typing import Any, NoReturn

import yaml

from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import AcceleratorFacts, Plan, PoolPlan
from vllm_operator.api.resource import VLLMDeployment, parse_resource
from vllm_operator.planning import catalog, kvcache
from vllm_operator.planning.planner import RemediationState, plan

PROG = "vllm-operator plan"


class UsageError(Exception):
    """A command-line mistake; the CLIs print it as one line and exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Plan a VLLMDeployment: engine args, KV budget, capacity, warnings.")
    p.add_argument("-f", "--file", help="VLLMDeployment YAML (several documents are planned in turn)")
    p.add_argument("path", nargs="?", help="the same as -f FILE")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format")
    p.add_argument("--gpu", metavar="TYPE", help="plan for this GPU type (needed offline for accelerator.type auto)")
    p.add_argument("--engine-version", metavar="V", help="vLLM version to plan the flags for (e.g. 0.26)")
    p.add_argument("--model-config", metavar="FILE",
                   help="a Hugging Face config.json describing a model outside the catalog")
    p.add_argument("--weights-gib", type=float, metavar="GIB",
                   help="weight size for --model-config (default: estimated from the shape)")
    return p


def load_documents(path: str) -> list[Any]:
    """The non-empty YAML documents of a file; SpecError (naming the file) when unreadable, invalid or empty."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as err:
        raise SpecError("", f"cannot read {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise SpecError("", f"{path} is not UTF-8 text") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError("", f"{path} is not valid YAML{where}: {problem}") from None
    if not docs:
        raise SpecError("", f"{path} is empty: expected a VLLMDeployment")
    return docs


def _model_config(path: str, weights_gib: float | None) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except OSError as err:
        raise SpecError("--model-config", f"cannot read {path}: {err.strerror or err}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise SpecError("--model-config", f"{path} is not valid JSON: {err}") from None
    if not isinstance(config, dict):
        raise SpecError("--model-config", f"{path} must hold a JSON object (a Hugging Face config.json)")
    return catalog.facts_from_hf_config(config, weights_gib=weights_gib, origin=f"--model-config {path}")


def accelerator_for_gpu(resource: VLLMDeployment, gpu: str | None) -> AcceleratorFacts | None:
    """Facts for `--gpu TYPE` (None without the flag, so the planner uses the spec's own type)."""
    if gpu is None:
        return None
    if gpu in {"cpu", "auto"}:
        raise SpecError("--gpu", f"expects a GPU type from the catalog, not {gpu!r}")
    try:
        return catalog.gpu_facts(catalog.gpu_type(gpu), resource.spec.accelerator.count)
    except SpecError as err:
        raise SpecError("--gpu", err.message) from None


def _gib(n: float) -> str:
    return f"{n / catalog.GIB:.2f}"


def _pool_lines(pool: PoolPlan, acc: AcceleratorFacts) -> list[str]:
    state = "enabled" if pool.enabled else "disabled"
    lo, hi = pool.prompt_range
    lines = [f"pool {pool.name}: {state}, replicas {pool.replicas}"
             f"{' (external autoscaler)' if pool.external_autoscaler else ''}, prompts [{lo}, {hi}) tokens, "
             f"maxModelLen {pool.max_model_len}, maxTokens {pool.max_tokens}",
             f"  model  {pool.model}",
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


def _plan_one(doc: Any, args: argparse.Namespace, facts: Any) -> Plan:
    resource = parse_resource(doc)
    spec = resource.spec
    if facts is not None:
        spec = spec.model_copy(update={"model": spec.model.model_copy(update={"facts": facts})})
    return plan(spec, accelerator_for_gpu(resource, args.gpu), RemediationState.from_status(resource.status),
                name=resource.metadata.name, namespace=resource.metadata.namespace,
                engine_version=args.engine_version)


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.file and args.path and args.file != args.path:
            raise UsageError(f"two files given ({args.file}, {args.path}); plan one -f FILE at a time")
        args.file = args.file or args.path
        if not args.file:
            raise UsageError("the following arguments are required: -f/--file")
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    where = args.file
    try:
        facts = _model_config(args.model_config, args.weights_gib) if args.model_config else None
        plans = [_plan_one(doc, args, facts) for doc in load_documents(args.file)]
    except SpecError as err:
        print(f"{PROG}: {where}: {err}".replace("\n", " "), file=sys.stderr)
        return 2
    if args.output == "json":
        wire = [p.to_wire() for p in plans]
        text = json.dumps(wire[0] if len(wire) == 1 else wire, indent=2, sort_keys=True)
    else:
        text = "\n\n".join(format_table(p) for p in plans)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `plan ... | head`: the reader left; not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
    return 0
