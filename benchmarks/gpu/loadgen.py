#!/usr/bin/env python3
"""Mixed short/long load generator for the GPU benchmark (issue 12): does splitting short and long traffic pay?

Why it is built this way:
* It runs on the GPU machine's bare Python 3.12, where only aiohttp and numpy exist and nothing can be installed,
  so it imports nothing but those and the standard library, and is copied (or carried) alone.
* The question is what long-document prefills do to interactive latency, so it is an *open-loop* generator: every
  request is sent at its scheduled time whether or not earlier ones have finished (a closed loop would slow down
  exactly when the server does and hide the queueing). Short requests arrive at a steady rate (Poisson or fixed
  gaps); long requests arrive in bursts.
* It streams every request, so each one yields its time to first token (TTFT: from sending to the first chunk
  that brought a token, not to the response headers or the role-only chunk) and its inter-token gaps (ITL: between
  consecutive token chunks). Tokens are counted by the engine itself (`stream_options.continuous_usage_stats` puts
  `usage` in every chunk), because a weightless model's random tokens often decode to no text at all.
  `ignore_eos: true` gives outputs of exact lengths.
* Layouts at equal hardware: `unified` sends half of each kind to each of two identical replicas (round-robin per
  kind); `split` sends all short requests to the short replica and all long requests to the long replica. With one
  GPU, `--replica` runs one replica's share of the *same* seeded schedule alone, and `summarize` merges the
  per-replica raw files into the layout's summary.
* Prompt lengths: prompts are random words from a fixed list (random, so prefix caching cannot make the long
  prompts cheap; a unique header per request makes sure). Words become tokens at a ratio measured once through the
  server's `/tokenize` (`--calibrate`, the default) or given with `--tokens-per-word`; the engine's own count per
  request is recorded from `usage`.
* Preemptions: `vllm:num_preemptions_total` (or `vllm_num_preemptions_total`) is scraped from each replica's
  /metrics before and after, and the delta is reported.

Outputs (under --out): `raw.json` (meta, every request with its chunk arrival times, metric scrapes) and
`summary.json`; the summary is also printed as JSON on stdout. Times are seconds from the run's start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

SHORT = "short"
LONG = "long"
DEFAULT_TOKENS_PER_WORD = 1.3
"""Assumed tokens per word when /tokenize cannot be used (typical of English text under a BPE tokenizer)."""
CALIBRATION_WORDS = 2000
PREEMPTION_METRICS = ("vllm:num_preemptions_total", "vllm_num_preemptions_total")

_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education foot boy age policy process music "
    "market sense nation plan college interest death experience effect use class control care field development "
    "role effort rate heart drug show leader light voice wife police mind price report decision son view "
    "relationship town road arm difference value building action model season society tax director position player "
    "record paper space ground form event official matter center couple site project activity star table need court "
    "oil situation cost industry figure street image phone data picture practice piece land product doctor wall "
    "patient worker news test movie north love support technology step baby computer type attention film tree "
    "source organization hair window evidence population truth"
)
WORDS = tuple(_WORD_TEXT.split())
"""Common English nouns: each is one or two tokens under most BPE tokenizers."""


# ----------------------------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Planned:
    """One request of the schedule: when, what kind, how long, and which replica takes it in each layout."""

    index: int
    kind: str
    at_s: float
    prompt_tokens: int
    output_tokens: int
    unified_replica: int
    """0 or 1: the replica this request goes to in the unified layout (round-robin within its kind)."""

    def replica(self, layout: str) -> int:
        """Index into the URL list: unified → 0/1; split → 0 for short, 1 for long."""
        if layout == "unified":
            return self.unified_replica
        return 0 if self.kind == SHORT else 1


@dataclass(frozen=True)
class Workload:
    duration_s: float = 60.0
    short_rate: float = 4.0
    """Short requests per second, over all replicas."""
    short_arrival: str = "poisson"
    short_prompt: tuple[int, int] = (100, 500)
    short_output: tuple[int, int] = (64, 256)
    long_prompt: int = 24000
    long_output: int = 512
    long_bursts: int = 2
    long_burst_size: int = 4
    long_first_burst_s: float = 5.0
    long_burst_every_s: float = 25.0
    seed: int = 0

    def validate(self) -> None:
        if self.duration_s <= 0:
            raise ValueError(f"--duration must be > 0 s, got {self.duration_s}")
        if self.short_rate < 0:
            raise ValueError(f"--short-rate must be >= 0 req/s, got {self.short_rate}")
        if self.short_arrival not in ("poisson", "fixed"):
            raise ValueError(f"--short-arrival must be poisson or fixed, got {self.short_arrival!r}")
        for name, (lo, hi) in (("--short-prompt", self.short_prompt), ("--short-output", self.short_output)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be MIN:MAX with 1 <= MIN <= MAX, got {lo}:{hi}")
        if self.long_prompt < 1 or self.long_output < 1:
            raise ValueError(
                f"--long-prompt and --long-output must be >= 1, got {self.long_prompt}, {self.long_output}"
            )
        if self.long_bursts < 0 or self.long_burst_size < 0:
            raise ValueError(
                f"--long-bursts and --long-burst-size must be >= 0, got {self.long_bursts}, {self.long_burst_size}"
            )
        if self.long_first_burst_s < 0 or self.long_burst_every_s < 0:
            raise ValueError("--long-first-burst and --long-burst-every must be >= 0 s")


def build_schedule(w: Workload) -> list[Planned]:
    """The whole seeded schedule, independent of layout and replica, sorted by time."""
    rng = np.random.default_rng(w.seed)
    times: list[float] = []
    if w.short_rate > 0 and w.short_arrival == "fixed":
        times = [k / w.short_rate for k in range(math.ceil(w.duration_s * w.short_rate))]
        times = [t for t in times if t < w.duration_s]
    elif w.short_rate > 0:
        t = float(rng.exponential(1.0 / w.short_rate))
        while t < w.duration_s:
            times.append(t)
            t += float(rng.exponential(1.0 / w.short_rate))
    entries: list[tuple[float, str, int, int]] = []
    for t in times:
        p = int(rng.integers(w.short_prompt[0], w.short_prompt[1] + 1))
        o = int(rng.integers(w.short_output[0], w.short_output[1] + 1))
        entries.append((t, SHORT, p, o))
    for b in range(w.long_bursts):
        at = w.long_first_burst_s + b * w.long_burst_every_s
        entries.extend((at, LONG, w.long_prompt, w.long_output) for _ in range(w.long_burst_size))
    entries.sort(key=lambda e: (e[0], e[1]))
    counters = {SHORT: 0, LONG: 0}
    out = []
    for i, (t, kind, p, o) in enumerate(entries):
        out.append(Planned(i, kind, t, p, o, counters[kind] % 2))
        counters[kind] += 1
    return out


def make_prompt(index: int, n_words: int, rng: np.random.Generator) -> str:
    """A unique header and `n_words` random words: no two prompts share a prefix beyond a few tokens."""
    header = f"Document {index} {rng.integers(1 << 30)}."
    picks = rng.integers(0, len(WORDS), size=max(0, n_words))
    return header + " " + " ".join(WORDS[k] for k in picks)


def words_for(tokens: int, tokens_per_word: float) -> int:
    """Words to ask for so that the prompt has about `tokens` tokens (the header costs about 4 words' worth)."""
    return max(1, round(tokens / tokens_per_word) - 4)


# ----------------------------------------------------------------------------------------------- measuring


@dataclass
class Result:
    index: int
    kind: str
    replica: int
    url: str
    scheduled_s: float
    target_prompt_tokens: int
    target_output_tokens: int
    prompt_words: int
    sent_s: float | None = None
    headers_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)
    """Arrival time of every token event (see `absorb`); the first one is the first token."""
    chunk_tokens: list[int] = field(default_factory=list)
    """Tokens each event brought (1 unless the engine batched several into one chunk)."""
    end_s: float | None = None
    status: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.status == 200
            and self.error is None
            and bool(self.chunk_s)
            and self.sent_s is not None
            and self.end_s is not None
        )

    @property
    def sent(self) -> float:
        assert self.sent_s is not None, f"request {self.index} was not sent"
        return self.sent_s

    @property
    def end(self) -> float:
        assert self.end_s is not None, f"request {self.index} did not end"
        return self.end_s


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def ttft(r: Result) -> float:
    return r.chunk_s[0] - r.sent


