"""Diagnose, then act: the pure half that names what is wrong with each engine pod and each pool.

`diagnose(snapshot, settings)` reads a `Snapshot` (pods from the API, series from Prometheus, with times) and
returns a `Diagnosis`; it decides nothing. Each `State` documents the evidence it stands for, so an event that says
"Stalled" can be traced to numbers. Causes win over symptoms: a pod in CrashLoopBackOff because vLLM ran out of GPU
memory is EngineOOM, not CrashLooping, because the cause picks the remedy (the step-down ladder, not restarts).
Metric-based states are only ever derived from fresh samples; when Prometheus is not configured, unreachable or
stale, the pod or pool is MetricsUnavailable and nothing downstream may act destructively on it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_operator import constants
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.constants import STARTUP_PHASES as PHASES
from vllm_operator.constants import StartupPhase as Phase
from vllm_operator.engine.phases import human_bytes, human_seconds
from vllm_operator.health.snapshot import PodFacts, PodMetrics, Snapshot, Termination


class State(enum.StrEnum):
    """What a pod or pool is in. See `DESCRIPTIONS` for the evidence behind each."""

    HEALTHY = "Healthy"
    STARTING = "Starting"
    ENGINE_OOM = "EngineOOM"
    HOST_OOM_KILLED = "HostOOMKilled"
    KV_CACHE_TOO_SMALL = "KVCacheTooSmall"
    CRASH_LOOPING = "CrashLooping"
    ENGINE_DEAD = "EngineDead"
    STARTUP_STALLED = "StartupStalled"
    STARTUP_FAILED = "StartupFailed"
    STALLED = "Stalled"
    ENGINE_UNRESPONSIVE = constants.REASON_ENGINE_UNRESPONSIVE
    RUNAWAY_GENERATION = "RunawayGeneration"
    KV_PRESSURE = "KVPressure"
    UNSCHEDULABLE = "Unschedulable"
    HUB_UNREACHABLE = "HubUnreachable"
    MODEL_ACCESS_DENIED = "ModelAccessDenied"
    CACHE_DISK_FULL = "CacheDiskFull"
    FETCH_FAILED = "FetchFailed"
    WEIGHTS_GONE = constants.REASON_WEIGHTS_GONE
    METRICS_UNAVAILABLE = "MetricsUnavailable"

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self]


DESCRIPTIONS: Mapping[State, str] = {
    State.HEALTHY: "Ready, running, and (where metrics are on) producing tokens whenever requests run.",
    State.STARTING: "Created, pulling, loading the model or being replaced; no failure seen yet. Not available. "
                    "Where the wrapper's metrics are scraped, the message names the start-up phase, since when and "
                    "its progress (a slow start that moves stays Starting however long it takes).",
    State.ENGINE_OOM: "The engine ran out of accelerator memory: the wrapper's exit code 87 / termination reason "
                      "EngineOOM (\"CUDA out of memory\", OutOfMemoryError) within the OOM window. Remedy: the "
                      "step-down ladder after repeated OOM, not restarts (the kubelet restarts the container).",
    State.HOST_OOM_KILLED: "The kernel killed the container for exceeding its memory limit (kubelet reason "
                           "OOMKilled, exit 137): host RAM, not GPU memory. Raise the pod's memory limit.",
    State.KV_CACHE_TOO_SMALL: "vLLM refused to start because one max_model_len sequence needs more KV cache than "
                              "the memory left (exit code 89). Remedy: FP8 KV where allowed, then the opt-in lower "
                              "maxModelLen — never less KV memory.",
    State.CRASH_LOOPING: "The container keeps exiting for another reason (CrashLoopBackOff, or a non-zero exit "
                         "the wrapper did not classify); the kubelet already restarts it.",
    State.ENGINE_DEAD: "The engine core died (\"EngineCore encountered a fatal error\" or an unexpected exit 0, "
                       "exit codes 88/86). The kubelet restarts the container; the loop records it.",
    State.STARTUP_STALLED: "The start stopped advancing: one start-up phase went its limit without a new phase, a "
                           "progress line or a downloaded byte (fresh wrapper metrics say so, or the wrapper "
                           "stopped vLLM with exit code 83). The wrapper already stops it and the kubelet restarts "
                           "it; the loop reports the phase. Not a slow start, not an OOM.",
    State.STARTUP_FAILED: "vLLM exited with an error before it ever served, and the error is not out of memory and "
                          "not a KV cache too small (the wrapper's exit code 82 / termination reason "
                          "StartupFailed, its detail vLLM's error line — e.g. FlashAttention 3's \"For FP8 input, "
                          "output must have dtype BF16\"): this model, these arguments and this GPU do not run "
                          "together. Smaller memory settings cannot help, so nothing is stepped down and the "
                          "operator deletes nothing; the kubelet's restarts (with its back-off) are the only ones. "
                          "The pool's status and an event carry the error line; the fix is in the spec or the "
                          "planner's tables.",
    State.STALLED: "Ready and answering /health, with requests running for the whole stall window and zero new "
                   "generation tokens, from fresh samples; the window is counted from when the current vLLM "
                   "process began serving (its wrapper's metrics), not from the container's start. Nothing else "
                   "catches this: the operator deletes the pod (within the restart budget and the disruption "
                   f"floor), with a {constants.STALLED_POD_GRACE_S} s grace period instead of the pod's 30 s "
                   "(`STALLED_POD_GRACE_S`: a stalled engine cannot drain, and its GPU or cores go to the "
                   "replacement only once it is killed).",
    State.ENGINE_UNRESPONSIVE: "Ready and answering /health, but the engine wrapper's one-token probes of the idle "
                               "engine failed several times in a row (`vllm_operator_engine_unresponsive` 1, fresh "
                               "from the wrapper's scrape; engine/idleprobe.py): the engine core hangs without "
                               "dying — a zombie, which vLLM's /health cannot see and the Stalled rule, which needs "
                               "requests running, cannot either. The wrapper probes only while nothing runs or "
                               "waits, so a request that legitimately runs long is never mistaken for it. The "
                               "operator deletes the pod like a Stalled one: within the restart budget and the "
                               f"disruption floor, with the {constants.STALLED_POD_GRACE_S} s grace period.",
    State.RUNAWAY_GENERATION: "The share of finished requests that stopped at max_tokens (finished_reason=length) "
                              "over the window is above the alert level (default 20 %). Condition and event only.",
    State.KV_PRESSURE: "Mean KV cache usage over the window is at or above the pressure level (default 95 %); "
                       "preemptions likely. Condition and event only.",
    State.UNSCHEDULABLE: "The scheduler cannot place the pod (PodScheduled=False, reason Unschedulable).",
    State.HUB_UNREACHABLE: "The pod's fetch-weights init container got no answer from the Hugging Face Hub "
                           "(connection refused, DNS, timeout, HTTP 5xx; exit code 78). The kubelet retries it "
                           "with back-off; staged bytes are kept and resumed. Nothing is stepped down or deleted.",
    State.MODEL_ACCESS_DENIED: "The Hub refused the pod's own token for the model (gated without access, private, "
                               "unknown repository or revision, HTTP 401/403; exit code 79) — also what a pod gets "
                               "whose token may not read a model another namespace's pod cached. Fix the token "
                               "Secret or the repository/revision; retries cannot help.",
    State.CACHE_DISK_FULL: "The weights cache cannot hold the model (exit code 80): its limit or its file system is "
                           "full with entries in use (the message names them). The partial fetch was removed; "
                           "raise the cache's size or free the disk.",
    State.FETCH_FAILED: "The weights fetch failed otherwise (a file still corrupt after a second fetch, an "
                        "unexpected error; exit code 81). No half-written model is served: only complete, "
                        "verified entries are linked.",
    State.WEIGHTS_GONE: "The engine container found its weights cache entry gone (exit code 90): evicted or "
                        "deleted while no engine of the pod ran for longer than the lease grace. Restarts cannot "
                        "fetch it again (the fetch is an init container, run when a pod is created), so the "
                        "operator deletes the pod — on the termination's evidence, within the restart budget and "
                        "the disruption floor — and its replacement fetches the model.",
    State.METRICS_UNAVAILABLE: "No fresh samples for the pod or pool: Prometheus not configured, unreachable, the "
                               "scrape target down, or samples older than the staleness limit. No destructive "
                               "action is taken on a pod in this state.",
}

SEVERITY: tuple[State, ...] = (
    State.ENGINE_OOM,
    State.KV_CACHE_TOO_SMALL,
    State.HOST_OOM_KILLED,
    State.STARTUP_FAILED,
    State.ENGINE_DEAD,
    State.STARTUP_STALLED,
    State.STALLED,
    State.ENGINE_UNRESPONSIVE,
    State.WEIGHTS_GONE,
    State.MODEL_ACCESS_DENIED,
    State.CACHE_DISK_FULL,
    State.FETCH_FAILED,
    State.HUB_UNREACHABLE,
    State.CRASH_LOOPING,
    State.UNSCHEDULABLE,
    State.RUNAWAY_GENERATION,
    State.KV_PRESSURE,
    State.METRICS_UNAVAILABLE,
    State.STARTING,
    State.HEALTHY,
)
"""Most severe first: a pool's primary state is the first of these present."""

