"""Start-up phases from vLLM's log lines: which line marks which phase, progress, stalls, limits."""

from __future__ import annotations

import pytest

from vllm_operator.engine import phases
from vllm_operator.engine.phases import Phase, Tracker, classify

# Lines as vLLM 0.32 prints them (a CPU start of the tiny test model, and the GPU-only lines from the same version's
# source: torch.compile, CUDA-graph capture, memory profiling, the loader's shard bar).
LINES: list[tuple[str, Phase | None]] = [
    ("(APIServer pid=26965) INFO 12-01 22:23:18 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}", None),
    ("(APIServer pid=26965) WARNING 12-01 22:23:18 [vllm.py:1703] Enforce eager set, disabling torch.compile, "
     "CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none", None),
    ("(EngineCore pid=27403) INFO 12-01 22:24:05 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
     "model='/tmp/tiny-llama'", None),
    ("(Worker pid=27676) INFO 12-01 22:24:54 [cpu_model_runner.py:68] Starting to load model /tmp/tiny-llama...",
     Phase.LOADING_WEIGHTS),
    ("(Worker pid=27676) INFO 12-01 22:24:54 [base_loader.py:82] Initializing model took 0.656656 seconds",
     Phase.LOADING_WEIGHTS),
    ("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03,  3.10s/it]", Phase.LOADING_WEIGHTS),
    ("(EngineCore pid=2) INFO [default_loader.py:502] Loading weights took 6.12 seconds", Phase.LOADING_WEIGHTS),
    ("(EngineCore pid=2) INFO [gpu_model_runner.py:5150] Model loading took 14.99 GiB memory and 7.1 seconds",
     Phase.LOADING_WEIGHTS),
    ("(EngineCore pid=2) INFO [backends.py:1167] Dynamo bytecode transform time: 4.21 s", Phase.COMPILING),
    ("(EngineCore pid=2) INFO [backends.py:399] Compiling a graph for compile range (1, 8192) takes 20.11 s",
     Phase.COMPILING),
    ("(EngineCore pid=2) INFO [cpu_model_runner.py:87] Warming up model for the compilation...", Phase.COMPILING),
    ("(Worker pid=14489) WARNING 12-01 23:33:06 [decorators.py:333] [backbone] Compiling model again due to a load "
     "failure from /root/.cache/vllm/torch_compile_cache/torch_aot_compile/e01d33c3", Phase.COMPILING),
    ("(Worker pid=14489) INFO 12-01 23:33:20 [decorators.py:743] [backbone] saved AOT compiled function to "
     "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/e01d33c3", Phase.COMPILING),
    ("(EngineCore pid=2) INFO [gpu_worker.py:760] Available KV cache memory: 52.3 GiB", Phase.PROFILING_MEMORY),
    ("(EngineCore pid=2) INFO [mem_utils.py:218] Memory profiling takes 3.12 seconds. Total non KV cache memory",
     Phase.PROFILING_MEMORY),
    ("(Worker pid=27676) INFO 12-01 22:24:58 [cpu_worker.py:260] Explicitly set (0.06/23.54) GiB for KV cache on "
     "node 0.", Phase.PROFILING_MEMORY),
    ("(EngineCore pid=27403) INFO 12-01 22:24:58 [kv_cache_utils.py:2327] CPU KV cache size: 65,536 tokens, "
     "Maximum concurrency for 2,048 tokens per request: 32.00x", Phase.KV_CACHE_ALLOCATED),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 40%|████      | 27/67 [00:02<00:03, 11.2it/s]",
     Phase.COMPILING),
    ("(EngineCore pid=2) INFO [gpu_model_runner.py:6582] Graph capturing finished in 9 secs, took 0.52 GiB",
     Phase.COMPILING),
    ("(EngineCore pid=27403) INFO 12-01 22:24:58 [core.py:402] init engine (profile, create kv cache, warmup model) "
     "took 0.30 s", Phase.KV_CACHE_ALLOCATED),
    ("(APIServer pid=26965) INFO 12-01 22:25:01 [entry.py:140] Starting vLLM server on http://127.0.0.1:18000", None),
    ("INFO:     Application startup complete.", Phase.SERVING),
    ("model-00001-of-00004.safetensors:  12%|█▏        | 602M/4.98G [00:03<00:22, 195MB/s]", Phase.DOWNLOADING),
]


@pytest.mark.parametrize(("line", "phase"), LINES, ids=[f"{i}-{p}" for i, (_, p) in enumerate(LINES)])
def test_each_line_marks_its_phase(line: str, phase: Phase | None) -> None:
    assert classify(line) is phase


