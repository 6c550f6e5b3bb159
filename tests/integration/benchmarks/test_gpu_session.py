"""A rehearsal of a GPU call: session.py with the fake vLLM standing in for the engine.

GPU calls are few and expensive, so the orchestration (start, wait for /health, capture /metrics, run each replica's
share, stop, merge layouts, one archive) must work before a GPU is touched. Only the engine command differs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.loadgen import GPU_BENCH, load_script
from tests.support.net import free_port

TINY = (
    "--duration 1 --short-rate 4 --short-arrival fixed --short-output 4:8 --long-prompt 600 --long-output 8 "
    "--long-bursts 1 --long-burst-size 2 --long-first-burst 0.2 --tokens-per-word 1 --warmup 0"
)


def test_rehearsal_with_fake_engine(tmp_path: Path) -> None:
    engine = f"{sys.executable} -m fakevllm --port {{port}} --max-model-len 32768 --ttft-ms 5"
    out = tmp_path / "results"
    cmd = [sys.executable, str(GPU_BENCH / "session.py"), "--steps", "long,short", "--plans", str(tmp_path),
           "--out", str(out), "--site", "", "--port", str(free_port()), "--model", "fake-model",
           "--engine-cmd", engine, "--loadgen-args", TINY, "--start-timeout", "60",
           "--archive", str(tmp_path / "back" / "call.tar.xz")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    session = json.loads((out / "session.json").read_text())
    steps = {s["step"]: s for s in session["steps"]}
    assert steps["long"]["run:unified-r0"] == steps["long"]["run:unified-r1"] == steps["long"]["run:split-long"] == 0
    assert steps["short"]["run:split-short"] == 0
    unified, split = session["layouts"]["unified"], session["layouts"]["split"]
    # the two unified shares together are the whole schedule: 4 short + 2 long, half on each replica
    assert (unified["short"]["ok"], unified["long"]["ok"]) == (4, 2)
    assert (split["short"]["ok"], split["long"]["ok"]) == (4, 2)
    assert unified["shares"] == ["unified-r0", "unified-r1"]
    assert "unified-tuned" not in session["layouts"]
    assert (out / "long" / "metrics-start.txt").read_text().count("vllm:cache_config_info{") == 1
    with tarfile.open(tmp_path / "back" / "call.tar.xz") as tar:
        names = set(tar.getnames())
    assert {"results/session.json", "results/runs/split-short/raw.json", "results/long/engine.log"} <= names


def test_unknown_step_is_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, str(GPU_BENCH / "session.py"), "--steps", "long,huge", "--plans", str(tmp_path),
           "--out", str(tmp_path / "o")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "unknown steps ['huge']" in done.stderr


def test_stop_waits_for_the_whole_engine_group(tmp_path: Path) -> None:
    """vLLM's EngineCore is a child process holding the GPU; the next start needs it gone, not just the leader."""
    session: Any = load_script("session")
    ready = tmp_path / "ready"
    # the leader (sh) dies at once on SIGTERM; its child, like EngineCore, takes a second to let go
    slow = (
        "import pathlib, signal, sys, time;"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(0)));"
        f"pathlib.Path('{ready}').touch(); time.sleep(300)"
    )
    proc = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "{slow}" & sleep 300 & wait'], start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists() and len(group_members(proc.pid)) == 3
    session.stop(proc)
    assert group_members(proc.pid) == []
    assert not session.group_alive(proc.pid)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def test_budget_skips_what_would_not_fit_and_still_archives(tmp_path: Path) -> None:
    """A GPU command is killed at its time limit; a session that ran past it would bring nothing back."""
    engine = f"{sys.executable} -m fakevllm --port {{port}} --max-model-len 32768"
    out = tmp_path / "results"
    cmd = [sys.executable, str(GPU_BENCH / "session.py"), "--steps", "short,bf16", "--plans", str(tmp_path),
           "--out", str(out), "--site", "", "--port", str(free_port()), "--model", "fake-model",
           "--engine-cmd", engine, "--budget-s", "100", "--archive", str(tmp_path / "call.tar.xz")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    steps = {s["step"]: s for s in json.loads((out / "session.json").read_text())["steps"]}
    # 100 s leave room for neither a start (150 s estimated) nor a share: nothing was started
    assert steps["short"]["skipped"] == "100 s left, a start and a share needs ~230"
    assert steps["bf16"]["skipped"] == "100 s left, a start needs ~150"
    assert not (out / "short" / "engine.log").exists()
    with tarfile.open(tmp_path / "call.tar.xz") as tar:
        assert "results/session.json" in tar.getnames()


def test_sigterm_stops_the_engine_and_still_archives(tmp_path: Path) -> None:
    """`timeout -s TERM` around a call: the engine's group is stopped, what ran is kept, the archive is written."""
    engine = f"{sys.executable} -m fakevllm --port {{port}} --max-model-len 32768 --ttft-ms 5"
    out, port = tmp_path / "results", free_port()
    loadgen = "--duration 600 --short-rate 2 --long-bursts 0 --tokens-per-word 1 --warmup 0"
    cmd = [sys.executable, str(GPU_BENCH / "session.py"), "--steps", "short,bf16", "--plans", str(tmp_path),
           "--out", str(out), "--site", "", "--port", str(port), "--model", "fake-model",
           "--engine-cmd", engine, "--loadgen-args", loadgen, "--start-timeout", "60",
           "--archive", str(tmp_path / "call.tar.xz")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    engine_log = out / "short" / "engine.log"
    deadline = time.monotonic() + 60
    while not healthy(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert healthy(port)
    time.sleep(2.0)  # the share is running now (no calibration, no warm-up)
    proc.terminate()
    output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 1, output
    steps = json.loads((out / "session.json").read_text())["steps"]
    assert [s["step"] for s in steps] == ["short"]  # bf16 never started
    assert steps[0]["error"] == "interrupted (signal 15)"
    assert engine_log.exists()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # the engine is gone, its port is free
        s.connect(("127.0.0.1", port))
    with tarfile.open(tmp_path / "call.tar.xz") as tar:
        assert "results/short/engine.log" in tar.getnames()
