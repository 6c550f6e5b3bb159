"""Fault -> detection and fault -> serving-again times with real vLLM engines on the real control plane (issue 11).

Starts the e2e stack once (examples/cpu-dev.yaml: two vLLM CPU engines, the router, Prometheus, the operator with its
health loop, on kube-apiserver and two real nodes, kubelet + containerd: `tests/support/e2e_stack.py`), then
alternates the two faults of the e2e tier on the short pool's engine under light traffic through the router, waiting
for the system to be Ready between runs:

* kill: SIGKILL of the engine core -> /health 503 (detection by the probe target), router ejection, serving again
  (the first 200 answered by the short pool after the kill);
* stall: SIGSTOP of the engine core while requests run -> pod deleted by the health loop (detection and action),
  serving again (first 200 from the short pool's replacement);
* oom: the engine container taken past its memory limit (tests/support/e2e_stack.exceed_memory_limit) -> the
  kernel's OOM kill of a vLLM process, the container reported OOMKilled, the health loop's step down (oomCount 1 in
  the benchmark's variant of cpu-dev.yaml), the next rung's pod Ready, the first 200 from the pool after it. A pool
  at a rung already is reset (`spec.remediation.resetToken`) and the system Ready again before the next OOM. A
  pool on a rung rolls without a surge pod (the OOMKilled pod goes first: rendering/engine.py), so the next rung's
  pod fits on the stack's two 2-CPU nodes wherever the router (rolled with the rung) lands.

Where the time of a restart goes is read off the containers' logs (`kubectl logs --timestamps`: the runtime's time
of each line): the old container's last line (the wrapper exiting), the new container's first line (the wrapper
started), vLLM's first line, the wrapper's start-up phases, and "Application startup complete"; beside them the
kubelet's own times (container started, pod Ready) from its status.

    flock /tmp/vllm-e2e.lock .venv/bin/python benchmarks/e2e/faults.py [--runs 3] [--faults kill,stall,oom]
        [--baseline-env NAME=VALUE [--baseline-faults kill]] [--shared-cores] [--json benchmarks/e2e/faults.json]

Each node's pods run on a core of their own (`testcluster.node.cpus_of`); `--shared-cores` runs the stack as it ran
before 2026-12-06, every pod on every core, for the baseline.

Medians are printed as a Markdown table. Measurements, not assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import re
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
    EXAMPLE,
    NAME,
    NS,
    PodContainer,
    Stack,
    Termination,
    Traffic,
    cond,
    counter,
    engine_core_pid,
    engine_url,
    exceed_memory_limit,
    kill_engine_core,
    metrics_text,
    running_stack,
)
from vllm_operator.k8s import VLLM_DEPLOYMENTS

MILESTONES = (
    ("wrapper_started_s", re.compile(r"vllm-operator engine: INFO Starting ")),
    ("vllm_first_line_s", re.compile(r"^(?!vllm-operator engine:)\S")),
    ("engine_core_first_line_s", re.compile(r"EngineCore")),
    ("phase_loading_weights_s", re.compile(r"Entered start-up phase LoadingWeights")),
    ("phase_kv_cache_allocated_s", re.compile(r"Entered start-up phase KVCacheAllocated")),
    ("startup_complete_s", re.compile(r"Application startup complete")),
)
"""Lines of a (re)started engine container's log whose first occurrence marks a step of vLLM's start."""
STAMP = re.compile(r"^(\S+) (.*)$")


def kill_run(stack: Stack, pool: str) -> dict[str, float]:
    container = stack.engine(pool)
    restarts = container.restart_count
    with Traffic(stack) as traffic:
        stack.wait(lambda: traffic.first(0, pool), 60, what="traffic on the pool")
        kill = kill_engine_core(stack, pool)
        t0, t_503, t_eject = kill.killed, kill.unhealthy, kill.ejected
        wall0 = time.time() - (time.monotonic() - t0)
        stack.wait(lambda: container.restart_count > restarts, 60, interval=0.1)
        t_exit = time.monotonic()
        serving = stack.wait(lambda: traffic.first(t0, pool), 400, interval=0.2)
    return {"health_503_s": t_503 - t0, "router_ejected_s": t_eject - t0, "process_exited_s": t_exit - t0,
            **phases_after(container, t0), **log_milestones(container, wall0, restarted=True),
            "serving_again_s": serving - t0}


def log_milestones(container: PodContainer, wall0: float, *, restarted: bool) -> dict[str, float]:
    """Seconds from `wall0` (the fault, wall clock) to the lines of `MILESTONES` in the container's current log,
    and, for a container restarted in place (`restarted`), to the previous container's last line (its wrapper's
    exit message)."""
    out: dict[str, float] = {}
    logs = [("", container.log(tail=-1, timestamps=True))]
    if restarted:
        logs.insert(0, ("previous", container.log(tail=50, previous=True, timestamps=True)))
    for which, text in logs:
        lines = [(at, line) for at, line in (_stamped(raw) for raw in text.splitlines()) if at is not None]
        if which == "previous":
            if lines:
                out["old_container_last_line_s"] = lines[-1][0] - wall0
            continue
        for key, pattern in MILESTONES:
            at = next((t for t, line in lines if pattern.search(line)), None)
            if at is not None:
                out[key] = at - wall0
    return out


def _stamped(raw: str) -> tuple[float | None, str]:
    m = STAMP.match(raw)
    if not m:
        return None, raw
    try:
        stamp = m.group(1).replace("Z", "+00:00")
        head, _, frac = stamp.partition(".")
        if frac:  # Python before 3.11 parses at most 6 digits of a fraction
            digits, _, zone = frac.partition("+")
            stamp = f"{head}.{digits[:6]}+{zone}"
        return datetime.datetime.fromisoformat(stamp).timestamp(), m.group(2)
    except ValueError:
        return None, raw


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
        wall0 = time.time() - (time.monotonic() - t0)
        serving = stack.wait(lambda: traffic.first(t_deleted, pool), 400, interval=0.2)
    new = stack.engine(pool)
    return {"pod_deleted_s": t_deleted - t0, **phases_after(new, t0), **log_milestones(new, wall0, restarted=False),
            "serving_again_s": serving - t0}


def oom_run(stack: Stack, pool: str) -> dict[str, float]:
    """The engine container past its memory limit -> the next rung serving (see the module docstring)."""
    level = rung(stack, pool)
    container = stack.engine(pool)
    pod = container.pod
    with Traffic(stack) as traffic, Termination(container, "OOMKilled") as termination:
        stack.wait(lambda: traffic.first(0, pool), 60, what="traffic on the pool")
        oom = exceed_memory_limit(stack, pool)
        t0 = oom.killed
        wall0 = time.time() - (time.monotonic() - t0)
        stack.wait(lambda: termination.found, 60, interval=0.05, what="OOMKilled reported")
        t_reported = time.monotonic()
        stack.wait(lambda: rung(stack, pool) > level, 120, interval=0.2, what="the pool stepped down")
        t_stepped = time.monotonic()

        def next_rung_ready() -> float | None:
            pods = stack.pods(pool, terminating=True)
            if len(pods) != 1 or pods[0]["metadata"]["name"] == pod:
                return None
            return time.monotonic() if cond(pods[0], "Ready").get("status") == "True" else None

        ready = stack.wait(next_rung_ready, 600, interval=0.2, what="the next rung's pod Ready, the old one gone")
        first = traffic.first(t0, pool)
    # The rung is in the router's pool table too: the router pod is replaced with it (a new address), so the
    # system Ready, then traffic through the router of now.
    stack.wait_ready()
    with Traffic(stack) as after:
        serving = stack.wait(lambda: after.first(0, pool), 120, interval=0.2, what="the next rung serving")
    new = stack.engine(pool)
    return {"allocation_to_kill_s": t0 - oom.started, "oomkilled_reported_s": t_reported - t0,
            "stepped_down_s": t_stepped - t0, **phases_after(new, t0), **log_milestones(new, wall0, restarted=False),
            "next_rung_ready_s": ready - t0, "next_rung_serving_s": serving - t0,
            **({"pool_served_meanwhile_s": first - t0} if first is not None else {})}


def rung(stack: Stack, pool: str) -> int:
    entry = (stack.obj().get("status", {}).get("pools", {}) or {}).get(pool) or {}
    return int((entry.get("stepDown") or {}).get("level", 0))


def reset_rungs(stack: Stack, token: str) -> None:
    """Back to the plan as specified (a new resetToken), and the system Ready at it."""
    stack.call(lambda k: k.patch(VLLM_DEPLOYMENTS, NS, NAME, {"spec": {"remediation": {"resetToken": token}}}))
    stack.wait(lambda: all(rung(stack, p) == 0 for p in ("short", "long")), 120, interval=0.5,
               what="the rungs reset")
    stack.wait_ready()


def set_pool_env(stack: Stack, assignment: str) -> None:
    """`NAME=VALUE` added to every pool's env, and the system Ready with every engine pod carrying it."""
    name, _, value = assignment.partition("=")
    spec = stack.obj()["spec"]
    pools = {pool: {"env": [*[e for e in entry.get("env") or [] if e["name"] != name],
                            {"name": name, "value": value}]}
             for pool, entry in spec["pools"].items()}
    stack.call(lambda k: k.patch(VLLM_DEPLOYMENTS, NS, NAME, {"spec": {"pools": pools}}))

    def rolled() -> bool:
        pods = stack.pods(terminating=True)
        return bool(pods) and all(
            {"name": name, "value": value} in next(c for c in p["spec"]["containers"] if c["name"] == "engine")["env"]
            for p in pods)

    stack.wait(rolled, 900, interval=1.0, what=f"every engine pod with {assignment}")
    stack.wait_ready()


