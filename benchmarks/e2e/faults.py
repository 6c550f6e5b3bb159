"""Fault -> detection and fault -> serving-again times with real vLLM engines on the real control plane (issue 11).

Starts the e2e stack once (examples/cpu-dev.yaml: two vLLM CPU engines, the router, Prometheus, the operator with its
health loop, on kube-apiserver and two real nodes, kubelet + containerd: `tests/support/e2e_stack.py`), then
alternates the two faults of the e2e tier on the short pool's engine under light traffic through the router, waiting
for the system to be Ready between runs:

* kill: SIGKILL of the engine core -> /health 503 (detection by the probe target), router ejection, serving again
  (the first 200 answered by the short pool after the kill);
* stall: SIGSTOP of the engine core while requests run -> pod deleted by the health loop (detection and action),
  serving again (first 200 from the short pool's replacement).

    .venv/bin/python benchmarks/e2e/faults.py [--runs 3] [--json benchmarks/e2e/faults.json]

Medians are printed as a Markdown table. Measurements, not assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import vllm_cpu
from tests.support.e2e_stack import (
    PodContainer,
    Stack,
    Traffic,
    counter,
    engine_core_pid,
    engine_url,
    kill_engine_core,
    metrics_text,
    running_stack,
)


def kill_run(stack: Stack, pool: str) -> dict[str, float]:
    container = stack.engine(pool)
    restarts = container.restart_count
    with Traffic(stack) as traffic:
        stack.wait(lambda: traffic.first(0, pool), 60, what="traffic on the pool")
        kill = kill_engine_core(stack, pool)
        t0, t_503, t_eject = kill.killed, kill.unhealthy, kill.ejected
        stack.wait(lambda: container.restart_count > restarts, 60, interval=0.1)
        t_exit = time.monotonic()
        serving = stack.wait(lambda: traffic.first(t0, pool), 400, interval=0.2)
    return {"health_503_s": t_503 - t0, "router_ejected_s": t_eject - t0, "process_exited_s": t_exit - t0,
            **phases_after(container, t0), "serving_again_s": serving - t0}


def phases_after(container: PodContainer, t0: float) -> dict[str, float]:
    """When the kubelet started the (re)started container and when its pod went Ready, from the status it wrote
    (RFC 3339 times to the second, turned to the monotonic clock of t0): what of 'serving again' is vLLM's start,
    what the rest."""
    offset = time.time() - time.monotonic()
    out: dict[str, float] = {}
    started = ((container.status().get("state") or {}).get("running") or {}).get("startedAt")
    ready = next((c.get("lastTransitionTime") for c in container.obj()["status"].get("conditions") or []
                  if c["type"] == "Ready" and c["status"] == "True"), None)
    for stamp, key in ((started, "container_started_s"), (ready, "container_ready_s")):
        if stamp:
            at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - offset
            if at >= t0 - 1:
                out[key] = max(0.0, at - t0)
    return out


def stall_run(stack: Stack, pool: str) -> dict[str, float]:
    pod = stack.engine(pool).pod
    with Traffic(stack, max_tokens=120, threads=2, timeout=30) as traffic:
        stack.wait(lambda: counter(metrics_text(engine_url(stack, pool)), "vllm:num_requests_running") > 0, 60,
                   interval=0.1)
        core = engine_core_pid(stack, pool)
        t0 = time.monotonic()
        os.kill(core, signal.SIGSTOP)
        try:
            stack.wait(lambda: pod not in {p["metadata"]["name"] for p in stack.pods(pool)}, 180, interval=0.25)
            t_deleted = time.monotonic()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)
        serving = stack.wait(lambda: traffic.first(t_deleted, pool), 400, interval=0.2)
    return {"pod_deleted_s": t_deleted - t0, **phases_after(stack.engine(pool), t0), "serving_again_s": serving - t0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pool", default="short")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {"kill": [], "stall": []}
    with tempfile.TemporaryDirectory(prefix="e2e-faults-") as tmp:  # the stack pins the engine image's files
        model = vllm_cpu.make_model("tiny", Path(tmp) / "models" / "tiny-llama")
        with running_stack(Path(tmp) / "stack", model) as stack:
            for i in range(args.runs):
                for fault, run in (("kill", kill_run), ("stall", stall_run)):
                    stack.wait_ready()
                    load = os.getloadavg()[0]
                    row = run(stack, args.pool)
                    row["load_avg_1m"] = load
                    results[fault].append(row)
                    print(f"run {i + 1} {fault}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    table: list[str] = ["| fault | measure | median s | runs (s) |", "|---|---|---:|---|"]
    for fault, rows in results.items():
        for key in (k for k in rows[0] if k != "load_avg_1m"):
            values = [r[key] for r in rows]
            table.append(f"| {fault} | {key} | {statistics.median(values):.1f} | "
                         f"{', '.join(f'{v:.1f}' for v in values)} |")
    print("\n".join(table))
    if args.json is not None:
        summary: dict[str, Any] = {"runs": results, "loadavg_end": os.getloadavg()}
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
