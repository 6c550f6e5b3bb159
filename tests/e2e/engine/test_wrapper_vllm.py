"""The engine wrapper around a REAL vLLM on CPU: start-up phases, engine-core death, a KV cache too small to start.

vLLM's API server exits with code 0 a few seconds after its engine core dies; the wrapper must turn that into exit
code 88 (EngineDead) with a termination message, from the text real vLLM prints. The start-up refusal when one
max_model_len sequence does not fit the KV cache must become exit code 89 (KVCacheTooSmall) with vLLM's numbers.
An EngineCore stopped by SIGSTOP while the engine is idle is the zombie: /health stays 200; the wrapper's one-token
idle probe must flag it. Timings from fault to the wrapper's exit (or flag) are logged (measurements, not assertions).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support import vllm_cpu
from tests.support.health_harness import record_timing
from tests.support.net import free_port
from vllm_operator import constants

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("venv_vllm_pinned")]  # vLLM from .venv-vllm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vllm_cpu.make_model("tiny", tmp_path_factory.mktemp("models") / "tiny-llama")


def start_wrapped(model: Path, args: list[str], tmp_path: Path, status_port: int | None = None,
                  wrapper_args: Sequence[str] = ()) -> tuple[vllm_cpu.VllmServer, Path]:
    port = free_port()
    message = tmp_path / "termination-log"
    argv = [sys.executable, "-m", "vllm_operator.cli", "engine", "--launcher=api-server",
            f"--python={vllm_cpu.require_vllm_venv()}", f"--termination-message-path={message}", "--preflight=off",
            "--status-host=127.0.0.1", f"--status-port={status_port or free_port()}",
            *wrapper_args, "--", "vllm", "serve", str(model), "--load-format=dummy", "--enforce-eager", *args,
            "--host=127.0.0.1", f"--port={port}"]
    log_path = tmp_path / "wrapper.log"
    env = vllm_cpu.cpu_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "operator")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    return vllm_cpu.VllmServer(proc=proc, argv=argv, host="127.0.0.1", port=port, log_path=log_path), message


def wrapper_status(port: int, path: str = "/status") -> tuple[int | None, dict[str, Any] | None]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), json.loads(err.read() or b"null")
    except OSError:
        return None, None


class WatchedStart:
    """A wrapped vLLM started once for the module, its start-up watched live off the wrapper's /status."""

    def __init__(self, server: vllm_cpu.VllmServer, message: Path, status_port: int) -> None:
        self.server = server
        self.message = message
        self.status_port = status_port
        self.seen: list[str] = []
        """The phases /status showed while it started, in the order seen."""
        self.probe_codes: set[int | None] = set()
        """What the startup probe answered before Serving."""
        self.snap: dict[str, Any] | None = None

    def watch(self) -> None:
        deadline = time.monotonic() + vllm_cpu.DEFAULT_STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and self.server.proc.poll() is None:
            # The probe is read before the phase: a phase other than Serving read after it proves the probe answered
            # before Serving, so its code must be a failure (read the other way round, the start could finish in
            # between and a correct 200 would fail the test: CI, 2026-12-03).
            code = wrapper_status(self.status_port, "/startup")[0]
            _, self.snap = wrapper_status(self.status_port)
            if self.snap is not None and (not self.seen or self.seen[-1] != self.snap["phase"]):
                self.seen.append(self.snap["phase"])
            if self.snap is not None and self.snap["phase"] == "Serving":
                return
            self.probe_codes.add(code)
            time.sleep(0.2)


@pytest.fixture(scope="module")
def watched(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedStart]:
    """Shared by the start-up test and the SIGTERM test (which ends it): one vLLM start less in the tier."""
    status_port = free_port()
    server, message = start_wrapped(model_dir, ["--kv-cache-memory-bytes=64M", "--max-model-len=2048"],
                                    tmp_path_factory.mktemp("watched"), status_port=status_port)
    try:
        start = WatchedStart(server, message, status_port)
        start.watch()
        yield start
    finally:
        server.stop(grace_s=10)


