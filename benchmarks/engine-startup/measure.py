"""How long each start-up phase of a real vLLM CPU engine takes, with a cold and a warm page cache.

Each run starts the real engine wrapper (`vllm-operator engine`, the engine pods' command) around real vLLM on CPU
with the tiny test model (`--load-format=dummy`, the e2e tier's flags), polls the wrapper's `/status` until Serving,
records the wrapper's per-phase durations, and stops it. "Cold" first evicts the vLLM venv's files and the model
from the page cache (`posix_fadvise(DONTNEED)` on every file: only this engine's files, not the whole machine's
cache, and pages other running processes have mapped stay); "warm" runs right after a start, with those files cached.
Runs alternate cold, warm, cold, warm… so both see the same machine load; the result is the median per phase and
the cold/warm ratio measured in the same session.

    .venv/bin/python benchmarks/engine-startup/measure.py [--runs 2] [--eager/--no-eager] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import vllm_cpu  # noqa: E402
from tests.support.net import free_port  # noqa: E402


def evict(paths: list[Path]) -> int:
    """Drop these trees' files from the page cache; returns the bytes advised."""
    total = 0
    for root in paths:
        for dirpath, _, files in os.walk(root, followlinks=True):
            for name in files:
                path = os.path.join(dirpath, name)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    total += os.fstat(fd).st_size
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return total


def resident_mib(path: Path) -> float | None:
    """Page-cache residency of one file (util-linux `fincore`), to show what the eviction left: pages that running
    processes map (other vLLM servers on the machine) cannot be dropped."""
    try:
        done = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                              capture_output=True, text=True, timeout=30, check=True)
        return round(int(done.stdout.split()[0]) / 2**20, 1)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def status(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except (OSError, urllib.error.HTTPError, ValueError):
        return None


def one_start(model: Path, eager: bool, log_dir: Path, label: str) -> dict[str, Any]:
    status_port, port = free_port(), free_port()
    args = ["--load-format=dummy", "--kv-cache-memory-bytes=64M", "--max-model-len=2048"]
    if eager:
        args.append("--enforce-eager")
    argv = [str(ROOT / ".venv" / "bin" / "vllm-operator"), "engine", "--launcher=api-server",
            f"--python={vllm_cpu.require_vllm_venv()}", "--preflight=off", "--status-host=127.0.0.1",
            f"--status-port={status_port}", f"--termination-message-path={log_dir / (label + '.term')}",
            "--", "vllm", "serve", str(model), *args, "--host=127.0.0.1", f"--port={port}"]
    log = log_dir / f"{label}.log"
    started = time.time()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=vllm_cpu.cpu_env(),
                                start_new_session=True)
    snap = None
    try:
        while proc.poll() is None and time.time() - started < 900:
            snap = status(status_port)
            if snap is not None and snap["phase"] == "Serving":
                break
            time.sleep(0.2)
        if snap is None or snap["phase"] != "Serving":
            raise RuntimeError(f"{label}: no Serving (rc={proc.poll()}); log {log}")
        return {"label": label, "total_s": round(time.time() - started, 2), "durations": snap["durations"],
                "history": [h["phase"] for h in snap["history"]], "kv_cache_tokens": snap["kvCacheTokens"]}
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=2, help="cold and warm starts each (alternating)")
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                   help="--enforce-eager (the e2e tier's flag); --no-eager adds torch.compile warm-up")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="engine-startup-"))
    model = vllm_cpu.make_model("tiny", work / "tiny-llama")
    venv = vllm_cpu.VLLM_VENV.resolve()
    libtorch = next(venv.glob("lib/python3*/site-packages/torch/lib/libtorch_cpu.so"), venv)
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        advised = evict([venv, model])
        left = resident_mib(libtorch)
        cold = one_start(model, args.eager, work, f"cold-{i}")
        cold.update(cache="cold", evicted_gib=round(advised / 2**30, 2), libtorch_cpu_resident_mib=left,
                    load=os.getloadavg()[0])
        runs.append(cold)
        print(json.dumps(cold), flush=True)
        resident = resident_mib(libtorch)
        warm = one_start(model, args.eager, work, f"warm-{i}")
        warm.update(cache="warm", libtorch_cpu_resident_mib=resident, load=os.getloadavg()[0])
        runs.append(warm)
        print(json.dumps(warm), flush=True)
    phases = sorted({p for r in runs for p in r["durations"]}, key=lambda p: runs[0]["history"].index(p)
                    if p in runs[0]["history"] else 99)
    print(f"\n{'phase':<18} {'cold s':>8} {'warm s':>8} {'cold/warm':>9}")
    summary: dict[str, dict[str, float]] = {}
    for phase in [*phases, "total"]:
        def med(cache: str, phase: str = phase) -> float:
            values = [r["total_s"] if phase == "total" else r["durations"].get(phase, 0.0) for r in runs
                      if r["cache"] == cache]
            return float(statistics.median(values))
        c, w = med("cold"), med("warm")
        summary[phase] = {"cold_s": round(c, 2), "warm_s": round(w, 2),
                          "ratio": round(c / w, 2) if w > 0 else float("nan")}
        print(f"{phase:<18} {c:8.2f} {w:8.2f} {summary[phase]['ratio']:9.2f}")
    if args.json:
        args.json.write_text(json.dumps({"eager": args.eager, "runs": runs, "median": summary,
                                         "cpus": len(os.sched_getaffinity(0))}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
