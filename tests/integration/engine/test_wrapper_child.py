"""The engine wrapper as a process: `vllm-operator engine -- python engine_child.py MODE`.

The child prints the failure texts real vLLM prints and exits as vLLM does (0 after an engine death). The wrapper
must pass the log through, exit with the documented code, and leave a one-line JSON termination message.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from vllm_operator import constants

pytestmark = pytest.mark.integration
CHILD = Path(__file__).with_name("vllm_stand_in.py")  # not under tests/support: its operator.py shadows the stdlib
WRAPPER = [sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=off", "--status-port=0"]


def wrap(mode: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, object] | None]:
    msg = tmp_path / "termination-log"
    done = subprocess.run([*WRAPPER, f"--termination-message-path={msg}", "--", sys.executable, str(CHILD), mode],
                          capture_output=True, text=True, timeout=60, check=False)
    return done, json.loads(msg.read_text()) if msg.exists() else None


@pytest.mark.parametrize(("mode", "code", "reason", "text"), [
    ("oom", constants.EXIT_ENGINE_OOM, "EngineOOM", "CUDA out of memory"),
    ("fatal", constants.EXIT_ENGINE_DEAD, "EngineDead", "EngineCore encountered a fatal error"),
    ("kv", constants.EXIT_KV_CACHE_TOO_SMALL, "KVCacheTooSmall", "larger than the available KV cache memory"),
    ("clean-exit", constants.EXIT_UNEXPECTED, "UnexpectedExit", "no stop was requested"),
], ids=["oom", "fatal", "kv-too-small", "unexpected-exit-0"])
def test_failure_text_becomes_exit_code_and_message(mode: str, code: int, reason: str, text: str,
                                                    tmp_path: Path) -> None:
    done, msg = wrap(mode, tmp_path)
    assert done.returncode == code, done.stderr
    assert msg is not None and msg["reason"] == reason and msg["exitCode"] == code
    assert text in str(msg["detail"])
    assert "INFO Starting vLLM API server" in done.stdout  # passed through


def test_an_error_after_serving_keeps_the_child_code(tmp_path: Path) -> None:
    done, msg = wrap("error-after-serving", tmp_path)
    assert done.returncode == 3 and "RuntimeError: something else" in done.stderr
    assert msg is not None and msg["reason"] is None and msg["exitCode"] == 3
    assert msg["detail"] == "RuntimeError: something else"


@pytest.mark.parametrize(("mode", "line"), [
    ("error", "RuntimeError: something else"),
    ("startup-fa3", "(EngineCore pid=7071) RuntimeError: For FP16/BF16 input, output must have the same dtype as "
                    "inputs. For FP8 input, output must have dtype BF16"),
], ids=["plain-error", "fa3-fp8-float16"])
def test_an_error_before_serving_is_startup_failed_with_the_root_cause(mode: str, line: str,
                                                                       tmp_path: Path) -> None:
    done, msg = wrap(mode, tmp_path)
    assert done.returncode == constants.EXIT_STARTUP_FAILED, done.stderr
    assert msg is not None and msg["reason"] == "StartupFailed" and msg["exitCode"] == 82
    assert msg["detail"] == line  # the cause, not vLLM's "See root cause above"


def test_a_dead_engine_core_stops_vllm_without_waiting_for_its_watchdog(tmp_path: Path) -> None:
    """vLLM's API server exits only when its watchdog next looks (every 5 s); the kubelet restarts the container
    only when the wrapper exits. The stand-in never exits by itself: the wrapper must stop it (SIGTERM) after the
    death line and exit EngineDead, well within `wrap`'s 60 s deadline."""
    done, msg = wrap("dead-core-lingers", tmp_path)
    assert done.returncode == constants.EXIT_ENGINE_DEAD, done.stderr
    assert "stopped after signal 15" in done.stdout
    assert msg is not None and msg["reason"] == "EngineDead" and msg["childExitCode"] == 0
    assert "engine core exited unexpectedly" in str(msg["detail"])
    assert "Stopped vLLM" in done.stderr and "its engine core died" in done.stderr


def test_killed_child_is_128_plus_signal(tmp_path: Path) -> None:
    done, _ = wrap("killed", tmp_path)
    assert done.returncode == 128 + signal.SIGKILL


def test_sigterm_is_forwarded_for_a_graceful_drain(tmp_path: Path) -> None:
    msg = tmp_path / "termination-log"
    proc = subprocess.Popen([*WRAPPER, f"--termination-message-path={msg}", "--", sys.executable, str(CHILD),
                             "sigterm"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "INFO Starting vLLM API server"
    assert proc.stdout.readline().strip() == "READY"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "drained after signal 15" in out and not msg.exists()


def test_missing_command_is_a_launch_failure(tmp_path: Path) -> None:
    msg = tmp_path / "termination-log"
    done = subprocess.run([*WRAPPER, f"--termination-message-path={msg}", "--", "/nonexistent/vllm", "serve", "m"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == constants.EXIT_LAUNCH_FAILED
    assert json.loads(msg.read_text())["reason"] == "LaunchFailed"


def test_preflight_required_without_gpu_fails_fast(tmp_path: Path) -> None:
    msg = tmp_path / "termination-log"
    done = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=required",
                           "--status-port=0", f"--termination-message-path={msg}", "--", sys.executable, str(CHILD),
                           "clean-exit"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/nonexistent", "PYTHONPATH": str(ROOT / "operator")})
    assert done.returncode == constants.EXIT_PREFLIGHT_FAILED, done.stderr
    assert "no GPU could be read" in json.loads(msg.read_text())["detail"]