def benchmark_example() -> dict[str, Any]:
    """cpu-dev.yaml with oomCount 1: one OOM steps a pool down (the tier's default of 2 would take two)."""
    example: dict[str, Any] = copy.deepcopy(EXAMPLE)
    example["spec"]["remediation"]["thresholds"]["oomCount"] = 1
    return example


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pool", default="short")
    parser.add_argument("--faults", default="kill,stall,oom",
                        help="comma-separated, run in this order in each round (default kill,stall,oom)")
    parser.add_argument("--baseline-env", default=None, metavar="NAME=VALUE",
                        help="after the rounds, set this variable in every pool's env (a roll-out) and run the "
                             "--baseline-faults again as many rounds: a same-stack comparison, e.g. "
                             "VLLM_OPERATOR_CPU_BIND=0 for vLLM's own CPU binding")
    parser.add_argument("--baseline-faults", default="kill")
    parser.add_argument("--shared-cores", action="store_true",
                        help="every node's pods on every CPU of the machine, as the stack ran before 2026-12-06 "
                             "(the baseline of the nodes' own cores)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    runs = {"kill": kill_run, "stall": stall_run, "oom": oom_run}
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    baseline = [f.strip() for f in args.baseline_faults.split(",") if f.strip()] if args.baseline_env else []
    if args.baseline_env is not None and "=" not in args.baseline_env:
        parser.error(f"--baseline-env: NAME=VALUE, got {args.baseline_env!r}")
    unknown = [f for f in [*faults, *baseline] if f not in runs]
    if unknown:
        parser.error(f"--faults: unknown {unknown}; choose from {sorted(runs)}")
    results: dict[str, list[dict[str, float]]] = {f: [] for f in faults}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="e2e-faults-") as tmp:  # the stack pins the engine image's files
        model = vllm_cpu.make_model("tiny", Path(tmp) / "models" / "tiny-llama")
        with running_stack(Path(tmp) / "stack", model, benchmark_example(), own_cores=not args.shared_cores) as stack:
            print(f"stack Ready after {time.monotonic() - started:.1f} s", flush=True)
            for i in range(args.runs):
                for fault in faults:
                    if fault == "oom" and rung(stack, args.pool) > 0:
                        reset_rungs(stack, f"faults-{i}")
                    stack.wait_ready()
                    load = os.getloadavg()[0]
                    row = runs[fault](stack, args.pool)
                    row["load_avg_1m"] = load
                    results[fault].append(row)
                    print(f"run {i + 1} {fault}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
                    if args.json is not None:  # what was measured survives a later failure
                        write(args.json, results)
            if baseline:
                set_pool_env(stack, str(args.baseline_env))
                for i in range(args.runs):
                    for fault in baseline:
                        stack.wait_ready()
                        load = os.getloadavg()[0]
                        row = runs[fault](stack, args.pool)
                        row["load_avg_1m"] = load
                        results.setdefault(f"{fault} ({args.baseline_env})", []).append(row)
                        print(f"baseline run {i + 1} {fault}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()),
                              flush=True)
                        if args.json is not None:
                            write(args.json, results)
    table: list[str] = ["| fault | measure | median s | runs (s) |", "|---|---|---:|---|"]
    for fault, rows in results.items():
        keys = list(dict.fromkeys(k for r in rows for k in r if k != "load_avg_1m"))
        for key in keys:
            values = [r[key] for r in rows if key in r]
            table.append(f"| {fault} | {key} | {statistics.median(values):.1f} | "
                         f"{', '.join(f'{v:.1f}' for v in values)} |")
    print("\n".join(table))
    if args.json is not None:
        write(args.json, results)
    return 0


def write(path: Path, results: dict[str, list[dict[str, float]]]) -> None:
    summary: dict[str, Any] = {"runs": results, "loadavg_end": os.getloadavg()}
    path.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
