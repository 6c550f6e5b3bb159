#!/usr/bin/env python3
"""What the router costs per request, side by side with nginx and the Rust `vllm-router`, in one run.

Why one run: the development machine has 2 cores shared with other engineers' test runs, so absolute figures move by
tens of percent from minute to minute. Every proxy is therefore measured in the same round as the direct path to the
upstream (the limit), the order of the targets rotates from round to round, and the figures are reported as
differences (added latency) and ratios to that round's direct baseline, with the spread over the rounds.

Layout (`taskset`): the proxy under test (our router, nginx, vllm-router) on core 0; the fake upstream
(`python -m fakevllm`) and the load generators on core 1, so the proxy has a core to itself and the
limit is what core 1 can generate and serve.

Two workloads:
* chat: a ~2 KB `/v1/chat/completions` request (system + user message), non-streaming, 16 output tokens.
* stream: the same request with `stream: true` and 256 output tokens = 256 content chunks (+ role and [DONE]).

Two measurements per workload and target:
* max rate: `wrk` (Debian) with a Lua script that posts the body, closed loop, N connections, D seconds.
  CPU seconds the proxy process used during the run are read from /proc, so CPU per request is also reported
  (less sensitive to the noise than the rate).
* latency at a fixed, moderate rate: an open-loop aiohttp client (the requests are sent on a fixed schedule,
  i/rate after the start, and each latency counts from its *scheduled* time, so a stall is not hidden by the client
  waiting for it: no coordinated omission). Debian has no wrk2. Added latency = the proxy's percentile minus the
  direct path's percentile in the same round.

`--profile` runs py-spy against our router under wrk load instead and writes collapsed stacks plus a summary.
`--tokenize` measures exact tokenization of a 100K-character prompt (in-process, and end to end through the router).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV_PY = REPO / ".venv" / "bin" / "python"
VLLM_ROUTER = REPO / ".venv-vllm-router" / "bin" / "vllm-router"
MODEL = "fake-model"
PROXY_CORE = "0"
LOAD_CORE = "1"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "engineers",
         "measure", "how", "much", "a", "gateway", "costs", "per", "request", "in", "latency", "and", "throughput",
         "on", "a", "small", "shared", "machine"]

# ------------------------------------------------------------------------------------------------ payloads


def prose(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def chat_body(stream: bool, user_chars: int = 1800, max_tokens: int = 16) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": prose(user_chars, 1)},
        ],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "ignore_eos": True,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


WORKLOADS: dict[str, dict[str, Any]] = {
    # name: body, wrk connections, fixed rate (req/s) for the latency run
    "chat": {"body": lambda: chat_body(False, max_tokens=16), "stream": False},
    "stream": {"body": lambda: chat_body(True, max_tokens=256), "stream": True},
}

# ------------------------------------------------------------------------------------------------ processes

SETTINGS = {"nice": 0}
"""`--nice`: every process of the benchmark runs at this niceness (negative = ahead of other users' jobs)."""


def pinned(core: str) -> list[str]:
    prefix = ["nice", "-n", str(SETTINGS["nice"])] if SETTINGS["nice"] else []
    return [*prefix, "taskset", "-c", core]



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    def __init__(self, name: str, argv: list[str], log: Path, core: str, cwd: Path | None = None) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as f:
            self.popen = subprocess.Popen([*pinned(core), *argv], stdout=f, stderr=subprocess.STDOUT,
                                          cwd=cwd, start_new_session=True)

    def pids(self) -> list[int]:
        """The process and its descendants (nginx workers)."""
        out = [self.popen.pid]
        frontier = [self.popen.pid]
        while frontier:
            pid = frontier.pop()
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            for k in kids:
                out.append(int(k))
                frontier.append(int(k))
        return out

    def cpu_seconds(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(30)


def wait_http(url: str, proc: Proc, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise SystemExit(f"{proc.name} exited with {proc.popen.returncode}; see {proc.log}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{proc.name} not ready at {url} within {timeout} s; see {proc.log}")


def router_config(upstream: str, tokenizer_dir: Path, port: int, strategy: str = "least-outstanding"
                  ) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "operator"))
    from vllm_operator.api.router_config import RouterConfig

    pool = {"enabled": True, "maxTokens": 4096, "endpoints": [upstream], "strategy": strategy}
    config = RouterConfig.model_validate({
        "model": MODEL, "deployment": "bench", "namespace": "bench",
        "promptLengthThreshold": 30000, "overLimit": "clamp",
        "tiers": [{"name": "default", "defaultMaxTokens": 256, "maxTokens": 4096}],
        "pools": {"short": {**pool, "maxModelLen": 32768}, "long": {**pool, "maxModelLen": 262144}},
        "tokenizer": {"path": str(tokenizer_dir)},
        "timeouts": {"connectSeconds": 2, "firstByteSeconds": 60, "idleSeconds": 60, "totalSeconds": 120},
        "maxBodyBytes": 4 * 1024 * 1024, "port": port,
    })
    return config.to_wire()


NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    client_max_body_size 4m;
    upstream engine {{
        server 127.0.0.1:{upstream_port};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


class Stack:
    """Every process of the run; targets are base URLs, each with the Proc whose CPU is the proxy's cost."""

    def __init__(self, work: Path, variants: list[str], baseline: Path | None = None,
                 router_python: Path = VENV_PY) -> None:
        self.work = work
        self.router_python = router_python
        self.procs: list[Proc] = []
        self.targets: dict[str, tuple[str, Proc | None]] = {}
        self.variants = variants
        self.baseline = baseline

    def start(self, tokens_dir: Path) -> None:
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        fake = self._spawn("fake-vllm", [str(VENV_PY), "-m", "fakevllm", "--port", str(up_port),
                                         "--no-record", "--max-model-len", "262144", "--tokens", "256",
                                         "--log-level", "WARNING"], LOAD_CORE)
        wait_http(f"{upstream}/health", fake)
        self.upstream_proc = fake
        self.targets["direct"] = (upstream, None)
        for variant in self.variants:
            if variant == "nginx":
                port = free_port()
                conf = self.work / "nginx.conf"
                conf.write_text(NGINX_CONF.format(work=self.work, upstream_port=up_port, port=port))
                proc = self._spawn("nginx", ["nginx", "-p", str(self.work), "-c", str(conf), "-e",
                                             str(self.work / "nginx-error.log")], PROXY_CORE)
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/health", proc)
            elif variant == "vllm-router":
                port = free_port()
                proc = self._spawn("vllm-router", [str(VLLM_ROUTER), *vllm_router_args(upstream, port)], PROXY_CORE)
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/health", proc)
            elif variant == "router" or variant.startswith("router-"):
                # `router[-MOD…]`: the router as `vllm-operator router --config router.json` runs it, at the log
                # level INFO it ships with (access log on, written to the target's log file), on uvloop when the
                # interpreter has it (a dependency of the package). Modifiers: `-asyncio` hides uvloop (plain
                # asyncio), `-noaccesslog` passes --no-access-log,
                # `-quiet` runs it at --log-level WARNING (how runs before the access log were made), `-baseline`
                # runs the router of another checkout (--baseline DIR, e.g. the commit before a change), `-prefix`
                # puts both pools on the prefix strategy (prefix naming, index and choice on every request).
                mods = set(variant.split("-")[1:])
                unknown = mods - {"asyncio", "noaccesslog", "quiet", "baseline", "prefix"}
                if unknown:
                    raise SystemExit(f"unknown router target modifier(s) {sorted(unknown)} in {variant!r}")
                port = free_port()
                cfg = self.work / f"{variant}.json"
                wire = router_config(upstream, tokens_dir, port, "prefix" if "prefix" in mods else "least-outstanding")
                if "baseline" in mods:
                    wire.pop("accessLog", None)  # newer than the baselines measured so far (their configs refuse it)
                cfg.write_text(json.dumps(wire, indent=2))
                block = "sys.modules['uvloop'] = None; " if "asyncio" in mods else ""
                if "baseline" in mods:
                    if self.baseline is None:
                        raise SystemExit(f"{variant} needs --baseline DIR (a checkout with operator/ in it)")
                    block += f"sys.path.insert(0, {str(self.baseline / 'operator')!r}); "
                argv = ["router", "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
                        "--log-level", "WARNING" if "quiet" in mods else "INFO"]
                if "noaccesslog" in mods:
                    argv.append("--no-access-log")
                code = f"import sys; {block}from vllm_operator.cli import main; sys.exit(main({argv!r}))"
                proc = self._spawn(variant, [str(self.router_python), "-c", code], PROXY_CORE)
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/health", proc)
            else:
                raise SystemExit(f"unknown target {variant!r}")
            self.targets[variant] = (url, proc)

    def _spawn(self, name: str, argv: list[str], core: str) -> Proc:
        proc = Proc(name, argv, self.work / f"{name}.log", core, cwd=REPO)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except subprocess.TimeoutExpired:
                print(f"{proc.name} (pid {proc.popen.pid}) did not stop", file=sys.stderr)


def vllm_router_args(upstream: str, port: int) -> list[str]:
    """How vllm-router is configured: one static worker, round robin (no prefix-cache tree to maintain), its
    defaults otherwise (retries, circuit breaker, 60 s health checks, request queue)."""
    return ["--worker-urls", upstream, "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            "--log-level", "warning", "--prometheus-port", str(free_port())]


# ------------------------------------------------------------------------------------------------ wrk (max rate)

WRK_LUA = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = assert(io.open(os.getenv("BENCH_BODY"), "rb"))
wrk.body = f:read("*a")
f:close()
"""


def parse_wrk(text: str) -> dict[str, Any]:
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if not m:
        raise RuntimeError(f"no Requests/sec in wrk output:\n{text}")
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errors = re.search(r"Socket errors:.*", text)
    total = re.search(r"(\d+) requests in", text)
    return {"rps": float(m.group(1)), "requests": int(total.group(1)) if total else None,
            "non_2xx": int(bad.group(1)) if bad else 0, "socket_errors": errors.group(0) if errors else None}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_wrk(url: str, body_file: Path, lua: Path, connections: int, seconds: float, proc: Proc | None,
            upstream: Proc) -> dict[str, Any]:
    """Closed-loop max rate. Besides the rate, the CPU seconds each side used per request: the proxy (core 0) and
    the upstream plus wrk (core 1). Those stay meaningful when other jobs take CPU away, and give the rate each
    core could sustain on its own (1 s / CPU per request)."""
    cpu0 = proc.cpu_seconds() if proc else 0.0
    up0, wrk0 = upstream.cpu_seconds(), children_cpu()
    t0 = time.monotonic()
    out = subprocess.run([*pinned(LOAD_CORE), "wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s",
                          "--timeout", "10s", "-s", str(lua), f"{url}/v1/chat/completions"],
                         capture_output=True, text=True, env={**os.environ, "BENCH_BODY": str(body_file)},
                         check=True)
    elapsed = time.monotonic() - t0
    result = parse_wrk(out.stdout)
    n = result["requests"]
    if n:
        result["upstream_cpu_us_per_req"] = (upstream.cpu_seconds() - up0) / n * 1e6
        result["wrk_cpu_us_per_req"] = (children_cpu() - wrk0) / n * 1e6
        if proc:
            cpu = proc.cpu_seconds() - cpu0
            result["proxy_cpu_us_per_req"] = cpu / n * 1e6
            result["proxy_cpu_util"] = cpu / elapsed
    return result


# ------------------------------------------------------------------------------------------------ open loop

OPEN_LOOP_CLIENT = r'''
import asyncio, json, sys, time
import aiohttp

async def main(url, body_file, rate, seconds):
    # Plain asyncio (not uvloop): its timers and clock have sub-millisecond resolution; uvloop's are 1 ms.
    body = open(body_file, "rb").read()
    n = int(rate * seconds)
    lat, ttfb, bad = [], [], 0
    clock = time.perf_counter
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=conn, timeout=timeout, auto_decompress=False) as s:
        async def warm():
            async with s.post(url, data=body, headers=headers) as r:
                await r.read()
        await asyncio.gather(*(warm() for _ in range(8)))  # open a few keep-alive connections (not measured)
        start = clock() + 0.05

        async def one(i):
            nonlocal bad
            due = start + i / rate          # the fixed schedule: latency counts from here (open loop)
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            first = None
            try:
                async with s.post(url, data=body, headers=headers) as r:
                    async for _ in r.content.iter_any():
                        if first is None:
                            first = clock()
                    end = clock()
                    if r.status != 200:
                        bad += 1
                        return
            except Exception:
                bad += 1
                return
            lat.append(end - due)
            ttfb.append((first or end) - due)

        await asyncio.gather(*(one(i) for i in range(n)))
        lag = clock() - (start + n / rate)
    json.dump({"latency": lat, "ttfb": ttfb, "bad": bad, "sent": n, "end_lag_s": lag}, sys.stdout)

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
'''


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def run_open_loop(url: str, body_file: Path, client: Path, rate: float, seconds: float) -> dict[str, Any]:
    out = subprocess.run([*pinned(LOAD_CORE), str(VENV_PY), str(client), f"{url}/v1/chat/completions",
                          str(body_file), str(rate), str(seconds)],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    lat = [x * 1000 for x in data["latency"]]
    ttfb = [x * 1000 for x in data["ttfb"]]
    return {"n": len(lat), "bad": data["bad"], "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90),
            "p99_ms": pct(lat, 99), "max_ms": max(lat) if lat else None, "ttfb_p50_ms": pct(ttfb, 50),
            "ttfb_p99_ms": pct(ttfb, 99)}


# ------------------------------------------------------------------------------------------------ the run


def make_tokenizer(work: Path) -> Path:
    out = work / "tiny-model"
    if not (out / "tokenizer.json").exists():
        subprocess.run([str(VENV_PY), str(REPO / "scripts" / "make_model.py"), "--shape", "tiny", "--out", str(out)],
                       check=True, capture_output=True)
    return out


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure(args: argparse.Namespace, stack: Stack, work: Path) -> dict[str, Any]:
    lua = work / "post.lua"
    lua.write_text(WRK_LUA)
    client = work / "open_loop.py"
    client.write_text(OPEN_LOOP_CLIENT)
    rates = {"chat": args.chat_rate, "stream": args.stream_rate}
    conns = {"chat": args.chat_connections, "stream": args.stream_connections}
    rounds: list[dict[str, Any]] = []
    names = list(stack.targets)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        rnd: dict[str, Any] = {"round": r + 1, "order": order, "loadavg_start": loadavg(), "results": {}}
        for wl, spec in WORKLOADS.items():
            body_file = work / f"{wl}.json"
            body_file.write_bytes(spec["body"]())
            for name in order:
                url, proc = stack.targets[name]
                res: dict[str, Any] = {}
                if not args.skip_max:
                    res["max"] = run_wrk(url, body_file, lua, conns[wl], args.max_seconds, proc,
                                         stack.upstream_proc)
                if not args.skip_latency:
                    res["fixed"] = run_open_loop(url, body_file, client, rates[wl], args.latency_seconds)
                rnd["results"].setdefault(wl, {})[name] = res
                print(f"round {r + 1} {wl:6s} {name:14s} {json.dumps(res)}", flush=True)
        rnd["loadavg_end"] = loadavg()
        rounds.append(rnd)
    return {"rounds": rounds, "rates": rates, "connections": conns, "router_metrics": router_overhead(stack)}


def router_overhead(stack: Stack) -> dict[str, Any]:
    """The router's own view: `overhead_seconds` (arrival to forwarding: parse, count, decide, rewrite) and the
    prompt-count methods it used, from its /metrics after the run."""
    out: dict[str, Any] = {}
    for name, (url, _) in stack.targets.items():
        if not name.startswith("router"):
            continue
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
                text = r.read().decode()
        except OSError as err:  # a machine too busy to answer in time loses this extra, not the run
            out[name] = {"error": str(err)}
            continue
        total = re.search(r"^vllm_operator_router_overhead_seconds_sum\S* ([\d.e+-]+)$", text, re.M)
        count = re.search(r"^vllm_operator_router_overhead_seconds_count\S* ([\d.e+-]+)$", text, re.M)
        methods = dict(re.findall(r'^vllm_operator_router_prompt_counts_total\{method="([^"]+)"\} ([\d.e+-]+)$', text,
                                  re.M))
        if total and count and float(count.group(1)):
            out[name] = {"requests": int(float(count.group(1))),
                         "mean_overhead_us": float(total.group(1)) / float(count.group(1)) * 1e6,
                         "prompt_count_methods": {k: int(float(v)) for k, v in methods.items()}}
    return out


def summarize(data: dict[str, Any]) -> str:
    """Markdown table: medians over rounds of per-round differences/ratios against direct, with min–max."""
    lines = []
    rounds = data["rounds"]
    for wl in WORKLOADS:
        lines.append(f"\n### {wl} (fixed rate {data['rates'][wl]:g}/s for latency; wrk -c{data['connections'][wl]})\n")
        lines.append("| target | added p50 ms | added p99 ms | p50 / p99 ms | max rate req/s | ratio to direct | "
                     "proxy CPU µs/req | core 1 CPU µs/req | CPU-bound rate (ratio) |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        names = list(rounds[0]["results"][wl])
        names.sort(key=lambda n: (n != "direct", n))
        for name in names:
            add50, add99, p50, p99, rps, ratio, cpu, core1, bound, bound_ratio = ([] for _ in range(10))
            for rnd in rounds:
                res = rnd["results"][wl]
                me, base = res[name], res["direct"]
                if "fixed" in me:
                    p50.append(me["fixed"]["p50_ms"])
                    p99.append(me["fixed"]["p99_ms"])
                    add50.append(me["fixed"]["p50_ms"] - base["fixed"]["p50_ms"])
                    add99.append(me["fixed"]["p99_ms"] - base["fixed"]["p99_ms"])
                if "max" in me:
                    rps.append(me["max"]["rps"])
                    ratio.append(me["max"]["rps"] / base["max"]["rps"])
                    if "proxy_cpu_us_per_req" in me["max"]:
                        cpu.append(me["max"]["proxy_cpu_us_per_req"])
                    if "upstream_cpu_us_per_req" in me["max"]:
                        one = me["max"]["upstream_cpu_us_per_req"] + me["max"]["wrk_cpu_us_per_req"]
                        base1 = base["max"]["upstream_cpu_us_per_req"] + base["max"]["wrk_cpu_us_per_req"]
                        core1.append(one)
                        # each core on its own at 100 %: the slower one sets the rate
                        est = 1e6 / max(one, me["max"].get("proxy_cpu_us_per_req", 0.0))
                        bound.append(est)
                        bound_ratio.append(est / (1e6 / base1))

            def cell(xs: list[float], fmt: str) -> str:
                if not xs:
                    return "–"
                med = statistics.median(xs)
                if len(xs) == 1:
                    return format(med, fmt)
                return f"{format(med, fmt)} ({format(min(xs), fmt)}…{format(max(xs), fmt)})"

            lat = f"{statistics.median(p50):.2f} / {statistics.median(p99):.2f}" if p50 else "–"
            if name == "direct":
                lines.append(f"| direct (limit) | – | – | {lat} | {cell(rps, '.0f')} | 1 | – | {cell(core1, '.0f')} | "
                             f"{cell(bound, '.0f')} (1) |")
            else:
                br = f"{statistics.median(bound_ratio):.2f}" if bound_ratio else "–"
                lines.append(f"| {name} | {cell(add50, '.2f')} | {cell(add99, '.2f')} | {lat} | {cell(rps, '.0f')} | "
                             f"{cell(ratio, '.2f')} | {cell(cpu, '.0f')} | {cell(core1, '.0f')} | "
                             f"{cell(bound, '.0f')} ({br}) |")
    errors = [f"round {rnd['round']} {wl} {name}: {res['max']['non_2xx']} non-2xx in the max-rate run"
              for rnd in rounds for wl, per in rnd["results"].items() for name, res in per.items()
              if res.get("max", {}).get("non_2xx")]
    errors += [f"round {rnd['round']} {wl} {name}: {res['fixed']['bad']} failed in the fixed-rate run"
               for rnd in rounds for wl, per in rnd["results"].items() for name, res in per.items()
               if res.get("fixed", {}).get("bad")]
    lines.append("\nErrors: " + ("; ".join(errors) if errors else "none (every response 200)."))
    loads = [rnd["loadavg_start"][0] for rnd in rounds] + [rnd["loadavg_end"][0] for rnd in rounds]
    lines.append(f"\nLoad average (1 min) during the run: {min(loads):.2f}–{max(loads):.2f}.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ profile

CATEGORIES = [
    # (label, regex on a frame "function (file:line)"); first match from the leaf upwards wins
    ("aiohttp server: HTTP parsing / request objects", r"aiohttp/(web_protocol|http_parser|web_request|helpers|"
     r"_http_parser|streams|web_urldispatcher|web_app)"),
    ("aiohttp server: writing the response", r"aiohttp/(web_response|http_writer|abc|payload)"),
    ("router: JSON parse + re-serialise", r"json/(decoder|encoder|__init__)"),
    ("router: tokens/decide (bounds, decision)", r"vllm_operator/router/(tokens|decide)"),
    ("router: upstream client (http1)", r"vllm_operator/router/http1"),
    ("router: metrics (prometheus_client)", r"prometheus_client|vllm_operator/router/metrics"),
    ("router: HTTP server (server.py: parsing, dispatch, writing)", r"vllm_operator/router/server"),
    ("router: proxy.py own code", r"vllm_operator/router/proxy"),
    ("router: auth / upstream choice", r"vllm_operator/router/(auth|upstreams)"),
    ("event loop and socket I/O (asyncio in Python)", r"asyncio/|uvloop|selectors"),
]


IDLE = re.compile(r"^(EpollSelector\.)?select \(selectors\.py")
"""asyncio's wait in epoll: the process was idle (py-spy samples it like work)."""
UVLOOP_LOOP = re.compile(r"^Runner\.run \(asyncio/runners\.py")
"""uvloop runs its loop in C: py-spy (without --native) sees it as time in Runner.run, idle wait included."""


def summarize_profile(collapsed: Path) -> dict[str, Any]:
    """Attribute each busy sample to the innermost frame matching a category (so library calls made *by* router
    code count as the library's); the idle epoll wait is counted apart and left out of the shares."""
    counts: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        leaf = frames[-1] if frames else ""
        if IDLE.search(leaf):
            idle += int(n)
            continue
        total += int(n)
        label = "other"
        if UVLOOP_LOOP.search(leaf):
            label = "uvloop's C event loop (I/O syscalls and idle wait, not separable)"
        else:
            for frame in reversed(frames):
                hit = next((lab for lab, rx in CATEGORIES if re.search(rx, frame)), None)
                if hit:
                    label = hit
                    break
        counts[label] += int(n)
    shares = [(label, n / total * 100) for label, n in counts.most_common()] if total else []
    return {"busy_samples": total, "idle_samples": idle, "shares": shares}


def self_time_top(collapsed: Path, top: int = 25) -> list[tuple[str, float]]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        counts[stack.split(";")[-1]] += int(n)
    return [(f, n / total * 100) for f, n in counts.most_common(top)]


def profile(args: argparse.Namespace, stack: Stack, work: Path) -> dict[str, Any]:
    pyspy = REPO / ".venv" / "bin" / "py-spy"
    lua = work / "post.lua"
    lua.write_text(WRK_LUA)
    out: dict[str, Any] = {}
    for variant in [v for v in stack.targets if v.startswith("router")]:
        url, proc = stack.targets[variant]
        assert proc is not None
        pid = proc.pids()[-1] if len(proc.pids()) > 1 else proc.popen.pid
        for wl, spec in WORKLOADS.items():
            body_file = work / f"{wl}.json"
            body_file.write_bytes(spec["body"]())
            collapsed = work / f"profile-{variant}-{wl}.txt"
            spy = subprocess.Popen([*pinned(LOAD_CORE), str(pyspy), "record", "--pid", str(pid), "--rate",
                                    "200", "--duration", str(int(args.max_seconds) + 1), "--format", "raw",
                                    "--output", str(collapsed), *(["--native"] if args.native else ["--nonblocking"])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)
            res = run_wrk(url, body_file, lua, args.chat_connections if wl == "chat" else args.stream_connections,
                          args.max_seconds, proc, stack.upstream_proc)
            spy.wait(60)
            shutil.copy(collapsed, HERE / "profiles" / collapsed.name)
            summary = summarize_profile(collapsed)
            out[f"{variant}/{wl}"] = {"wrk": res, "categories": summary, "self_top": self_time_top(collapsed)}
            per_req = res.get("proxy_cpu_us_per_req", 0.0)
            print(f"profile {variant} {wl}: {res}", flush=True)
            print(f"  busy samples {summary['busy_samples']}, idle (epoll wait) {summary['idle_samples']}; "
                  f"shares of the busy samples, and of the {per_req:.0f} µs CPU per request:")
            for label, share in summary["shares"]:
                print(f"  {share:5.1f} %  {share / 100 * per_req:6.1f} µs  {label}")
    return out


# ------------------------------------------------------------------------------------------------ tokenization


def tokenize_cost(args: argparse.Namespace, stack: Stack | None, tokens_dir: Path, work: Path) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "operator"))
    from vllm_operator.api.router_config import TokenizerConfig
    from vllm_operator.router.tokens import extract_prompt, load_counter

    counter = load_counter(TokenizerConfig(path=str(tokens_dir)))
    text = prose(100_000, 7)
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16, "ignore_eos": True}
    prompt = extract_prompt(True, body)
    assert not isinstance(prompt, tuple) and hasattr(prompt, "texts")
    lower, upper = counter.bounds(prompt)  # type: ignore[arg-type]
    times = []
    n = 0
    for _ in range(args.tokenize_repeats):
        t0 = time.perf_counter()
        n = counter.exact(prompt)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
    result: dict[str, Any] = {
        "tokenizer": str(tokens_dir / "tokenizer.json"), "vocab": counter.tokenizer.get_vocab_size()
        if counter.tokenizer else None, "chars": len(text), "tokens": n, "bounds": [lower, upper],
        "exact_ms_median": statistics.median(times) * 1000, "exact_ms_min": min(times) * 1000,
        "exact_ms_max": max(times) * 1000}
    if stack is not None and "router" in stack.targets:
        body_bytes = json.dumps(body).encode()
        e2e: dict[str, list[float]] = {"direct": [], "router": []}
        methods = set()
        for _ in range(args.tokenize_repeats):
            for name in ("direct", "router"):
                url = stack.targets[name][0]
                req = urllib.request.Request(f"{url}/v1/chat/completions", data=body_bytes,
                                             headers={"Content-Type": "application/json"})
                t0 = time.perf_counter()
                with urllib.request.urlopen(req, timeout=30) as r:
                    r.read()
                    if name == "router":
                        methods.add(r.headers.get("x-vllm-operator-prompt-tokens-method"))
                e2e[name].append(time.perf_counter() - t0)
        result["e2e_ms_median"] = {k: statistics.median(v) * 1000 for k, v in e2e.items()}
        result["e2e_added_ms_median"] = result["e2e_ms_median"]["router"] - result["e2e_ms_median"]["direct"]
        result["router_count_methods"] = sorted(m or "?" for m in methods)
    print(f"tokenize: {json.dumps(result)}", flush=True)
    return result


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", default="nginx,router,router-noaccesslog,vllm-router",
                   help="comma list of nginx, vllm-router and "
                        "router[-asyncio][-noaccesslog][-quiet][-baseline][-prefix] (see Stack.start: router as "
                        "shipped; uvloop hidden; access log off; log level WARNING; the router of --baseline; prefix "
                        "strategy)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="another checkout's root for the router-baseline target, e.g. "
                        "`mkdir /tmp/base && git archive HEAD~1 operator | tar -x -C /tmp/base`")
    p.add_argument("--router-python", type=Path, default=VENV_PY,
                   help="the interpreter of the router targets (a venv with the project installed), e.g. "
                        ".venv-py312/bin/python for the router image's Python 3.12; default .venv's")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=5.0)
    p.add_argument("--latency-seconds", type=float, default=8.0)
    p.add_argument("--chat-rate", type=float, default=500.0, help="fixed rate of the chat latency run (req/s)")
    p.add_argument("--stream-rate", type=float, default=40.0, help="fixed rate of the stream latency run (req/s)")
    p.add_argument("--chat-connections", type=int, default=32)
    p.add_argument("--stream-connections", type=int, default=16)
    p.add_argument("--skip-max", action="store_true")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--profile", action="store_true", help="py-spy our router under wrk load instead")
    p.add_argument("--native", action="store_true",
                   help="with --profile: native frames too (uvloop's C loop, syscalls); py-spy then pauses the "
                        "process per sample, so compare shares, not rates")
    p.add_argument("--tokenize", action="store_true", help="also measure exact tokenization of a 100K-char prompt")
    p.add_argument("--tokenize-repeats", type=int, default=20)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-operator-router-bench"))
    p.add_argument("--nice", type=int, default=0,
                   help="niceness of every benchmark process (e.g. -5 on a machine shared with other jobs)")
    p.add_argument("--json", type=Path, default=None, help="write all results here")
    p.add_argument("--report", type=Path, default=None, help="print the tables of a recorded --json file and exit")
    args = p.parse_args()
    if args.report:
        print(summarize(json.loads(args.report.read_text())["bench"]))
        return 0
    SETTINGS["nice"] = args.nice
    for tool in ("taskset", "wrk", "nginx"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install -y wrk nginx-light util-linux)")
    if os.cpu_count() is None or os.cpu_count() < 2:  # type: ignore[operator]
        raise SystemExit("needs 2 cores (proxy on core 0, upstream + load on core 1)")
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    (HERE / "profiles").mkdir(exist_ok=True)
    tokens_dir = make_tokenizer(work)
    variants = [t for t in args.targets.split(",") if t]
    if any(v.startswith("router") for v in variants) and subprocess.run(
            [str(args.router_python), "-c", "import uvloop"], check=False, capture_output=True).returncode:
        raise SystemExit(f"{args.router_python} has no uvloop (a dependency of the package): reinstall it")
    if "vllm-router" in variants and not VLLM_ROUTER.exists():
        raise SystemExit(f"{VLLM_ROUTER} missing: python3.11 -m venv .venv-vllm-router && "
                         ".venv-vllm-router/bin/pip install vllm-router==0.1.17")
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False,
                                     capture_output=True,
                                     text=True).stdout.strip(), "loadavg_start": loadavg(), "args": {
                k: str(v) for k, v in vars(args).items()}, "vllm_router_args": vllm_router_args("UPSTREAM", 0)}
    meta["router_python"] = subprocess.run([str(args.router_python), "-c", "import sys; print(sys.version)"],
                                           check=True, capture_output=True, text=True).stdout.strip()
    stack = Stack(work, variants, args.baseline, args.router_python)
    results: dict[str, Any] = {"meta": meta}
    try:
        stack.start(tokens_dir)
        if args.profile:
            results["profile"] = profile(args, stack, work)
        else:
            results["bench"] = measure(args, stack, work)
            print(summarize(results["bench"]))
        if args.tokenize:
            results["tokenize"] = tokenize_cost(args, stack, tokens_dir, work)
    finally:
        stack.stop()
    meta["loadavg_end"] = loadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