FAILURE_STATES = frozenset({State.ENGINE_OOM, State.KV_CACHE_TOO_SMALL, State.HOST_OOM_KILLED, State.ENGINE_DEAD,
                            State.STARTUP_STALLED, State.STARTUP_FAILED, State.STALLED, State.ENGINE_UNRESPONSIVE,
                            State.CRASH_LOOPING, State.UNSCHEDULABLE, State.HUB_UNREACHABLE, State.MODEL_ACCESS_DENIED,
                            State.CACHE_DISK_FULL, State.FETCH_FAILED, State.WEIGHTS_GONE})
REPLACED_STATES = frozenset({State.STALLED, State.ENGINE_UNRESPONSIVE, State.WEIGHTS_GONE})
"""Pods that nothing else restarts (serving ones), or whose restarts cannot help: the operator deletes them
(policy.py), within the restart budget."""
REPLACED_ON_TERMINATION = frozenset({State.WEIGHTS_GONE})
"""Of those, the ones whose evidence is the kubelet's termination message, not metrics: replaced without fresh
samples."""
FETCH_STATES: Mapping[str, State] = {constants.REASON_HUB_UNREACHABLE: State.HUB_UNREACHABLE,
                                     constants.REASON_MODEL_ACCESS_DENIED: State.MODEL_ACCESS_DENIED,
                                     constants.REASON_CACHE_DISK_FULL: State.CACHE_DISK_FULL,
                                     constants.REASON_FETCH_FAILED: State.FETCH_FAILED}
