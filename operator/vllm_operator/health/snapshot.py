"""What the health loop looks at, as plain data: pod facts from the API, metric facts from Prometheus, with times.

`source.py` fills a `Snapshot` (the only I/O); `diagnose.py` and `policy.py` read it and nothing else. Keeping the
parsing of pod objects here, pure, lets the diagnosis tables in the unit tests start from real pod JSON. Every
metric fact carries when it was sampled, and the metrics part says when it was fetched or why it could not be, so
stale or missing data is visible to the code that must refuse to act on it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_operator import constants

ENGINE_CONTAINER = "engine"
FETCH_CONTAINER = constants.FETCH_CONTAINER


def parse_time(value: object) -> float | None:
    """RFC 3339 (as the API server writes it) -> epoch seconds; None for missing or unreadable values."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Termination:
    """One container termination as the kubelet recorded it, plus the wrapper's reason when it wrote one."""

    exit_code: int | None
    reason: str
    """The kubelet's reason: OOMKilled, Error, Completed, ..."""
    message: str
    finished_at: float | None
    restart_count: int
    """Which termination of the container this is (1 = the first); stable across the kubelet's restart."""
    wrapper_reason: str | None = None
    """EngineOOM, EngineDead, KVCacheTooSmall, ... from the termination message, else from the exit code."""
    detail: str = ""

    def key(self, pod_uid: str, container: str) -> str:
        return f"{pod_uid}/{container}/{self.restart_count}"


@dataclass(frozen=True)
class PodFacts:
    """An engine pod as the API server shows it."""

    name: str
    uid: str
    pool: str
    phase: str
    ready: bool
    created_at: float | None
    deleting: bool = False
    unschedulable: str | None = None
    """The scheduler's message when PodScheduled is False with reason Unschedulable."""
    container_name: str = ENGINE_CONTAINER
    started_at: float | None = None
    """When the engine container's current run started (None unless it is running)."""
    restart_count: int = 0
    waiting_reason: str | None = None
    """CrashLoopBackOff, ContainerCreating, ImagePullBackOff, ... while the container waits."""
    last_termination: Termination | None = None
    current_termination: Termination | None = None
    """Set while the container is in state terminated (before the kubelet restarts it)."""

    @property
    def terminations(self) -> tuple[Termination, ...]:
        return tuple(t for t in (self.current_termination, self.last_termination) if t is not None)


@dataclass(frozen=True)
class PodMetrics:
    """One engine pod's series in Prometheus; None means the series was absent."""

    pod: str
    pool: str
    up: bool | None = None
    last_sample_at: float | None = None
    """Timestamp of the newest sample of the engine's own series (not of `up`)."""
    running: float | None = None
    running_min: float | None = None
    """Lowest num_requests_running over the stall window."""
    generated: float | None = None
    """Increase of generation_tokens_total over the stall window."""
    samples: int | None = None
    """Samples of generation_tokens_total inside the stall window (two are needed for an increase)."""
    kv_usage: float | None = None
    kv_usage_avg: float | None = None
    """Mean kv_cache_usage_perc over the metric window."""
    preemptions: float | None = None
    """Increase of num_preemptions_total over the metric window."""
    kv_cache_tokens: int | None = None
    """kv_cache_size_tokens from vllm:cache_config_info."""
    startup_phase: str | None = None
    """The engine wrapper's start-up phase (`engine.phases.Phase` value), from its own series."""
    startup_sample_at: float | None = None
    """Sample time of the wrapper's series (staleness of the start-up facts)."""
    startup_since: float | None = None
    """When the current phase began; for Serving, when this vLLM process began to serve."""
    startup_last_progress: float | None = None
    startup_stalled: bool | None = None
    startup_limit_s: float | None = None
    startup_download_bytes: float | None = None
    startup_download_total_bytes: float | None = None
    startup_download_files: int | None = None
    startup_download_total_files: int | None = None
    startup_download_eta_s: float | None = None
    """As the wrapper estimated it at `startup_sample_at`."""
    startup_kv_tokens: int | None = None
    process_start: float | None = None
    """When the wrapper launched the current vLLM process."""
    adapters: tuple[tuple[str, bool], ...] | None = None
    """(adapter, loaded) per adapter the pod's adapters file lists, from its wrapper; None without LoRA."""
    unresponsive: bool | None = None
    """The wrapper's idle-engine probes keep failing (engine/idleprobe.py); None when the wrapper does not probe."""


@dataclass(frozen=True)
class PoolMetrics:
    """Per-pool request outcomes over the metric window."""

    finished: float | None = None
    finished_length: float | None = None


