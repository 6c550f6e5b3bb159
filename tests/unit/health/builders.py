"""Pod JSON and snapshots for the health tables: real Pod shapes, so `pod_facts` is exercised too."""

from __future__ import annotations

import json
from typing import Any

from vllm_operator import constants
from vllm_operator.health.snapshot import (
    MetricsSnapshot,
    PodMetrics,
    PoolFacts,
    PoolMetrics,
    Snapshot,
    format_time,
    pod_facts,
)

NOW = 1_800_000_000.0


def ts(ago: float) -> str:
    return format_time(NOW - ago)


def term(code: int, reason: str = "Error", *, ago: float = 30, wrapper: str | None = None,
         detail: str = "") -> dict[str, Any]:
    msg = json.dumps({"reason": wrapper, "exitCode": code, "detail": detail}) if wrapper else ""
    return {"exitCode": code, "reason": reason, "message": msg, "startedAt": ts(ago + 60), "finishedAt": ts(ago)}


OOM = term(constants.EXIT_ENGINE_OOM, wrapper=constants.REASON_ENGINE_OOM,
           detail="torch.OutOfMemoryError: CUDA out of memory")
KV = term(constants.EXIT_KV_CACHE_TOO_SMALL, wrapper=constants.REASON_KV_CACHE_TOO_SMALL,
          detail="2.0 GiB needed, 1.1 GiB left")
DEAD = term(constants.EXIT_ENGINE_DEAD, wrapper=constants.REASON_ENGINE_DEAD,
            detail="EngineCore encountered a fatal error")
FA3_LINE = ("(EngineCore pid=7071) RuntimeError: For FP16/BF16 input, output must have the same dtype as inputs. "
            "For FP8 input, output must have dtype BF16")
"""vLLM 0.26.0's error line on the H200 (benchmarks/gpu/results/matrix, cell awq72-fp8-nodtype)."""
STARTUP_FAILED = term(constants.EXIT_STARTUP_FAILED, wrapper=constants.REASON_STARTUP_FAILED, detail=FA3_LINE)
HOST_OOM = term(137, "OOMKilled")
ERROR = term(1)


def pod(name: str, pool: str = "short", *, ready: bool = True, started_ago: float | None = 3600,
        restarts: int = 0, waiting: str | None = None, last: dict[str, Any] | None = None,
        terminated: dict[str, Any] | None = None, unschedulable: bool = False, deleting: bool = False,
        phase: str | None = None) -> dict[str, Any]:
    state: dict[str, Any]
    if terminated is not None:
        state = {"terminated": terminated}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting}}
    elif started_ago is not None:
        state = {"running": {"startedAt": ts(started_ago)}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                       "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}", "namespace": "ns", "creationTimestamp": ts(7200),
                            "labels": {constants.LABEL_POOL: pool, constants.LABEL_DEPLOYMENT: "d"}}
    if deleting:
        meta["deletionTimestamp"] = ts(1)
    status: dict[str, Any] = {"phase": phase or ("Pending" if unschedulable else "Running"), "conditions": conditions}
    if not unschedulable:
        status["containerStatuses"] = [{"name": "engine", "ready": ready, "restartCount": restarts, "state": state,
                                        "lastState": {"terminated": last} if last else {}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def busy(pod_name: str, pool: str = "short", **over: Any) -> PodMetrics:
    """Fresh, healthy metrics: requests running and tokens flowing."""
    values: dict[str, Any] = {"up": True, "last_sample_at": NOW - 1, "running": 3.0, "running_min": 1.0,
                              "generated": 500.0, "samples": 10, "kv_usage": 0.3, "kv_usage_avg": 0.3,
                              "preemptions": 0.0, "kv_cache_tokens": 65536}
    values.update(over)
    return PodMetrics(pod=pod_name, pool=pool, **values)


def stalled(pod_name: str, pool: str = "short", **over: Any) -> PodMetrics:
    return busy(pod_name, pool, **{"generated": 0.0, "running": 2.0, "running_min": 2.0, **over})


def starting(pod_name: str, phase: str, pool: str = "short", *, since_ago: float = 30, progress_ago: float = 5,
             limit: float | None = 1200, flag: bool = False, **over: Any) -> PodMetrics:
    """A start in progress as its wrapper reports it: only the wrapper's series exist (vLLM serves no HTTP yet, so
    its target is down)."""
    values: dict[str, Any] = {"up": False, "startup_phase": phase, "startup_sample_at": NOW - 1,
                              "startup_since": NOW - since_ago, "startup_last_progress": NOW - progress_ago,
                              "startup_limit_s": limit, "startup_stalled": flag, "process_start": NOW - 600}
    values.update(over)
    return PodMetrics(pod=pod_name, pool=pool, **values)


def serving_since(ago: float) -> dict[str, Any]:
    """Wrapper facts of a vLLM process that began serving `ago` seconds ago (to merge into busy()/stalled())."""
    return {"startup_phase": "Serving", "startup_sample_at": NOW - 1, "startup_since": NOW - ago,
            "startup_last_progress": NOW - ago, "startup_stalled": False, "process_start": NOW - ago - 90}


def zombie(pod_name: str, pool: str = "short", **over: Any) -> PodMetrics:
    """An idle engine whose wrapper's one-token probes keep failing (engine/idleprobe.py): /health and /metrics
    answer, nothing runs, no token comes; the wrapper's series (fresh) say unresponsive."""
    values: dict[str, Any] = {"running": 0.0, "running_min": 0.0, "generated": 0.0, **serving_since(3000),
                              "unresponsive": True}
    values.update(over)
    return busy(pod_name, pool, **values)


def snapshot(pods: list[dict[str, Any]], metrics: dict[str, PodMetrics] | None = None, *,
             pools: dict[str, PoolMetrics] | None = None, error: str | None = None, prometheus: bool = True,
             replicas: dict[str, int] | None = None, max_unavailable: int = 1) -> Snapshot:
    facts = [pod_facts(p) for p in pods]
    wanted = replicas or {"short": sum(1 for f in facts if f.pool == "short") or 1}
    m = None
    if prometheus:
        m = MetricsSnapshot(fetched_at=NOW, error=error, pods=metrics or {}, pools=pools or {})
    return Snapshot(namespace="ns", deployment="d", taken_at=NOW,
                    pools={n: PoolFacts(n, r, max_unavailable) for n, r in wanted.items()},
                    pods=tuple(facts), metrics=m)


def fetch_term(reason: str, detail: str, *, ago: float = 30) -> dict[str, Any]:
    """A termination of the fetch-weights init container, as `vllm-operator fetch` writes it."""
    return term(constants.EXIT_CODES[reason], wrapper=reason, detail=detail, ago=ago)


def fetching(name: str, pool: str = "short", *, last: dict[str, Any] | None = None, waiting: str | None = None,
             terminated: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    """An engine pod whose fetch-weights init container has not finished (or just finished: `terminated` exit 0):
    the engine container waits in PodInitializing, as the kubelet shows it."""
    obj = pod(name, pool, ready=False, waiting="PodInitializing")
    state: dict[str, Any] = ({"terminated": terminated} if terminated is not None else
                             {"waiting": {"reason": waiting}} if waiting is not None else
                             {"running": {"startedAt": ts(10)}})
    obj["status"]["phase"] = "Pending"
    obj["status"]["initContainerStatuses"] = [
        {"name": constants.CACHE_OWNER_CONTAINER, "ready": True, "restartCount": 0,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": ts(100)}}},
        {"name": constants.FETCH_CONTAINER, "ready": False, "restartCount": restarts, "state": state,
         "lastState": {"terminated": last} if last else {}}]
    return obj