def gaps(r: Result) -> list[float]:
    return [b - a for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False)]


def tpot_of(r: Result) -> float:
    """Time per output token after the first: (last token event - first) / (completion tokens - 1)."""
    return (r.chunk_s[-1] - r.chunk_s[0]) / ((r.completion_tokens or len(r.chunk_s)) - 1)


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 3)


def summarize(results: Sequence[Result], preemptions: dict[str, float | None], label: str = "") -> dict[str, Any]:
    """The numbers issue 12 asks for, from raw results (pure: the unit tests check it against hand-made inputs).

    short: TTFT p50/p90/p99, ITL (all inter-chunk gaps pooled) p50/p90/p99 and TPOT p50/p99, in ms.
    long: end-to-end time (send to last chunk) mean/p50/max in s; tokens/s per request (completion tokens over
    end-to-end time) mean; aggregate output tokens/s (all long completion tokens over first send to last end).
    """
    out: dict[str, Any] = {"label": label}
    for kind in (SHORT, LONG):
        rs = [r for r in results if r.kind == kind]
        good = [r for r in rs if r.ok]
        part: dict[str, Any] = {"requests": len(rs), "ok": len(good), "errors": len(rs) - len(good)}
        if good:
            t = [ttft(r) for r in good]
            part["ttft_ms"] = {f"p{q}": ms(percentile(t, q)) for q in (50, 90, 99)}
            part["ttft_ms"]["max"] = ms(max(t))
            itl = [g for r in good for g in gaps(r)]
            part["itl_ms"] = {f"p{q}": ms(percentile(itl, q)) for q in (50, 90, 99)}
            tpot = [tpot_of(r) for r in good if (r.completion_tokens or 0) > 1]
            part["tpot_ms"] = {f"p{q}": ms(percentile(tpot, q)) for q in (50, 99)}
            e2e = [r.end - r.sent for r in good]
            part["e2e_s"] = {
                "mean": round(float(np.mean(e2e)), 4),
                "p50": round(percentile(e2e, 50) or 0.0, 4),
                "max": round(max(e2e), 4),
            }
            tokens = [r.completion_tokens if r.completion_tokens is not None else len(r.chunk_s) for r in good]
            per_req = [n / d for n, d in zip(tokens, e2e, strict=True) if d > 0]
            part["tokens_per_s_per_request_mean"] = round(float(np.mean(per_req)), 2) if per_req else None
            span = max(r.end for r in good) - min(r.sent for r in good)
            part["aggregate_output_tokens_per_s"] = round(sum(tokens) / span, 2) if span > 0 else None
            prompts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
            part["prompt_tokens_mean"] = round(float(np.mean(prompts)), 1) if prompts else None
            part["completion_tokens_mean"] = round(float(np.mean(tokens)), 1)
        errors = sorted({r.error or f"HTTP {r.status}" for r in rs if not r.ok})
        if errors:
            part["error_kinds"] = errors[:10]
        out[kind] = part
    known = [v for v in preemptions.values() if v is not None]
    out["preemptions"] = {"per_url": preemptions, "total": sum(known) if known else None}
    return out


