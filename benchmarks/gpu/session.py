#!/usr/bin/env python3
"""One GPU call's worth of the issue-12 benchmark: start each planned engine, check its KV cache against the plan,
drive its replica shares with the load generator, stop it, and pack everything into one archive.

Why a script: GPU time is scarce (a vLLM start costs 90-150 s; at most 4 calls of at most 10 minutes, back to back,
and only a few files come back per call), so every step that can go wrong is rehearsed locally first: `--engine-cmd`
swaps the vLLM launcher for any command (the fake vLLM server) and the same code runs end to end on a laptop.

Steps (each one engine start; see benchmarks/gpu/README.md for which call runs which):
  long      plan default, pool long:  unified share 0, unified share 1, split long share
  short     plan default, pool short: split short share
  tuned     plan tuned (smaller max_num_batched_tokens), pool long: unified-tuned share 0 and share 1
  bf16      plan bf16 (long pool with a bf16 KV cache): KV accuracy only, no traffic
  seqs64    plan seqs64 (long pool with --max-num-seqs 64), pool long: unified-seqs64 share 0 and share 1
  splitlong plan default, pool long: the split long share alone (a rerun, e.g. with a padded tokenizer)
Every step records the planned vs observed KV cache of its engine.
Layout summaries are merged from the shares that exist so far (`loadgen.py summarize`).

A GPU command is killed at its time limit, and a killed session would bring nothing back, so `--budget-s` makes the
session skip (and record as skipped) any engine start or share that would not fit in the time left, and SIGTERM
(`timeout -s TERM ...` around the call) still stops the engine and writes the archive.

Standard library only (plus the two sibling scripts it runs): the GPU machine has a bare Python 3.12.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOADGEN = HERE / "loadgen.py"
ENGINE_CMD = HERE / "engine_cmd.py"
ENGINE_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
"""What the GPU machine's vLLM needs (per the GPU machine's own notes); PYTHONPATH=/tmp/site comes from --site."""

# The mixed workload of issue 12 for one layout (both replicas together); each run sends one replica's share.
WORKLOAD = [
    "--duration", "60", "--short-rate", "8", "--short-arrival", "poisson",
    "--short-prompt", "100:500", "--short-output", "64:256",
    "--long-prompt", "24000", "--long-output", "512",
    "--long-bursts", "3", "--long-burst-size", "8", "--long-first-burst", "5", "--long-burst-every", "20",
    "--seed", "12",
]  # fmt: skip
START_EST_S = 150.0
"""Time an engine start may take on the H200 (90-150 s seen on the H200)."""
RUN_EST_S = 80.0
"""Time one share takes: 60 s of arrivals, the last burst's drain, calibration and warm-up."""
ARCHIVE_RESERVE_S = 20.0
"""Kept back for stopping the last engine and writing the archive."""


class Interrupted(Exception):
    """SIGTERM arrived (the call's time limit is near): stop the engine, keep what ran, write the archive."""


def on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


@dataclass
class Budget:
    """Wall-clock seconds this session may use from its start (0: no limit)."""

    total_s: float
    t0: float

    def left(self) -> float:
        return float("inf") if self.total_s <= 0 else self.total_s - (time.monotonic() - self.t0)

    def fits(self, need_s: float) -> bool:
        return self.left() >= need_s + ARCHIVE_RESERVE_S


@dataclass(frozen=True)
class Run:
    name: str
    layout: str
    replica: int


@dataclass(frozen=True)
class Step:
    plan: str
    pool: str
    runs: tuple[Run, ...]


STEPS = {
    "long": Step("default", "long", (Run("unified-r0", "unified", 0), Run("unified-r1", "unified", 1),
                                  Run("split-long", "split", 1))),
    "short": Step("default", "short", (Run("split-short", "split", 0),)),
    "tuned": Step("tuned", "long", (Run("tuned-r0", "unified", 0), Run("tuned-r1", "unified", 1))),
    "bf16": Step("bf16", "long", ()),
    "seqs64": Step("seqs64", "long", (Run("seqs64-r0", "unified", 0), Run("seqs64-r1", "unified", 1))),
    "splitlong": Step("default", "long", (Run("split-long", "split", 1),)),
}  # fmt: skip
LAYOUTS = {"unified": ("unified-r0", "unified-r1"), "split": ("split-short", "split-long"),
           "unified-tuned": ("tuned-r0", "tuned-r1"), "unified-seqs64": ("seqs64-r0", "seqs64-r1")}  # fmt: skip


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""
    except (urllib.error.URLError, OSError):
        return 0, ""