@dataclass(frozen=True)
class MetricsSnapshot:
    """What Prometheus said, and when; `error` set means it could not be asked (all values absent)."""

    fetched_at: float
    error: str | None = None
    pods: Mapping[str, PodMetrics] = field(default_factory=dict)
    pools: Mapping[str, PoolMetrics] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolFacts:
    """The pool's desired size and disruption allowance (from its Deployment and PodDisruptionBudget)."""

    name: str
    desired_replicas: int
    max_unavailable: int = 1


@dataclass(frozen=True)
class Snapshot:
    """Everything one health check knows about one VLLMDeployment."""

    namespace: str
    deployment: str
    taken_at: float
    pools: Mapping[str, PoolFacts]
    pods: tuple[PodFacts, ...]
    metrics: MetricsSnapshot | None
    """None when no Prometheus URL is configured."""

    def pods_of(self, pool: str) -> tuple[PodFacts, ...]:
        return tuple(p for p in self.pods if p.pool == pool)


def _termination(raw: Mapping[str, Any] | None, restart_count: int) -> Termination | None:
    if not isinstance(raw, Mapping):
        return None
    code = raw.get("exitCode")
    exit_code = int(code) if isinstance(code, int) else None
    message = str(raw.get("message") or "")
    wrapper_reason: str | None = None
    detail = ""
    first = message.strip().splitlines()[0] if message.strip() else ""
    if first.startswith("{"):
        try:
            parsed = json.loads(first)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("reason"), str):
            wrapper_reason = parsed["reason"]
            detail = str(parsed.get("detail") or "")
    if wrapper_reason is None and exit_code is not None:
        wrapper_reason = constants.EXIT_REASONS.get(exit_code)
    return Termination(exit_code=exit_code, reason=str(raw.get("reason") or ""), message=message,
                       finished_at=parse_time(raw.get("finishedAt")), restart_count=restart_count,
                       wrapper_reason=wrapper_reason, detail=detail)


def _unfinished_fetch(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The weights fetch init container's status while it has not finished (None once it exited 0, or without one).
    Its terminations carry the fetch's reasons (HubUnreachable, ModelAccessDenied, CacheDiskFull, FetchFailed,
    StartupStalled) in the termination message, as the engine wrapper's do."""
    inits = [c for c in status.get("initContainerStatuses", []) or [] if isinstance(c, Mapping)]
    fetch = next((c for c in inits if c.get("name") == FETCH_CONTAINER), None)
    if fetch is None:
        return None
    done = ((fetch.get("state", {}) or {}).get("terminated") or {})
    return None if isinstance(done, Mapping) and done.get("exitCode") == 0 else fetch


def pod_facts(pod: Mapping[str, Any], container: str = ENGINE_CONTAINER) -> PodFacts:
    """Read the facts the diagnosis needs off a Pod object (as the API returns it)."""
    meta = pod.get("metadata", {}) or {}
    status = pod.get("status", {}) or {}
    conditions = {c.get("type"): c for c in status.get("conditions", []) or [] if isinstance(c, Mapping)}
    ready = conditions.get("Ready", {}).get("status") == "True"
    scheduled = conditions.get("PodScheduled", {})
    unschedulable = None
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = str(scheduled.get("message") or "no node fits the pod")
    statuses = [c for c in status.get("containerStatuses", []) or [] if isinstance(c, Mapping)]
    chosen = next((c for c in statuses if c.get("name") == container), statuses[0] if statuses else None)
    fetching = _unfinished_fetch(status)
    if fetching is not None:  # the engine cannot start before the weights are in place: the fetch is the pod's state
        chosen = fetching
    facts: dict[str, Any] = {}
    if chosen is not None:
        restarts = int(chosen.get("restartCount") or 0)
        state = chosen.get("state", {}) or {}
        running = state.get("running")
        waiting = state.get("waiting")
        facts = {
            "container_name": str(chosen.get("name") or container),
            "restart_count": restarts,
            "started_at": parse_time(running.get("startedAt")) if isinstance(running, Mapping) else None,
            "waiting_reason": str(waiting.get("reason") or "Waiting") if isinstance(waiting, Mapping) else None,
            # Number terminations so one keeps its key when the kubelet restarts the container: while the
            # container is terminated its termination is number restartCount+1; after the restart it shows up in
            # lastState with restartCount already bumped to that number.
            "last_termination": _termination((chosen.get("lastState", {}) or {}).get("terminated"), restarts),
            "current_termination": _termination(state.get("terminated"), restarts + 1),
        }
    labels = meta.get("labels", {}) or {}
    return PodFacts(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        pool=str(labels.get(constants.LABEL_POOL, "")),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        created_at=parse_time(meta.get("creationTimestamp")),
        deleting=bool(meta.get("deletionTimestamp")),
        unschedulable=unschedulable,
        **facts,
    )