"""The weights fetch's termination reasons (engine/fetch.py)."""


@dataclass(frozen=True)
class TerminationEvent:
    """A container termination, classified; `key` identifies it across checks (pod uid/container/number)."""

    key: str
    pod: str
    state: State
    exit_code: int | None
    finished_at: float | None
    detail: str


@dataclass(frozen=True)
class DownloadView:
    """A download in progress, from fresh wrapper samples; files and the ETA only where the fetch counts them
    (the weights cache's fetch-weights container), not for a download vLLM makes itself."""

    bytes_done: int
    bytes_total: int | None = None
    files_done: int | None = None
    files_total: int | None = None
    eta_s: float | None = None
    """Seconds left as of the check: the wrapper's estimate less the time since it was sampled."""


@dataclass(frozen=True)
class StartupView:
    """Where one pod's start is, from fresh wrapper samples."""

    phase: str
    since: float | None
    progress: str
    stalled: bool
    download: DownloadView | None = None
    """Set in phase Downloading."""

    @property
    def rank(self) -> int:
        """Position in the usual phase order (unknown names first): the pool reports its least advanced start."""
        names = [p.value for p in PHASES]
        return names.index(self.phase) if self.phase in names else -1


@dataclass(frozen=True)
class PodDiagnosis:
    pod: str
    uid: str
    pool: str
    state: State
    message: str
    available: bool
    """Counts toward the disruption floor: Ready, not being deleted, and not Stalled or EngineUnresponsive."""
    metrics_fresh: bool
    terminations: tuple[TerminationEvent, ...] = ()
    deleting: bool = False
    startup: StartupView | None = None


@dataclass(frozen=True)
class PoolDiagnosis:
    pool: str
    state: State
    """The most severe state present (see SEVERITY)."""
    states: frozenset[State]
    message: str
    pods: tuple[PodDiagnosis, ...]
    desired_replicas: int
    max_unavailable: int
    metrics_fresh: bool
    """True when the pool's metric states rest on fresh samples of every Ready pod."""
    length_share: float | None = None
    finished: float | None = None
    length_watch: bool = False
    """Length share above the watch level (default 5 %) but not the alert level."""
    kv_usage: float | None = None
    """Highest per-pod mean KV usage over the window."""
    preemptions: float | None = None
    observed_kv_tokens: int | None = None
    terminations: tuple[TerminationEvent, ...] = ()
    startup: StartupView | None = None
    """The least advanced start among the pool's pods (Serving when all serve); None without wrapper metrics."""
    startup_pod: str | None = None
    adapters: tuple[tuple[str, int], ...] | None = None
    """(adapter, pods that loaded it) over the pool's fresh pods; None when no pod reports adapters."""

    @property
    def available(self) -> int:
        return sum(1 for p in self.pods if p.available)