def test_start_up_phases_of_real_vllm_in_order(watched: WatchedStart) -> None:
    """The phases a real vLLM CPU start goes through, read live off the wrapper's /status, with vLLM's KV number;
    the startup probe fails while it starts and passes once it serves. Per-phase seconds are recorded."""
    snap, seen = watched.snap, watched.seen
    log = watched.server.log_text()
    assert snap is not None and snap["phase"] == "Serving", log[-3000:]
    history = [h["phase"] for h in snap["history"]]
    assert history == ["Launching", "LoadingWeights", "ProfilingMemory", "KVCacheAllocated", "Serving"], history
    assert seen[0] == "Launching" and seen[-1] == "Serving" and seen == [p for p in history if p in seen]
    assert snap["kvCacheTokens"] == 65536 and snap["maxConcurrency"] == 32.0  # vLLM's own numbers
    assert "CPU KV cache size: 65,536 tokens" in log and not snap["stalled"]
    assert watched.probe_codes <= {503, None} and 503 in watched.probe_codes, watched.probe_codes
    assert wrapper_status(watched.status_port, "/startup")[0] == 200
    watched.server.wait_healthy()
    assert watched.server.health_status() == 200
    record_timing("real vLLM CPU start-up phases", sum(snap["durations"].values()), tier="real vLLM CPU",
                  durations=snap["durations"], seen_live=seen)


def test_engine_core_killed_becomes_engine_dead(model_dir: Path, tmp_path: Path) -> None:
    server, message = start_wrapped(model_dir, ["--kv-cache-memory-bytes=64M", "--max-model-len=2048"], tmp_path)
    try:
        server.wait_healthy()
        core = server.engine_core_pid()
        killed = time.monotonic()
        os.kill(core, signal.SIGKILL)
        code = server.proc.wait(timeout=120)
        took = time.monotonic() - killed
        log = server.log_text()
        assert code == constants.EXIT_ENGINE_DEAD, log[-3000:]
        msg = json.loads(message.read_text())
        assert msg["reason"] == "EngineDead" and msg["exitCode"] == constants.EXIT_ENGINE_DEAD
        # vLLM exits 0 when its engine core dies, by its own watchdog or on the SIGTERM the wrapper sends it a second
        # after the death line (engine/main.py, ENGINE_DEATH_GRACE_S); never killed
        assert msg["childExitCode"] in (0, -signal.SIGTERM), msg
        assert msg["detail"] and msg["detail"] in log
        record_timing("EngineCore SIGKILL -> wrapper exit 88", took, tier="real vLLM CPU", matched=msg["detail"])
    finally:
        server.stop(grace_s=10)


def test_kv_cache_too_small_at_start_up(model_dir: Path, tmp_path: Path) -> None:
    server, message = start_wrapped(model_dir, ["--kv-cache-memory-bytes=4M", "--max-model-len=65536"], tmp_path)
    started = time.monotonic()
    try:
        code = server.proc.wait(timeout=vllm_cpu.DEFAULT_STARTUP_TIMEOUT_S)
        took = time.monotonic() - started
        log = server.log_text()
        assert code == constants.EXIT_KV_CACHE_TOO_SMALL, log[-3000:]
        msg = json.loads(message.read_text())
        assert msg["reason"] == "KVCacheTooSmall" and msg["childExitCode"] != 0
        assert msg["max_seq_len"] == 65536 and msg["needed_gib"] > msg["available_gib"]
        assert "larger than the available KV cache memory" in msg["detail"]
        record_timing("launch -> KV cache too small -> wrapper exit 89", took, tier="real vLLM CPU",
                      message={k: v for k, v in msg.items() if k != "detail"})
    finally:
        server.stop(grace_s=10)


