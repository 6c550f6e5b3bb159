"""The engine wrapper follows a start as phases: `vllm-operator engine -- python -m fakevllm`.

The fake vLLM prints vLLM 0.32's real start-up lines (and progress bars with `\\r`) before it serves, can stall in a
phase, and can write a Hub download into `$HF_HOME`. The wrapper must serve the phases on its own port (`/status`,
`/startup` for the startup probe, `/metrics`), stop a start that stalls in a phase with exit code 83, and leave a
slow start that keeps moving alone — also when it takes longer than the old startup probe's whole budget.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.net import free_port
from vllm_operator import constants
from vllm_operator.rendering import engine as engine_rendering

pytestmark = pytest.mark.integration
WRAPPER = [sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=off", "--status-host=127.0.0.1",
           "--watch-interval=0.2"]
FAKE = [sys.executable, "-m", "fakevllm", "--host=127.0.0.1"]
ORDER = ["Launching", "LoadingWeights", "Compiling", "ProfilingMemory", "KVCacheAllocated", "Serving"]


class Wrapped:
    def __init__(self, proc: subprocess.Popen[bytes], status_port: int, engine_port: int, message: Path,
                 log: Path) -> None:
        self.proc, self.status_port, self.engine_port, self.message, self.log = (
            proc, status_port, engine_port, message, log)

    def get(self, path: str) -> tuple[int | None, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.status_port}{path}", timeout=2) as resp:
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()
        except OSError:
            return None, b""

    def status(self) -> dict[str, Any] | None:
        code, body = self.get("/status")
        return json.loads(body) if code == 200 else None

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.engine_port}/health", timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except OSError:
            return None


@contextlib.contextmanager
def wrapped(tmp_path: Path, fake_args: list[str], wrapper_args: list[str] = (),  # type: ignore[assignment]
            env: dict[str, str] | None = None) -> Iterator[Wrapped]:
    status_port, engine_port = free_port(), free_port()
    message, log = tmp_path / "termination-log", tmp_path / "wrapper.log"
    argv = [*WRAPPER, f"--status-port={status_port}", f"--termination-message-path={message}", *wrapper_args,
            "--", *FAKE, f"--port={engine_port}", *fake_args]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield Wrapped(proc, status_port, engine_port, message, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def follow(w: Wrapped, timeout: float = 60.0) -> tuple[list[str], dict[str, Any] | None]:
    """Poll /status until Serving, a stall or the wrapper's exit; the distinct phases seen, and the last status."""
    seen: list[str] = []
    last = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and w.proc.poll() is None:
        snap = w.status()
        if snap is not None:
            last = snap
            if not seen or seen[-1] != snap["phase"]:
                seen.append(snap["phase"])
            if snap["phase"] == "Serving" or snap["stalled"]:
                break
        time.sleep(0.05)
    return seen, last


def test_each_phase_in_order_then_the_startup_probe_passes(tmp_path: Path) -> None:
    with wrapped(tmp_path, ["--startup-step-s=0.3", "--startup-steps=3", "--kv-cache-tokens=65536",
                            "--max-model-len=2048"]) as w:
        code, body = None, b""
        deadline = time.monotonic() + 30
        while code is None and time.monotonic() < deadline:
            code, body = w.get("/startup")
            time.sleep(0.05)
        assert code == 503 and json.loads(body)["phase"] in ORDER[:2], "starting: the startup probe fails"
        seen, last = follow(w)
        assert last is not None and last["phase"] == "Serving", w.log.read_text()[-3000:]
        assert [h["phase"] for h in last["history"]] == ORDER  # every phase, in vLLM's order
        assert set(seen) <= set(ORDER) and len(seen) >= 4, seen  # ... and most of them seen live by polling
        assert last["kvCacheTokens"] == 65536 and last["maxConcurrency"] == 32.0
        assert all(last["durations"][p] >= 0.25 for p in ("LoadingWeights", "Compiling")), last["durations"]
        assert w.get("/startup")[0] == 200
        assert w.health() == 200, "the fake serves once it printed Application startup complete"
        metrics = w.get("/metrics")[1].decode()
        assert 'vllm_operator_engine_startup_phase{phase="Serving"} 1.0' in metrics
        assert 'vllm_operator_engine_startup_phase{phase="Compiling"} 0.0' in metrics
        assert "vllm_operator_engine_startup_kv_cache_tokens 65536.0" in metrics
        assert "vllm_operator_engine_process_start_timestamp_seconds" in metrics
        assert "Entered start-up phase KVCacheAllocated" in w.log.read_text()
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(timeout=20) == 128 + signal.SIGTERM  # the fake dies of the signal it was forwarded
        assert json.loads(w.message.read_text())["reason"] is None