def parse_preemptions(text: str) -> float | None:
    """Sum of vllm:num_preemptions_total over all its series in a Prometheus text page; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(PREEMPTION_METRICS):
            name_end = min(i for i in (line.find("{"), line.find(" ")) if i >= 0)
            if line[:name_end] in PREEMPTION_METRICS:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
    return total if seen else None


async def scrape_preemptions(session: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                return None
            return parse_preemptions(await resp.text())
    except (aiohttp.ClientError, TimeoutError):
        return None


async def calibrate(session: aiohttp.ClientSession, url: str, model: str, seed: int) -> float:
    """Tokens per word of this generator's text, by the server's tokenizer (vLLM's POST /tokenize)."""
    text = make_prompt(0, CALIBRATION_WORDS, np.random.default_rng(seed + 7919))
    words = len(text.split())
    async with session.post(url + "/tokenize", json={"model": model, "prompt": text}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"/tokenize on {url} answered {resp.status}: {(await resp.text())[:200]}")
        body = await resp.json()
    count = int(body["count"])
    return count / words


async def run_one(
    session: aiohttp.ClientSession, t0: float, r: Result, body: dict[str, Any], path: str, timeout_s: float
) -> None:
    """Send one streaming request at its scheduled time and record when each text chunk arrived."""
    delay = t0 + r.scheduled_s - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    r.sent_s = time.monotonic() - t0
    try:
        async with session.post(r.url + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            r.headers_s = time.monotonic() - t0
            r.status = resp.status
            if resp.status != 200:
                r.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                r.end_s = time.monotonic() - t0
                return
            async for raw in resp.content:
                now = time.monotonic() - t0
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    r.error = f"stream error: {json.dumps(event['error'])[:300]}"
                    break
                absorb(r, event, now)
            r.end_s = time.monotonic() - t0
            if r.error is None and r.finish_reason is None:
                r.error = "stream ended without a finish_reason"
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        r.error = f"{type(err).__name__}: {err}"
        r.end_s = time.monotonic() - t0


def absorb(r: Result, event: dict[str, Any], now: float) -> None:
    """Take one streamed event into the result.

    A token event is a chunk after which the engine has produced more tokens. With vLLM's `continuous_usage_stats`
    every chunk carries `usage.completion_tokens`, so tokens that decode to no text (random weights sample ids the
    small tokenizer cannot spell) still count, and a chunk carrying two tokens counts two. Without usage in the
    chunk, a chunk with non-empty text counts as one token. The chat role chunk and the final usage-only chunk are
    never token events."""
    usage = event.get("usage")
    choices = event.get("choices") or ()
    if usage:
        if usage.get("prompt_tokens") is not None:
            r.prompt_tokens = int(usage["prompt_tokens"])
        produced = int(usage.get("completion_tokens") or 0)
        seen = r.completion_tokens or 0
        if choices and produced > seen:
            r.chunk_s.append(now)
            r.chunk_tokens.append(produced - seen)
        r.completion_tokens = max(produced, seen)
    else:
        for choice in choices:
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content")
            if text:
                r.chunk_s.append(now)
                r.chunk_tokens.append(1)
    for choice in choices:
        if choice.get("finish_reason"):
            r.finish_reason = choice["finish_reason"]


def request_body(api: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


@dataclass
class RunConfig:
    layout: str
    urls: list[str]
    model: str
    workload: Workload
    replica: int | None = None
    """Run only this replica's share (index into the layout's replicas), against urls[0]."""
    api: str = "completions"
    tokens_per_word: float | None = None
    """None: measure it through /tokenize on `calibrate_url` (default: the first URL)."""
    calibrate_url: str | None = None
    """Where /tokenize is asked when the URLs do not serve it (a router in front of the engines)."""
    timeout_s: float = 900.0
    warmup: int = 1
    label: str = ""

    def validate(self) -> None:
        self.workload.validate()
        if self.layout not in ("unified", "split"):
            raise ValueError(f"--layout must be unified or split, got {self.layout!r}")
        if self.api not in ("completions", "chat"):
            raise ValueError(f"--api must be completions or chat, got {self.api!r}")
        if self.replica is None and len(self.urls) != 2:
            raise ValueError(
                f"--layout {self.layout} needs two --url (replica 0 and 1), got {len(self.urls)}; "
                "or pass --replica N with one --url to run one replica's share"
            )
        if self.replica is not None and (self.replica not in (0, 1) or len(self.urls) != 1):
            raise ValueError(
                f"--replica must be 0 or 1 with exactly one --url, got {self.replica} with {len(self.urls)} URLs"
            )
        if self.tokens_per_word is not None and self.tokens_per_word <= 0:
            raise ValueError(f"--tokens-per-word must be > 0, got {self.tokens_per_word}")


async def run(cfg: RunConfig) -> dict[str, Any]:
    """Run the schedule (or one replica's share of it) and return the raw record."""
    cfg.validate()
    schedule = build_schedule(cfg.workload)
    if cfg.replica is not None:
        schedule = [p for p in schedule if p.replica(cfg.layout) == cfg.replica]
    path = "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        tpw = cfg.tokens_per_word
        calibration = "given"
        if tpw is None:
            where = cfg.calibrate_url or cfg.urls[0]
            tpw = await calibrate(session, where, cfg.model, cfg.workload.seed)
            calibration = f"measured via {where}/tokenize over {CALIBRATION_WORDS} words"
        rng = np.random.default_rng(cfg.workload.seed + 1)
        results: list[Result] = []
        bodies: list[dict[str, Any]] = []
        for p in schedule:
            url = cfg.urls[0] if cfg.replica is not None else cfg.urls[p.replica(cfg.layout)]
            n_words = words_for(p.prompt_tokens, tpw)
            bodies.append(request_body(cfg.api, cfg.model, make_prompt(p.index, n_words, rng), p.output_tokens))
            results.append(
                Result(
                    p.index,
                    p.kind,
                    cfg.replica if cfg.replica is not None else p.replica(cfg.layout),
                    url,
                    p.at_s,
                    p.prompt_tokens,
                    p.output_tokens,
                    n_words,
                )
            )
        for url in cfg.urls:  # warm-up (not recorded): first requests pay one-off costs
            for k in range(cfg.warmup):
                warm = Result(-1, "warmup", 0, url, 0.0, 16, 8, 16)
                await run_one(
                    session,
                    time.monotonic(),
                    warm,
                    request_body(cfg.api, cfg.model, make_prompt(-1 - k, 16, rng), 8),
                    path,
                    cfg.timeout_s,
                )
                if not warm.ok:
                    raise RuntimeError(f"warm-up request to {url} failed: {warm.error}")
        before = {url: await scrape_preemptions(session, url) for url in cfg.urls}
        started_at = time.time()
        t0 = time.monotonic()
        await asyncio.gather(
            *(run_one(session, t0, r, b, path, cfg.timeout_s) for r, b in zip(results, bodies, strict=True))
        )
        wall = time.monotonic() - t0
        after = {url: await scrape_preemptions(session, url) for url in cfg.urls}
    deltas: dict[str, float | None] = {}
    for url in cfg.urls:
        b, a = before[url], after[url]
        deltas[url] = None if a is None or b is None else a - b
    meta = {
        "label": cfg.label,
        "layout": cfg.layout,
        "replica": cfg.replica,
        "urls": cfg.urls,
        "model": cfg.model,
        "api": cfg.api,
        "workload": asdict(cfg.workload),
        "tokens_per_word": tpw,
        "calibration": calibration,
        "started_at": started_at,
        "wall_s": wall,
    }
    return {"meta": meta, "preemptions": deltas, "requests": [asdict(r) for r in results]}


def load_raw(paths: Sequence[str | Path]) -> tuple[list[Result], dict[str, float | None], list[dict[str, Any]]]:
    """Merge raw files (e.g. the two replicas' shares run one after another) into one result list."""
    results: list[Result] = []
    preemptions: dict[str, float | None] = {}
    metas = []
    for i, path in enumerate(paths):
        raw = json.loads(Path(path).read_text())
        metas.append(raw["meta"])
        results.extend(Result(**r) for r in raw["requests"])
        for url, value in raw["preemptions"].items():
            preemptions[f"{i}:{url}"] = value
    return results, preemptions, metas


# ----------------------------------------------------------------------------------------------- CLI


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected MIN:MAX integers, got {text!r}") from err


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loadgen.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = p.add_subparsers(dest="cmd", required=True)
    wl = argparse.ArgumentParser(add_help=False)
    wl.add_argument("--duration", type=float, default=60.0, help="seconds over which short requests arrive")
    wl.add_argument("--short-rate", type=float, default=4.0, help="short requests/s over all replicas")
    wl.add_argument("--short-arrival", default="poisson", choices=("poisson", "fixed"))
    wl.add_argument("--short-prompt", type=_range, default=(100, 500), help="prompt tokens MIN:MAX")
    wl.add_argument("--short-output", type=_range, default=(64, 256), help="output tokens MIN:MAX")
    wl.add_argument("--long-prompt", type=int, default=24000)
    wl.add_argument("--long-output", type=int, default=512)
    wl.add_argument("--long-bursts", type=int, default=2)
    wl.add_argument("--long-burst-size", type=int, default=4, help="long requests per burst, over all replicas")
    wl.add_argument("--long-first-burst", type=float, default=5.0, help="seconds")
    wl.add_argument("--long-burst-every", type=float, default=25.0, help="seconds between bursts")
    wl.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", parents=[wl], help="run the mixed workload and write raw.json + summary.json")
    r.add_argument("--layout", required=True, choices=("unified", "split"))
    r.add_argument(
        "--url",
        action="append",
        required=True,
        dest="urls",
        help="base URL of a replica (http://host:port); unified: two replicas; split: short then long",
    )
    r.add_argument(
        "--replica",
        type=int,
        default=None,
        help="run only this replica's share (0/1; split: 0 = short, 1 = long) against the one --url",
    )
    r.add_argument("--model", required=True, help="served model name")
    r.add_argument("--api", default="completions", choices=("completions", "chat"))
    r.add_argument(
        "--tokens-per-word",
        type=float,
        default=None,
        help=f"skip /tokenize calibration (documented fallback: {DEFAULT_TOKENS_PER_WORD})",
    )
    r.add_argument(
        "--calibrate-url",
        default=None,
        help="ask this server's /tokenize for the calibration (default: the first --url; a router has none)",
    )
    r.add_argument("--warmup", type=int, default=1, help="unrecorded requests per URL before the run")
    r.add_argument("--timeout", type=float, default=900.0, help="per-request total timeout, seconds")
    r.add_argument("--label", default="")
    r.add_argument("--out", required=True, help="directory for raw.json and summary.json")
    s = sub.add_parser("summarize", help="merge raw.json files (per-replica shares) into one summary")
    s.add_argument("raw", nargs="+")
    s.add_argument("--label", default="")
    s.add_argument("--out", default=None, help="write summary.json here (a file path)")
    sub.add_parser("schedule", parents=[wl], help="print the seeded schedule as JSON lines (a dry run)")
    return p


def workload_from(args: argparse.Namespace) -> Workload:
    return Workload(
        duration_s=args.duration,
        short_rate=args.short_rate,
        short_arrival=args.short_arrival,
        short_prompt=args.short_prompt,
        short_output=args.short_output,
        long_prompt=args.long_prompt,
        long_output=args.long_output,
        long_bursts=args.long_bursts,
        long_burst_size=args.long_burst_size,
        long_first_burst_s=args.long_first_burst,
        long_burst_every_s=args.long_burst_every,
        seed=args.seed,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "summarize":
        results, pre, metas = load_raw(args.raw)
        summary = summarize(results, pre, args.label or "+".join(str(m.get("label", "")) for m in metas))
        text = json.dumps(summary, indent=2)
        if args.out:
            Path(args.out).write_text(text + "\n")
        print(text)
        return 0
    workload = workload_from(args)
    try:
        workload.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.cmd == "schedule":
        for item in build_schedule(workload):
            print(json.dumps(asdict(item)))
        return 0
    cfg = RunConfig(
        layout=args.layout,
        urls=[u.rstrip("/") for u in args.urls],
        model=args.model,
        workload=workload,
        replica=args.replica,
        api=args.api,
        tokens_per_word=args.tokens_per_word,
        calibrate_url=args.calibrate_url.rstrip("/") if args.calibrate_url else None,
        timeout_s=args.timeout,
        warmup=args.warmup,
        label=args.label,
    )
    try:
        cfg.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    raw = asyncio.run(run(cfg))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps(raw) + "\n")
    results = [Result(**r) for r in raw["requests"]]
    summary = summarize(results, raw["preemptions"], args.label)
    summary["meta"] = raw["meta"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if all(summary[k]["errors"] == 0 for k in (SHORT, LONG)) else 1


if __name__ == "__main__":
    sys.exit(main())
