"""Rehearsals of the issue-28 GPU calls: dataplane.py with stand-ins for vLLM, everything else real.

The router is `vllm-operator router` with the planner's RouterConfig, each engine runs under `vllm-operator engine`,
the plans come from the real planner, and the oom step's re-plan goes through the health loop's diagnose/decide. Only
vLLM is replaced: by the fake vLLM for traffic, and by a stand-in that dies of a CUDA OOM for the oom step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from tests.support.loadgen import GPU_BENCH
from tests.support.net import free_port
from tests.support.paths import ROOT

TINY = ("--duration 1 --short-rate 4 --short-arrival fixed --short-output 4:8 --long-prompt 600 --long-output 8 "
        "--long-bursts 1 --long-burst-size 2 --long-first-burst 0.2 --warmup 0")


def plans(tmp: Path, *names: str) -> Path:
    out = tmp / "plans"
    out.mkdir(exist_ok=True)
    for name in names:
        done = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "plan", str(GPU_BENCH / "deployments" /
                                                                                  f"{name}.yaml"),
                               "-o", "json", "--engine-version", "0.26.0"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        (out / f"{name}.json").write_text(done.stdout)
    return out


def dataplane(tmp: Path, steps: str, engine: str, *more: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp / "out"
    cmd = [sys.executable, str(GPU_BENCH / "dataplane.py"), "--steps", steps, "--plans", str(tmp / "plans"),
           "--out", str(out), "--site", "", "--src", str(ROOT / "operator"), "--engine-cmd", engine,
           "--tokenizer-dir", str(tmp / "tok"), "--router-port", str(free_port()), "--long-port", str(free_port()),
           "--short-port", str(free_port()), "--oom-port", str(free_port()), "--start-timeout", "60",
           "--tokens-per-word", "1", "--archive", str(tmp / "back" / "call.tar.xz"), *more]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, cwd=ROOT), out


def tokenizer(tmp: Path) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_model.py"), "--shape", "tiny", "--out",
                    str(tmp / "tok")], check=True, capture_output=True)  # fmt: skip


def test_split_and_unified_through_the_router(tmp_path: Path) -> None:
    plans(tmp_path, "shared", "unified")
    tokenizer(tmp_path)
    engine = (f"{sys.executable} -m fakevllm --port {{port}} --model llama-3.1-8b "
              "--max-model-len 32768 --ttft-ms 2")
    done, out = dataplane(tmp_path, "split,unified", engine, "--loadgen-args", TINY)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = {r["step"]: r for r in json.loads((out / "dataplane.json").read_text())}
    for step, pools in (("split", ("long", "short")), ("unified", ("long",))):
        rec = records[step]
        assert rec["loadgen_rc"] == 0
        assert [f"startup_s:{p}" in rec for p in pools] == [True] * len(pools)
        verdicts = {v["name"]: v for v in rec["probe_verdicts"]}
        assert all(v["ok"] for v in verdicts.values()), verdicts
        assert verdicts["prompt-too-long"]["status"] == 400
        assert verdicts["bad-max-tokens"]["status"] == 400
        assert len(rec["pairs"]) == 30 and all(p["router"] > 0 and p["direct"] > 0 for p in rec["pairs"])
        summary = json.loads((out / step / "load" / "summary.json").read_text())
        assert (summary["short"]["ok"], summary["long"]["ok"]) == (4, 2)
    split = {v["name"]: v for v in records["split"]["probe_verdicts"]}
    assert split["omitted-max-tokens"]["got"].startswith("short max_tokens=1024 ")  # the tier default
    assert split["tier-clamp"]["expected"] == "long max_tokens=4096 clamps=['tier']"
    unified = {v["name"]: v for v in records["unified"]["probe_verdicts"]}
    assert unified["omitted-max-tokens"]["got"].startswith("long max_tokens=4096 ")  # short pool disabled
    router_cfg = json.loads((out / "split" / "router.json").read_text())
    assert router_cfg["pools"]["short"]["endpoints"] and router_cfg["pools"]["short"]["service"] is None
    argv = json.loads((out / "split" / "argv-engine-long.json").read_text())["argv"]
    assert argv[1:4] == ["-m", "vllm_operator.cli", "engine"]
    with tarfile.open(tmp_path / "back" / "call.tar.xz") as tar:
        assert "out/split/router-metrics-end.txt" in tar.getnames()


def test_oom_then_the_next_rung(tmp_path: Path) -> None:
    plans(tmp_path, "oom")
    tokenizer(tmp_path)
    engine = f"{sys.executable} -m tests.support.oom_engine {{port}} {tmp_path / 'started-once'}"
    done, out = dataplane(tmp_path, "oom", engine)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rec = json.loads((out / "dataplane.json").read_text())[0]
    assert rec["exit_code:planned"] == 87 and rec["ended_by_itself:planned"] is True
    term = json.loads(rec["termination:planned"])
    assert term["reason"] == "EngineOOM" and "CUDA out of memory" in term["detail"]
    decision = json.loads((out / "oom" / "decision.json").read_text())
    assert decision["diagnosis"]["state"] == "EngineOOM"
    assert decision["rungChanges"] == [{"pool": "long", "ladder": "memory", "from": 0, "to": 1,
                                        "rung": "gpu-memory-utilization 0.99->0.94"}]
    replanned = json.loads((out / "oom" / "plan-replanned.json").read_text())["pools"]["long"]
    assert "--gpu-memory-utilization=0.94" in replanned["engineArgs"] and replanned["stepDownLevel"] == 1
    assert [a["status"] for a in rec["answers:replanned"]] == [200, 200, 200]
    assert rec["ended_by_itself:replanned"] is False
