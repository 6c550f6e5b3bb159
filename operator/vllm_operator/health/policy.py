"""Decide what to do about a diagnosis: pure, so every rule is a row in a unit-test table.

Who restarts what (docs/architecture.md): the kubelet restarts containers that exit (vLLM exits when its
engine dies, the wrapper turns the exit into a reason), the liveness probe catches a hung API server, the scheduler
owns Pending pods. The operator deletes a pod only for a state nothing else catches — Stalled: Ready and answering
/health, requests running, no token progress; EngineUnresponsive: Ready and answering /health, idle, and the engine
wrapper's one-token probes keep failing — or one the kubelet's restarts cannot help — WeightsGone: the engine found
its weights cache entry gone, and only a new pod runs the fetch again — and only

* within the pool's restart budget (`remediation.restartBudget` deletions per `budgetWindowSeconds`, sliding), and
* within the pool's disruption allowance (PodDisruptionBudget `maxUnavailable`, 1 for pool PDBs): a Stalled pod is
  not available, so deleting it spends no availability, but pods already down for another reason (starting,
  crashing, missing, or replacements of pods deleted earlier) use up the allowance — in a storm where every pod
  stalls, pods are replaced one at a time, each after the previous replacement is Ready, until the budget is spent.

Repeated EngineOOM moves the pool one rung down the step-down ladder (planning.ladder: memory headroom first);
KVCacheTooSmall takes its own path (FP8 KV where allowed, then the opt-in lower maxModelLen). A rung change is
written into `status.pools.<p>.stepDown` and rolled out by the controller's reconcile, like any other change.
RunawayGeneration and KVPressure only set conditions and post events. Missing or stale metrics never lead to a
deletion: a pod is only Stalled on fresh samples, and a pool only counts as stable (for stepping back up) when its
metrics are fresh or metrics are off. Every action and every condition change is an event.

The state the policy keeps — rungs with history, the restart budget, OOM events already seen, stable-since, the
last reset token — lives in status, so a restarted operator continues where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vllm_operator import constants
from vllm_operator.api.conditions import set_condition
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.api.status import (
    RESTART_HISTORY_MAX,
    STEP_DOWN_HISTORY_MAX,
    AdapterStatus,
    Condition,
    ConditionStatus,
    PoolsStatus,
    PoolStatus,
    RestartBudgetStatus,
    StartupDownloadStatus,
    StepDownRecord,
    StepDownStatus,
    VLLMDeploymentStatus,
)
from vllm_operator.health.diagnose import (
    FAILURE_STATES,
    REPLACED_ON_TERMINATION,
    REPLACED_STATES,
    Diagnosis,
    DownloadView,
    PoolDiagnosis,
    State,
)
from vllm_operator.health.snapshot import format_time, parse_time

LADDER_MEMORY = "memory"
LADDER_KV = "kv"


@dataclass(frozen=True)
class LadderView:
    """What the planner's ladders (planning.ladder) allow next for one pool, computed from the plan in effect:
    `(level, what moving there changes)`, or None when no rung that changes anything is left. Rungs that would
    change nothing (FP8 on a GPU that refuses it, a value at its floor) are skipped by the planner, so the next
    level may be more than one above the current one."""

    next_memory: tuple[int, str] | None = None
    next_kv: tuple[int, str] | None = None
    host_memory: bool = False
    """CPU pools keep weights, activations and the KV cache in the pod's memory: there an OOMKilled container is
    the engine running out of memory and counts towards the step-down like EngineOOM."""


@dataclass(frozen=True)
class DeletePod:
    pool: str
    pod: str
    uid: str
    message: str


@dataclass(frozen=True)
class RungChange:
    pool: str
    ladder: str
    """LADDER_MEMORY or LADDER_KV."""
    from_level: int
    to_level: int
    description: str


@dataclass(frozen=True)
class Event:
    type: str
    """Normal or Warning."""
    reason: str
    message: str


@dataclass(frozen=True)
class ObservedTermination:
    """A container termination seen for the first time (the handler counts it in engine_restarts_total)."""

    pool: str
    pod: str
    reason: str
    """The metric's `reason` label (see METRIC_REASONS)."""