@dataclass(frozen=True)
class Diagnosis:
    taken_at: float
    pools: Mapping[str, PoolDiagnosis]
    metrics_available: bool
    metrics_reason: str
    """PrometheusNotConfigured, PrometheusUnreachable, TargetsDown, Stale, or Scraped."""
    metrics_message: str
    notes: tuple[str, ...] = field(default=())


def classify(term: Termination) -> State | None:
    """The state a termination stands for; None for a clean or unclassified exit."""
    if term.wrapper_reason == constants.REASON_KV_CACHE_TOO_SMALL:
        return State.KV_CACHE_TOO_SMALL
    if term.wrapper_reason == constants.REASON_ENGINE_OOM:
        return State.ENGINE_OOM
    if term.reason == "OOMKilled":
        return State.HOST_OOM_KILLED
    if term.wrapper_reason in {constants.REASON_ENGINE_DEAD, constants.REASON_UNEXPECTED_EXIT}:
        return State.ENGINE_DEAD
    if term.wrapper_reason == constants.REASON_STARTUP_STALLED:
        return State.STARTUP_STALLED
    if term.wrapper_reason == constants.REASON_STARTUP_FAILED:
        return State.STARTUP_FAILED
    if term.wrapper_reason == constants.REASON_WEIGHTS_GONE:
        return State.WEIGHTS_GONE
    if term.wrapper_reason is not None and term.wrapper_reason in FETCH_STATES:
        return FETCH_STATES[term.wrapper_reason]
    if term.exit_code not in (None, 0):
        return State.CRASH_LOOPING
    return None


def _describe_termination(term: Termination, state: State) -> str:
    parts = [f"exit code {term.exit_code}" if term.exit_code is not None else "no exit code"]
    if term.reason:
        parts.append(f"reason {term.reason}")
    lines = term.message.strip().splitlines()
    text = term.detail or (lines[0] if lines else "")
    if text:  # a start-up failure's error line is the whole diagnosis: keep more of it
        parts.append(text[:600] if state is State.STARTUP_FAILED else text[:200])
    return f"{state.value}: " + ", ".join(parts)


def _recent_terminations(pod: PodFacts, now: float, horizon_s: float) -> tuple[TerminationEvent, ...]:
    events = []
    for term in pod.terminations:
        state = classify(term)
        if state is None:
            continue
        if term.finished_at is not None and now - term.finished_at > horizon_s:
            continue
        events.append(TerminationEvent(key=term.key(pod.uid, pod.container_name), pod=pod.name, state=state,
                                       exit_code=term.exit_code, finished_at=term.finished_at,
                                       detail=_describe_termination(term, state)))
    return tuple(events)


def _fresh(m: PodMetrics | None, now: float, settings: HealthSettings) -> bool:
    return (m is not None and m.up is True and m.last_sample_at is not None
            and now - m.last_sample_at <= settings.stale_after_s)


def _startup(m: PodMetrics | None, now: float, settings: HealthSettings) -> StartupView | None:
    """The pod's start-up facts when its wrapper's samples are fresh; a phase past its limit counts as stalled
    even before the wrapper's own flag is scraped."""
    if (m is None or m.startup_phase is None or m.startup_sample_at is None
            or now - m.startup_sample_at > settings.stale_after_s):
        return None
    progress = ""
    download = _download(m, now)
    if download is not None:
        done = human_bytes(download.bytes_done)
        progress = f"{done} of {human_bytes(download.bytes_total)} downloaded" if download.bytes_total else \
            f"{done} downloaded"
        if download.files_total:
            progress += f", {download.files_done or 0} of {download.files_total} files"
        if download.eta_s is not None:
            progress += f", ETA {human_seconds(download.eta_s)}"
    elif m.startup_kv_tokens is not None and m.startup_phase in (Phase.KV_CACHE_ALLOCATED.value,
                                                                 Phase.COMPILING.value, Phase.SERVING.value):
        progress = f"KV cache {m.startup_kv_tokens:,} tokens"
    over = (m.startup_limit_s is not None and m.startup_last_progress is not None
            and m.startup_phase != Phase.SERVING.value and now - m.startup_last_progress > m.startup_limit_s)
    if m.startup_last_progress is not None and m.startup_phase != Phase.SERVING.value:
        quiet = f"last progress {max(0.0, now - m.startup_last_progress):.0f}s ago"
        if m.startup_limit_s is not None:
            quiet += f" (limit {m.startup_limit_s:.0f}s)"
        progress = f"{progress}, {quiet}" if progress else quiet
    return StartupView(phase=m.startup_phase, since=m.startup_since, progress=progress[:256],
                       stalled=bool(m.startup_stalled) or over, download=download)


