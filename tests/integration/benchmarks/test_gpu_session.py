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
from pathlib import Path
from typing import Any

from tests.support.loadgen import GPU_BENCH, load_script

TINY = (
    "--duration 1 --short-rate 4 --short-arrival fixed --short-output 4:8 --long-prompt 600 --long-output 8 "
    "--long-bursts 1 --long-burst-size 2 --long-first-burst 0.2 --tokens-per-word 1 --warmup 0"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_rehearsal_with_fake_engine(tmp_path: Path) -> None:
    engine = f"{sys.executable} -m vllm_operator.sim.fake_vllm --port {{port}} --max-model-len 32768 --ttft-ms 5"
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
