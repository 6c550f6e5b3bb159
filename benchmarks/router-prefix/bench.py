#!/usr/bin/env python3
"""Prefix routing against least-outstanding on real vLLM (CPU), two replicas of a pool, multi-turn sessions, one run.

Layout: two real vLLM CPU servers (the tiny model of scripts/make_model.py, `--load-format=dummy`, prefix caching
on as vLLM's default, engine A on core 0 and engine B on core 1) are the two replicas of one pool. Two router
processes sit in front of both: one with `strategy: prefix`, one with `strategy: least-outstanding`; everything else
in their router.json is the same (tokenizer = the model's tokenizer.json, static endpoints).

Workload per phase (one strategy): `--sessions` conversations, each `--turns` turns. A turn sends the whole
conversation so far plus a new user message — `--first-words` words for the first (a document or long context the
conversation is about), `--user-words` for the later ones (random words, so nothing is shared across conversations or
phases) — streams the answer (`--max-tokens`, ignore_eos) and appends it as the assistant message: a session grows
by about user + answer tokens a turn, and prefill dominates. `--concurrency` clients take the next
pending turn of the conversations round-robin (many users at once, each waiting for their answer before the next
turn). Each engine's KV cache (`--kv-mib`, default 40 MiB = 40K tokens of the tiny model) holds about half of all
the conversations (12 x ~4K tokens): what prefix routing partitions fits, what least-outstanding duplicates on both
replicas does not — caches are full in production. `--kv-mib 256` is the ample-cache case.

Per phase: prefix cache hit rate = Δ vllm:prefix_cache_hits_total / Δ vllm:prefix_cache_queries_total over both
engines (tokens), TTFT p50/p99 at the client (request sent → first streamed content), balance = max/mean requests
per engine (Δ vllm:request_success_total), and the router process's CPU seconds per request. Rounds rotate which
strategy goes first (`--variants prefix,prefix@1.5` adds routers with another loadFactor). Ratios are prefix /
least-outstanding within the same round.

    .venv/bin/python benchmarks/router-prefix/bench.py --rounds 3 --json benchmarks/router-prefix/results/DATE.json
    .venv/bin/python benchmarks/router-prefix/bench.py --report benchmarks/router-prefix/results/DATE.json

`--memory` measures the router's prefix state instead (no engines): bytes per remembered block of the index and of
the text cache, at the planner's ceiling of 262,144 blocks, and the CPU of one prefix choice in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "operator"))

import aiohttp  # noqa: E402

from tests.support.net import free_port  # noqa: E402
from tests.support.vllm_cpu import cpu_env, make_model, metric_lines, start_vllm  # noqa: E402

MODEL = "tiny-llama"
ROUTER_MAX_MODEL_LEN = 65536
WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
    "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
    "xray", "yankee", "zulu", "red", "green", "blue", "cyan", "magenta", "yellow", "black", "white", "north",
    "south", "east", "west", "river", "mountain", "valley", "ocean", "forest", "desert", "island", "city",
    "village", "road",
)


# ------------------------------------------------------------------------------------------------ processes


def router_config(variant: str, engines: list[str], tokenizer_dir: Path, port: int) -> dict[str, Any]:
    """`variant`: least-outstanding, prefix, or prefix@F (prefix with loadFactor F)."""
    from vllm_operator.api.router_config import RouterConfig

    # The router is told a longer context than the engines have, so that counting never needs the tokenizer (the
    # bounds settle every decision) and the CPU difference between the two routers is the prefix naming alone.
    strategy, _, factor = variant.partition("@")
    prefix: dict[str, Any] = {"blockTokens": 128, "indexBlocks": 65536}
    if factor:
        prefix["loadFactor"] = float(factor)
    pool = {"enabled": True, "maxModelLen": ROUTER_MAX_MODEL_LEN, "maxTokens": 512, "endpoints": engines,
            "strategy": strategy, "prefix": prefix}
    return RouterConfig.model_validate({
        "model": MODEL, "deployment": "bench", "namespace": "bench",
        "promptLengthThreshold": ROUTER_MAX_MODEL_LEN, "overLimit": "clamp",
        "tiers": [{"name": "default", "defaultMaxTokens": 64, "maxTokens": 512}],
        "pools": {"short": {**pool, "enabled": False}, "long": pool},
        "tokenizer": {"path": str(tokenizer_dir)},
        "timeouts": {"connectSeconds": 5, "firstByteSeconds": 300, "idleSeconds": 300, "totalSeconds": 600},
        "maxBodyBytes": 8 * 1024 * 1024, "health": {"intervalSeconds": 5, "timeoutSeconds": 5}, "port": port,
    }).to_wire()


class Router:
    def __init__(self, strategy: str, engines: list[str], model_dir: Path, work: Path) -> None:  # strategy = variant
        self.strategy = strategy
        self.port = free_port()
        cfg = work / f"router-{strategy}.json"
        cfg.write_text(json.dumps(router_config(strategy, engines, model_dir, self.port)))
        self.log = (work / f"router-{strategy}.log").open("wb")
        self.proc = subprocess.Popen([str(REPO / ".venv" / "bin" / "vllm-operator"), "router", "--config", str(cfg),
                                      "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "WARNING"],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time of the router process (all its threads), in ns resolution from the scheduler's accounting."""
        return int(Path(f"/proc/{self.proc.pid}/schedstat").read_text().split()[0]) / 1e9

    def wait(self) -> None:
        import urllib.request
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.3)
        raise SystemExit(f"router {self.strategy} not ready; see {self.log.name}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def counters(engine_metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:request_success_total",
                 "vllm:prompt_tokens_total"):
        out[name] = sum(float(line.rsplit(" ", 1)[1]) for line in metric_lines(engine_metrics, name))
    return out