def wait_healthy(url: str, proc: subprocess.Popen[bytes], deadline_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with code {proc.returncode} before /health answered")
        if get(url + "/health", 2.0)[0] == 200:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise RuntimeError(f"engine not healthy after {deadline_s:.0f} s")


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process is left in the group (zombies hold no GPU memory; read from /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # after "pid (comm)": state, ppid, pgrp
            return True
    return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's whole process group and wait until every member is gone: vLLM's EngineCore is a child
    process, and the next engine start needs its GPU memory back."""
    if group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while group_alive(proc.pid) and time.monotonic() < deadline:
        proc.poll()  # reap the leader so it does not linger as a zombie
        time.sleep(0.5)
    if group_alive(proc.pid):
        log("engine group still alive 60 s after SIGTERM; sending SIGKILL")
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def engine_argv(args: argparse.Namespace, plan: Path, pool: str) -> tuple[list[str], dict[str, str]]:
    if args.engine_cmd:
        return shlex.split(args.engine_cmd.format(port=args.port)), {}
    out = subprocess.run([sys.executable, str(ENGINE_CMD), "argv", str(plan), "--pool", pool, "--model-dir",
                          args.model_dir, "--port", str(args.port), "--mount", f"/models={args.models_mount}",
                          "--json"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"engine_cmd.py argv failed: {out.stderr.strip()}")
    data = json.loads(out.stdout)
    argv = [sys.executable if a == "python3" else a for a in data["argv"]]
    return argv, dict(data["env"])


def run_step(args: argparse.Namespace, name: str, out: Path, budget: Budget) -> dict[str, object]:
    step = STEPS[name]
    plan = Path(args.plans) / f"{step.plan}.json"
    sdir = out / name
    sdir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{args.port}"
    record: dict[str, object] = {"step": name, "plan": str(plan), "pool": step.pool}
    need = START_EST_S + (RUN_EST_S if step.runs else 0.0)
    if not budget.fits(need):
        what = "a start and a share" if step.runs else "a start"
        record["skipped"] = f"{budget.left():.0f} s left, {what} needs ~{need:.0f}"
        log(f"{name} skipped: {record['skipped']}")
        return record
    argv, plan_env = engine_argv(args, plan, step.pool)
    env = {**os.environ, **ENGINE_ENV, **plan_env}
    if args.site:
        env["PYTHONPATH"] = args.site
    (sdir / "argv.json").write_text(json.dumps({"argv": argv, "env": plan_env}, indent=2) + "\n")
    log(f"starting {name}: {shlex.join(argv)}")
    with (sdir / "engine.log").open("wb") as engine_log:
        proc = subprocess.Popen(argv, stdout=engine_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            record["startup_s"] = round(wait_healthy(url, proc, args.start_timeout), 1)
            log(f"{name} healthy after {record['startup_s']} s")
            metrics = get(url + "/metrics")[1]
            (sdir / "metrics-start.txt").write_text(metrics)
            if plan.exists():  # also in a rehearsal, to exercise the comparison
                cmp = subprocess.run([sys.executable, str(ENGINE_CMD), "compare", str(plan), "--pool", step.pool,
                                      "--metrics", str(sdir / "metrics-start.txt")],
                                     capture_output=True, text=True, check=False)  # fmt: skip
                (sdir / "kv-compare.json").write_text(cmp.stdout or cmp.stderr)
                record["kv_compare"] = json.loads(cmp.stdout) if cmp.returncode == 0 else cmp.stderr.strip()
            model = args.model or served_model(plan, step.pool)
            for run in step.runs:
                rdir = out / "runs" / run.name
                if not budget.fits(RUN_EST_S):
                    record[f"run:{run.name}"] = f"skipped: {budget.left():.0f} s left, a share needs ~{RUN_EST_S:.0f}"
                    log(f"run {run.name} {record[f'run:{run.name}']}")
                    continue
                cmd = [sys.executable, str(LOADGEN), "run", "--layout", run.layout, "--replica", str(run.replica),
                       "--url", url, "--model", model, "--label", run.name, "--out", str(rdir), *WORKLOAD,
                       *shlex.split(args.loadgen_args)]  # fmt: skip
                log(f"run {run.name}")
                done = subprocess.run(cmd, capture_output=True, text=True, check=False)
                rdir.mkdir(parents=True, exist_ok=True)
                (rdir / "loadgen.log").write_text(done.stderr)
                record[f"run:{run.name}"] = done.returncode
            (sdir / "metrics-end.txt").write_text(get(url + "/metrics")[1])
        except RuntimeError as err:
            record["error"] = str(err)
            log(f"{name} failed: {err}")
        finally:
            stop(proc)
    return record


def served_model(plan: Path, pool: str) -> str:
    data = json.loads(plan.read_text())
    return str(data["pools"][pool]["servedModelName"])


def summarize_layouts(out: Path) -> dict[str, object]:
    summaries: dict[str, object] = {}
    for layout, runs in LAYOUTS.items():
        raws = [out / "runs" / r / "raw.json" for r in runs if (out / "runs" / r / "raw.json").exists()]
        if not raws:
            continue
        done = subprocess.run([sys.executable, str(LOADGEN), "summarize", *map(str, raws), "--label", layout,
                               "--out", str(out / f"summary-{layout}.json")],
                              capture_output=True, text=True, check=False)  # fmt: skip
        summaries[layout] = json.loads(done.stdout) if done.returncode == 0 else done.stderr.strip()
        if isinstance(summaries[layout], dict):
            summaries[layout]["shares"] = [p.parent.name for p in raws]  # type: ignore[index]
    return summaries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="session.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--steps", required=True, help=f"comma-separated, from {sorted(STEPS)}")
    ap.add_argument(
        "--plans", required=True, help="directory with default.json, tuned.json, bf16.json (planner output)"
    )
    ap.add_argument("--out", required=True, help="results directory; the archive goes next to it")
    ap.add_argument("--model-dir", default="/tmp/model")
    ap.add_argument("--models-mount", default="/tmp/models", help="local stand-in for the pods' /models volume")
    ap.add_argument("--site", default="/tmp/site", help="PYTHONPATH for vLLM ('' to leave it)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default=None, help="served model name (default: from the plan)")
    ap.add_argument("--start-timeout", type=float, default=420.0)
    ap.add_argument("--loadgen-args", default="", help="extra loadgen flags, after the standard workload")
    ap.add_argument("--archive", default=None, help="where the .tar.xz goes (default: next to --out); put it in $OUT")
    ap.add_argument("--engine-cmd", default=None, help="rehearsal: run this instead of vLLM ({port} is filled in)")
    ap.add_argument(
        "--budget-s", type=float, default=0.0, help="wall seconds this session may use; what would not fit is skipped"
    )
    args = ap.parse_args(argv)
    names = [s for s in args.steps.split(",") if s]
    unknown = [s for s in names if s not in STEPS]
    if unknown:
        print(f"error: unknown steps {unknown}; known: {sorted(STEPS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s, time.monotonic())
    signal.signal(signal.SIGTERM, on_sigterm)
    records: list[dict[str, object]] = []
    for name in names:
        try:
            records.append(run_step(args, name, out, budget))
        except Interrupted as err:  # the time limit is near: no further steps, but the archive must be written
            log(f"step {name} interrupted: {err}")
            records.append({"step": name, "error": f"interrupted ({err})"})
            break
        except Exception as err:  # keep going: whatever ran must still reach the archive
            log(f"step {name} failed: {type(err).__name__}: {err}")
            records.append({"step": name, "error": f"{type(err).__name__}: {err}"})
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    summary = {"steps": records, "layouts": summarize_layouts(out)}
    (out / "session.json").write_text(json.dumps(summary, indent=2) + "\n")
    archive = Path(args.archive) if args.archive else out.parent / f"{out.name}.tar.xz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(out, arcname=out.name)
    log(f"wrote {archive} ({archive.stat().st_size} bytes)")
    print(json.dumps(summary["layouts"], indent=2))
    failed = any(
        "error" in r or "skipped" in r or any(v != 0 for k, v in r.items() if k.startswith("run:")) for r in records
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
