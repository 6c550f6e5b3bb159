"""The GPU load generator's pure parts: schedule, layouts, prompt sizing, summary maths, metric parsing.

The numbers the GPU benchmark reports come out of `summarize`, so its maths is checked against hand-computed
values (numpy's linear-interpolation percentiles), and TTFT must come from the first text chunk, not the headers.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.loadgen import LOADGEN_PATH, load_loadgen

lg: Any = load_loadgen()


def result(kind: str, sent: float, chunks: list[float], end: float, **kw: Any) -> Any:
    base = {
        "index": 0,
        "kind": kind,
        "replica": 0,
        "url": "u",
        "scheduled_s": sent,
        "target_prompt_tokens": 1,
        "target_output_tokens": len(chunks),
        "prompt_words": 1,
        "sent_s": sent,
        "headers_s": sent + 0.001,
        "chunk_s": chunks,
        "end_s": end,
        "status": 200,
        "finish_reason": "length",
    }
    base.update(kw)
    return lg.Result(**base)


# ------------------------------------------------------------------ summary maths


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.5, id="p50-even"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 90, 3.7, id="p90-interpolated"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 99, 3.97, id="p99-interpolated"),
        pytest.param([5.0], 99, 5.0, id="single"),
        pytest.param([], 50, None, id="empty"),
    ],
)
def test_percentile(values: list[float], q: float, want: float | None) -> None:
    assert lg.percentile(values, q) == (pytest.approx(want) if want is not None else None)


def test_summary_short_ttft_from_first_text_chunk_and_itl_from_gaps() -> None:
    results = [
        # headers at +1 ms must not count: TTFT is to the first chunk that carries text.
        result("short", 0.0, [0.1, 0.15, 0.25], 0.3, completion_tokens=3, prompt_tokens=100),
        result("short", 1.0, [1.3, 1.32], 1.35, completion_tokens=2, prompt_tokens=300),
        result("short", 2.0, [], 2.1, status=500, error="HTTP 500: boom"),
    ]
    s = lg.summarize(results, {})["short"]
    assert (s["requests"], s["ok"], s["errors"]) == (3, 2, 1)
    assert s["error_kinds"] == ["HTTP 500: boom"]
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p90"] == pytest.approx(280.0)
    assert s["ttft_ms"]["p99"] == pytest.approx(298.0)
    assert s["ttft_ms"]["max"] == pytest.approx(300.0)
    # gaps 0.05, 0.10 (request 1) and 0.02 (request 2), pooled
    assert s["itl_ms"]["p50"] == pytest.approx(50.0)
    assert s["itl_ms"]["p99"] == pytest.approx(99.0)
    # TPOT per request: (0.25 - 0.1) / 2 = 75 ms and (1.32 - 1.3) / 1 = 20 ms
    assert s["tpot_ms"]["p50"] == pytest.approx(47.5)
    assert s["prompt_tokens_mean"] == 200.0
    assert s["completion_tokens_mean"] == 2.5


def test_summary_long_throughput_and_e2e() -> None:
    results = [
        result("long", 2.0, [4.0, 4.5, 5.0], 6.0, completion_tokens=512),
        result("long", 2.0, [5.0, 9.0], 10.0, completion_tokens=512),
    ]
    s = lg.summarize(results, {"a": 2.0, "b": None}, "unified")
    long = s["long"]
    assert long["e2e_s"] == {"mean": 6.0, "p50": 6.0, "max": 8.0}
    assert long["tokens_per_s_per_request_mean"] == pytest.approx((128 + 64) / 2)
    assert long["aggregate_output_tokens_per_s"] == pytest.approx(1024 / 8.0)
    assert long["ttft_ms"]["p50"] == pytest.approx(2500.0)
    assert s["short"] == {"requests": 0, "ok": 0, "errors": 0}
    assert s["preemptions"] == {"per_url": {"a": 2.0, "b": None}, "total": 2.0}
    assert s["label"] == "unified"


def test_a_stream_without_text_is_an_error() -> None:
    results = [result("short", 0.0, [], 0.5, completion_tokens=0)]
    assert lg.summarize(results, {})["short"]["errors"] == 1


def test_preemptions_unknown_when_no_scrape_worked() -> None:
    assert lg.summarize([], {"a": None})["preemptions"]["total"] is None


# ------------------------------------------------------------------ metrics text


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param('vllm:num_preemptions_total{engine="0",model_name="m"} 7.0\n', 7.0, id="colon-name"),
        pytest.param('vllm_num_preemptions_total{engine="0"} 3.0\n', 3.0, id="escaped-name"),
        pytest.param(
            'vllm:num_preemptions_total{engine="0"} 1.0\nvllm:num_preemptions_total{engine="1"} 2.0\n',
            3.0,
            id="summed-over-engines",
        ),
        pytest.param("vllm:num_preemptions_total 4\n", 4.0, id="no-labels"),
        pytest.param("# HELP vllm:num_preemptions_total x\nvllm:num_preemptions_created 9\n", None, id="absent"),
        pytest.param("vllm:num_preemptions_total_other 9\n", None, id="longer-name-ignored"),
    ],
)
def test_parse_preemptions(text: str, want: float | None) -> None:
    assert lg.parse_preemptions(text) == want


# ------------------------------------------------------------------ schedule and layouts


def workload(**kw: Any) -> Any:
    base = {
        "duration_s": 10.0,
        "short_rate": 4.0,
        "short_arrival": "fixed",
        "long_bursts": 2,
        "long_burst_size": 4,
        "long_first_burst_s": 5.0,
        "long_burst_every_s": 25.0,
    }
    base.update(kw)
    return lg.Workload(**base)


def test_fixed_schedule_counts_times_and_sizes() -> None:
    plan = lg.build_schedule(workload())
    short = [p for p in plan if p.kind == "short"]
    long = [p for p in plan if p.kind == "long"]
    assert [p.at_s for p in short] == pytest.approx([k * 0.25 for k in range(40)])
    assert [p.at_s for p in long] == [5.0] * 4 + [30.0] * 4
    assert all(100 <= p.prompt_tokens <= 500 and 64 <= p.output_tokens <= 256 for p in short)
    assert all((p.prompt_tokens, p.output_tokens) == (24000, 512) for p in long)
    assert [p.at_s for p in plan] == sorted(p.at_s for p in plan)
    assert [p.index for p in plan] == list(range(len(plan)))


def test_poisson_schedule_is_seeded_and_near_its_rate() -> None:
    w = workload(short_arrival="poisson", short_rate=10.0, duration_s=100.0, long_bursts=0)
    a, b = lg.build_schedule(w), lg.build_schedule(w)
    assert a == b
    assert 900 <= len(a) <= 1100
    assert lg.build_schedule(workload(short_arrival="poisson", seed=1)) != lg.build_schedule(
        workload(short_arrival="poisson", seed=2)
    )


def test_unified_gives_each_replica_half_of_each_kind() -> None:
    plan = lg.build_schedule(workload())
    for kind, total in (("short", 40), ("long", 8)):
        per = [sum(1 for p in plan if p.kind == kind and p.replica("unified") == r) for r in (0, 1)]
        assert per == [total // 2, total // 2]
    # within one burst of 4 long requests, two go to each replica
    first_burst = [p.replica("unified") for p in plan if p.kind == "long" and p.at_s == 5.0]
    assert sorted(first_burst) == [0, 0, 1, 1]


def test_split_sends_short_to_0_and_long_to_1() -> None:
    plan = lg.build_schedule(workload())
    assert {p.replica("split") for p in plan if p.kind == "short"} == {0}
    assert {p.replica("split") for p in plan if p.kind == "long"} == {1}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"duration_s": 0}, "--duration must be > 0 s, got 0", id="duration"),
        pytest.param({"short_prompt": (500, 100)}, "--short-prompt must be MIN:MAX", id="short-prompt"),
        pytest.param({"short_arrival": "burst"}, "--short-arrival must be poisson or fixed", id="arrival"),
        pytest.param({"long_burst_size": -1}, "--long-burst-size must be >= 0", id="burst-size"),
    ],
)
def test_workload_validation_names_the_flag(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        workload(**changes).validate()


@pytest.mark.parametrize(
    ("urls", "replica", "message"),
    [
        pytest.param(["http://a"], None, "needs two --url", id="unified-one-url"),
        pytest.param(["http://a", "http://b"], 0, "exactly one --url", id="share-two-urls"),
        pytest.param(["http://a"], 2, "--replica must be 0 or 1", id="share-bad-index"),
    ],
)
def test_run_config_validation(urls: list[str], replica: int | None, message: str) -> None:
    cfg = lg.RunConfig(layout="unified", urls=urls, model="m", workload=workload(), replica=replica)
    with pytest.raises(ValueError, match=message):
        cfg.validate()


# ------------------------------------------------------------------ prompts


def test_prompts_are_unique_and_sized_in_words() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = lg.make_prompt(1, 50, rng), lg.make_prompt(2, 50, rng)
    assert a.split()[:2] != b.split()[:2]
    assert len(a.split()) == 50 + 3  # "Document <i> <nonce>." then the words
    assert lg.words_for(24000, 1.0) == 23996
    assert lg.words_for(24000, 1.5) == 15996
    assert lg.words_for(2, 1.0) == 1


# ------------------------------------------------------------------ files and portability


def test_summarize_merges_replica_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for i, (kind, url) in enumerate([("short", "http://s"), ("long", "http://l")]):
        r = result(kind, 0.0, [0.5, 0.6], 1.0, completion_tokens=2)
        raw = {"meta": {"label": f"share{i}"}, "preemptions": {url: float(i + 1)}, "requests": [lg.asdict(r)]}
        path = tmp_path / f"raw{i}.json"
        path.write_text(json.dumps(raw))
        files.append(str(path))
    out = tmp_path / "summary.json"
    assert lg.main(["summarize", *files, "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["short"]["ok"] == 1 and summary["long"]["ok"] == 1
    assert summary["preemptions"]["total"] == 3.0
    assert summary["label"] == "share0+share1"
    assert json.loads(capsys.readouterr().out) == summary


def test_schedule_dry_run_prints_one_line_per_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        lg.main(
            [
                "schedule",
                "--duration",
                "2",
                "--short-rate",
                "2",
                "--short-arrival",
                "fixed",
                "--long-bursts",
                "1",
                "--long-burst-size",
                "2",
                "--long-first-burst",
                "0.5",
            ]
        )
        == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in lines] == ["short", "long", "long", "short", "short", "short"]


def test_bad_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert lg.main(["schedule", "--duration", "-1"]) == 2
    assert "--duration must be > 0 s, got -1.0" in capsys.readouterr().err


def test_imports_only_stdlib_aiohttp_and_numpy() -> None:
    """It must run on the GPU machine's bare Python: no project code, no pydantic, nothing else installed."""
    tree = ast.parse(LOADGEN_PATH.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    foreign = {r for r in roots if r not in sys.stdlib_module_names and r != "__future__"}
    assert foreign == {"aiohttp", "numpy"}


# ------------------------------------------------------------------ stream events


def events_result() -> Any:
    return lg.Result(0, "short", 0, "u", 0.0, 10, 3, 10, sent_s=0.0)


def test_absorb_counts_tokens_by_engine_usage_even_without_text() -> None:
    """Random weights often sample ids the small tokenizer cannot spell: empty text, still a token."""
    r = events_result()
    role = {
        "choices": [{"delta": {"role": "assistant", "content": ""}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 0},
    }
    lg.absorb(r, role, 0.05)
    for now, n in ((0.1, 1), (0.2, 3)):  # the second chunk carries two tokens
        lg.absorb(
            r, {"choices": [{"delta": {"content": ""}}], "usage": {"prompt_tokens": 10, "completion_tokens": n}}, now
        )
    final = {
        "choices": [{"delta": {"content": ""}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3},
    }
    lg.absorb(r, final, 0.25)
    lg.absorb(r, {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3}}, 0.3)
    assert (r.chunk_s, r.chunk_tokens) == ([0.1, 0.2], [1, 2])
    assert (r.prompt_tokens, r.completion_tokens, r.finish_reason) == (10, 3, "length")


def test_absorb_without_usage_counts_text_chunks() -> None:
    r = events_result()
    lg.absorb(r, {"choices": [{"text": " a"}]}, 0.1)
    lg.absorb(r, {"choices": [{"text": ""}]}, 0.15)
    lg.absorb(r, {"choices": [{"text": " b", "finish_reason": "stop"}]}, 0.2)
    assert (r.chunk_s, r.chunk_tokens, r.finish_reason) == ([0.1, 0.2], [1, 1], "stop")