def _download(m: PodMetrics, now: float) -> DownloadView | None:
    """The download's counts in phase Downloading; the ETA counted down from the sample to `now`."""
    if m.startup_phase != Phase.DOWNLOADING.value or m.startup_download_bytes is None:
        return None
    eta = m.startup_download_eta_s
    if eta is not None and m.startup_sample_at is not None:
        eta = max(0.0, eta - max(0.0, now - m.startup_sample_at))
    total = m.startup_download_total_bytes
    return DownloadView(bytes_done=int(m.startup_download_bytes), bytes_total=int(total) if total else None,
                        files_done=m.startup_download_files, files_total=m.startup_download_total_files,
                        eta_s=round(eta) if eta is not None else None)


def stall_clock_start(pod: PodFacts, m: PodMetrics) -> float | None:
    """Where the stall window may begin: when the current vLLM process began serving (the wrapper's Serving
    phase; its first fresh metrics follow within one scrape), else when the wrapper launched it, else — without
    wrapper metrics — the container's start. A cold restart that spends minutes re-reading torch from a slow disk
    must not have those minutes counted as a stall, and samples of the previous process must not fill the window."""
    if m.startup_phase == Phase.SERVING.value and m.startup_since is not None:
        return m.startup_since
    if m.process_start is not None:
        return m.process_start
    return pod.started_at


def _is_stalled(pod: PodFacts, m: PodMetrics, now: float, settings: HealthSettings) -> bool:
    since = stall_clock_start(pod, m)
    running_long_enough = since is not None and now - since >= settings.stall_s
    return (running_long_enough and m.running is not None and m.running > 0 and m.running_min is not None
            and m.running_min > 0 and m.generated is not None and m.generated <= 0 and (m.samples or 0) >= 2)


def _is_unresponsive(m: PodMetrics, now: float, settings: HealthSettings) -> bool:
    """The wrapper's verdict, from a fresh sample of its own series (the wrapper's scrape, not vLLM's)."""
    return (m.unresponsive is True and m.startup_sample_at is not None
            and now - m.startup_sample_at <= settings.stale_after_s)