# ------------------------------------------------------------------------------------------------ workload


def user_text(rng: random.Random, words: int) -> str:
    """Random words (about 4 tokens each with the tiny model's 2K-entry BPE: prompt sizes are reported from the
    engines' usage)."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def run_phase(url: str, sessions: int, turns: int, concurrency: int, first_words: int, user_words: int,
                    max_tokens: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    convs: list[list[dict[str, str]]] = [[{"role": "system", "content": f"You are assistant {seed}-{s}."}]
                                         for s in range(sessions)]
    pending = [s for _ in range(turns) for s in range(sessions)]  # round-robin over the conversations
    busy: set[int] = set()
    ttfts: list[float] = []
    prompt_tokens: list[int] = []
    errors: list[str] = []
    cond = asyncio.Condition()

    async def worker(http: aiohttp.ClientSession) -> None:
        while True:
            async with cond:
                while True:  # the next pending turn whose conversation is not waiting for its previous answer
                    if not pending:
                        return
                    pick = next((i for i, s in enumerate(pending) if s not in busy), None)
                    if pick is not None:
                        s = pending.pop(pick)
                        busy.add(s)
                        break
                    await cond.wait()
            conv = convs[s]
            conv.append({"role": "user", "content": user_text(rng, first_words if len(conv) == 1 else user_words)})
            body = {"model": MODEL, "messages": conv, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, "temperature": 0}
            start = time.perf_counter()
            first: float | None = None
            reply: list[str] = []
            async with http.post(url + "/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    errors.append(f"{response.status}: {(await response.text())[:200]}")
                else:
                    async for line in response.content:
                        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                            continue
                        event = json.loads(line[6:])
                        for choice in event.get("choices") or []:
                            text = (choice.get("delta") or {}).get("content")
                            if text:
                                if first is None:
                                    first = time.perf_counter()
                                reply.append(text)
                        if event.get("usage"):
                            prompt_tokens.append(int(event["usage"]["prompt_tokens"]))
            if first is not None:
                ttfts.append(first - start)
            conv.append({"role": "assistant", "content": "".join(reply)})
            async with cond:
                busy.discard(s)
                cond.notify_all()

    timeout = aiohttp.ClientTimeout(total=900)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    return {"ttft_s": ttfts, "prompt_tokens": prompt_tokens, "errors": errors, "wall_s": wall}


def pct(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def router_choices(url: str) -> dict[str, float]:
    """The router's prefix_choices_total by outcome (hit, spill, miss); empty for least-outstanding."""
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in metric_lines(text, "vllm_operator_router_prefix_choices_total"):
        outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
        out[outcome] = out.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def phase_summary(before: list[dict[str, float]], after: list[dict[str, float]], res: dict[str, Any],
                  cpu: float) -> dict[str, Any]:
    d = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    hits = sum(x["vllm:prefix_cache_hits_total"] for x in d)
    queries = sum(x["vllm:prefix_cache_queries_total"] for x in d)
    per_engine = [x["vllm:request_success_total"] for x in d]
    requests = sum(per_engine)
    return {
        "hit_rate": hits / queries if queries else 0.0, "hits": hits, "queries": queries,
        "requests_per_engine": per_engine,
        "balance_max_over_mean": max(per_engine) / (requests / len(per_engine)) if requests else float("nan"),
        "ttft_p50_s": pct(res["ttft_s"], 0.5), "ttft_p99_s": pct(res["ttft_s"], 0.99),
        "ttft_mean_s": statistics.fmean(res["ttft_s"]) if res["ttft_s"] else float("nan"),
        "prompt_tokens_mean": statistics.fmean(res["prompt_tokens"]) if res["prompt_tokens"] else 0,
        "prompt_tokens_max": max(res["prompt_tokens"], default=0),
        "router_cpu_ms_per_request": cpu / requests * 1e3 if requests else float("nan"),
        "errors": res["errors"], "wall_s": res["wall_s"],
    }


