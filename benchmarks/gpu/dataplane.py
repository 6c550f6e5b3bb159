#!/usr/bin/env python3
"""Issue 28: the whole data plane on one GPU — our router in front of engines started by our engine wrapper.

Why a script of its own (next to session.py, which drives vLLM directly): here every process is the one a pod runs.
The router is `vllm-operator router` with the RouterConfig the planner wrote (only the launcher's substitutions:
static endpoints for the EndpointSlices, the mounted tokenizer directory, a port); each engine is `vllm-operator
engine -- vllm serve MODEL <the plan's engineArgs>` (the wrapper's launcher rewrite, preflight, log scan, exit codes
and termination message all run for real). One GPU call is short and only one archive comes back, so each step
records raw data only (metrics pages, loadgen raw files, probe answers, logs) and the analysis happens afterwards.

Steps (each one or two engine starts; see PLAN-28.md for which call runs which):
  split    plan `shared`: the long pool, then — once it is healthy — the short pool on the same GPU (each its share
           of the GPU's memory); the mixed workload, contract probes and router-vs-direct pairs through the router
  unified  plan `unified`: one long-pool engine at full utilisation (short pool disabled), the same traffic
  oom      plan `oom`: a long pool planned with a too-high gpuMemoryUtilization; prompt-logprob requests over a full
           prefill chunk until the engine dies; the wrapper's exit code and termination message; re-planned through
           the health loop's own diagnose/decide (replan.py); restarted at the new rung; the same requests again
  moe      plan `moe`: a MoE shape, KV planned vs `vllm:cache_config_info`, no traffic
  lora     plan `lora`: the long pool with two LoRA slots of rank 16; KV planned (slots taken off) vs vLLM's after its
           profiling run with LoRA on; a random rank-16 adapter made here, loaded at run time by the wrapper from its
           adapters file and asked for by name; the wrapper's start-up phase durations, cold, then a second start
           (warm page cache) — what a pool waking from zero on a GPU waits for

Standard library (plus loadgen.py's numpy for prompt text, and the operator package on --src for replan.py).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import engine_cmd  # noqa: E402  (sibling script, standard library only)
import session  # noqa: E402

LOADGEN = HERE / "loadgen.py"
REPLAN = HERE / "replan.py"
START_EST_S = 150.0
LOAD_EST_S = 110.0
"""The mixed workload (60 s of arrivals + the last burst's drain + warm-up) plus probes and latency pairs."""
HOG = ("import sys, time, torch; free, _ = torch.cuda.mem_get_info(); keep = int(sys.argv[1]) << 20; "
       "x = torch.empty(max(free - keep, 0), dtype=torch.uint8, device='cuda'); "
       "print('hog', x.numel(), 'of', free, flush=True); time.sleep(3600)")
"""Another process on the same GPU taking what the engine left free (all but `keep` MiB)."""
PAIRS = 30
"""Router-vs-direct request pairs on an idle system (the router's added latency)."""


class Interrupted(Exception):
    """SIGTERM: the call's limit is near; stop everything and write the archive."""


def on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------- processes


class Proc:
    """A child in its own process group with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logfile: Path) -> None:
        self.name, self.argv, self.logfile = name, argv, logfile
        self.fh = logfile.open("wb")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log(f"started {name} (pid {self.proc.pid}): {shlex.join(argv)[:400]}")

    def wait_healthy(self, url: str, deadline_s: float) -> float:
        return session.wait_healthy(url, self.proc, deadline_s)

    def stop(self) -> int:
        """SIGTERM the group leader only (the wrapper forwards it to vLLM), then make sure the group is gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            log(f"{self.name} still running 60 s after SIGTERM; killing its group")
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while session.group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if session.group_alive(self.proc.pid):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.fh.close()
        log(f"stopped {self.name}: exit code {code}")
        return code


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_call(url: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """One request; status, the router's headers, the JSON body (or text), seconds taken. Never raises."""
    u = urllib.parse.urlsplit(url)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        if body is None:
            conn.request("GET", u.path)
        else:
            conn.request("POST", u.path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        out: dict[str, Any] = {"status": resp.status, "s": round(time.monotonic() - t0, 4),
                               "headers": {k.lower(): v for k, v in resp.getheaders()
                                           if k.lower().startswith("x-vllm-operator")}}
        try:
            out["body"] = json.loads(data)
        except ValueError:
            out["text"] = data.decode("utf-8", "replace")[:2000]
        return out
    except (OSError, http.client.HTTPException) as err:
        return {"status": 0, "s": round(time.monotonic() - t0, 4), "error": f"{type(err).__name__}: {err}"}
    finally:
        conn.close()


def scrape(url: str) -> str:
    return session.get(url + "/metrics", 10.0)[1]


# ----------------------------------------------------------------------------------------------- launchers


class Ctx:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out = args, out
        self.py = sys.executable
        self.t0 = time.monotonic()
        self.tpw: float | None = args.tokens_per_word

    def left(self) -> float:
        return float("inf") if self.args.budget_s <= 0 else self.args.budget_s - (time.monotonic() - self.t0)

    def fits(self, need_s: float) -> bool:
        return self.left() >= need_s + 20

    def env(self, *paths: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, **session.ENGINE_ENV, **(extra or {})}
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def plan(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((Path(self.args.plans) / f"{name}.json").read_text())
        return data

    def engine(self, sdir: Path, label: str, plan: dict[str, Any], pool: str, port: int,
               model_dir: str | None = None, extra_args: tuple[str, ...] = (), wrapper_args: tuple[str, ...] = (),
               status_port: int | None = None) -> tuple[Proc, Path]:
        """`vllm-operator engine -- vllm serve MODEL <plan args>` with the termination message in sdir."""
        model = model_dir or self.args.model_dir
        argv, plan_env = engine_cmd.build_argv(plan, pool, model, "127.0.0.1", port,
                                               {"/models": self.args.models_mount})
        serve_args = argv[len(engine_cmd.LAUNCHER) + 1:] + list(extra_args)
        term = sdir / f"termination-{label}.log"
        if self.args.engine_cmd:  # rehearsal: the wrapper runs a stand-in instead of vLLM
            child = shlex.split(self.args.engine_cmd.format(port=port))
            launcher = ["--launcher", "serve"]
        else:
            child = ["vllm", "serve", model, *serve_args]
            launcher = ["--launcher", "cli-main", "--python", self.py]
        # Each wrapper serves its start-up status on a port of its own (two engines share this host, and the default
        # status port is the long engine's API port here).
        cmd = [self.py, "-m", "vllm_operator.cli", "engine", *launcher, "--termination-message-path", str(term),
               "--status-host", "127.0.0.1", "--status-port", str(status_port or free_port()), *wrapper_args,
               "--", *child]
        (sdir / f"argv-{label}.json").write_text(json.dumps({"argv": cmd, "env": plan_env}, indent=2) + "\n")
        return Proc(label, cmd, self.env(self.args.site, self.args.src, extra=plan_env), sdir / f"{label}.log"), term

    def router(self, sdir: Path, plan: dict[str, Any], endpoints: dict[str, str]) -> Proc:
        """The plan's RouterConfig with the launcher's substitutions: static endpoints, a local tokenizer, a port."""
        cfg = json.loads(json.dumps(plan["router"]))
        for pool, route in cfg["pools"].items():
            route["service"] = None
            route["endpoints"] = [endpoints[pool]] if pool in endpoints and route.get("enabled") else []
        cfg["tokenizer"] = {"path": self.args.tokenizer_dir or self.args.model_dir}
        cfg["port"] = self.args.router_port
        path = sdir / "router.json"
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        cmd = [self.py, "-m", "vllm_operator.cli", "router", "--config", str(path), "--host", "127.0.0.1"]
        return Proc("router", cmd, self.env(self.args.router_site, self.args.src, self.args.site),
                    sdir / "router.log")


def wait_router(url: str, proc: Proc, deadline_s: float) -> float:
    """Until the router's /health is 200 (it polls the engines itself)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"router exited with code {proc.proc.returncode}")
        if session.get(url + "/health", 2.0)[0] == 200:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError("router not healthy in time")


# ----------------------------------------------------------------------------------------------- traffic


def tokens_per_word(ctx: Ctx, engine_url: str, model: str) -> float:
    """Measured once per call through an engine's /tokenize, exactly as loadgen.py calibrates."""
    if ctx.tpw is None:
        import loadgen  # numpy; only where traffic is sent
        import numpy as np

        text = loadgen.make_prompt(0, loadgen.CALIBRATION_WORDS, np.random.default_rng(12 + 7919))
        got = http_call(engine_url + "/tokenize", {"model": model, "prompt": text}, 60)
        ctx.tpw = int(got["body"]["count"]) / len(text.split())
        log(f"tokens per word: {ctx.tpw:.4f}")
    return ctx.tpw


def prompt_of(tokens: int, tpw: float, tag: int) -> str:
    import loadgen
    import numpy as np

    return loadgen.make_prompt(10_000 + tag, loadgen.words_for(tokens, tpw), np.random.default_rng(tag))


def probes(plan: dict[str, Any], tpw: float) -> list[dict[str, Any]]:
    """Requests whose routing and caps the plan decides exactly (checked afterwards against decide())."""
    r = plan["router"]
    short_len, long_len = r["pools"]["short"]["maxModelLen"], r["pools"]["long"]["maxModelLen"]
    threshold = r["promptLengthThreshold"]

    def comp(name: str, tokens: int, max_tokens: int | None, **more: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": r["model"], "prompt": prompt_of(tokens, tpw, len(name)), "ignore_eos": True,
                                "temperature": 0.0, **more}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        return {"name": name, "path": "/v1/completions", "target_prompt_tokens": tokens, "requested": max_tokens,
                "body": body}

    chat = {"name": "chat-short", "path": "/v1/chat/completions", "target_prompt_tokens": 300, "requested": 32,
            "body": {"model": r["model"], "messages": [{"role": "user", "content": prompt_of(300, tpw, 99)}],
                     "max_tokens": 32, "ignore_eos": True, "temperature": 0.0}}
    return [
        comp("omitted-max-tokens", 300, None),
        comp("tier-clamp", 300, 100_000),
        comp("context-clamp", long_len - 1200, 4000),
        comp("prompt-too-long", long_len + 2000, 16),
        comp("near-threshold", threshold - 150, 32),
        comp("above-short-len", short_len + 500, 32),
        comp("bad-max-tokens", 300, 0),
        chat,
    ]


def run_probes(base: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in items]

    def one(i: int) -> None:
        item = items[i]
        got = http_call(base + item["path"], item["body"], 300)
        body = got.pop("body", None)
        usage = body.get("usage") if isinstance(body, dict) else None
        err = body.get("error") if isinstance(body, dict) else None
        results[i] = {"name": item["name"], "target_prompt_tokens": item["target_prompt_tokens"],
                      "requested": item["requested"], **got, "usage": usage, "error_body": err}

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def check_probes(plan: dict[str, Any], results: list[dict[str, Any]], src: str) -> list[dict[str, Any]] | str:
    """Each probe against the router's own decide() at the count the router reported: the pool, the max_tokens it
    forwarded (or the refusal), and — for forwarded requests with ignore_eos — that the engine produced exactly that
    many tokens."""
    if src and src not in sys.path:
        sys.path.insert(0, src)
    try:
        from vllm_operator.api.router_config import RouterConfig
        from vllm_operator.router.decide import Limits, Refusal, Route, decide, requested_max_tokens
    except ImportError as err:
        return f"cannot import the router's decide(): {err}"
    config = RouterConfig.model_validate(plan["router"])
    limits, tier = Limits.from_config(config), config.tiers[0]
    out = []
    for r in results:
        counted = r.get("headers", {}).get("x-vllm-operator-prompt-tokens")
        body = {"max_tokens": r["requested"]} if r["requested"] is not None else {}
        want, bad = requested_max_tokens(body)
        verdict: dict[str, Any] = {"name": r["name"], "status": r["status"], "counted": counted}
        if bad is not None:
            verdict.update(expected=f"{bad.status} {bad.reason}", ok=r["status"] == bad.status)
        elif counted is None:
            verdict.update(expected="a count header", ok=False)
        else:
            d = decide(int(counted), want, tier, limits)
            got_pool = r.get("headers", {}).get("x-vllm-operator-pool")
            got_max = r.get("headers", {}).get("x-vllm-operator-max-tokens")
            usage = r.get("usage") or {}
            if isinstance(d, Refusal):
                verdict.update(expected=f"{d.status} {d.reason}", ok=r["status"] == d.status and got_pool is None)
            else:
                assert isinstance(d, Route)
                produced = usage.get("completion_tokens")
                verdict.update(expected=f"{d.pool} max_tokens={d.max_tokens} clamps={list(d.clamps)}",
                               got=f"{got_pool} max_tokens={got_max} completion_tokens={produced}",
                               engine_prompt_tokens=usage.get("prompt_tokens"),
                               ok=r["status"] == 200 and got_pool == d.pool and got_max == str(d.max_tokens)
                               and produced == d.max_tokens)
        out.append(verdict)
    return out


def latency_pairs(router: str, direct: str, model: str, tpw: float, n: int) -> list[dict[str, float]]:
    """The same small request straight to the engine and through the router, alternating which goes first."""
    out = []
    for i in range(n):
        body = {"model": model, "prompt": prompt_of(300, tpw, 500 + i), "max_tokens": 1, "temperature": 0.0}
        order = [("direct", direct), ("router", router)] if i % 2 == 0 else [("router", router), ("direct", direct)]
        row: dict[str, float] = {}
        for name, base in order:
            got = http_call(base + "/v1/completions", body, 60)
            row[name] = got["s"] if got["status"] == 200 else -1.0
        out.append(row)
    return out


def traffic(ctx: Ctx, sdir: Path, plan: dict[str, Any], label: str, engines: dict[str, str]) -> dict[str, Any]:
    """The mixed workload, probes and latency pairs through the router; raw data into sdir."""
    router_url = f"http://127.0.0.1:{ctx.args.router_port}"
    model = plan["router"]["model"]
    direct = engines.get("short") or engines["long"]
    tpw = tokens_per_word(ctx, direct, model)
    rec: dict[str, Any] = {"tokens_per_word": tpw}
    metrics_before = {pool: scrape(url) for pool, url in engines.items()}
    (sdir / "router-metrics-before.txt").write_text(scrape(router_url))
    cmd = [ctx.py, str(LOADGEN), "run", "--layout", "split", "--url", router_url, "--url", router_url,
           "--model", model, "--label", label, "--out", str(sdir / "load"), "--tokens-per-word", f"{tpw:.6f}",
           *session.WORKLOAD, *shlex.split(ctx.args.loadgen_args)]
    log(f"load {label}: {shlex.join(cmd)[:300]}")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    (sdir / "loadgen.log").write_text(done.stderr)
    rec["loadgen_rc"] = done.returncode
    (sdir / "router-metrics-after-load.txt").write_text(scrape(router_url))
    for pool, url in engines.items():
        (sdir / f"metrics-before-{pool}.txt").write_text(metrics_before[pool])
        (sdir / f"metrics-after-load-{pool}.txt").write_text(scrape(url))
    log(f"probes {label}")
    rec["probes"] = run_probes(router_url, probes(plan, tpw))
    rec["probe_verdicts"] = check_probes(plan, rec["probes"], ctx.args.src)
    log(f"latency pairs {label}")
    rec["pairs"] = latency_pairs(router_url, direct, model, tpw, PAIRS)
    (sdir / "router-metrics-end.txt").write_text(scrape(router_url))
    for pool, url in engines.items():
        (sdir / f"metrics-end-{pool}.txt").write_text(scrape(url))
    return rec


def kv_compare(plan_path: Path, pool: str, metrics: str, sdir: Path) -> Any:
    (sdir / f"metrics-start-{pool}.txt").write_text(metrics)
    try:
        return engine_cmd.compare(json.loads(plan_path.read_text()), pool, metrics)
    except (engine_cmd.PlanError, KeyError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


# ----------------------------------------------------------------------------------------------- steps


def step_layout(ctx: Ctx, name: str, plan_name: str, pools: tuple[str, ...]) -> dict[str, Any]:
    """Start the router and the plan's engines in order (each after the previous is healthy), then traffic."""
    sdir = ctx.out / name
    sdir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"step": name, "plan": plan_name}
    need = START_EST_S * len(pools) + LOAD_EST_S
    if not ctx.fits(need):
        rec["skipped"] = f"{ctx.left():.0f} s left, needs ~{need:.0f}"
        log(f"{name} skipped: {rec['skipped']}")
        return rec
    plan = ctx.plan(plan_name)
    ports = {"long": ctx.args.long_port, "short": ctx.args.short_port}
    engines = {p: f"http://127.0.0.1:{ports[p]}" for p in pools}
    procs: list[Proc] = []
    try:
        router = ctx.router(sdir, plan, engines)
        procs.append(router)
        for pool in pools:  # staggered: vLLM profiles memory at start, another engine starting would skew it
            proc, _ = ctx.engine(sdir, f"engine-{pool}", plan, pool, ports[pool])
            procs.append(proc)
            rec[f"startup_s:{pool}"] = round(proc.wait_healthy(engines[pool], ctx.args.start_timeout), 1)
            log(f"{name}: {pool} healthy after {rec[f'startup_s:{pool}']} s")
            rec[f"kv:{pool}"] = kv_compare(Path(ctx.args.plans) / f"{plan_name}.json", pool, scrape(engines[pool]),
                                           sdir)
        rec["router_ready_s"] = round(wait_router(f"http://127.0.0.1:{ctx.args.router_port}", router, 60), 1)
        rec.update(traffic(ctx, sdir, plan, name, engines))
    except RuntimeError as err:
        rec["error"] = str(err)
        log(f"{name} failed: {err}")
    finally:
        for proc in reversed(procs):
            rec[f"exit:{proc.name}"] = proc.stop()
    return rec


def oom_requests(url: str, model: str, tpw: float, chunk: int) -> list[dict[str, Any]]:
    """Prompt logprobs (top 20) over a long prompt: vLLM computes logits over the vocabulary for every prompt
    token of each prefill chunk, memory its start-up profile never measured. (At 0.97 on 2026-12-01 one such request
    over an 8,192-token chunk with top-1 still fitted in the ~3.4 GiB left outside the budget.)"""
    body = {"model": model, "prompt": prompt_of(max(3 * chunk, 24_000), tpw, 4242), "max_tokens": 1,
            "prompt_logprobs": 20, "temperature": 0.0}
    return [http_call(url + "/v1/completions", body, 120)]


def step_oom(ctx: Ctx) -> dict[str, Any]:
    sdir = ctx.out / "oom"
    sdir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"step": "oom"}
    if not ctx.fits(START_EST_S + 60):  # each rung checks again before its start
        rec["skipped"] = f"{ctx.left():.0f} s left, needs ~{START_EST_S + 60:.0f}"
        return rec
    plan_path = Path(ctx.args.plans) / "oom.json"
    plan = json.loads(plan_path.read_text())
    pool = "long"
    url = f"http://127.0.0.1:{ctx.args.oom_port}"
    model = plan["router"]["model"]
    chunk = int(plan["pools"][pool]["maxNumBatchedTokens"])
    hogs: list[Proc] = []
    try:
        _oom_rungs(ctx, sdir, rec, plan, plan_path, pool, url, model, chunk, hogs)
    finally:
        for hog in hogs:
            rec["hog_exit"] = hog.stop()
    return rec


def _start_hog(ctx: Ctx, sdir: Path, rec: dict[str, Any]) -> Proc:
    cmd = shlex.split(ctx.args.hog_cmd) if ctx.args.hog_cmd else [ctx.py, "-c", HOG, str(ctx.args.hog_leave_mib)]
    hog = Proc("hog", cmd, ctx.env(), sdir / "hog.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and hog.proc.poll() is None:
        text = (sdir / "hog.log").read_text()
        if "hog " in text:
            rec["hog"] = text.strip().splitlines()[-1]
            break
        time.sleep(0.5)
    else:
        rec["hog"] = f"no allocation reported (exit {hog.proc.poll()}): {(sdir / 'hog.log').read_text()[-300:]}"
    log(f"hog: {rec['hog']}")
    return hog


def _oom_rungs(ctx: Ctx, sdir: Path, rec: dict[str, Any], plan: dict[str, Any], plan_path: Path, pool: str,
               url: str, model: str, chunk: int, hogs: list[Proc]) -> None:
    for rung in ("planned", "replanned"):
        if rung == "replanned":
            if not rec.get("ended_by_itself:planned") or rec.get("exit_code:planned") == 0:
                break
            done = subprocess.run([ctx.py, str(REPLAN), "--deployment", ctx.args.oom_deployment, "--pool", pool,
                                   "--exit-code", str(rec["exit_code:planned"]), "--termination-message",
                                   str(sdir / "termination-engine-planned.log"), "--engine-version",
                                   ctx.args.engine_version, "--out-plan", str(sdir / "plan-replanned.json"),
                                   "--out-decision", str(sdir / "decision.json")],
                                  capture_output=True, text=True, check=False,
                                  env=ctx.env(ctx.args.router_site, ctx.args.src, ctx.args.site))
            rec["replan_rc"] = done.returncode
            (sdir / "replan.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                rec["error"] = f"replan.py exited {done.returncode}: {(done.stdout + done.stderr)[-300:]}"
                break
            plan_path = sdir / "plan-replanned.json"
            plan = json.loads(plan_path.read_text())
        if not ctx.fits(START_EST_S + 40):
            rec[f"skipped:{rung}"] = f"{ctx.left():.0f} s left"
            break
        proc, term = ctx.engine(sdir, f"engine-{rung}", plan, pool, ctx.args.oom_port)
        died = False
        try:
            rec[f"startup_s:{rung}"] = round(proc.wait_healthy(url, ctx.args.start_timeout), 1)
            rec[f"kv:{rung}"] = kv_compare(plan_path, pool, scrape(url), sdir)
            tpw = tokens_per_word(ctx, url, model)
            if ctx.args.hog_leave_mib is not None and not hogs:
                hogs.append(_start_hog(ctx, sdir, rec))
            answers: list[dict[str, Any]] = []
            for _ in range(3):  # the same request a few times: the first that runs out of memory ends the engine
                answers += oom_requests(url, model, tpw, chunk)
                if proc.proc.poll() is not None or answers[-1]["status"] != 200:
                    break
            rec[f"answers:{rung}"] = [{k: (str(v)[:300] if k == "body" else v) for k, v in a.items()}
                                      for a in answers]
            (sdir / f"metrics-end-{rung}.txt").write_text(scrape(url))
            died = answers[-1]["status"] != 200 or proc.proc.poll() is not None
            if died:
                try:
                    proc.proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    rec[f"note:{rung}"] = "a request failed but the engine was still running 90 s later"
        except RuntimeError as err:  # ended before /health answered: a start-time failure
            rec[f"error:{rung}"] = str(err)
            died = True
        finally:
            rec[f"exit_code:{rung}"] = proc.stop()
            rec[f"ended_by_itself:{rung}"] = died
        rec[f"termination:{rung}"] = term.read_text() if term.exists() else None


def step_moe(ctx: Ctx) -> dict[str, Any]:
    sdir = ctx.out / "moe"
    sdir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"step": "moe"}
    if not ctx.fits(START_EST_S + 30):
        rec["skipped"] = f"{ctx.left():.0f} s left"
        return rec
    plan_path = Path(ctx.args.plans) / "moe.json"
    plan = json.loads(plan_path.read_text())
    pool = next(p for p, v in plan["pools"].items() if v.get("enabled", True))
    url = f"http://127.0.0.1:{ctx.args.long_port}"
    proc, term = ctx.engine(sdir, "engine-moe", plan, pool, ctx.args.long_port, model_dir=ctx.args.moe_model_dir)
    try:
        rec["startup_s"] = round(proc.wait_healthy(url, ctx.args.start_timeout), 1)
        rec["kv"] = kv_compare(plan_path, pool, scrape(url), sdir)
        rec["probe"] = http_call(url + "/v1/completions", {"model": plan["pools"][pool]["servedModelName"],
                                                           "prompt": "Document 1 time year people", "max_tokens": 8,
                                                           "ignore_eos": True}, 60)
    except RuntimeError as err:
        rec["error"] = str(err)
    finally:
        rec["exit"] = proc.stop()
    rec["termination"] = term.read_text() if term.exists() else None
    return rec


LORA_TARGETS = ("q_proj", "v_proj")
ADAPTER = """import json, sys, torch
from safetensors.torch import save_file
cfg = json.load(open(sys.argv[1] + "/config.json")); out, r = sys.argv[2], int(sys.argv[3])
h = cfg["hidden_size"]; kv = cfg["num_key_value_heads"] * cfg.get("head_dim", h // cfg["num_attention_heads"])
g = torch.Generator().manual_seed(0); t = {}
for i in range(cfg["num_hidden_layers"]):
    for m, o in (("q_proj", h), ("v_proj", kv)):
        k = f"base_model.model.model.layers.{i}.self_attn.{m}"
        t[k + ".lora_A.weight"] = (torch.randn(r, h, generator=g) * 0.01).to(torch.bfloat16)
        t[k + ".lora_B.weight"] = (torch.randn(o, r, generator=g) * 0.01).to(torch.bfloat16)
save_file(t, out + "/adapter_model.safetensors")
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0,
           "target_modules": ["q_proj", "v_proj"], "bias": "none", "fan_in_fan_out": False,
           "base_model_name_or_path": sys.argv[1]}, open(out + "/adapter_config.json", "w"))
print(len(t), "tensors")
"""
"""A random LoRA adapter of the carried model's shape (q_proj and v_proj of every layer), made on the GPU machine
with its torch and safetensors: nothing of the kind is in the carried archives."""


def poll_status(url: str) -> dict[str, Any] | None:
    try:
        code, text = session.get(url + "/status", 2.0)
    except OSError:
        return None
    if code != 200:
        return None
    body: dict[str, Any] = json.loads(text)
    return body


def step_lora(ctx: Ctx) -> dict[str, Any]:
    sdir = ctx.out / "lora"
    sdir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"step": "lora", "starts": []}
    plan_path = Path(ctx.args.plans) / "lora.json"
    plan = json.loads(plan_path.read_text())
    pool = "long"
    served = plan["pools"][pool]["servedModelName"]
    adapter_dir = sdir / "a1"
    adapter_dir.mkdir(exist_ok=True)
    made = subprocess.run([ctx.py, "-c", ADAPTER, ctx.args.model_dir, str(adapter_dir), "16"], capture_output=True,
                          text=True, env=ctx.env(ctx.args.site), timeout=120, check=False)
    rec["adapter"] = (made.stdout + made.stderr).strip()[-400:]
    adapters_file = sdir / "adapters.json"
    adapters_file.write_text(json.dumps({"adapters": [{"name": "a1", "path": str(adapter_dir)}]}))
    if not (adapter_dir / "adapter_model.safetensors").exists():
        log(f"lora: no adapter made: {rec['adapter']}")
    url = f"http://127.0.0.1:{ctx.args.long_port}"
    for attempt in ("cold", "warm"):
        if not ctx.fits(START_EST_S + 30):
            rec["starts"].append({"start": attempt, "skipped": f"{ctx.left():.0f} s left"})
            break
        status_port = free_port()
        status_url = f"http://127.0.0.1:{status_port}"
        proc, term = ctx.engine(sdir, f"engine-{attempt}", plan, pool, ctx.args.long_port,
                                wrapper_args=("--adapters-file", str(adapters_file)), status_port=status_port)
        start: dict[str, Any] = {"start": attempt}
        try:
            start["healthy_s"] = round(proc.wait_healthy(url, ctx.args.start_timeout), 1)
            if attempt == "cold":
                start["kv"] = kv_compare(plan_path, pool, scrape(url), sdir)
            deadline, loaded = time.monotonic() + 60, None
            while time.monotonic() < deadline:
                state = (poll_status(status_url) or {}).get("adapters") or {}
                if "a1" in state.get("loaded", []) or "a1" in state.get("failed", {}):
                    loaded = state
                    break
                time.sleep(0.25)
            start["adapter_after_healthy_s"] = round(time.monotonic() - proc.t0 - start["healthy_s"], 2)
            start["adapter_state"] = loaded
            for model in (served, "a1"):
                start[f"completion:{model}"] = http_call(url + "/v1/completions", {
                    "model": model, "prompt": "Document 1 time year people", "max_tokens": 8, "ignore_eos": True}, 60)
            start["models"] = http_call(url + "/v1/models", None, 10)
            start["status"] = poll_status(status_url)
        except RuntimeError as err:
            start["error"] = str(err)
            log(f"lora {attempt} failed: {err}")
        finally:
            start["exit"] = proc.stop()
            start["termination"] = term.read_text() if term.exists() else None
        rec["starts"].append(start)
        if "error" in start:
            break
    return rec


STEPS = {
    "lora": step_lora,
    "split": lambda ctx: step_layout(ctx, "split", "shared", ("long", "short")),
    "unified": lambda ctx: step_layout(ctx, "unified", "unified", ("long",)),
    "oom": step_oom,
    "moe": step_moe,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dataplane.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--steps", required=True, help=f"comma-separated, from {sorted(STEPS)}")
    ap.add_argument("--plans", required=True, help="directory with shared.json, unified.json, oom.json, moe.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--archive", default=None)
    ap.add_argument("--model-dir", default="/tmp/model")
    ap.add_argument("--moe-model-dir", default="/tmp/moe-model")
    ap.add_argument("--tokenizer-dir", default=None, help="the router's tokenizer directory (default: --model-dir)")
    ap.add_argument("--models-mount", default="/tmp/models")
    ap.add_argument("--site", default="/tmp/site", help="PYTHONPATH entry holding vLLM")
    ap.add_argument("--src", default=str(HERE.parent.parent / "operator"), help="PYTHONPATH entry for vllm_operator")
    ap.add_argument("--router-site", default="", help="PYTHONPATH entry with the router's carried wheels")
    ap.add_argument("--oom-deployment", default=str(HERE / "deployments" / "oom.yaml"))
    ap.add_argument("--engine-version", default="0.26.0")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--tokens-per-word", type=float, default=None)
    ap.add_argument("--loadgen-args", default="")
    ap.add_argument("--engine-cmd", default=None, help="rehearsal: the wrapper runs this instead of vLLM ({port})")
    ap.add_argument("--budget-s", type=float, default=0.0)
    ap.add_argument("--hog-leave-mib", type=int, default=None,
                    help="oom step: once the engine is healthy, another process takes all free GPU memory but this")
    ap.add_argument("--hog-cmd", default=None, help="rehearsal: the memory taker to run instead of the torch one")
    ap.add_argument("--router-port", type=int, default=8080)
    ap.add_argument("--long-port", type=int, default=8001)
    ap.add_argument("--short-port", type=int, default=8002)
    ap.add_argument("--oom-port", type=int, default=8003)
    args = ap.parse_args(argv)
    names = [s for s in args.steps.split(",") if s]
    if unknown := [s for s in names if s not in STEPS]:
        print(f"error: unknown steps {unknown}; known: {sorted(STEPS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(args, out)
    signal.signal(signal.SIGTERM, on_sigterm)
    records: list[dict[str, Any]] = []
    for name in names:
        try:
            records.append(STEPS[name](ctx))
        except Interrupted as err:
            records.append({"step": name, "error": f"interrupted ({err})"})
            break
        except Exception as err:  # whatever ran must still reach the archive
            log(f"step {name} failed: {type(err).__name__}: {err}")
            records.append({"step": name, "error": f"{type(err).__name__}: {err}"})
        (out / "dataplane.json").write_text(json.dumps(records, indent=2) + "\n")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    (out / "dataplane.json").write_text(json.dumps(records, indent=2) + "\n")
    archive = Path(args.archive) if args.archive else out.parent / f"{out.name}.tar.xz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(out, arcname=out.name)
    log(f"wrote {archive} ({archive.stat().st_size} bytes)")
    print(json.dumps(records, indent=1, default=str)[:6000])
    return 1 if any("error" in r or "skipped" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