def test_a_start_goes_through_the_phases_in_order_with_vllm_numbers() -> None:
    t = Tracker(started_at=100.0)
    clock = 100.0
    for line, _ in LINES[:-1]:
        clock += 1.0
        t.feed(line, clock)
    seen = [p for p, _ in t.history]
    assert seen == [Phase.LAUNCHING, Phase.LOADING_WEIGHTS, Phase.COMPILING, Phase.PROFILING_MEMORY,
                    Phase.KV_CACHE_ALLOCATED, Phase.COMPILING, Phase.KV_CACHE_ALLOCATED, Phase.SERVING]
    assert t.kv_cache_tokens == 65536 and t.max_concurrency == 32.0
    assert t.serving and not t.check(clock + 10**6), "Serving has no limit"
    durations = t.durations(clock + 50)
    assert durations[Phase.LOADING_WEIGHTS] == 5.0 and durations[Phase.SERVING] == 0.0
    assert durations[Phase.LAUNCHING] == 4.0
    assert durations[Phase.COMPILING] == 5.0 + 2.0  # before profiling, and the graph capture after the KV sizing
    body = t.to_json(clock)
    assert body["phase"] == "Serving" and body["kvCacheTokens"] == 65536 and body["stalled"] is False
    assert [h["phase"] for h in body["history"]] == [p.value for p in seen]  # type: ignore[index, union-attr]


def test_progress_lines_say_what_moved() -> None:
    t = Tracker(started_at=0.0)
    t.feed("Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:03<00:03,  3.10s/it]", 1.0)
    assert (t.phase, t.progress) == (Phase.LOADING_WEIGHTS, "shards 1/2")
    t.feed("CPU KV cache size: 65,536 tokens, Maximum concurrency for 2,048 tokens per request: 32.00x", 2.0)
    assert t.progress == "65,536 tokens, 32.00x concurrency at 2,048 tokens"
    t2 = Tracker(started_at=0.0)
    t2.feed("model-00001-of-00004.safetensors:  12%|█▏        | 602M/4.98G [00:03<00:22, 195MB/s]", 1.0)
    assert (t2.phase, t2.download_bytes, t2.download_total_bytes) == (Phase.DOWNLOADING, 602 * 10**6, 4980 * 10**6)
    assert t2.progress == "574.1 MiB of 4.6 GiB"


def test_a_phase_that_advances_is_never_stalled_however_long_it_takes() -> None:
    limits = {**phases.DEFAULT_LIMITS_S, Phase.LOADING_WEIGHTS: 10.0}
    t = Tracker(started_at=0.0, limits=limits)
    t.feed("Starting to load model m...", 1.0)
    for second in range(2, 3600, 9):  # an hour of shards, one every 9 s
        t.feed(f"Loading safetensors checkpoint shards: 1% Completed | {second}/4000 [..]", float(second))
        assert not t.check(second + 9.0)
    assert t.phase is Phase.LOADING_WEIGHTS and t.stalled_at is None


def test_a_phase_that_stops_advancing_stalls_at_its_own_limit() -> None:
    limits = {**phases.DEFAULT_LIMITS_S, Phase.PROFILING_MEMORY: 30.0}
    t = Tracker(started_at=0.0, limits=limits)
    t.feed("Available KV cache memory: 52.3 GiB", 5.0)
    assert not t.check(35.0)
    assert t.check(35.5) and t.stalled_at == 35.5
    assert "phase ProfilingMemory" in t.describe(36.0) and "limit 30s" in t.describe(36.0)
    assert not t.feed("CPU KV cache size: 1 tokens", 37.0), "a stalled start stays stalled (the wrapper stops it)"
    assert t.to_json(40.0)["stalled"] is True


def test_launching_counts_any_output_as_progress_and_has_its_limit() -> None:
    t = Tracker(started_at=0.0, limits={**phases.DEFAULT_LIMITS_S, Phase.LAUNCHING: 60.0})
    t.feed("INFO non-default args: {...}", 50.0)
    assert not t.check(100.0)
    assert t.check(111.0) and t.phase is Phase.LAUNCHING


def test_downloads_advance_by_bytes_not_by_time() -> None:
    t = Tracker(started_at=0.0, limits={**phases.DEFAULT_LIMITS_S, Phase.DOWNLOADING: 20.0})
    t.feed("Starting to load model org/big...", 1.0)
    assert not t.observe_download(0, 2.0), "the first measurement is the baseline"
    for i, second in enumerate(range(3, 300, 15), start=1):  # 15 s between growths, under the 20 s limit
        assert t.observe_download(i * 2**30, float(second))
        assert not t.check(second + 15.0)
    assert t.phase is Phase.DOWNLOADING and t.progress.endswith("GiB downloaded")
    assert not t.observe_download(t.download_bytes or 0, 400.0)  # no new byte
    assert t.check(400.0)


def test_a_warm_cache_is_not_a_download() -> None:
    t = Tracker(started_at=0.0)
    t.feed("Starting to load model org/big...", 1.0)
    t.observe_download(15 * 2**30, 2.0)
    t.observe_download(15 * 2**30, 4.0)
    assert t.phase is Phase.LOADING_WEIGHTS


@pytest.mark.parametrize(("items", "error"), [
    (["loadingweights=5"], None),
    (["Compiling=2.5", "Downloading=1"], None),
    (["Serving=5"], "PHASE one of"),
    (["LoadingWeights"], "PHASE=SECONDS"),
    (["LoadingWeights=soon"], "not a number"),
    (["LoadingWeights=0"], "positive"),
])
def test_parse_limits(items: list[str], error: str | None) -> None:
    if error is None:
        limits = phases.parse_limits(items)
        assert set(limits) == set(phases.DEFAULT_LIMITS_S)
        return
    with pytest.raises(ValueError, match=error):
        phases.parse_limits(items)