def diagnose_pod(pod: PodFacts, metrics: PodMetrics | None, metrics_on: bool, now: float,
                 settings: HealthSettings) -> PodDiagnosis:
    """One pod's state (see module docstring for the order of evidence)."""
    horizon = max(settings.oom_window_s, settings.stall_s)
    terms = _recent_terminations(pod, now, horizon)
    fresh = metrics_on and _fresh(metrics, now, settings)
    startup = _startup(metrics, now, settings) if metrics_on else None

    def out(state: State, message: str, available: bool = False) -> PodDiagnosis:
        return PodDiagnosis(pod=pod.name, uid=pod.uid, pool=pod.pool, state=state, message=message,
                            available=available, metrics_fresh=fresh, terminations=terms, deleting=pod.deleting,
                            startup=startup)

    if pod.deleting:
        return out(State.STARTING, f"pod {pod.name} is being deleted")
    if pod.unschedulable is not None:
        return out(State.UNSCHEDULABLE, f"pod {pod.name} cannot be scheduled: {pod.unschedulable}")
    serving = pod.ready and pod.current_termination is None and pod.waiting_reason is None
    if not serving:
        if terms:
            latest = max(terms, key=lambda t: t.finished_at or 0.0)
            suffix = f" (waiting: {pod.waiting_reason})" if pod.waiting_reason else ""
            return out(latest.state, f"pod {pod.name}: {latest.detail}{suffix}")
        if pod.waiting_reason == "CrashLoopBackOff":
            return out(State.CRASH_LOOPING, f"pod {pod.name} is in CrashLoopBackOff after "
                                            f"{pod.restart_count} restarts")
        if startup is not None and pod.waiting_reason is None and startup.phase != Phase.SERVING.value:
            since = f" for {now - startup.since:.0f}s" if startup.since is not None else ""
            where = f"phase {startup.phase}{since}" + (f", {startup.progress}" if startup.progress else "")
            if startup.stalled:
                return out(State.STARTUP_STALLED, f"pod {pod.name}: start stuck in {where}")
            return out(State.STARTING, f"pod {pod.name} is starting ({where})")
        if pod.container_name == constants.FETCH_CONTAINER:
            running = f"running for {now - pod.started_at:.0f}s" if pod.started_at is not None else \
                (pod.waiting_reason or "waiting")
            return out(State.STARTING,
                       f"pod {pod.name} is fetching its weights ({constants.FETCH_CONTAINER} {running})")
        detail = pod.waiting_reason or ("not ready" if pod.phase == "Running" else pod.phase)
        return out(State.STARTING, f"pod {pod.name} is starting ({detail})")
    if not metrics_on:
        return out(State.HEALTHY, f"pod {pod.name} is ready (metrics off)", available=True)
    if metrics is None or not fresh:
        why = ("no series in Prometheus" if metrics is None else
               "scrape target down" if metrics.up is not True else
               "no engine samples" if metrics.last_sample_at is None else
               f"newest sample {now - metrics.last_sample_at:.0f}s old (limit {settings.stale_after_s:.0f}s)")
        return out(State.METRICS_UNAVAILABLE, f"pod {pod.name} is ready but has no fresh metrics: {why}",
                   available=True)
    assert metrics is not None
    if _is_stalled(pod, metrics, now, settings):
        return out(State.STALLED, f"pod {pod.name}: {metrics.running:.0f} requests running for "
                                  f"{settings.stall_s:.0f}s with 0 new generation tokens")
    if _is_unresponsive(metrics, now, settings):
        return out(State.ENGINE_UNRESPONSIVE, f"pod {pod.name}: the engine answers /health but its idle-engine "
                                              "probes (one token each) failed several times in a row")
    return out(State.HEALTHY, f"pod {pod.name} is ready", available=True)


def _adapters(value: object) -> tuple[tuple[str, int], ...] | None:
    return value if isinstance(value, tuple) else None


def _pool_metric_states(pool: str, pods: tuple[PodDiagnosis, ...], snap: Snapshot, settings: HealthSettings
                        ) -> tuple[set[State], dict[str, object], list[str]]:
    states: set[State] = set()
    facts: dict[str, object] = {}
    notes: list[str] = []
    metrics = snap.metrics
    if metrics is None or metrics.error is not None:
        return states, facts, notes
    pm = metrics.pools.get(pool)
    if pm is not None and pm.finished is not None and pm.finished_length is not None:
        facts["finished"] = pm.finished
        if pm.finished >= settings.min_finished and pm.finished > 0:
            share = pm.finished_length / pm.finished
            facts["length_share"] = share
            if share > settings.length_share_alert:
                states.add(State.RUNAWAY_GENERATION)
                notes.append(f"{share:.0%} of {pm.finished:.0f} finished requests hit max_tokens over "
                             f"{settings.window_s:.0f}s (alert above {settings.length_share_alert:.0%})")
            elif share > settings.length_share_watch:
                facts["length_watch"] = True
                notes.append(f"{share:.0%} of {pm.finished:.0f} finished requests hit max_tokens over "
                             f"{settings.window_s:.0f}s (watch above {settings.length_share_watch:.0%})")
    fresh_pods = [metrics.pods[p.pod] for p in pods if p.metrics_fresh and p.pod in metrics.pods]
    usages = [m.kv_usage_avg for m in fresh_pods if m.kv_usage_avg is not None]
    if usages:
        facts["kv_usage"] = max(usages)
        if max(usages) >= settings.kv_pressure:
            states.add(State.KV_PRESSURE)
            preempt = sum(m.preemptions or 0.0 for m in fresh_pods)
            notes.append(f"KV cache usage averaged {max(usages):.0%} over {settings.window_s:.0f}s "
                         f"(pressure at {settings.kv_pressure:.0%}), {preempt:.0f} preemptions")
    preemptions = [m.preemptions for m in fresh_pods if m.preemptions is not None]
    if preemptions:
        facts["preemptions"] = sum(preemptions)
    kv_tokens = [m.kv_cache_tokens for m in fresh_pods if m.kv_cache_tokens is not None]
    if kv_tokens:
        facts["observed_kv_tokens"] = min(kv_tokens)
    reports = [m.adapters for m in fresh_pods if m.adapters is not None]
    if reports:
        loaded: dict[str, int] = {}
        for report in reports:
            for name, ok in report:
                loaded[name] = loaded.get(name, 0) + int(ok)
        facts["adapters"] = tuple(sorted(loaded.items()))
    return states, facts, notes