def test_a_start_stalled_in_one_phase_is_stopped_with_its_own_exit_code(tmp_path: Path) -> None:
    with wrapped(tmp_path, ["--startup-step-s=0.1", "--stall-in=ProfilingMemory"],
                 ["--phase-limit=ProfilingMemory=1.5", "--phase-limit=Compiling=1.5"]) as w:
        # The fake prints the Compiling phase last and then stalls; the limit of the phase it is in applies.
        seen, last = follow(w, timeout=30)
        # The last status seen live: the phase it stalled in (flagged stalled if polled between the stall and the
        # wrapper's exit, which is quick: the fake dies at once on SIGTERM).
        assert last is not None and last["phase"] == "Compiling" and seen[-1] == "Compiling", (seen, last)
        assert w.get("/startup")[0] in (503, None)  # None: the wrapper already stopped vLLM and exited
        code = w.proc.wait(timeout=40)
        assert code == constants.EXIT_STARTUP_STALLED, w.log.read_text()[-3000:]
        msg = json.loads(w.message.read_text())
        assert msg["reason"] == "StartupStalled" and msg["exitCode"] == 83 and msg["phase"] == "Compiling"
        assert msg["limitSeconds"] == 1.5 and "no progress for" in msg["detail"]
        assert "Stopped vLLM" in w.log.read_text()


def kubelet_startup_probe(w: Wrapped, probe: dict[str, Any], scale: float, timeout: float) -> str:
    """The kubelet's startup-probe rule on a rendered probe, its periods scaled by `scale`: "started" at the first
    success, "killed" after failureThreshold consecutive failures (a refused connection is a failure too)."""
    get = probe["httpGet"]
    port = w.status_port if get["port"] == engine_rendering.STATUS_PORT_NAME else w.engine_port
    failures = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{get['path']}", timeout=probe["timeoutSeconds"]):
                return "started"
        except (OSError, urllib.error.HTTPError):
            failures += 1
        if failures >= probe["failureThreshold"]:
            return "killed"
        time.sleep(probe["periodSeconds"] * scale)
    return "undecided"


def test_a_slow_start_that_moves_outlasts_the_old_probe_budget_and_is_not_killed(tmp_path: Path) -> None:
    """The same slow start under the old startup probe (/health, 120 x 10 s on CPU pools) and the rendered one,
    both on a clock 100x faster: the old probe gives up at 12 s, the wrapper's backstop is 6600 s / 100 = 66 s; the
    phase limits are scaled too (LoadingWeights 1200 s -> 12 s) and the start moves every second."""
    scale = 0.01
    old = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5,
           "failureThreshold": 120}
    new = {"httpGet": {"path": engine_rendering.STARTUP_PATH, "port": engine_rendering.STATUS_PORT_NAME},
           "periodSeconds": engine_rendering.STARTUP_PERIOD_S, "timeoutSeconds": engine_rendering.STARTUP_TIMEOUT_S,
           "failureThreshold": int(engine_rendering.STARTUP_BACKSTOP_S / engine_rendering.STARTUP_PERIOD_S)}
    limits = [f"--phase-limit={p}=12" for p in ("Launching", "LoadingWeights", "Compiling", "ProfilingMemory",
                                                "KVCacheAllocated")]
    fake = ["--startup-step-s=1.0", "--startup-steps=8"]  # ~19 s: 9 shard steps, 9 compile steps, 1 s apart
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    started = time.monotonic()
    with wrapped(tmp_path / "old", fake, limits) as w_old:
        assert kubelet_startup_probe(w_old, old, scale, timeout=60) == "killed"
        old_verdict_s = time.monotonic() - started
    started = time.monotonic()
    with wrapped(tmp_path / "new", fake, limits) as w:
        assert kubelet_startup_probe(w, new, scale, timeout=90) == "started", w.log.read_text()[-3000:]
        took = time.monotonic() - started
        snap = w.status()
        assert snap is not None and snap["phase"] == "Serving" and not snap["stalled"]
    assert took > old["periodSeconds"] * old["failureThreshold"] * scale, "the start outlasted the old budget"
    assert old_verdict_s < took


def test_a_hub_download_advances_by_bytes(tmp_path: Path) -> None:
    total = 8 * 2**20
    env = {"HF_HOME": str(tmp_path / "hf")}
    with wrapped(tmp_path, ["--model=org/tiny", "--download-repo=org/tiny", f"--download-bytes={total}",
                            "--startup-step-s=0.5", "--startup-steps=6"], ["--phase-limit=Downloading=5"],
                 env=env) as w:
        sizes = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            snap = w.status()
            if snap is not None and snap["phase"] == "Downloading":
                sizes.append(snap["downloadBytes"])
            if snap is not None and snap["phase"] == "Serving":
                break
            time.sleep(0.1)
        assert snap is not None and snap["phase"] == "Serving", w.log.read_text()[-3000:]
        assert len(set(sizes)) >= 2 and sizes == sorted(sizes), sizes  # seen growing while downloading
        assert snap["downloadBytes"] == total and "Downloading" in [h["phase"] for h in snap["history"]]
        assert snap["history"][1]["phase"] == "Downloading"  # after launching, before loading the weights
        line = next(x for x in w.get("/metrics")[1].decode().splitlines()
                    if x.startswith("vllm_operator_engine_startup_download_bytes "))
        assert float(line.split()[1]) == total