def summarize(data: dict[str, Any]) -> str:
    variants = list(data["rounds"][0]["phases"])
    lines = ["| round | strategy | hit rate | TTFT p50 (s) | TTFT p99 (s) | max/mean requests | requests per engine | "
             "router CPU ms/request | mean/max prompt tokens |", "|---|---|---:|---:|---:|---:|---|---:|---:|"]
    ratios: dict[str, dict[str, list[float]]] = {v: {"hit": [], "p50": [], "p99": [], "cpu": []}
                                                 for v in variants if v != "least-outstanding"}
    for rnd in data["rounds"]:
        for strategy in variants:
            s = rnd["phases"][strategy]
            lines.append(f"| {rnd['round']} | {strategy} | {s['hit_rate']:.3f} | {s['ttft_p50_s']:.3f} | "
                         f"{s['ttft_p99_s']:.3f} | {s['balance_max_over_mean']:.3f} | "
                         f"{'/'.join(str(int(x)) for x in s['requests_per_engine'])} | "
                         f"{s['router_cpu_ms_per_request']:.2f} | {s['prompt_tokens_mean']:.0f}/"
                         f"{s['prompt_tokens_max']} |")
        lo = rnd["phases"]["least-outstanding"]
        for v, r in ratios.items():
            px = rnd["phases"][v]
            r["hit"].append(px["hit_rate"] / lo["hit_rate"] if lo["hit_rate"] else float("inf"))
            r["p50"].append(px["ttft_p50_s"] / lo["ttft_p50_s"])
            r["p99"].append(px["ttft_p99_s"] / lo["ttft_p99_s"])
            r["cpu"].append(px["router_cpu_ms_per_request"] - lo["router_cpu_ms_per_request"])
    heads = " | ".join(f"round {r['round']}" for r in data["rounds"])
    for v, r in ratios.items():
        lines.append("")
        lines.append(f"| {v} vs least-outstanding | {heads} |")
        lines.append("|---|" + "---:|" * len(data["rounds"]))
        lines.append("| hit rate ratio | " + " | ".join(f"{x:.2f}x" for x in r["hit"]) + " |")
        lines.append("| TTFT p50 ratio | " + " | ".join(f"{x:.2f}" for x in r["p50"]) + " |")
        lines.append("| TTFT p99 ratio | " + " | ".join(f"{x:.2f}" for x in r["p99"]) + " |")
        lines.append("| router CPU added, ms/request | " + " | ".join(f"{x:+.2f}" for x in r["cpu"]) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ memory


def memory(block_tokens: int = 16, blocks: int = 262_144) -> dict[str, Any]:
    """Bytes the prefix state holds per block: fill an index and text cache to `blocks` with distinct texts."""
    from vllm_operator.api.router_config import PrefixRouting
    from vllm_operator.router.prefix import PrefixBalancer
    from vllm_operator.router.tokens import Prompt

    rng = random.Random(1)
    balancer = PrefixBalancer(PrefixRouting(block_tokens=block_tokens, index_blocks=blocks), None)
    texts = [" ".join(rng.choice(WORDS) for _ in range(600)) for _ in range(64)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    n = 0
    while balancer.index_size < blocks:
        prompt = Prompt((f"{n} " + texts[n % 64], texts[(n * 7) % 64] + f" {n}"), chat=True, messages=2)
        balancer.record(n % 4 + 1, balancer.chain(prompt), {1, 2, 3, 4})
        n += 1
    for extra in range(n, n + n // 4):  # keep going: the bound holds (the LRU forgets), memory stays flat
        prompt = Prompt((f"{extra} " + texts[extra % 64], texts[(extra * 7) % 64] + f" {extra}"), chat=True,
                        messages=2)
        balancer.record(extra % 4 + 1, balancer.chain(prompt), {1, 2, 3, 4})
    used, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    text_blocks = sum(len(v) for v in balancer._texts.values())
    return {"index_blocks": balancer.index_size, "text_cache_blocks": text_blocks, "bytes": used - base,
            "peak_bytes": peak - base, "bytes_per_index_block": (used - base) / balancer.index_size,
            "prompts": n + n // 4}


def naming_cost(repeats: int = 30) -> dict[str, Any]:
    """In-process CPU of one prefix choice (name the prompt, walk the index, choose, record) with the tiny model's
    tokenizer, for a conversation of 6 turns (~4.6K tokens) whose earlier turns are cached (`warm`: a new user
    message and answer to tokenize, as in the workload) and for the same conversation all new (`cold`)."""
    import tokenizers

    from vllm_operator.api.router_config import PrefixRouting
    from vllm_operator.router.prefix import PrefixBalancer
    from vllm_operator.router.tokens import Prompt

    with tempfile.TemporaryDirectory() as tmp:
        tok = tokenizers.Tokenizer.from_file(str(make_model("tiny", Path(tmp) / "m") / "tokenizer.json"))

    class Rep:
        def __init__(self, claim: int) -> None:
            self.claim, self.outstanding = claim, 0

    reps = [Rep(1), Rep(2)]
    out: dict[str, Any] = {}
    for case in ("warm", "cold", "chars-cold"):
        balancer = PrefixBalancer(PrefixRouting(block_tokens=128), None if case == "chars-cold" else tok)
        times = []
        for i in range(repeats):
            rng = random.Random(i)
            texts = [user_text(rng, 750)] + [user_text(rng, 80) for _ in range(10)]
            prompt = Prompt(tuple(texts), chat=True, messages=len(texts))
            if case == "warm":
                balancer.chain(Prompt(tuple(texts[:-2]), chat=True, messages=len(texts) - 2))
            t0 = time.process_time()
            chain = balancer.chain(prompt)
            chosen, _, credit = balancer.choose(reps, chain)
            balancer.record(chosen.claim, chain[:credit], {1, 2})
            times.append(time.process_time() - t0)
        out[case] = {"cpu_ms_median": statistics.median(times) * 1e3, "cpu_ms_p90": pct(times, 0.9) * 1e3,
                     "chars": sum(map(len, texts)), "blocks": len(chain)}
    return out


# ------------------------------------------------------------------------------------------------ main


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model_dir = make_model("tiny", work / "model")
    engine_args = [f"--served-model-name={MODEL}", f"--max-model-len={args.max_model_len}",
                   f"--kv-cache-memory-bytes={args.kv_mib * 1024 * 1024}", "--max-num-seqs=8",
                   f"--max-num-batched-tokens={args.max_model_len}", "--no-enable-log-requests"]
    engines = []
    try:
        for i, core in enumerate(("0", "1")):
            engines.append(start_vllm(model_dir, engine_args, env=cpu_env(core), log_path=work / f"engine-{i}.log",
                                      timeout=600, wait=False))
        for e in engines:
            e.wait_healthy(600)
        urls = [e.url for e in engines]
        variants = ["least-outstanding", *args.variants.split(",")]
        routers = {s: Router(s, urls, model_dir, work) for s in variants}
        try:
            for r in routers.values():
                r.wait()
            # warm both engines (first requests compile kernels), not counted
            await run_phase(routers["least-outstanding"].url, 2, 2, 2, 64, 64, 4, seed=999)
            rounds = []
            for rnd in range(args.rounds):
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                phases: dict[str, Any] = {}
                for strategy in order:
                    router = routers[strategy]
                    before = [counters(e.metrics_text()) for e in engines]
                    cpu0 = router.cpu_seconds()
                    choices0 = router_choices(router.url)
                    res = await run_phase(router.url, args.sessions, args.turns, args.concurrency, args.first_words,
                                          args.user_words, args.max_tokens,
                                          seed=1000 * rnd + variants.index(strategy))
                    cpu = router.cpu_seconds() - cpu0
                    after = [counters(e.metrics_text()) for e in engines]
                    phases[strategy] = phase_summary(before, after, res, cpu)
                    choices = router_choices(router.url)
                    phases[strategy]["router_choices"] = {k: v - choices0.get(k, 0.0) for k, v in choices.items()}
                    print(f"round {rnd + 1} {strategy}: {json.dumps({k: v for k, v in phases[strategy].items()})}",
                          flush=True)
                rounds.append({"round": rnd + 1, "order": list(order), "phases": phases,
                               "loadavg": os.getloadavg()})
            return {"rounds": rounds}
        finally:
            for r in routers.values():
                r.stop()
    finally:
        for e in engines:
            e.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sessions", type=int, default=12)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--first-words", type=int, default=750,
                   help="words in a conversation's first user message (a document, a long context; ~4 tokens each)")
    p.add_argument("--user-words", type=int, default=80, help="words in each later user message (~4 tokens each)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--kv-mib", type=int, default=40, help="KV cache per engine (tiny model: 1 KiB per token)")
    p.add_argument("--variants", default="prefix",
                   help="comma list of prefix routers compared with least-outstanding: prefix, prefix@F (loadFactor F)")
    p.add_argument("--memory", action="store_true", help="measure the prefix state's memory only")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--report", type=Path, default=None)
    args = p.parse_args()
    if args.report:
        print(summarize(json.loads(args.report.read_text())["bench"]))
        return 0
    meta = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False,
                                     capture_output=True, text=True).stdout.strip(),
            "args": {k: str(v) for k, v in vars(args).items()}, "loadavg_start": os.getloadavg()}
    results: dict[str, Any] = {"meta": meta}
    if args.memory:
        results["memory"] = {"gpu_blocks": memory(16), "cpu_blocks": memory(128)}
        results["naming_cost"] = naming_cost()
        print(json.dumps({k: results[k] for k in ("memory", "naming_cost")}, indent=1))
    else:
        with tempfile.TemporaryDirectory(prefix="router-prefix-") as tmp:
            results["bench"] = asyncio.run(bench(args, Path(tmp)))
        print(summarize(results["bench"]))
    meta["loadavg_end"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