METRIC_REASONS = {State.HOST_OOM_KILLED: "OOMKilled", State.CRASH_LOOPING: "Error"}
"""`vllm_operator_engine_restarts_total{reason}` uses the kubelet's words where the kubelet has them (OOMKilled,
Error) and the wrapper's otherwise (EngineOOM, EngineDead, KVCacheTooSmall); deletions count as Stalled or
EngineUnresponsive."""
DELETION_EVENTS = {State.STALLED: "RestartedStalledPod", State.ENGINE_UNRESPONSIVE: "RestartedUnresponsivePod",
                   State.WEIGHTS_GONE: "ReplacedPodWithoutWeights"}
"""The event reason of each deletion the operator makes (one per state in diagnose.REPLACED_STATES)."""
OOM_METRIC_REASONS = ("OOMKilled", "EngineOOM")
"""Reasons the OOM alert counts; the handler creates these series at 0 so `increase()` sees the first OOM."""


@dataclass
class Decision:
    status: VLLMDeploymentStatus
    deletions: list[DeletePod] = field(default_factory=list)
    rung_changes: list[RungChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    observed: list[ObservedTermination] = field(default_factory=list)
    actions: list[tuple[str, str]] = field(default_factory=list)
    """(pool, action) pairs for vllm_operator_actions_total: delete_pod, step_down, step_up, kv_step, reset."""

    @property
    def reconcile_needed(self) -> bool:
        return bool(self.rung_changes)


def _within(stamps: Iterable[str], now: float, window_s: float, after: float | None = None) -> list[str]:
    kept = []
    for s in stamps:
        t = parse_time(s)
        if t is not None and now - t < window_s and (after is None or t >= after):
            kept.append(s)
    return kept


def _last_move_time(step: StepDownStatus) -> float | None:
    return parse_time(step.history[-1].time) if step.history else None


def _record(step: StepDownStatus, level: int, rung: str, reason: str, now: str) -> list[StepDownRecord]:
    history = [*step.history, StepDownRecord(level=level, rung=rung[:128], reason=reason[:1024], time=now)]
    return history[-STEP_DOWN_HISTORY_MAX:]


@dataclass
class _PoolOutcome:
    status: PoolStatus
    decision: Decision
    notes: list[str] = field(default_factory=list)
    """Why the pool is not remediated further (budget, floor, ladder) — goes into the Remediating condition."""
    acted: list[str] = field(default_factory=list)


def _decide_pool(pd: PoolDiagnosis, prev: PoolStatus, settings: HealthSettings, ladder: LadderView, now: float,
                 metrics_configured: bool, decision: Decision) -> _PoolOutcome:
    stamp = format_time(now)
    st = prev.model_copy(deep=True)
    budget = st.restart_budget
    step = st.step_down
    out = _PoolOutcome(status=st, decision=decision)
    pool = pd.pool

    # 1. Windows slide: forget deletions and OOMs that fell out of them.
    budget.restarts = _within(budget.restarts, now, settings.budget_window_s)
    budget.used = len(budget.restarts)
    budget.window_start = budget.restarts[0] if budget.restarts else None
    last_move = _last_move_time(step)
    budget.oom_events = _within(budget.oom_events, now, settings.oom_window_s, after=last_move)

    # 2. Terminations seen for the first time: count, tell, and remember (OOMs feed the ladder).
    seen = set(budget.seen_terminations)
    new_kv = False
    for term in pd.terminations:
        if term.key in seen:
            continue
        seen.add(term.key)
        budget.seen_terminations = [*budget.seen_terminations, term.key][-RESTART_HISTORY_MAX:]
        decision.observed.append(ObservedTermination(pool=pool, pod=term.pod,
                                                     reason=METRIC_REASONS.get(term.state, term.state.value)))
        decision.events.append(Event("Warning", f"Observed{term.state.value}",
                                     f"Pool {pool}: pod {term.pod} terminated — {term.detail}"))
        stale_rung = last_move is not None and term.finished_at is not None and term.finished_at < last_move
        oom = term.state is State.ENGINE_OOM or (term.state is State.HOST_OOM_KILLED and ladder.host_memory)
        if oom and not stale_rung:
            when = format_time(term.finished_at) if term.finished_at is not None else stamp
            budget.oom_events = [*budget.oom_events, when][-RESTART_HISTORY_MAX:]
        if term.state is State.KV_CACHE_TOO_SMALL and not stale_rung:
            new_kv = True
        if term.state is State.STARTUP_FAILED:
            out.notes.append(f"pool {pool}: vLLM cannot start with this plan ({term.detail[:300]}); not an "
                             "out-of-memory, so nothing is stepped down and no pod is deleted — the kubelet "
                             "restarts it with back-off; the spec (or the planner's tables) needs the fix")

    # 3. The KVCacheTooSmall path: deterministic at start-up, so one occurrence is enough.
    if new_kv:
        if not settings.step_down or not settings.enabled:
            out.notes.append(f"pool {pool}: KV cache too small, step-down disabled")
        elif ladder.next_kv is not None:
            level, rung = ladder.next_kv
            change = RungChange(pool, LADDER_KV, step.kv_level, level, rung)
            step.history = _record(step, level, f"KV: {rung}", "KVCacheTooSmall at start-up", stamp)
            step.kv_level = level
            decision.rung_changes.append(change)
            decision.actions.append((pool, "kv_step"))
            decision.events.append(Event("Warning", "SteppedKVPath",
                                         f"Pool {pool}: KV cache cannot hold one full sequence; KV rung "
                                         f"{change.from_level}->{change.to_level}: {rung}"))
            out.acted.append(f"pool {pool} KV rung {change.to_level} ({rung})")
            st.stable_since = None
        else:
            why = ("set remediation.allowLowerMaxModelLen to let the operator lower maxModelLen, or plan for a "
                   "bigger accelerator" if not settings.allow_lower_max_model_len else "no KV rung left")
            out.notes.append(f"pool {pool}: KV cache too small at KV rung {step.kv_level}; {why}")
            decision.events.append(Event("Warning", "KVPathExhausted", out.notes[-1]))

    # 4. Repeated EngineOOM: one rung down the memory ladder, then wait for fresh OOMs at the new rung.
    if len(budget.oom_events) >= settings.oom_count:
        if not settings.step_down or not settings.enabled:
            out.notes.append(f"pool {pool}: {len(budget.oom_events)} engine OOMs, step-down disabled")
        elif ladder.next_memory is not None:
            level, rung = ladder.next_memory
            reason = f"EngineOOM x{len(budget.oom_events)} in {settings.oom_window_s:.0f}s"
            change = RungChange(pool, LADDER_MEMORY, step.level, level, rung)
            step.history = _record(step, level, rung, reason, stamp)
            step.level = level
            budget.oom_events = []
            decision.rung_changes.append(change)
            decision.actions.append((pool, "step_down"))
            decision.events.append(Event("Warning", "SteppedDown", f"Pool {pool}: {reason}; rung "
                                                                  f"{change.from_level}->{change.to_level}: {rung}"))
            out.acted.append(f"pool {pool} stepped down to rung {step.level} ({rung})")
            st.stable_since = None
        else:
            out.notes.append(f"pool {pool}: {len(budget.oom_events)} engine OOMs at the last rung "
                             f"({step.level}); nothing left to step down")

    # 5. Stalled and unresponsive pods: delete within budget and disruption allowance; never without fresh samples.
    #    A pod whose engine found its weights gone: the same, on its termination's evidence (restarts cannot help).
    stalled = sorted((p for p in pd.pods if p.state in REPLACED_STATES
                      and (p.metrics_fresh or p.state in REPLACED_ON_TERMINATION)), key=lambda p: p.pod)
    if stalled:
        live = [p for p in pd.pods if not p.deleting]
        missing = max(0, pd.desired_replicas - len(live))
        down_other = missing + sum(1 for p in live if not p.available and p.state not in REPLACED_STATES)
        allowance = max(0, pd.max_unavailable - down_other)
        remaining = max(0, settings.restart_budget - budget.used)
        for pod in stalled:
            what = pod.state.value
            if not settings.enabled:
                out.notes.append(f"pool {pool}: pod {pod.pod} is {what}; remediation disabled")
                continue
            if remaining <= 0:
                out.notes.append(f"pool {pool}: restart budget spent ({budget.used}/{settings.restart_budget} "
                                 f"in {settings.budget_window_s:.0f}s); pod {pod.pod} stays {what}")
                continue
            if allowance <= 0:
                out.notes.append(f"pool {pool}: pod {pod.pod} is {what}; waiting — {down_other} pod(s) already "
                                 f"down, maxUnavailable {pd.max_unavailable}")
                continue
            remaining -= 1
            allowance -= 1
            budget.restarts = [*budget.restarts, stamp][-RESTART_HISTORY_MAX:]
            budget.used = len(budget.restarts)
            budget.window_start = budget.restarts[0]
            decision.deletions.append(DeletePod(pool, pod.pod, pod.uid, f"{what}: {pod.message}"))
            decision.observed.append(ObservedTermination(pool=pool, pod=pod.pod, reason=what))
            decision.actions.append((pool, "delete_pod"))
            decision.events.append(Event("Warning", DELETION_EVENTS[pod.state],
                                         f"Deleted pod {pod.pod} of pool {pool}: {pod.message} (restart "
                                         f"{budget.used}/{settings.restart_budget} in this window)"))
            out.acted.append(f"deleted {what} pod {pod.pod}")

    # 6. Stable since / step back up.
    stable = (not (pd.states & FAILURE_STATES) and State.STARTING not in pd.states
              and pd.available >= pd.desired_replicas and (pd.metrics_fresh or not metrics_configured)
              and not budget.oom_events and not decision.rung_changes)
    if not stable:
        st.stable_since = None
    elif st.stable_since is None:
        st.stable_since = stamp
    since = parse_time(st.stable_since)
    if (stable and since is not None and settings.step_up_after_s is not None and step.level > 0
            and now - since >= settings.step_up_after_s and settings.enabled):
        done = [r.rung for r in step.history if r.level == step.level and not r.rung.startswith(("undo", "KV"))]
        rung = done[-1] if done else f"rung {step.level}"
        change = RungChange(pool, LADDER_MEMORY, step.level, step.level - 1, f"undo: {rung}")
        reason = f"stable for {now - since:.0f}s (step up after {settings.step_up_after_s:.0f}s)"
        step.history = _record(step, step.level - 1, f"undo: {rung}", reason, stamp)
        step.level -= 1
        st.stable_since = stamp
        decision.rung_changes.append(change)
        decision.actions.append((pool, "step_up"))
        decision.events.append(Event("Normal", "SteppedUp", f"Pool {pool}: {reason}; rung "
                                                           f"{change.from_level}->{change.to_level}"))
        out.acted.append(f"pool {pool} stepped up to rung {step.level}")

    st.diagnosis = pd.state.value
    start = pd.startup
    st.startup_phase = start.phase if start is not None else None
    st.startup_phase_since = format_time(start.since) if start is not None and start.since is not None else None
    st.startup_progress = (start.progress or None) if start is not None else None
    st.startup_download = _download_status(start.download) if start is not None else None
    st.startup_pod = pd.startup_pod if start is not None else None
    if pd.observed_kv_tokens is not None:
        st.observed_kv_tokens = pd.observed_kv_tokens
    if pd.adapters is not None:
        st.adapters = [AdapterStatus(name=n, loaded_replicas=k) for n, k in pd.adapters]
    return out


def _download_status(d: DownloadView | None) -> StartupDownloadStatus | None:
    if d is None:
        return None
    return StartupDownloadStatus(bytes_done=d.bytes_done, bytes_total=d.bytes_total, files_done=d.files_done,
                                 files_total=d.files_total, eta_seconds=int(d.eta_s) if d.eta_s is not None else None)


def _reset(status: VLLMDeploymentStatus, token: str, now: str, decision: Decision) -> None:
    """A new reset token clears rungs and budgets (terminations already seen stay seen)."""
    pools = status.pools or PoolsStatus()
    for name in constants.POOLS:
        entry: PoolStatus | None = getattr(pools, name)
        if entry is None:
            continue
        step = entry.step_down
        if step.level or step.kv_level:
            decision.rung_changes.append(RungChange(name, LADDER_MEMORY, step.level, 0, "reset"))
            step.history = _record(step, 0, "reset", f"resetToken {token}", now)
            step.level = 0
            step.kv_level = 0
        seen = entry.restart_budget.seen_terminations
        entry.restart_budget = RestartBudgetStatus(seen_terminations=seen)
        entry.stable_since = None
        decision.actions.append((name, "reset"))
    status.pools = pools
    status.last_reset_token = token
    decision.events.append(Event("Normal", "RemediationReset",
                                 f"Reset token {token!r}: cleared step-down rungs and restart budgets"))


QUIET_REASONS = frozenset({"Idle", "Healthy", "NoData", "LengthShareNormal", "KVUsageNormal", "Scraped"})


def _transition_events(before: list[Condition], after: list[Condition], decision: Decision) -> None:
    old = {c.type: c for c in before}
    for cond in after:
        prev = old.get(cond.type)
        if prev is not None and prev.status == cond.status and prev.reason == cond.reason:
            continue
        if prev is None and cond.reason in QUIET_REASONS:
            continue  # a condition appearing in its normal state is not news
        warn = cond.status is ConditionStatus.TRUE and cond.type in {
            constants.COND_RUNAWAY, constants.COND_KV_PRESSURE, constants.COND_DEGRADED}
        warn = warn or (cond.type == constants.COND_METRICS_AVAILABLE and cond.status is ConditionStatus.FALSE)
        decision.events.append(Event("Warning" if warn else "Normal", f"{cond.type}{cond.status.value}",
                                     f"{cond.type}={cond.status.value} ({cond.reason}): {cond.message}"))


def decide(diagnosis: Diagnosis, status: VLLMDeploymentStatus | None, settings: HealthSettings,
           ladders: Mapping[str, LadderView], *, generation: int | None = None,
           metrics_configured: bool = True) -> Decision:
    """The actions and the new status for one health check of one VLLMDeployment."""
    now = diagnosis.taken_at
    stamp = format_time(now)
    new = status.model_copy(deep=True) if status else VLLMDeploymentStatus()
    decision = Decision(status=new)
    if settings.reset_token and settings.reset_token != new.last_reset_token:
        _reset(new, settings.reset_token, stamp, decision)
    pools = new.pools.model_copy(deep=True) if new.pools else PoolsStatus()
    notes: list[str] = []
    acted: list[str] = []
    for name, pd in diagnosis.pools.items():
        prev: PoolStatus = getattr(pools, name, None) or PoolStatus()
        outcome = _decide_pool(pd, prev, settings, ladders.get(name, LadderView()), now, metrics_configured,
                               decision)
        setattr(pools, name, outcome.status)
        notes += outcome.notes
        acted += outcome.acted
    new.pools = pools
    levels = [p.step_down.level + p.step_down.kv_level for p in (pools.short, pools.long) if p]
    new.step_down_level = max(levels, default=0)

    before = list(new.conditions)
    conds = list(new.conditions)

    def put(type_: str, value: ConditionStatus, reason: str, message: str) -> None:
        nonlocal conds
        conds = set_condition(conds, type_, value, reason, message, generation=generation, now=stamp)

    T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN
    put(constants.COND_METRICS_AVAILABLE, T if diagnosis.metrics_available else F, diagnosis.metrics_reason,
        diagnosis.metrics_message)
    runaway = [p for p in diagnosis.pools.values() if State.RUNAWAY_GENERATION in p.states]
    watch = [p for p in diagnosis.pools.values() if p.length_watch]
    judged = [p for p in diagnosis.pools.values() if p.length_share is not None]
    if runaway:
        put(constants.COND_RUNAWAY, T, "LengthShareHigh", "; ".join(_share(p) for p in runaway))
    elif watch:
        put(constants.COND_RUNAWAY, F, "LengthShareWatch", "; ".join(_share(p) for p in watch))
    elif judged:
        put(constants.COND_RUNAWAY, F, "LengthShareNormal", "; ".join(_share(p) for p in judged))
    else:
        put(constants.COND_RUNAWAY, U, "NoData", "too few finished requests in the window, or no fresh metrics")
    pressure = [p for p in diagnosis.pools.values() if State.KV_PRESSURE in p.states]
    measured = [p for p in diagnosis.pools.values() if p.kv_usage is not None]
    if pressure:
        put(constants.COND_KV_PRESSURE, T, "KVUsageHigh", "; ".join(_kv(p, settings) for p in pressure))
    elif measured:
        put(constants.COND_KV_PRESSURE, F, "KVUsageNormal", "; ".join(_kv(p, settings) for p in measured))
    else:
        put(constants.COND_KV_PRESSURE, U, "NoData", "no fresh KV cache usage samples")
    failing = [p for p in diagnosis.pools.values() if p.states & FAILURE_STATES]
    if failing:
        put(constants.COND_DEGRADED, T, failing[0].state.value, "; ".join(f"pool {p.pool}: {p.message}"
                                                                          for p in failing))
    else:
        put(constants.COND_DEGRADED, F, "Healthy", "no engine pod in a failure state")
    rungs = [f"pool {n} at step-down rung {p.step_down.level}" + (f", KV rung {p.step_down.kv_level}"
                                                                   if p.step_down.kv_level else "")
             for n in constants.POOLS if (p := getattr(pools, n)) and (p.step_down.level or p.step_down.kv_level)]
    if acted:
        put(constants.COND_REMEDIATING, T, "Acting", "; ".join(acted + rungs))
    elif notes:
        blocked = "BudgetExhausted" if any("budget spent" in n for n in notes) else (
            "RemediationDisabled" if any("disabled" in n for n in notes) else
            "WaitingForReplacement" if any("waiting" in n for n in notes) else "NothingLeftToTry")
        put(constants.COND_REMEDIATING, T if blocked == "WaitingForReplacement" else F, blocked,
            "; ".join(notes + rungs))
    else:
        put(constants.COND_REMEDIATING, F, "Idle", "; ".join(rungs) or "nothing to remediate")
    new.conditions = conds
    _transition_events(before, conds, decision)
    return decision


def _share(p: PoolDiagnosis) -> str:
    return f"pool {p.pool}: {p.length_share or 0:.0%} of {p.finished or 0:.0f} finished requests ended at max_tokens"


def _kv(p: PoolDiagnosis, settings: HealthSettings) -> str:
    return (f"pool {p.pool}: KV usage mean {p.kv_usage or 0:.0%} over {settings.window_s:.0f}s "
            f"(pressure at {settings.kv_pressure:.0%})")
