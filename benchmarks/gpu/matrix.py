#!/usr/bin/env python3
"""Issue 38: the compatibility matrix — does every engine the planner writes for a GPU start?

Two halves, so the GPU time goes to engines only:

* `stage` (here, with the operator's venv): for each cell, a VLLMDeployment is written, planned and **rendered with
  the product's own renderer** (`vllm_operator.rendering.cli.render_documents`, what the operator applies); the
  started pool's Deployment gives the engine container's command and arguments
  (`vllm-operator engine -- vllm serve MODEL ...`) and env, its router ConfigMap the router's config; the plan gives
  the planned weights and KV tokens. A cell the planner refuses is recorded with its message and never started. The
  shapes' `config.json` files (`matrix/shapes/`, written from the models' published architecture numbers) get a
  small tokenizer, and everything a GPU call needs is copied into one folder.
* `run` (the GPU machine, standard library only): each staged cell in turn, alone on the GPU — the container's
  command and arguments as rendered, with only what a launcher substitutes (below); wait for the wrapper's
  `/startup` to say Serving (the kubelet's startup probe); scrape `vllm:cache_config_info`; one chat request through
  `vllm-operator router` with the rendered RouterConfig (direct to the engine, with the reason recorded, when the
  router does not start); stop; record started or not with vLLM's error line, vLLM's own weights and KV figures
  (its log), the wrapper's start-up phase durations and termination message. One archive per call.

What the rig substitutes, as a launcher does (and nothing else): the model id after `serve` becomes the carried
weightless shape directory and `--load-format=dummy` is appended (no weights to download); `$(POD_IP)` and the
pod's POD_IP env become 127.0.0.1; `/models` and `/adapters` (the pods' volumes) become local folders, the
adapters ConfigMap's files are written to a local folder instead of `/etc/vllm-operator/adapters`; the wrapper's
`--termination-message-path` points into the cell's folder instead of /dev/termination-log. `vllm` and
`vllm-operator` are small shims on PATH (`python3 -m vllm.entrypoints.cli.main`, `python3 -m vllm_operator.cli`),
since the carried packages have no console scripts.

Usage:
  python benchmarks/gpu/matrix.py stage DEST [--cells a,b] [--engine-version 0.26.0]   (here)
  python3 DEST/matrix.py run --stage DEST --out DIR --archive FILE [--cells a,b] [--budget-s S]   (GPU machine)
  python benchmarks/gpu/matrix.py table RESULT.json ...                                          (here)
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHAPES = HERE / "matrix" / "shapes"
ENGINE_PORT = 8000
STATUS_PORT = 8001
ROUTER_PORT = 18080
START_LIMIT_S = 420.0
"""Longest a start may take before the rig gives up on it (the slowest seen: ~150 s)."""
START_EST_S = 150.0
"""What a start is budgeted at when deciding whether the next cell fits the call."""
CHAT_BODY = {"messages": [{"role": "user", "content": "Say hello in five words."}], "max_tokens": 16,
             "temperature": 0.0, "ignore_eos": True}


@dataclass(frozen=True)
class Cell:
    """One start: a shape, a workload class, the pool started, and what the spec sets beyond the class."""

    name: str
    shape: str
    workload_class: str
    pool: str
    model: str
    model_config: bool = True  # plan from the shape's config.json (--model-config); False: the catalog entry
    pools: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    drop_args: tuple[str, ...] = ()  # a deliberately broken variant: arguments taken out of the rendered ones
    note: str = ""
    start_est_s: float = 150.0  # what the start is budgeted at when deciding whether it fits the call


# The run order: AWQ + fp8, FP8 70B, GPTQ, sliding window, MLA, tied embeddings, MoE fp8, LoRA, the rest.
CELLS: tuple[Cell, ...] = (
    Cell("awq72-fp8", "qwen2.5-72b-instruct-awq", "long-doc", "long", "Qwen/Qwen2.5-72B-Instruct-AWQ",
         spec={"model": {"quantization": "awq"}}, note="float16 AWQ checkpoint, fp8 KV (the long-doc default)"),
    Cell("fp8w70-auto", "llama-3.3-70b-instruct-fp8-dynamic", "long-doc", "long",
         "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", pools={"long": {"kvCacheDtype": "auto"}},
         note="compressed-tensors FP8 weights, bf16 KV (the issue's -2.8 % case)"),
    Cell("gptq7-fp8", "qwen2.5-7b-instruct-gptq-int4", "long-doc", "long", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
         spec={"model": {"quantization": "gptq"}}, note="float16 GPTQ-Int4 checkpoint, fp8 KV"),
    Cell("mistral-sw-fp8", "mistral-7b-instruct-v0.1", "long-doc", "long", "mistralai/Mistral-7B-Instruct-v0.1",
         note="sliding window 4096 on every layer, 32768 context, fp8 KV"),
    Cell("dsv2lite-mla-chat", "deepseek-v2-lite-chat", "chat", "long", "deepseek-ai/DeepSeek-V2-Lite-Chat",
         note="MLA latent cache (MoE: needs the MoE kernels), chat long pool, model-dtype KV"),
    Cell("llama3b-tied-chat", "llama-3.2-3b-instruct", "chat", "short", "meta-llama/Llama-3.2-3B-Instruct",
         note="tied embeddings, chat short pool, model-dtype KV"),
    Cell("qwen3moe-fp8", "qwen3-30b-a3b", "long-doc", "long", "Qwen/Qwen3-30B-A3B", model_config=False,
         note="MoE (needs the MoE kernels), catalog entry, fp8 KV"),
    Cell("lora8-fp8", "llama-3.1-8b-instruct", "long-doc", "long", "meta-llama/Llama-3.1-8B-Instruct",
         model_config=False, spec={"lora": {"maxLoras": 2, "maxRank": 16}, "adapters": [
             {"name": "a1", "source": {"pvc": {"claimName": "adapters", "path": "a1"}}, "maxRank": 16,
              "pools": ["long"]}]},
         note="two LoRA slots of rank 16 (an adapter listed, so the planner reserves them), fp8 KV"),
    Cell("fp8w70-fp8", "llama-3.3-70b-instruct-fp8-dynamic", "long-doc", "long",
         "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", note="FP8 weights and fp8 KV", start_est_s=200.0),
    Cell("awq72-short", "qwen2.5-72b-instruct-awq", "long-doc", "short", "Qwen/Qwen2.5-72B-Instruct-AWQ",
         spec={"model": {"quantization": "awq"}}, note="float16 AWQ checkpoint, model-dtype KV"),
    Cell("dense8-chat", "llama-3.1-8b-instruct", "chat", "short", "meta-llama/Llama-3.1-8B-Instruct",
         model_config=False, note="dense, catalog entry, chat short pool"),
    Cell("gptq7-short", "qwen2.5-7b-instruct-gptq-int4", "long-doc", "short", "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4",
         spec={"model": {"quantization": "gptq"}}, note="float16 GPTQ-Int4 checkpoint, model-dtype KV"),
    Cell("dsv2lite-mla-fp8", "deepseek-v2-lite-chat", "long-doc", "long", "deepseek-ai/DeepSeek-V2-Lite-Chat",
         note="MLA with the long-doc default fp8 KV (MoE kernels)"),
    Cell("qwen3moe-short", "qwen3-30b-a3b", "long-doc", "short", "Qwen/Qwen3-30B-A3B", model_config=False,
         note="MoE, model-dtype KV (MoE kernels)"),
    Cell("gemma2-chat", "gemma-2-9b-it", "chat", "short", "google/gemma-2-9b-it",
         note="Gemma-2: 21 sliding (4096) + 21 global layers, soft-capping, head_dim 256, float32 checkpoint; chat "
              "short pool, model-dtype KV"),
    Cell("gemma2-fp8", "gemma-2-9b-it", "chat", "long", "google/gemma-2-9b-it", pools={"long": {"kvCacheDtype": "fp8"}},
         note="Gemma-2 with fp8 KV (FA3: --dtype=bfloat16), chat long pool at the native 8192"),
    Cell("awq72-fp8-nodtype", "qwen2.5-72b-instruct-awq", "long-doc", "long", "Qwen/Qwen2.5-72B-Instruct-AWQ",
         spec={"model": {"quantization": "awq"}}, drop_args=("--dtype=bfloat16",),
         note="awq72-fp8 without the planner's --dtype=bfloat16 (what main rendered before issue 38): the start-up "
              "failure the wrapper and the health loop must name"),
)
CELLS_BY_NAME = {c.name: c for c in CELLS}
MOE_SHAPES = frozenset({"deepseek-v2-lite-chat", "qwen3-30b-a3b"})


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def pick(names: str | None) -> list[Cell]:
    if not names:
        return list(CELLS)
    unknown = [n for n in names.split(",") if n not in CELLS_BY_NAME]
    if unknown:
        raise SystemExit(f"unknown cells {unknown} (known: {', '.join(CELLS_BY_NAME)})")
    return [CELLS_BY_NAME[n] for n in names.split(",")]


# ----------------------------------------------------------------------------------------------- stage (here)


def deployment(cell: Cell, engine_version: str, gpu: str = "nvidia-h200-141gb") -> dict[str, Any]:
    """The cell's VLLMDeployment: the class's pools, only the started one with a replica. The node weights cache is
    off (`model.cache.enabled: false`): the GPU machine loads dummy weights from the shape's directory, so there is
    nothing to fetch, and the engine then starts as it does without a cache (the model path, no --hold-weights)."""
    other = "short" if cell.pool == "long" else "long"
    pools: dict[str, Any] = {cell.pool: {"replicas": 1, **cell.pools.get(cell.pool, {})},
                             other: {"replicas": 0, **cell.pools.get(other, {})}}
    spec: dict[str, Any] = {
        "model": {"name": cell.model, "cache": {"enabled": False}, **cell.spec.get("model", {})},
        "workloadClass": cell.workload_class,
        "accelerator": {"type": gpu, "count": 1},
        "engine": {"gpu": {"version": engine_version}},
        "pools": pools,
        **{k: v for k, v in cell.spec.items() if k != "model"},
    }
    name = re.sub(r"[^a-z0-9-]", "-", cell.name.lower())
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMDeployment",
            "metadata": {"name": name, "namespace": "matrix"}, "spec": spec}


def render_cell(cell: Cell, engine_version: str, gpu: str = "nvidia-h200-141gb") -> dict[str, Any]:
    """Plan and render one cell with the product's code; the started pool's container and the router's config."""
    from vllm_operator.api.errors import SpecError
    from vllm_operator.planning import catalog
    from vllm_operator.planning.cli_inputs import plan_documents
    from vllm_operator.rendering.cli import render_planned

    doc = deployment(cell, engine_version, gpu)
    facts = None
    if cell.model_config:
        config = json.loads((SHAPES / cell.shape / "config.json").read_text())
        facts = catalog.facts_from_hf_config(config, origin=f"{cell.shape}/config.json")
    rec: dict[str, Any] = {"cell": cell.name, "shape": cell.shape, "pool": cell.pool, "note": cell.note,
                           "deployment": doc, "facts": facts.to_wire() if facts is not None else None}
    try:
        planned = plan_documents([doc], engine_version=engine_version, facts=facts)
        objects, warnings = render_planned(planned)
    except SpecError as err:
        rec.update(refused=True, reason=f"{err.field}: {err.message}")
        return rec
    plan = planned[0].plan
    pool = plan.pools[cell.pool]
    deploy = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith(f"-{cell.pool}"))
    container = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    router_cm = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-router"))
    args = [a for a in container.get("args", []) if a not in cell.drop_args]
    adapters_cm = next((o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-adapters")),
                       None)
    kv = pool.kv
    rec.update(
        refused=False, warnings=warnings, command=container["command"], args=args, dropped=list(cell.drop_args),
        env=[{"name": e["name"], "value": e.get("value"), "fieldRef": (e.get("valueFrom") or {}).get("fieldRef")}
             for e in container.get("env", [])],
        router=json.loads(router_cm["data"]["router.json"]),
        adapters_files=dict(adapters_cm["data"]) if adapters_cm is not None else {},
        planned={"weights_bytes": kv.breakdown.weights_bytes, "kv_tokens": kv.planned_tokens,
                 "budget_bytes": kv.budget_bytes, "bytes_per_token": kv.bytes_per_token,
                 "concurrency": kv.concurrency_at_full_length, "kv_cache_dtype": pool.kv_cache_dtype,
                 "max_model_len": pool.max_model_len, "gpu_memory_utilization": pool.gpu_memory_utilization,
                 "breakdown": kv.breakdown.model_dump()})
    return rec


def stage(dest: Path, cells: list[Cell], engine_version: str, tokenizer_from: Path | None,
          gpu: str = "nvidia-h200-141gb") -> None:
    """Everything a GPU call needs under `dest`: cells/*.json, shapes with a tokenizer, the operator package."""
    dest.mkdir(parents=True, exist_ok=True)
    for sub in ("cells", "shapes", "src"):
        shutil.rmtree(dest / sub, ignore_errors=True)
    (dest / "cells").mkdir()
    repo = HERE.parent.parent
    tok = tokenizer_from
    if tok is None:
        tok = dest / "tokenizer"
        shutil.rmtree(tok, ignore_errors=True)
        subprocess.run([sys.executable, str(repo / "scripts" / "make_model.py"), "--shape", "tiny", "--out",
                        str(tok)], check=True)
    for cell in cells:
        rec = render_cell(cell, engine_version, gpu)
        (dest / "cells" / f"{cell.name}.json").write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        shape = dest / "shapes" / cell.shape
        if not shape.exists():
            shape.mkdir(parents=True)
            shutil.copy(SHAPES / cell.shape / "config.json", shape / "config.json")
            for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                if (tok / f).exists():
                    shutil.copy(tok / f, shape / f)
        log(f"staged {cell.name}: " + (f"REFUSED {rec['reason']}" if rec["refused"] else
                                        f"{rec['planned']['kv_tokens']} KV tokens planned; {' '.join(rec['args'])}"))
    shutil.copytree(repo / "operator" / "vllm_operator", dest / "src" / "vllm_operator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(Path(__file__), dest / "matrix.py")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dataplane import ADAPTER  # the sibling script's recipe, one copy (imported here only: it is not staged)

    (dest / ADAPTER_SCRIPT).write_text(ADAPTER)


# ----------------------------------------------------------------------------------------------- run (GPU)


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("GET", u.path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as err:
        return 0, f"{type(err).__name__}: {err}"
    finally:
        conn.close()


def post(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    u = urllib.parse.urlsplit(url)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("POST", u.path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode("utf-8", "replace")
        out: dict[str, Any] = {"status": resp.status, "s": round(time.monotonic() - t0, 3),
                               "headers": {k.lower(): v for k, v in resp.getheaders()
                                           if k.lower().startswith("x-vllm-operator")}}
        try:
            out["body"] = json.loads(data)
        except ValueError:
            out["text"] = data[:2000]
        return out
    except (OSError, http.client.HTTPException) as err:
        return {"status": 0, "s": round(time.monotonic() - t0, 3), "error": f"{type(err).__name__}: {err}"}
    finally:
        conn.close()


def shims(bindir: Path, python: str) -> None:
    """`vllm` and `vllm-operator` on PATH, as the image's console scripts would be."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, module in (("vllm", "vllm.entrypoints.cli.main"), ("vllm-operator", "vllm_operator.cli")):
        path = bindir / name
        path.write_text(f"#!/bin/sh\nexec {python} -m {module} \"$@\"\n")
        path.chmod(0o755)


ADAPTER_SCRIPT = "make_adapter.py"
"""Staged beside matrix.py: the data-plane run's random rank-r LoRA recipe (dataplane.ADAPTER), run with the GPU
machine's torch."""
ADAPTERS_DIR = "/etc/vllm-operator/adapters"
"""Where the pods mount the adapters ConfigMap; the rig writes its files to a local folder instead."""


def substitute(rec: dict[str, Any], model_dir: str, term_path: str, mount: str, adapters_dir: str = "",
               ports: tuple[int, int] = (ENGINE_PORT, STATUS_PORT)) -> tuple[list[str], dict[str, str]]:
    """The launcher's substitutions (module docstring) on the rendered command, args and env. `ports` (engine,
    wrapper status) other than the pod's 8000/8001 are for rehearsals that share a host with other tests."""
    command = [c.replace(ADAPTERS_DIR, adapters_dir) if adapters_dir else c for c in rec["command"]]
    command = [c.replace("=/adapters/", f"={mount}/adapters/") for c in command]
    if ports[1] != STATUS_PORT:
        command.insert(command.index("engine") + 1, f"--status-port={ports[1]}")
    serve = command.index("serve")
    command[serve + 1] = model_dir
    engine = command.index("engine")
    command[engine + 1:engine + 1] = [f"--termination-message-path={term_path}"]
    args = [a.replace("$(POD_IP)", "127.0.0.1") for a in rec["args"]]
    if ports[0] != ENGINE_PORT:
        args = [f"--port={ports[0]}" if a.startswith("--port=") else a for a in args]
    if any(a.startswith("--load-format") for a in args):
        raise SystemExit(f"{rec['cell']}: the plan already sets --load-format")
    env: dict[str, str] = {}
    for e in rec["env"]:
        if e["name"] == "POD_IP":
            env["POD_IP"] = "127.0.0.1"
        elif e["value"] is not None:
            env[e["name"]] = e["value"].replace("/models", mount, 1) if e["value"].startswith("/models") else e["value"]
    return command + args + ["--load-format=dummy"], env


LOG_FACTS = {
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "kv_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "kv_memory_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    "graph_gib": re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.-]+) GiB"),
    "attention_backend": re.compile(r"Using (\w+) attention backend"),
    "quant_kernel": re.compile(r"(Using \w*Marlin\w*[^\n]*|Selected \w+ for \w+)"),
}
ERROR_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[\w.]*(?:Error|Exception))\b: ")
"""A Python exception line, also as vLLM's engine-core process prefixes it
(`(EngineCore_DP0 pid=N) RuntimeError: …`)."""
GENERIC_ERROR = re.compile(r"Engine core initialization failed|See root cause above|sitecustomize")
"""Exception lines that only point at another one (the root cause is printed before them)."""


def log_facts(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, pattern in LOG_FACTS.items():
        found = pattern.findall(text)
        if found:
            value = found[-1]
            out[key] = value if key in ("attention_backend", "quant_kernel") else float(value.replace(",", ""))
    errors = [line.strip() for line in text.splitlines() if ERROR_LINE.search(line) and not GENERIC_ERROR.search(line)]
    if errors:
        out["error_line"] = errors[-1][-600:]
    return out


def cache_info(metrics: str) -> dict[str, str]:
    for line in metrics.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            return dict(re.findall(r'(\w+)="([^"]*)"', line))
    return {}


def trim(text: str, head: int = 400, tail: int = 400) -> str:
    """The log without progress-bar redraws, at most head + tail lines."""
    lines = [ln.rsplit("\r", 1)[-1] for ln in text.splitlines()]
    if len(lines) <= head + tail:
        return "\n".join(lines) + "\n"
    return "\n".join([*lines[:head], f"... {len(lines) - head - tail} lines left out ...", *lines[-tail:]]) + "\n"


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stage = Path(args.stage).resolve()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.python = args.python
        self.bindir = Path(args.work) / "bin"
        shims(self.bindir, self.python)
        self.site = args.site
        self.engine_port, self.status_port, self.router_port = args.engine_port, args.status_port, args.router_port

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0) if self.args.budget_s > 0 else float("inf")

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {**os.environ, **extra}
        env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.site, str(self.stage / "src")) if p)
        env.update(PYTHONUNBUFFERED="1", VLLM_USE_FLASHINFER_SAMPLER="0", HF_HUB_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", VLLM_CACHE_ROOT=str(Path(self.args.work) / "vllm-cache"))
        return env

    def model_dir(self, shape: str) -> str:
        target = Path(self.args.work) / "models" / shape
        if not target.exists():
            shutil.copytree(self.stage / "shapes" / shape, target)
        return str(target)

    def make_adapters(self, adapters_json: str, shape: str) -> list[str]:
        """A random LoRA adapter of the shape (q_proj and v_proj, every layer) at each listed adapter's path (in the
        local `/adapters` volume), made with the machine's torch: nothing of the kind is carried."""
        made = []
        for entry in json.loads(adapters_json).get("adapters", []):
            target = Path(str(entry.get("path", "")))
            target.mkdir(parents=True, exist_ok=True)
            rank = int(entry.get("maxRank") or entry.get("rank") or 16)
            script = str(self.stage / ADAPTER_SCRIPT)
            got = subprocess.run([self.python, script, self.model_dir(shape), str(target), str(rank)],
                                 capture_output=True, text=True, env=self.env({}), timeout=120, check=False)
            made.append(f"{entry.get('name')} at {target}: {(got.stdout + got.stderr).strip()[-300:]}")
        return made

    def cell(self, rec: dict[str, Any]) -> dict[str, Any]:
        name = rec["cell"]
        cdir = self.out / name
        cdir.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {"cell": name, "shape": rec["shape"], "pool": rec["pool"], "note": rec["note"],
                                  "planned": rec.get("planned"), "args": rec.get("args"),
                                  "dropped": rec.get("dropped", [])}
        if rec["refused"]:
            result.update(outcome="refused", reason=rec["reason"])
            return result
        if self.left() < CELLS_BY_NAME.get(name, CELLS[0]).start_est_s + 30:
            result.update(outcome="not-run", reason=f"call budget: {self.left():.0f} s left")
            return result
        mount = str(Path(self.args.work) / "models-volume")
        term = cdir / "termination.log"
        adapters_dir = cdir / "adapters"
        adapters_dir.mkdir(exist_ok=True)
        for fname, rendered in (rec.get("adapters_files") or {}).items():
            text = rendered.replace('"/adapters/', f'"{mount}/adapters/')  # the pod's /adapters volume, mounted here
            (adapters_dir / fname).write_text(text)
            result["adapters_made"] = self.make_adapters(text, rec["shape"])
        argv, env = substitute(rec, self.model_dir(rec["shape"]), str(term), mount, str(adapters_dir),
                               (self.engine_port, self.status_port))
        result["argv"] = argv
        logfile = cdir / "engine.log"
        fh = logfile.open("wb")
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env(env),
                                start_new_session=True)
        log(f"{name}: started (pid {proc.pid}): {' '.join(argv)[:300]}")
        try:
            return self._follow(rec, result, proc, fh, t0, cdir, term, logfile)
        finally:
            if proc.poll() is None:  # interrupted (SIGTERM near the call's limit): never leave vLLM behind
                stop(proc)

    def _follow(self, rec: dict[str, Any], result: dict[str, Any], proc: subprocess.Popen[bytes], fh: Any,
                t0: float, cdir: Path, term: Path, logfile: Path) -> dict[str, Any]:
        name = rec["cell"]
        serving_s = None
        limit = min(START_LIMIT_S, max(self.left() - 40, 60))
        while time.monotonic() - t0 < limit:
            if proc.poll() is not None:
                break
            code, _ = get(f"http://127.0.0.1:{self.status_port}/startup", 2.0)
            if code == 200:
                serving_s = round(time.monotonic() - t0, 1)
                break
            time.sleep(1.0)
        result["serving_s"] = serving_s
        if serving_s is not None:
            log(f"{name}: serving after {serving_s} s")
            deadline = time.monotonic() + 30
            while get(f"http://127.0.0.1:{self.engine_port}/health", 2.0)[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.5)
            metrics = get(f"http://127.0.0.1:{self.engine_port}/metrics", 10.0)[1]
            result["cache_config_info"] = cache_info(metrics)
            result["chat"] = self.chat(rec, cdir)
            adapters = [a["name"] for f in (rec.get("adapters_files") or {}).values()
                        for a in json.loads(f).get("adapters", [])]
            if adapters:  # the wrapper loads them after Serving (its adapters file, every 2 s)
                result["adapter_status"] = self.wait_adapters(adapters)
                result["chat_adapter"] = self.chat(rec, cdir, model=adapters[0])
        result["status"] = _json(get(f"http://127.0.0.1:{self.status_port}/status", 5.0)[1])
        code = stop(proc)
        fh.close()
        result["wrapper_exit_code"] = code
        result["termination"] = term.read_text()[:4000] if term.exists() else None
        text = logfile.read_text(errors="replace")
        result["vllm"] = log_facts(text)
        logfile.write_text(trim(text))
        result["outcome"] = "started" if serving_s is not None else (
            "start-timeout" if code is None or proc.returncode is None or time.monotonic() - t0 >= limit
            else "failed")
        result["wall_s"] = round(time.monotonic() - t0, 1)
        log(f"{name}: {result['outcome']}; vLLM {result['vllm']}")
        return result

    def wait_adapters(self, names: list[str], limit_s: float = 30.0) -> Any:
        """The wrapper's adapters status once every listed adapter loaded or failed (at most `limit_s`)."""
        deadline = time.monotonic() + limit_s
        while True:
            status = _json(get(f"http://127.0.0.1:{self.status_port}/status", 5.0)[1])
            got = status.get("adapters") if isinstance(status, dict) else None
            done = isinstance(got, dict) and all(n in (got.get("loaded") or []) or n in (got.get("failed") or {})
                                                 for n in names)
            if done or time.monotonic() > deadline:
                return got
            time.sleep(1.0)

    def chat(self, rec: dict[str, Any], cdir: Path, model: str | None = None) -> dict[str, Any]:
        """One chat request through the router with the rendered RouterConfig (every enabled pool's endpoints
        are the one engine started); direct to the engine if the router does not come up. `model`: an adapter's
        name instead of the served model's."""
        served = rec["router"]["model"]
        body = {"model": model or served, **CHAT_BODY}
        cfg = json.loads(json.dumps(rec["router"]))
        for route in cfg["pools"].values():
            route["service"] = None
            route["endpoints"] = [f"http://127.0.0.1:{self.engine_port}"] if route.get("enabled") else []
        cfg["tokenizer"] = {"path": self.model_dir(rec["shape"])}
        cfg["port"] = self.router_port
        (cdir / "router.json").write_text(json.dumps(cfg, indent=2) + "\n")
        rlog = (cdir / ("router.log" if model is None else f"router-{model}.log")).open("wb")
        router = subprocess.Popen(["vllm-operator", "router", "--config", str(cdir / "router.json"), "--host",
                                   "127.0.0.1"], stdout=rlog, stderr=subprocess.STDOUT, env=self.env({}),
                                  start_new_session=True)
        via, why = "router", None
        t0 = time.monotonic()
        while True:
            if router.poll() is not None:
                via, why = "direct", f"router exited with code {router.returncode} (router.log)"
                break
            if get(f"http://127.0.0.1:{self.router_port}/health", 2.0)[0] == 200:
                break
            if time.monotonic() - t0 > 60:
                via, why = "direct", "router not healthy within 60 s (router.log)"
                break
            time.sleep(0.5)
        base = f"http://127.0.0.1:{self.router_port if via == 'router' else self.engine_port}"
        try:
            got = post(base + "/v1/chat/completions", body)
        finally:
            stop(router)
            rlog.close()
        body_out = got.pop("body", None)
        usage = body_out.get("usage") if isinstance(body_out, dict) else None
        return {"via": via, "why_direct": why, **got, "usage": usage,
                "ok": got["status"] == 200 and bool(usage) and usage.get("completion_tokens") == 16}

    def run(self) -> list[dict[str, Any]]:
        if self.args.cells:  # the order given
            names = self.args.cells.split(",")
        else:  # the run order
            order = [c.name for c in CELLS]
            names = sorted((p.stem for p in (self.stage / "cells").glob("*.json")),
                           key=lambda n: order.index(n) if n in order else len(order))
        results = []
        for name in names:
            rec = json.loads((self.stage / "cells" / f"{name}.json").read_text())
            try:
                results.append(self.cell(rec))
            except Interrupted:
                results.append({"cell": name, "outcome": "not-run", "reason": "call interrupted"})
                break
            (self.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (self.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        return results


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text[:500]


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM to the leader (the wrapper forwards it to vLLM), then make sure the whole group is gone."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    return code


class Interrupted(Exception):
    pass


def on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def archive(out: Path, path: str) -> None:
    with tarfile.open(path, "w:xz") as tar:
        tar.add(out, arcname=out.name)


# ----------------------------------------------------------------------------------------------- table (here)


def pct(planned: float, observed: float) -> str:
    return f"{(planned - observed) / observed * 100:+.2f} %"


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| cell | pool | KV dtype | outcome | weights planned / vLLM (GiB) | KV tokens planned / vLLM | error |"
            " launch → Serving | chat |", "|" + "---|" * 9]
    for r in results:
        p = r.get("planned") or {}
        v = r.get("vllm") or {}
        w = (f"{p['weights_bytes'] / (1 << 30):.2f} / {v['weights_gib']:.2f}" if p and "weights_gib" in v
             else "—")
        observed = (r.get("cache_config_info") or {}).get("kv_cache_size_tokens") or v.get("kv_tokens")
        kv = f"{p['kv_tokens']:,} / {int(float(observed)):,}" if p and observed else "—"
        err = pct(p["kv_tokens"], float(observed)) if p and observed else "—"
        chat = r.get("chat") or {}
        chat_text = f"{chat.get('via')} {chat.get('status')}" if chat else "—"
        outcome = r["outcome"] + (f": {r.get('reason') or v.get('error_line', '')}"[:160] if r["outcome"] != "started"
                                  else "")
        rows.append(f"| {r['cell']} | {r.get('pool', '')} | {p.get('kv_cache_dtype', '—')} | {outcome} | {w} | {kv} "
                    f"| {err} | {r.get('serving_s') or '—'} s | {chat_text} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="matrix.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage")
    s.add_argument("dest")
    s.add_argument("--cells", default=None)
    s.add_argument("--engine-version", default="0.26.0")
    s.add_argument("--gpu", default="nvidia-h200-141gb", help="the accelerator type the cells are planned for")
    s.add_argument("--tokenizer-from", default=None, help="a model directory whose tokenizer files to copy")
    r = sub.add_parser("run")
    r.add_argument("--stage", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--archive", default=None)
    r.add_argument("--cells", default=None)
    r.add_argument("--budget-s", type=float, default=0.0)
    r.add_argument("--site", default="/tmp/site")
    r.add_argument("--work", default="/tmp/matrix")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--engine-port", type=int, default=ENGINE_PORT)
    r.add_argument("--status-port", type=int, default=STATUS_PORT)
    r.add_argument("--router-port", type=int, default=ROUTER_PORT)
    t = sub.add_parser("table")
    t.add_argument("results", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "stage":
        stage(Path(args.dest), pick(args.cells), args.engine_version,
              Path(args.tokenizer_from) if args.tokenizer_from else None, args.gpu)
        return 0
    if args.cmd == "table":
        results = [r for path in args.results for r in json.loads(Path(path).read_text())]
        sys.stdout.write(table(results))
        return 0
    signal.signal(signal.SIGTERM, on_sigterm)
    out = Path(args.out)
    try:
        Run(args).run()
    finally:
        if args.archive:
            archive(out, args.archive)
            log(f"wrote {args.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
