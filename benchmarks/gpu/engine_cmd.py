#!/usr/bin/env python3
"""Turns a planner's JSON plan into the vLLM command the GPU benchmark runs, and checks the plan against vLLM.

Why: issue 12 tests what the operator would deploy, so the engine arguments are never written by hand — they come
from `vllm-operator plan FILE -o json --engine-version 0.26.0`. This script adds only what a launcher must add
(docs/architecture.md, Plan: each launcher prepends its own command): the command itself, the local model
directory in place of the plan's model, `$(POD_IP)` and other `$(VAR)` references expanded as the kubelet would,
paths under the pod's volume mounts (`/models`) mapped to local directories as the volume mount would
(`--mount /models=/tmp/models`), and the benchmark-only `--load-format=dummy` (real shapes, no weights). It also
compares the plan's KV cache with what vLLM allocated
(`vllm:cache_config_info` from /metrics), the planner-accuracy number the issue asks for.

Standard library only: it runs on the GPU machine's bare Python next to the load generator.

  python3 engine_cmd.py argv PLAN.json --pool long --model-dir /tmp/model     # prints a shell command line
  python3 engine_cmd.py facts PLAN.json                                       # planned KV per pool, JSON
  python3 engine_cmd.py compare PLAN.json --pool long --metrics metrics.txt   # planned vs observed, JSON
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

LAUNCHER = ("python3", "-m", "vllm.entrypoints.cli.main", "serve")
"""How the GPU machine starts vLLM (its `vllm` console script is not installed there)."""
BENCHMARK_ARGS = ("--load-format=dummy",)
"""Added by the benchmark, never by the planner: weightless model directories."""
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_INFO_LABELS = re.compile(r'(\w+)="([^"]*)"')


class PlanError(ValueError):
    """The plan file cannot be used as asked (the message names the pool, flag or variable)."""


def load_pool(plan: dict[str, Any], pool: str) -> dict[str, Any]:
    pools = plan.get("pools")
    if not isinstance(pools, dict) or pool not in pools:
        have = sorted(pools) if isinstance(pools, dict) else []
        raise PlanError(f"plan has no pool {pool!r} (pools: {have})")
    p: dict[str, Any] = pools[pool]
    if not p.get("enabled", True):
        raise PlanError(f"pool {pool!r} is disabled in the plan")
    if not isinstance(p.get("engineArgs"), list):
        raise PlanError(f"pool {pool!r} has no engineArgs list")
    return p


def expand(arg: str, variables: dict[str, str]) -> str:
    """Expand `$(VAR)` as the kubelet does; an unknown variable is an error (the kubelet would leave it verbatim,
    which vLLM would then reject less clearly)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in variables:
            raise PlanError(f"engine argument {arg!r} refers to $({name}), which has no value here")
        return variables[name]

    return _VAR.sub(sub, arg)


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def remount(value: str, mounts: dict[str, str]) -> str:
    """Map a path under a pod volume mount to its local stand-in (`/models/x` -> `/tmp/models/x`), also in
    `--flag=/models/x` form; anything else is returned unchanged."""
    prefix, sep, path = value.partition("=") if value.startswith("--") else ("", "", value)
    if not sep:
        prefix, path = "", value
    for src, dst in mounts.items():
        root = src.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return prefix + sep + dst.rstrip("/") + path[len(root) :]
    return value