def test_sigterm_drains_real_vllm_and_exits_zero(watched: WatchedStart, model_dir: Path) -> None:
    """The kubelet's SIGTERM reaches vLLM through the wrapper; vLLM shuts down cleanly and nothing is reported.
    It ends the module's shared engine, so it runs last (the start-up test reads only what was recorded).

    Before that, the engine's very first request is a prompt of one token: with `--enforce-eager` and an explicit KV
    cache size vLLM runs no warm-up pass, and on an AMX host its AMX attention then ran before anything had asked
    for the tile permission, killing the worker with SIGILL (vllm_operator/engine/amx.py)."""
    server, message = watched.server, watched.message
    server.wait_healthy()
    body = json.dumps({"model": str(model_dir), "prompt": "x", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200 and json.loads(resp.read())["choices"], server.log_text()[-3000:]
    children = server.descendants()
    assert children, "vLLM runs as the wrapper's child"
    stopped = time.monotonic()
    os.kill(server.pid, signal.SIGTERM)  # the wrapper only, as the kubelet signals PID 1
    code = server.proc.wait(timeout=120)
    took = time.monotonic() - stopped
    log = server.log_text()
    assert code == 0, log[-3000:]
    assert not message.exists(), message.read_text()
    assert "Forwarded signal 15" in log
    record_timing("SIGTERM -> wrapper exit 0 (graceful)", took, tier="real vLLM CPU")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in children):
        time.sleep(0.2)
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()], "vLLM processes outlived the wrapper"


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of a vLLM series' samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"vllm:{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_engine_core_stopped_while_idle_is_flagged_unresponsive(model_dir: Path, tmp_path: Path) -> None:
    """The zombie of vLLM issue 39863 made on purpose: SIGSTOP the EngineCore of an idle, serving vLLM. /health stays
    200 (the API server is fine), nothing else moves; the wrapper's idle probe must say so within
    idle + failures x timeout (+ ticks), and clear it once the process is continued. Before the fault, the real
    vLLM must take the probe as intended: one token, finished as `stop` (never `length`, which feeds the
    RunawayGeneration share)."""
    status_port = free_port()
    probe = ["--idle-probe-after=5", "--idle-probe-timeout=5", "--idle-probe-failures=2", "--idle-probe-tick=1"]
    server, _ = start_wrapped(model_dir, ["--kv-cache-memory-bytes=64M", "--max-model-len=2048"], tmp_path,
                              status_port=status_port, wrapper_args=probe)
    core: int | None = None
    try:
        server.wait_healthy()
        deadline = time.monotonic() + 120
        snap: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            snap = wrapper_status(status_port)[1]
            if snap is not None and snap.get("idleProbe", {}).get("lastSuccessAt"):
                break
            time.sleep(0.5)
        assert snap is not None and snap["idleProbe"]["lastSuccessAt"], (snap, server.log_text()[-3000:])
        text = metrics_text(server.url)
        assert sample(text, "request_success_total", finished_reason="stop") >= 1, "the probe ended as stop"
        assert sample(text, "request_success_total", finished_reason="length") == 0, "probes never end as length"
        assert snap["idleProbe"]["failures"] == 0 and not snap["idleProbe"]["unresponsive"]

        core = server.engine_core_pid()
        stopped = time.monotonic()
        os.kill(core, signal.SIGSTOP)
        flagged: float | None = None
        while time.monotonic() - stopped < 120:
            snap = wrapper_status(status_port)[1]
            if snap is not None and snap["idleProbe"]["unresponsive"]:
                flagged = time.monotonic() - stopped
                break
            time.sleep(0.5)
        assert flagged is not None, (snap, server.log_text()[-3000:])
        assert server.health_status() == 200, "a zombie: vLLM's /health still answers 200"
        with urllib.request.urlopen(f"http://127.0.0.1:{status_port}/metrics", timeout=5) as resp:
            assert f"{constants.METRIC_ENGINE_UNRESPONSIVE} 1.0" in resp.read().decode()
        record_timing("EngineCore SIGSTOP while idle -> wrapper flags unresponsive", flagged, tier="real vLLM CPU",
                      idle_probe_after_s=5, idle_probe_timeout_s=5, idle_probe_failures=2)

        os.kill(core, signal.SIGCONT)
        continued = time.monotonic()
        core = None
        cleared: float | None = None
        while time.monotonic() - continued < 120:
            snap = wrapper_status(status_port)[1]
            if snap is not None and not snap["idleProbe"]["unresponsive"]:
                cleared = time.monotonic() - continued
                break
            time.sleep(0.5)
        assert cleared is not None, (snap, server.log_text()[-3000:])
        record_timing("EngineCore SIGCONT -> wrapper clears unresponsive", cleared, tier="real vLLM CPU")
        assert server.proc.poll() is None
    finally:
        if core is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)
        server.stop(grace_s=10)
