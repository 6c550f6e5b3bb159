"""The engine wrapper's pure parts: log patterns -> exit codes, termination messages, launchers, preflight checks."""

from __future__ import annotations

import json

import pytest

from vllm_operator import constants
from vllm_operator.engine import preflight
from vllm_operator.engine.main import Scanner, launch_command, outcome, termination_message
from vllm_operator.engine.preflight import EngineRequest, GpuInfo

KV_LINE = ("ValueError: To serve at least one request with the model's max seq len (65536), (4.00 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (0.06 GiB). Based on the available memory, "
           "the estimated maximum model length is 1008. Try increasing `gpu_memory_utilization` or decreasing "
           "`max_model_len` when initializing the engine.")
OOM_LINES = ["ERROR [core.py:1] EngineCore encountered a fatal error.",
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity"]


def scan(lines: list[str]) -> dict[str, str]:
    s = Scanner()
    for line in lines:
        s.feed(line)
    return s.seen


@pytest.mark.parametrize(("lines", "child", "stop", "code", "reason"), [
    (OOM_LINES, 0, False, constants.EXIT_ENGINE_OOM, "EngineOOM"),
    (["RuntimeError: CUDA error: out of memory"], 1, False, constants.EXIT_ENGINE_OOM, "EngineOOM"),
    (["ERROR EngineCore encountered a fatal error."], 0, False, constants.EXIT_ENGINE_DEAD, "EngineDead"),
    (["ERROR Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."], 0, False,
     constants.EXIT_ENGINE_DEAD, "EngineDead"),
    ([KV_LINE], 1, False, constants.EXIT_KV_CACHE_TOO_SMALL, "KVCacheTooSmall"),
    (["INFO shutting down"], 0, False, constants.EXIT_UNEXPECTED, "UnexpectedExit"),
    (["INFO shutting down"], 0, True, 0, None),
    (["INFO x"], 3, False, 3, None),
    (["INFO x"], -9, False, 137, None),
    (["EngineCore encountered a fatal error"], 0, True, constants.EXIT_ENGINE_DEAD, "EngineDead"),
], ids=["oom-wins-over-fatal", "cuda-error-oom", "fatal", "core-died", "kv-too-small", "exit0-unasked",
        "exit0-after-sigterm", "plain-error", "killed", "fatal-during-drain"])
def test_outcome(lines: list[str], child: int, stop: bool, code: int, reason: str | None) -> None:
    result = outcome(child, scan(lines), stop)
    assert (result.exit_code, result.reason) == (code, reason)


def test_engine_death_lines_after_a_stop_request_are_a_normal_shutdown() -> None:
    """vLLM raises EngineDeadError in its API server when the engine core exits first during a SIGTERM drain."""
    scanner = Scanner()
    scanner.feed("INFO Application startup complete.")
    scanner.stopping = True
    scanner.feed("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    scanner.feed("torch.OutOfMemoryError: CUDA out of memory.")  # other failures still count
    assert outcome(0, scanner.seen, True).reason == "EngineOOM"
    quiet = Scanner(stopping=True)
    quiet.feed("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
    assert outcome(0, quiet.seen, True).exit_code == 0


def test_kv_numbers_in_termination_message() -> None:
    result = outcome(1, scan([KV_LINE]), False)
    msg = json.loads(termination_message(result, 1))
    assert msg["reason"] == "KVCacheTooSmall" and msg["exitCode"] == 89 and msg["childExitCode"] == 1
    assert msg["max_seq_len"] == 65536 and msg["needed_gib"] == 4.0 and msg["available_gib"] == 0.06
    assert msg["estimated_max_model_len"] == 1008


def test_termination_message_is_one_line_within_4096_bytes() -> None:
    result = outcome(0, {"EngineDead": "EngineCore encountered a fatal error " + "x" * 20000}, False)
    text = termination_message(result, 0)
    assert "\n" not in text and len(text.encode()) <= 4096 and json.loads(text)["reason"] == "EngineDead"


def test_exit_codes_are_distinct_and_named() -> None:
    codes = [constants.EXIT_ENGINE_OOM, constants.EXIT_ENGINE_DEAD, constants.EXIT_KV_CACHE_TOO_SMALL,
             constants.EXIT_PREFLIGHT_FAILED, constants.EXIT_UNEXPECTED, constants.EXIT_LAUNCH_FAILED,
             constants.EXIT_STARTUP_STALLED, constants.EXIT_STARTUP_FAILED, constants.EXIT_HUB_UNREACHABLE,
             constants.EXIT_MODEL_ACCESS_DENIED, constants.EXIT_CACHE_DISK_FULL, constants.EXIT_FETCH_FAILED,
             constants.EXIT_WEIGHTS_GONE]
    assert len(set(codes)) == len(codes) and set(constants.EXIT_REASONS) == set(codes)
    assert all(78 <= c <= 90 for c in codes)


@pytest.mark.parametrize(("launcher", "expect"), [
    ("serve", ["vllm", "serve", "/models/m", "--max-model-len=4096"]),
    ("api-server", ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m", "--max-model-len=4096"]),
    ("cli-main", ["py", "-m", "vllm.entrypoints.cli.main", "serve", "/models/m", "--max-model-len=4096"]),
])
def test_launchers(launcher: str, expect: list[str]) -> None:
    assert launch_command(["vllm", "serve", "/models/m", "--max-model-len=4096"], launcher, "py") == expect


def test_other_commands_run_as_given_and_bad_serve_is_refused() -> None:
    assert launch_command(["python", "child.py"], "api-server", "py") == ["python", "child.py"]
    with pytest.raises(ValueError, match="model third"):
        launch_command(["vllm", "serve", "--port=1"], "api-server", "py")


GIB = 1024**3
H100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", 80 * GIB, 79 * GIB, (9, 0))
A10G = GpuInfo(0, "NVIDIA A10G", 24 * GIB, 23 * GIB, (8, 6))
T4 = GpuInfo(0, "Tesla T4", 16 * GIB, 15 * GIB, (7, 5))
BUSY = GpuInfo(0, "NVIDIA L4", 24 * GIB, 10 * GIB, (8, 9))


@pytest.mark.parametrize(("gpus", "args", "required", "problem"), [
    ([H100], ["--gpu-memory-utilization=0.9"], None, None),
    ([BUSY], ["--gpu-memory-utilization", "0.9"], None, "10.0 GiB free of 24.0 GiB, needs 21.6 GiB"),
    ([BUSY], [], 8 * GIB, None),
    ([BUSY], [], 12 * GIB, "needs 12.0 GiB (the plan's budget); 14.0 GiB is held by another process"),
    ([H100], ["--kv-cache-dtype=fp8"], None, None),
    ([A10G], ["--kv-cache-dtype=fp8", "--attention-backend=FLASH_ATTN"], None,
     "kv-cache-dtype fp8 is not supported at compute capability 8.6 with attention backend FLASH_ATTN"),
    ([H100], ["--tensor-parallel-size=2"], None, "tensor-parallel-size 2 needs 2 GPUs; 1 visible"),
], ids=["fits", "busy-gpu", "budget-fits", "budget-short", "fp8-hopper", "fp8-fa2-refused", "tp-too-few"])
def test_preflight_check(gpus: list[GpuInfo], args: list[str], required: int | None, problem: str | None) -> None:
    problems = preflight.check(gpus, preflight.parse_request(args), required_bytes=required)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


def test_parse_request_and_bad_values() -> None:
    req = preflight.parse_request(["--kv-cache-memory-bytes=1G", "--tensor_parallel_size", "2",
                                   "--gpu-memory-utilization=0.85"])
    assert req == EngineRequest(gpu_memory_utilization=0.85, tensor_parallel_size=2, kv_cache_memory_bytes=GIB)
    with pytest.raises(ValueError, match="--gpu-memory-utilization must be a number, got 'lots'"):
        preflight.parse_request(["--gpu-memory-utilization=lots"])
    with pytest.raises(ValueError, match="--tensor-parallel-size must be a positive integer"):
        preflight.parse_request(["--tensor-parallel-size=0"])


def test_parse_nvidia_smi() -> None:
    rows = preflight.parse_nvidia_smi("0, NVIDIA H200, 143771, 143000, 9.0\n1, NVIDIA H200, 143771, 1000, 9.0\n")
    assert [(g.index, g.free_bytes // 1024**2, g.compute_capability) for g in rows] == [(0, 143000, (9, 0)),
                                                                                        (1, 1000, (9, 0))]


# The tail of vLLM 0.26.0's log on the H200 when a float16 AWQ model met an fp8 KV cache on FlashAttention 3
# (benchmarks/gpu/results/matrix/call4.tar.xz, cell awq72-fp8-nodtype): the root cause first, then the pointers to it.
FA3_TAIL = [
    "(EngineCore pid=7071) INFO 12-04 03:25:20 [gpu_model_runner.py:1] Capturing CUDA graphs (mixed prefill-decode)",
    "(EngineCore pid=7071) ERROR 12-04 03:25:21 [core.py:1] EngineCore failed to start.",
    "(EngineCore pid=7071) Traceback (most recent call last):",
    "(EngineCore pid=7071) RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. For FP8 "
    "input, output must have dtype BF16",
    "(APIServer pid=580) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {}",
]


def scanner_of(lines: list[str]) -> Scanner:
    s = Scanner()
    for line in lines:
        s.feed(line)
    return s


def test_a_start_that_fails_with_an_error_line_is_startup_failed_with_that_line() -> None:
    s = scanner_of(FA3_TAIL)
    result = outcome(1, s.seen, False, error_line=s.error_line, served=False)
    assert (result.exit_code, result.reason) == (constants.EXIT_STARTUP_FAILED, "StartupFailed")
    assert result.detail == FA3_TAIL[3]
    body = json.loads(termination_message(result, 1, {"phase": "Compiling", "since": 1.0}))
    assert body["reason"] == "StartupFailed" and body["exitCode"] == 82 and body["phase"] == "Compiling"
    assert "For FP8 input, output must have dtype BF16" in body["detail"]


@pytest.mark.parametrize(("child", "stop", "served", "lines", "code", "reason"), [
    pytest.param(1, False, True, FA3_TAIL, 1, None, id="after-serving-keeps-vllms-code"),
    pytest.param(1, True, False, FA3_TAIL, 1, None, id="while-stopping"),
    pytest.param(1, False, False, ["INFO nothing went wrong in words"], 1, None, id="no-error-line"),
    pytest.param(1, False, False, [*FA3_TAIL, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"],
                 constants.EXIT_ENGINE_OOM, "EngineOOM", id="an-oom-wins"),
    pytest.param(1, False, False, [FA3_TAIL[4]], 1, None, id="only-the-pointer-to-a-cause"),
])
def test_startup_failed_needs_a_failed_start_with_a_cause(child: int, stop: bool, served: bool, lines: list[str],
                                                          code: int, reason: str | None) -> None:
    s = scanner_of(lines)
    result = outcome(child, s.seen, stop, error_line=s.error_line, served=served)
    assert (result.exit_code, result.reason) == (code, reason)


def test_exception_lines_after_a_stop_request_are_not_the_cause() -> None:
    s = Scanner()
    s.feed("ValueError: a real cause")
    s.stopping = True
    s.feed("RuntimeError: raised while shutting down")
    assert s.error_line == "ValueError: a real cause"