def diagnose(snap: Snapshot, settings: HealthSettings) -> Diagnosis:
    """Diagnose every pod and pool of one VLLMDeployment from one snapshot."""
    now = snap.taken_at
    metrics = snap.metrics
    metrics_on = metrics is not None and metrics.error is None
    pools: dict[str, PoolDiagnosis] = {}
    for name, facts in snap.pools.items():
        pods = tuple(diagnose_pod(p, metrics.pods.get(p.name) if metrics_on and metrics else None, metrics_on,
                                  now, settings) for p in snap.pods_of(name))
        states = {p.state for p in pods}
        metric_states, mfacts, notes = _pool_metric_states(name, pods, snap, settings)
        states |= metric_states
        serving = [p for p in pods if p.state in {State.HEALTHY, State.METRICS_UNAVAILABLE, *REPLACED_STATES}]
        fresh = metrics_on and bool(serving) and all(p.metrics_fresh for p in serving)
        if not metrics_on:
            states.add(State.METRICS_UNAVAILABLE)
        if not pods:
            states.add(State.STARTING if facts.desired_replicas > 0 else State.HEALTHY)
        terms = tuple(t for p in pods for t in p.terminations)
        starts = [(p.startup, p.pod) for p in pods if p.startup is not None and not p.deleting]
        behind = min(starts, key=lambda s: (s[0].phase == Phase.SERVING.value, s[0].rank, -(s[0].since or 0.0)),
                     default=None)
        if behind is not None and behind[0].phase == Phase.SERVING.value:  # all serve: since the last one began
            behind = max(starts, key=lambda s: s[0].since or 0.0)
        # A termination inside the OOM window marks the pool even when the pod is serving again: it is not stable.
        states |= {t.state for t in terms}
        primary = next(s for s in SEVERITY if s in states) if states else State.HEALTHY
        messages = [p.message for p in pods if p.state not in {State.HEALTHY}] + notes
        messages += [f"pod {p.pod} recovered from {t.detail}" for p in pods if p.state is State.HEALTHY
                     for t in p.terminations]
        message = "; ".join(messages) if messages else (
            f"pool {name}: {sum(1 for p in pods if p.available)}/{facts.desired_replicas} pods available")
        pools[name] = PoolDiagnosis(
            pool=name, state=primary, states=frozenset(states), message=message, pods=pods,
            desired_replicas=facts.desired_replicas, max_unavailable=facts.max_unavailable, metrics_fresh=fresh,
            length_share=_float(mfacts.get("length_share")), finished=_float(mfacts.get("finished")),
            length_watch=bool(mfacts.get("length_watch", False)), kv_usage=_float(mfacts.get("kv_usage")),
            preemptions=_float(mfacts.get("preemptions")),
            observed_kv_tokens=_int(mfacts.get("observed_kv_tokens")), terminations=terms,
            startup=behind[0] if behind else None, startup_pod=behind[1] if behind else None,
            adapters=_adapters(mfacts.get("adapters")))
    reason, message = _metrics_summary(snap, pools)
    return Diagnosis(taken_at=now, pools=pools, metrics_available=reason == "Scraped", metrics_reason=reason,
                     metrics_message=message)


def _metrics_summary(snap: Snapshot, pools: Mapping[str, PoolDiagnosis]) -> tuple[str, str]:
    m = snap.metrics
    if m is None:
        return "PrometheusNotConfigured", "no Prometheus URL configured: metric-based diagnoses are off"
    if m.error is not None:
        return "PrometheusUnreachable", f"Prometheus query failed: {m.error}"
    blind = [p for pool in pools.values() for p in pool.pods if p.state is State.METRICS_UNAVAILABLE]
    if blind:
        return ("TargetsDown" if any("target down" in p.message or "no series" in p.message for p in blind)
                else "Stale"), "; ".join(p.message for p in blind[:5])
    return "Scraped", "fresh samples for every ready engine pod"


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) else None