def build_argv(
    plan: dict[str, Any],
    pool: str,
    model_dir: str,
    host: str,
    port: int | None,
    mounts: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command (launcher + model dir + the plan's args, expanded and remounted) and the plan's environment."""
    p = load_pool(plan, pool)
    mounts = mounts or {}
    env = {str(k): remount(str(v), mounts) for k, v in (p.get("env") or {}).items()}
    variables = {**os.environ, **env, "POD_IP": host}
    args = [remount(expand(str(a), variables), mounts) for a in p["engineArgs"]]
    if port is not None:
        args = [a for a in args if flag_name(a) != "--port"] + [f"--port={port}"]
    planned = {flag_name(a) for a in args}
    clash = planned & {flag_name(a) for a in BENCHMARK_ARGS}
    if clash:
        raise PlanError(f"pool {pool!r}: the plan already sets {sorted(clash)}, which the benchmark adds itself")
    return [*LAUNCHER, model_dir, *args, *BENCHMARK_ARGS], env


def facts(plan: dict[str, Any]) -> dict[str, Any]:
    """What the plan predicts per enabled pool, for comparing with vLLM's own numbers."""
    out: dict[str, Any] = {}
    for name, p in (plan.get("pools") or {}).items():
        if not p.get("enabled", True):
            continue
        kv = p.get("kv") or {}
        out[name] = {
            "servedModelName": p.get("servedModelName"),
            "maxModelLen": p.get("maxModelLen"),
            "kvCacheDtype": p.get("kvCacheDtype"),
            "gpuMemoryUtilization": p.get("gpuMemoryUtilization"),
            "maxNumBatchedTokens": p.get("maxNumBatchedTokens"),
            "maxNumSeqs": p.get("maxNumSeqs"),
            "plannedTokens": kv.get("plannedTokens"),
            "concurrencyAtFullLength": kv.get("concurrencyAtFullLength"),
        }
    return out


def parse_cache_config(metrics_text: str) -> dict[str, str]:
    """Labels of `vllm:cache_config_info` (or `vllm_cache_config_info`) from a Prometheus text page."""
    for line in metrics_text.splitlines():
        if line.startswith(("vllm:cache_config_info{", "vllm_cache_config_info{")):
            return dict(_INFO_LABELS.findall(line[line.index("{") : line.rindex("}") + 1]))
    raise PlanError("no vllm:cache_config_info series in the metrics text")


def compare(plan: dict[str, Any], pool: str, metrics_text: str) -> dict[str, Any]:
    """Planned vs observed KV tokens and concurrency; `error_pct` is (planned - observed) / observed x 100."""
    p = load_pool(plan, pool)
    kv = p.get("kv") or {}
    info = parse_cache_config(metrics_text)
    if "kv_cache_size_tokens" in info and info["kv_cache_size_tokens"] not in ("", "None"):
        observed = int(info["kv_cache_size_tokens"])
    else:  # older vLLM: blocks x block size
        observed = int(info["num_gpu_blocks"]) * int(info["block_size"])
    planned = int(kv["plannedTokens"])
    max_len = int(p["maxModelLen"])
    return {
        "pool": pool,
        "kvCacheDtype": {"planned": p.get("kvCacheDtype"), "observed": info.get("cache_dtype")},
        "kvTokens": {
            "planned": planned,
            "observed": observed,
            "error_pct": round((planned - observed) / observed * 100, 2) if observed else None,
        },
        "concurrencyAtFullLength": {
            "planned": kv.get("concurrencyAtFullLength"),
            "observed": round(observed / max_len, 2),
        },
        "cacheConfigInfo": info,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="engine_cmd.py", description="vLLM command lines and checks from a plan")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("argv", help="print the engine command (shell-quoted; --json for a list)")
    a.add_argument("plan")
    a.add_argument("--pool", required=True)
    a.add_argument("--model-dir", required=True, help="local model directory (replaces the plan's model)")
    a.add_argument("--host", default="127.0.0.1", help="value of $(POD_IP)")
    a.add_argument("--port", type=int, default=None, help="replace/add --port")
    a.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="POD_PATH=LOCAL_PATH",
        help="map a pod volume mount to a local directory, e.g. /models=/tmp/models",
    )
    a.add_argument("--json", action="store_true")
    f = sub.add_parser("facts", help="planned KV facts per pool, JSON")
    f.add_argument("plan")
    c = sub.add_parser("compare", help="planned vs vLLM's vllm:cache_config_info, JSON")
    c.add_argument("plan")
    c.add_argument("--pool", required=True)
    c.add_argument("--metrics", required=True, help="a saved /metrics page")
    args = ap.parse_args(argv)
    try:
        plan = json.loads(Path(args.plan).read_text())
        if args.cmd == "argv":
            mounts = dict(m.split("=", 1) for m in args.mount if "=" in m)
            if len(mounts) != len(args.mount):
                raise PlanError(f"--mount takes POD_PATH=LOCAL_PATH, got {args.mount}")
            cmd, env = build_argv(plan, args.pool, args.model_dir, args.host, args.port, mounts)
            if args.json:
                print(json.dumps({"argv": cmd, "env": env}))
            else:
                print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())), shlex.join(cmd)]))
        elif args.cmd == "facts":
            print(json.dumps(facts(plan), indent=2))
        else:
            print(json.dumps(compare(plan, args.pool, Path(args.metrics).read_text()), indent=2))
    except (PlanError, OSError, json.JSONDecodeError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
