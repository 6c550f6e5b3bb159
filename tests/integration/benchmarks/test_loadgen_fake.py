"""The GPU load generator against fake vLLM servers: what it sends, where it sends it, and what it measures.

The fakes' delays are known, so measured TTFT and generation times must be at least those delays (lower bounds
only: a busy CI machine is slower, never faster), headers arriving early must not count as the first token, outputs must
have the exact asked lengths (`ignore_eos`), and the preemption delta must be what the server's counter moved by.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from fakevllm.engine import FakeVllm
from tests.support.loadgen import LOADGEN_PATH, load_loadgen

lg: Any = load_loadgen()
MODEL = "fake-model"
TTFT = 0.15
GAP = 0.02


def small_workload(**kw: Any) -> Any:
    base = {
        "duration_s": 1.0,
        "short_rate": 4.0,
        "short_arrival": "fixed",
        "short_prompt": (100, 200),
        "short_output": (4, 6),
        "long_prompt": 1500,
        "long_output": 12,
        "long_bursts": 1,
        "long_burst_size": 2,
        "long_first_burst_s": 0.3,
        "long_burst_every_s": 1.0,
    }
    base.update(kw)
    return lg.Workload(**base)


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeVllm, FakeVllm]]:
    knobs: dict[str, Any] = {"ttft_s": TTFT, "chunk_delay_s": GAP, "max_model_len": 32768, "natural_tokens": 1}
    async with FakeVllm(**knobs) as a, FakeVllm(**knobs) as b:
        yield a, b


def model_requests(fake: FakeVllm) -> list[Any]:
    """Requests of the measured run (the warm-up asks for 8 tokens and is excluded by its prompt)."""
    return [r for r in fake.requests("/v1/completions") if not r.body["prompt"].startswith("Document -")]


async def test_unified_run_measures_and_routes(fakes: tuple[FakeVllm, FakeVllm]) -> None:
    a, b = fakes

    async def preempt_once_traffic_starts() -> None:
        while not model_requests(a):  # noqa: ASYNC110 (the fake's request log has no event to wait on)
            await asyncio.sleep(0.01)
        a.set_metric("vllm:num_preemptions_total", a.metrics.preemptions + 3)

    bump = asyncio.create_task(preempt_once_traffic_starts())
    cfg = lg.RunConfig(layout="unified", urls=[a.url, b.url], model=MODEL, workload=small_workload())
    raw = await lg.run(cfg)
    await bump

    # calibrated through /tokenize: the fake counts one token per word
    assert raw["meta"]["tokens_per_word"] == pytest.approx(1.0)
    assert raw["preemptions"] == {a.url: 3.0, b.url: 0.0}
    results = [lg.Result(**r) for r in raw["requests"]]
    assert len(results) == 6 and all(r.ok for r in results), [r.error for r in results]
    for r in results:
        # exact output lengths (ignore_eos) and prompt sizes hit through the calibration
        assert r.completion_tokens == r.target_output_tokens == len(r.chunk_s)
        assert abs(r.prompt_tokens - r.target_prompt_tokens) <= 2
        assert r.finish_reason == "length"
        # the fake sends headers at once: TTFT is to the first text chunk, not the headers
        assert r.headers_s <= r.chunk_s[0] and r.chunk_s[0] - r.sent_s >= TTFT
        # the server cannot send the last token earlier than this; single gaps can look shorter when the client
        # read one chunk late and the next on time, so they are only checked in aggregate below
        assert r.chunk_s[-1] - r.sent_s >= TTFT + (len(r.chunk_s) - 1) * GAP
        assert r.sent_s >= r.scheduled_s

    # each replica got half of each kind, and the engine saw what the loadgen meant to send
    for fake in (a, b):
        seen = model_requests(fake)
        kinds = sorted("long" if rec.prompt_tokens > 1000 else "short" for rec in seen)
        assert kinds == ["long", "short", "short"]
        for rec in seen:
            assert rec.body["ignore_eos"] is True and rec.body["stream"] is True
            assert rec.body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
            assert rec.max_tokens == rec.body["max_tokens"]

    summary = lg.summarize(results, raw["preemptions"])
    assert summary["short"]["ttft_ms"]["p50"] >= TTFT * 1000
    assert summary["short"]["itl_ms"]["p50"] >= GAP * 1000 * 0.5
    assert summary["long"]["completion_tokens_mean"] == 12.0
    assert summary["preemptions"]["total"] == 3.0


async def test_split_layout_and_one_replica_share(fakes: tuple[FakeVllm, FakeVllm]) -> None:
    a, b = fakes
    raw = await lg.run(
        lg.RunConfig(
            layout="split", urls=[a.url, b.url], model=MODEL, workload=small_workload(), tokens_per_word=1.0, warmup=0
        )
    )
    assert {rec.prompt_tokens > 1000 for rec in model_requests(a)} == {False}
    assert {rec.prompt_tokens > 1000 for rec in model_requests(b)} == {True}
    assert raw["meta"]["calibration"] == "given"
    a.clear_requests()
    share = await lg.run(
        lg.RunConfig(
            layout="split",
            urls=[a.url],
            replica=1,
            model=MODEL,
            workload=small_workload(),
            tokens_per_word=1.0,
            warmup=0,
        )
    )
    assert [r["kind"] for r in share["requests"]] == ["long", "long"]
    assert len(model_requests(a)) == 2


async def test_chat_api_ignores_the_role_chunk(fakes: tuple[FakeVllm, FakeVllm]) -> None:
    a, _ = fakes
    a.configure(ttft_s=0.0, chunk_delay_s=0.0)
    raw = await lg.run(
        lg.RunConfig(
            layout="split",
            urls=[a.url],
            replica=0,
            model=MODEL,
            api="chat",
            workload=small_workload(long_bursts=0),
            tokens_per_word=1.0,
            warmup=0,
        )
    )
    for r in raw["requests"]:
        assert len(r["chunk_s"]) == r["completion_tokens"] == r["target_output_tokens"]
    assert a.requests("/v1/chat/completions")[-1].body["messages"][0]["role"] == "user"


async def test_failures_are_counted_not_fatal(fakes: tuple[FakeVllm, FakeVllm]) -> None:
    a, b = fakes
    for fake in (a, b):
        fake.configure(ttft_s=0.0, chunk_delay_s=0.0)
    a.configure(fail_mode="status", fail_status=503, fail_count=1)
    raw = await lg.run(
        lg.RunConfig(
            layout="unified", urls=[a.url, b.url], model=MODEL, workload=small_workload(), tokens_per_word=1.0, warmup=0
        )
    )
    summary = lg.summarize([lg.Result(**r) for r in raw["requests"]], raw["preemptions"])
    assert summary["short"]["errors"] + summary["long"]["errors"] == 1
    kinds = summary["short"].get("error_kinds", []) + summary["long"].get("error_kinds", [])
    assert len(kinds) == 1 and kinds[0].startswith("HTTP 503")


def test_cli_run_writes_raw_and_summary(tmp_path: Path) -> None:
    """The script as the GPU machine runs it: a separate process, only its own file."""
    fake_cmd = [
        sys.executable,
        "-m",
        "fakevllm",
        "--port",
        "0",
        "--max-model-len",
        "32768",
        "--ttft-ms",
        "30",
        "--chunk-delay-ms",
        "5",
    ]
    servers = [subprocess.Popen(fake_cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        urls = []
        for proc in servers:
            assert proc.stdout is not None
            urls.append(proc.stdout.readline().rsplit(" ", 1)[1].strip())
        out = tmp_path / "unified"
        cmd = [
            sys.executable,
            str(LOADGEN_PATH),
            "run",
            "--layout",
            "unified",
            "--url",
            urls[0],
            "--url",
            urls[1],
            "--model",
            MODEL,
            "--duration",
            "1",
            "--short-rate",
            "4",
            "--short-arrival",
            "fixed",
            "--short-output",
            "4:6",
            "--long-prompt",
            "1000",
            "--long-output",
            "8",
            "--long-bursts",
            "1",
            "--long-burst-size",
            "2",
            "--long-first-burst",
            "0.2",
            "--label",
            "unified",
            "--out",
            str(out),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        summary = json.loads((out / "summary.json").read_text())
        assert json.loads(done.stdout) == summary
        assert summary["label"] == "unified" and summary["short"]["ok"] == 4 and summary["long"]["ok"] == 2
        assert summary["short"]["ttft_ms"]["p50"] >= 30
        raw = json.loads((out / "raw.json").read_text())
        assert len(raw["requests"]) == 6 and raw["meta"]["layout"] == "unified"
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=10)


async def test_tokens_without_text_still_count(fakes: tuple[FakeVllm, FakeVllm]) -> None:
    """A weightless model's tokens often decode to nothing: TTFT and token counts must come from the engine's usage."""
    a, _ = fakes
    a.configure(token_text="", ttft_s=0.05, chunk_delay_s=0.0)
    raw = await lg.run(lg.RunConfig(layout="split", urls=[a.url], replica=0, model=MODEL, workload=small_workload(),
                                    tokens_per_word=1.0, warmup=0))  # fmt: skip
    results = [lg.Result(**r) for r in raw["requests"]]
    assert results and all(r.ok for r in results), [r.error for r in results]
    for r in results:
        assert r.completion_tokens == r.target_output_tokens == sum(r.chunk_tokens) == len(r.chunk_s)
        assert r.chunk_s[0] - r.sent_s >= 0.05
