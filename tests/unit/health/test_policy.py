"""decide(): diagnosis + status -> actions + new status, as tables (budget, disruption floor, stale data, storm)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.health.builders import (
    KV,
    NOW,
    OOM,
    busy,
    pod,
    serving_since,
    snapshot,
    stalled,
    starting,
    term,
    zombie,
)
from vllm_operator import constants
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.api.status import (
    ConditionStatus,
    PoolsStatus,
    PoolStatus,
    RestartBudgetStatus,
    StepDownStatus,
    VLLMDeploymentStatus,
)
from vllm_operator.health.diagnose import diagnose
from vllm_operator.health.policy import LADDER_KV, LADDER_MEMORY, Decision, LadderView, decide
from vllm_operator.health.snapshot import PodMetrics, format_time

S = HealthSettings(stall_s=60, window_s=120, oom_window_s=900, interval_s=2, restart_budget=3,
                   budget_window_s=3600, oom_count=2)
LADDER = {"short": LadderView(next_memory=(1, "gpu-memory-utilization 0.9->0.85"),
                              next_kv=(1, "kv-cache-dtype auto->fp8"))}


def status_with(**pool: Any) -> VLLMDeploymentStatus:
    return VLLMDeploymentStatus(pools=PoolsStatus(short=PoolStatus(**pool)))


def run(pods: list[dict[str, Any]], metrics: dict[str, PodMetrics] | None = None, status: VLLMDeploymentStatus |
        None = None, settings: HealthSettings = S, ladders: dict[str, LadderView] | None = None,
        **kw: Any) -> Decision:
    snap = snapshot(pods, metrics, **kw)
    return decide(diagnose(snap, settings), status, settings, LADDER if ladders is None else ladders,
                  metrics_configured=snap.metrics is not None)


def cond(d: Decision, type_: str) -> tuple[str, str]:
    c = next(c for c in d.status.conditions if c.type == type_)
    return c.status.value, c.reason


def short(d: Decision) -> PoolStatus:
    assert d.status.pools and d.status.pools.short
    return d.status.pools.short


def ago(seconds: float) -> str:
    return format_time(NOW - seconds)


# --------------------------------------------------------------------------- deletions: who, how many
DELETE_ROWS: dict[str, tuple[list[dict[str, Any]], dict[str, PodMetrics], dict[str, Any], list[str]]] = {
    "healthy-nothing": ([pod("a"), pod("b")], {"a": busy("a"), "b": busy("b")}, {}, []),
    "one-stalled-deleted": ([pod("a"), pod("b")], {"a": stalled("a"), "b": busy("b")}, {}, ["a"]),
    "stalled-single-replica": ([pod("a")], {"a": stalled("a")}, {}, ["a"]),
    "storm-every-pod-stalled-one-at-a-time": ([pod("a"), pod("b"), pod("c")],
                                              {n: stalled(n) for n in "abc"}, {}, ["a"]),
    "storm-max-unavailable-2": ([pod("a"), pod("b"), pod("c")], {n: stalled(n) for n in "abc"},
                                {"max_unavailable": 2}, ["a", "b"]),
    "floor-replacement-still-starting": ([pod("a", ready=False, started_ago=5), pod("b"), pod("c")],
                                         {"b": stalled("b"), "c": busy("c")}, {}, []),
    "floor-pod-missing": ([pod("b"), pod("c")], {"b": stalled("b"), "c": busy("c")},
                          {"replicas": {"short": 3}}, []),
    "floor-crashlooping-neighbour": ([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=3,
                                          last=term(1)), pod("b")], {"b": stalled("b")}, {}, []),
    "terminating-pod-not-counted-twice": ([pod("x", deleting=True), pod("b"), pod("c")],
                                          {"b": stalled("b"), "c": busy("c")}, {"replicas": {"short": 2}}, ["b"]),
    "stale-data-no-delete": ([pod("a")], {"a": stalled("a", last_sample_at=NOW - 600)}, {}, []),
    "target-down-no-delete": ([pod("a")], {"a": stalled("a", up=False)}, {}, []),
    "prometheus-down-no-delete": ([pod("a")], {"a": stalled("a")}, {"error": "connection refused"}, []),
    "prometheus-not-configured-no-delete": ([pod("a")], {}, {"prometheus": False}, []),
    "oom-is-not-a-delete": ([pod("a", ready=False, started_ago=5, restarts=1, last=OOM)], {}, {}, []),
    "kv-pressure-is-not-a-delete": ([pod("a")], {"a": busy("a", kv_usage_avg=0.99)}, {}, []),
}


@pytest.mark.parametrize(("pods", "metrics", "kw", "deleted"), DELETE_ROWS.values(), ids=DELETE_ROWS.keys())
def test_deletions(pods: list[dict[str, Any]], metrics: dict[str, PodMetrics], kw: dict[str, Any],
                   deleted: list[str]) -> None:
    d = run(pods, metrics, **kw)
    assert [x.pod for x in d.deletions] == deleted
    assert short(d).restart_budget.used == len(deleted)
    assert all(x.uid == f"uid-{x.pod}" for x in d.deletions)
    assert [e.reason for e in d.events].count("RestartedStalledPod") == len(deleted)


UNRESPONSIVE_ROWS: dict[str, tuple[list[dict[str, Any]], dict[str, PodMetrics], dict[str, Any], list[str]]] = {
    "zombie-deleted": ([pod("a"), pod("b")], {"a": zombie("a"), "b": busy("b")}, {}, ["a"]),
    "zombie-single-replica": ([pod("a")], {"a": zombie("a")}, {}, ["a"]),
    "zombie-waits-for-a-replacement-still-starting": ([pod("a", ready=False, started_ago=5), pod("b"), pod("c")],
                                                      {"b": zombie("b"), "c": busy("c")}, {}, []),
    "zombie-and-stalled-one-at-a-time": ([pod("a"), pod("b"), pod("c")],
                                         {"a": stalled("a"), "b": zombie("b"), "c": busy("c")}, {}, ["a"]),
    "zombie-stale-wrapper-sample-no-delete": ([pod("a")], {"a": zombie("a", startup_sample_at=NOW - 600)}, {}, []),
    "zombie-prometheus-down-no-delete": ([pod("a")], {"a": zombie("a")}, {"error": "connection refused"}, []),
    "long-request-running-is-no-zombie": ([pod("a")], {"a": busy("a", unresponsive=False, **serving_since(3000))},
                                          {}, []),
}


@pytest.mark.parametrize(("pods", "metrics", "kw", "deleted"), UNRESPONSIVE_ROWS.values(),
                         ids=UNRESPONSIVE_ROWS.keys())
def test_unresponsive_deletions(pods: list[dict[str, Any]], metrics: dict[str, PodMetrics], kw: dict[str, Any],
                                deleted: list[str]) -> None:
    """EngineUnresponsive pods go as Stalled ones do: within the budget and the disruption allowance, on fresh
    samples only; each deletion says why in its own event reason and is counted as a restart of that reason."""
    d = run(pods, metrics, **kw)
    assert [x.pod for x in d.deletions] == deleted
    assert short(d).restart_budget.used == len(deleted)
    zombies = [x for x in d.deletions if metrics[x.pod].unresponsive]
    assert [e.reason for e in d.events].count("RestartedUnresponsivePod") == len(zombies)
    assert all(x.message.startswith("EngineUnresponsive: ") for x in zombies)
    assert [o.reason for o in d.observed if o.reason == "EngineUnresponsive"] == ["EngineUnresponsive"] * len(zombies)


def test_an_unresponsive_engine_degrades_the_pool_and_its_status_says_so() -> None:
    d = run([pod("a")], {"a": zombie("a")})
    assert short(d).diagnosis == "EngineUnresponsive"
    assert cond(d, constants.COND_DEGRADED) == ("True", "EngineUnresponsive")
    assert cond(d, constants.COND_REMEDIATING) == ("True", "Acting")
    event = next(e for e in d.events if e.reason == "RestartedUnresponsivePod")
    assert event.type == "Warning" and "Deleted pod a of pool short" in event.message and "probes" in event.message


def test_unresponsive_engine_within_a_spent_budget_stays_and_says_so() -> None:
    used = [ago(100), ago(200), ago(300)]
    d = run([pod("a")], {"a": zombie("a")}, status_with(restart_budget=RestartBudgetStatus(used=3, restarts=used)))
    assert d.deletions == []
    assert cond(d, constants.COND_REMEDIATING) == ("False", "BudgetExhausted")
    assert any("stays EngineUnresponsive" in e.message for e in d.events)


def test_budget_exhaustion_stops_deleting_and_says_so() -> None:
    used = [ago(100), ago(200), ago(300)]
    d = run([pod("a")], {"a": stalled("a")}, status_with(restart_budget=RestartBudgetStatus(used=3, restarts=used)))
    assert d.deletions == []
    assert cond(d, constants.COND_REMEDIATING) == ("False", "BudgetExhausted")
    assert any(e.reason == "RemediatingFalse" and "budget spent (3/3" in e.message for e in d.events)


def test_budget_window_slides() -> None:
    """Deletions older than the window no longer count."""
    used = [ago(4000), ago(3700), ago(100)]
    d = run([pod("a")], {"a": stalled("a")}, status_with(restart_budget=RestartBudgetStatus(used=3, restarts=used)))
    assert [x.pod for x in d.deletions] == ["a"]
    assert short(d).restart_budget.used == 2
    assert short(d).restart_budget.restarts == [ago(100), format_time(NOW)]


def test_storm_spends_budget_then_stops() -> None:
    """Every pod stalls, again and again: one deletion per check while the allowance permits, never more than the
    budget per window."""
    status: VLLMDeploymentStatus | None = None
    deleted: list[str] = []
    for _ in range(6):
        d = run([pod(n) for n in "abcd"], {n: stalled(n) for n in "abcd"}, status, max_unavailable=1)
        deleted += [x.pod for x in d.deletions]
        status = d.status
    assert len(deleted) == S.restart_budget
    assert cond(d, constants.COND_REMEDIATING) == ("False", "BudgetExhausted")


def test_remediation_disabled_deletes_nothing() -> None:
    d = run([pod("a")], {"a": stalled("a")}, settings=HealthSettings(**{**S.__dict__, "enabled": False}))
    assert d.deletions == [] and cond(d, constants.COND_REMEDIATING) == ("False", "RemediationDisabled")


# --------------------------------------------------------------------------- step-down ladder
def oom_pod(name: str, n: int, ago_s: float = 30) -> dict[str, Any]:
    return pod(name, ready=False, started_ago=5, restarts=n, last={**OOM, "finishedAt": ago(ago_s)})


def test_one_oom_is_counted_not_stepped() -> None:
    d = run([oom_pod("a", 1)])
    assert d.rung_changes == [] and len(short(d).restart_budget.oom_events) == 1
    assert [o.reason for o in d.observed] == ["EngineOOM"]
    assert any(e.reason == "ObservedEngineOOM" for e in d.events)


def test_same_termination_is_counted_once() -> None:
    first = run([oom_pod("a", 1)])
    again = run([oom_pod("a", 1)], status=first.status)
    assert again.observed == [] and len(short(again).restart_budget.oom_events) == 1


def test_repeated_oom_steps_down_one_rung_and_asks_for_reconcile() -> None:
    first = run([oom_pod("a", 1, ago_s=200)])
    d = run([oom_pod("a", 2, ago_s=20)], status=first.status)
    assert [(c.ladder, c.from_level, c.to_level) for c in d.rung_changes] == [(LADDER_MEMORY, 0, 1)]
    assert d.reconcile_needed
    assert short(d).step_down.level == 1
    assert short(d).step_down.history[-1].rung == "gpu-memory-utilization 0.9->0.85"
    assert short(d).restart_budget.oom_events == []
    assert d.status.step_down_level == 1
    assert ("short", "step_down") in d.actions
    assert cond(d, constants.COND_REMEDIATING) == ("True", "Acting")


def test_oom_from_before_the_last_rung_does_not_count() -> None:
    step = StepDownStatus(level=1, history=[{"level": 1, "rung": "x", "reason": "y", "time": ago(60)}])
    d = run([oom_pod("a", 3, ago_s=120), oom_pod("b", 1, ago_s=90)], status=status_with(step_down=step))
    assert d.rung_changes == [] and short(d).restart_budget.oom_events == []


def test_ladder_exhausted() -> None:
    step = StepDownStatus(level=3)
    status = status_with(step_down=step, restart_budget=RestartBudgetStatus(oom_events=[ago(300)]))
    d = run([oom_pod("a", 1)], status=status, ladders={"short": LadderView(next_memory=None)})
    assert d.rung_changes == [] and short(d).step_down.level == 3
    assert cond(d, constants.COND_REMEDIATING) == ("False", "NothingLeftToTry")


def test_step_down_disabled() -> None:
    status = status_with(restart_budget=RestartBudgetStatus(oom_events=[ago(300)]))
    d = run([oom_pod("a", 1)], status=status, settings=HealthSettings(**{**S.__dict__, "step_down": False}))
    assert d.rung_changes == []


def test_kv_cache_too_small_takes_the_kv_path_once() -> None:
    p = pod("a", ready=False, waiting="CrashLoopBackOff", restarts=1, last=KV)
    d = run([p])
    assert [(c.ladder, c.to_level) for c in d.rung_changes] == [(LADDER_KV, 1)]
    assert short(d).step_down.kv_level == 1 and short(d).step_down.level == 0
    again = run([p], status=d.status)
    assert again.rung_changes == []


def test_kv_path_exhausted_names_the_opt_in() -> None:
    d = run([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=1, last=KV)],
            ladders={"short": LadderView(next_memory=(1, "x"), next_kv=None)})
    assert d.rung_changes == []
    assert any("allowLowerMaxModelLen" in e.message for e in d.events)


# --------------------------------------------------------------------------- stable, step-up, reset
def test_stable_since_set_and_step_up_after_the_period() -> None:
    settings = HealthSettings(**{**S.__dict__, "step_up_after_s": 600})
    step = StepDownStatus(level=2, history=[{"level": 1, "rung": "gpu-memory-utilization 0.9->0.85", "reason": "y",
                                             "time": ago(6000)},
                                            {"level": 2, "rung": "max-num-batched-tokens 8192->4096", "reason": "y",
                                             "time": ago(5000)}])
    d = run([pod("a")], {"a": busy("a")}, status_with(step_down=step), settings=settings)
    assert short(d).stable_since == format_time(NOW) and d.rung_changes == []
    d = run([pod("a")], {"a": busy("a")}, status_with(step_down=step, stable_since=ago(700)), settings=settings)
    assert [(c.from_level, c.to_level) for c in d.rung_changes] == [(2, 1)]
    assert short(d).step_down.history[-1].rung.startswith("undo: max-num-batched-tokens")


def test_no_step_up_without_fresh_metrics() -> None:
    settings = HealthSettings(**{**S.__dict__, "step_up_after_s": 600})
    d = run([pod("a")], {"a": busy("a")}, status_with(step_down=StepDownStatus(level=1), stable_since=ago(9000)),
            settings=settings, error="connection refused")
    assert d.rung_changes == [] and short(d).stable_since is None


def test_unstable_pool_clears_stable_since() -> None:
    d = run([oom_pod("a", 1)], status=status_with(stable_since=ago(100)))
    assert short(d).stable_since is None


def test_reset_token_clears_rungs_and_budget_but_not_seen_terminations() -> None:
    status = status_with(step_down=StepDownStatus(level=2, kv_level=1),
                         restart_budget=RestartBudgetStatus(used=3, restarts=[ago(10)] * 3, oom_events=[ago(5)],
                                                            seen_terminations=["k1"]))
    settings = HealthSettings(**{**S.__dict__, "reset_token": "r1"})
    d = run([pod("a")], {"a": busy("a")}, status, settings=settings)
    assert short(d).step_down.level == 0 and short(d).step_down.kv_level == 0
    assert short(d).restart_budget.used == 0 and short(d).restart_budget.seen_terminations == ["k1"]
    assert d.status.last_reset_token == "r1" and d.reconcile_needed
    assert any(e.reason == "RemediationReset" for e in d.events)
    again = run([pod("a")], {"a": busy("a")}, d.status, settings=settings)
    assert again.rung_changes == [] and not any(e.reason == "RemediationReset" for e in again.events)


# --------------------------------------------------------------------------- conditions only
@pytest.mark.parametrize(("pools", "metrics", "expect"), [
    ({"short": (100, 30)}, {}, ("True", "LengthShareHigh")),
    ({"short": (100, 10)}, {}, ("False", "LengthShareWatch")),
    ({"short": (100, 1)}, {}, ("False", "LengthShareNormal")),
    ({"short": (3, 3)}, {}, ("Unknown", "NoData")),
], ids=["runaway", "watch", "normal", "too-few"])
def test_runaway_condition(pools: dict[str, tuple[int, int]], metrics: dict[str, Any],
                           expect: tuple[str, str]) -> None:
    from vllm_operator.health.snapshot import PoolMetrics
    d = run([pod("a")], {"a": busy("a")},
            pools={k: PoolMetrics(finished=f, finished_length=n) for k, (f, n) in pools.items()})
    assert cond(d, constants.COND_RUNAWAY) == expect
    assert d.deletions == [] and d.rung_changes == []


def test_kv_pressure_condition_and_event_on_transition_only() -> None:
    d = run([pod("a")], {"a": busy("a", kv_usage_avg=0.97)})
    assert cond(d, constants.COND_KV_PRESSURE) == ("True", "KVUsageHigh")
    assert any(e.reason == "KVPressureTrue" and e.type == "Warning" for e in d.events)
    again = run([pod("a")], {"a": busy("a", kv_usage_avg=0.98)}, d.status)
    assert not any(e.reason.startswith("KVPressure") for e in again.events)


def test_metrics_unavailable_condition() -> None:
    d = run([pod("a")], {}, error="connection refused")
    assert cond(d, constants.COND_METRICS_AVAILABLE) == ("False", "PrometheusUnreachable")
    c = next(c for c in d.status.conditions if c.type == constants.COND_METRICS_AVAILABLE)
    assert c.status is ConditionStatus.FALSE and "connection refused" in c.message


def test_observed_kv_tokens_go_into_status() -> None:
    d = run([pod("a")], {"a": busy("a", kv_cache_tokens=12345)})
    assert short(d).observed_kv_tokens == 12345 and short(d).diagnosis == "Healthy"


def test_status_is_unchanged_by_a_quiet_second_check() -> None:
    first = run([pod("a")], {"a": busy("a")})
    second = run([pod("a")], {"a": busy("a")}, first.status)
    assert second.status == first.status and second.events == []


def test_remediation_disabled_changes_no_rung() -> None:
    status = status_with(restart_budget=RestartBudgetStatus(oom_events=[ago(300)]))
    d = run([oom_pod("a", 1)], status=status, settings=HealthSettings(**{**S.__dict__, "enabled": False}))
    assert d.rung_changes == [] and cond(d, constants.COND_REMEDIATING) == ("False", "RemediationDisabled")


@pytest.mark.parametrize(("last", "reason"), [
    (OOM, "EngineOOM"), (KV, "KVCacheTooSmall"), (term(137, "OOMKilled"), "OOMKilled"), (term(1), "Error"),
    (term(88, wrapper="EngineDead"), "EngineDead"),
], ids=["engine-oom", "kv", "host-oom", "error", "dead"])
def test_restart_metric_reasons(last: dict[str, Any], reason: str) -> None:
    d = run([pod("a", ready=False, started_ago=5, restarts=1, last=last)])
    assert [o.reason for o in d.observed] == [reason]


def test_stalled_deletion_is_counted_as_a_restart() -> None:
    d = run([pod("a")], {"a": stalled("a")})
    assert [o.reason for o in d.observed] == ["Stalled"]


@pytest.mark.parametrize(("host_memory", "steps"), [(False, 0), (True, 1)], ids=["gpu-pool", "cpu-pool"])
def test_host_oom_kills_step_cpu_pools_down(host_memory: bool, steps: int) -> None:
    killed = {**term(137, "OOMKilled"), "finishedAt": ago(20)}
    status = status_with(restart_budget=RestartBudgetStatus(oom_events=[ago(300)]))
    view = LadderView(next_memory=(1, "kv-cache-memory share 1.0->0.9"), host_memory=host_memory)
    d = run([pod("a", ready=False, started_ago=5, restarts=1, last=killed)], status=status,
            ladders={"short": view})
    assert len(d.rung_changes) == steps


def test_startup_phase_reaches_pool_status_and_a_stuck_start_degrades() -> None:
    moving = run([pod("a", ready=False, started_ago=400)],
                 {"a": starting("a", "Downloading", since_ago=300, progress_ago=1, limit=600,
                                startup_download_bytes=3 * 2**30, startup_download_total_bytes=15 * 2**30)})
    entry = moving.status.pools.short if moving.status.pools else None
    assert entry is not None and entry.diagnosis == "Starting" and entry.startup_phase == "Downloading"
    assert entry.startup_phase_since == format_time(NOW - 300) and entry.startup_pod == "a"
    assert entry.startup_progress == "3.0 GiB of 15.0 GiB downloaded, last progress 1s ago (limit 600s)"
    assert not moving.deletions and cond(moving, constants.COND_DEGRADED) == ("False", "Healthy")
    stuck = run([pod("a", ready=False, started_ago=400)], {"a": starting("a", "ProfilingMemory", flag=True)})
    entry = stuck.status.pools.short if stuck.status.pools else None
    assert entry is not None and entry.diagnosis == "StartupStalled" and entry.startup_phase == "ProfilingMemory"
    assert cond(stuck, constants.COND_DEGRADED) == ("True", "StartupStalled")
    assert not stuck.deletions, "the wrapper stops a stuck start itself; the operator deletes nothing"
    served = run([pod("a")], {"a": busy("a", **serving_since(30))}, status=stuck.status)
    entry = served.status.pools.short if served.status.pools else None
    assert entry is not None and entry.startup_phase == "Serving" and entry.startup_progress is None


def test_a_fetchs_counts_and_eta_reach_pool_status_counted_down_to_the_check() -> None:
    """The weights fetch's own numbers (engine/fetch.py through its start-up metrics): startupProgress says them
    and startupDownload carries them; the ETA is the wrapper's estimate less the time since its sample."""
    fetching = run([pod("a", ready=False, started_ago=60)],
                   {"a": starting("a", "Downloading", since_ago=50, progress_ago=1, limit=600,
                                  startup_sample_at=NOW - 10, startup_download_bytes=6 * 2**30,
                                  startup_download_total_bytes=16 * 2**30, startup_download_files=2,
                                  startup_download_total_files=5, startup_download_eta_s=320.0)})
    entry = short(fetching)
    assert entry.startup_progress == ("6.0 GiB of 16.0 GiB downloaded, 2 of 5 files, ETA 5m10s, last progress 1s "
                                      "ago (limit 600s)")
    assert entry.startup_download is not None
    assert entry.startup_download.model_dump(by_alias=True) == {
        "bytesDone": 6 * 2**30, "bytesTotal": 16 * 2**30, "filesDone": 2, "filesTotal": 5, "etaSeconds": 310}
    small = run([pod("a", ready=False, started_ago=60)],
                {"a": starting("a", "Downloading", startup_download_bytes=3 * 2**20,
                               startup_download_total_bytes=24 * 2**20)})
    assert short(small).startup_progress is not None
    assert short(small).startup_progress.startswith("3.0 MiB of 24.0 MiB downloaded, last progress"), \
        "no counts, no ETA: a download vLLM makes itself"
    done = short(small).startup_download
    assert done is not None and (done.files_total, done.eta_seconds) == (None, None)
    served = run([pod("a")], {"a": busy("a", **serving_since(30))}, status=fetching.status)
    assert short(served).startup_download is None, "cleared once the pool serves (a settled check writes nothing)"


def test_loaded_adapters_go_into_status() -> None:
    d = run([pod("a")], {"a": busy("a", adapters=(("sql", True), ("new", False)))})
    assert [(a.name, a.loaded_replicas) for a in short(d).adapters or []] == [("new", 0), ("sql", 1)]


# --------------------------------------------------------------------------- a start-up failure that is not an OOM
def test_a_startup_failure_is_reported_with_vllms_line_and_nothing_is_stepped_down() -> None:
    # The H200 matrix's float16 AWQ + fp8 KV start: no OOM, so neither ladder moves and no pod is deleted; the pool's
    # status says StartupFailed, one event carries vLLM's error line, and the Remediating condition says why.
    from tests.unit.health.builders import FA3_LINE, STARTUP_FAILED

    p = pod("a", ready=False, waiting="CrashLoopBackOff", restarts=3, last=STARTUP_FAILED)
    d = run([p])
    assert d.rung_changes == [] and d.deletions == [] and d.actions == []
    assert short(d).diagnosis == "StartupFailed"
    assert short(d).step_down.level == 0 and short(d).step_down.kv_level == 0
    assert short(d).restart_budget.oom_events == [] and short(d).restart_budget.used == 0
    observed = [e for e in d.events if e.reason == "ObservedStartupFailed"]
    assert len(observed) == 1 and FA3_LINE in observed[0].message
    remediating = next(c for c in d.status.conditions if c.type == constants.COND_REMEDIATING)
    assert "not an out-of-memory, so nothing is stepped down" in remediating.message
    again = run([p], status=d.status)  # the same termination seen again: no second event, still nothing done
    assert [e for e in again.events if e.reason == "ObservedStartupFailed"] == [] and again.rung_changes == []


def test_repeated_startup_failures_never_feed_the_oom_ladder() -> None:
    from tests.unit.health.builders import STARTUP_FAILED

    pods = [pod(n, ready=False, waiting="CrashLoopBackOff", restarts=5, last={**STARTUP_FAILED, "finishedAt": ago(a)})
            for n, a in (("a", 30), ("b", 60), ("c", 90))]
    d = run(pods)
    assert d.rung_changes == [] and short(d).restart_budget.oom_events == []


# --------------------------------------------------------------------------- a weights fetch that fails
@pytest.mark.parametrize("reason", [constants.REASON_HUB_UNREACHABLE, constants.REASON_MODEL_ACCESS_DENIED,
                                    constants.REASON_CACHE_DISK_FULL, constants.REASON_FETCH_FAILED])
def test_a_failed_fetch_is_a_reason_in_status_and_an_event_and_nothing_is_deleted(reason: str) -> None:
    from tests.unit.health.builders import fetch_term, fetching

    p = fetching("a", waiting="CrashLoopBackOff", restarts=2, last=fetch_term(reason, "what the fetch said"))
    d = run([p])
    assert d.rung_changes == [] and d.deletions == [] and d.actions == []
    assert short(d).diagnosis == reason
    assert cond(d, constants.COND_DEGRADED) == ("True", reason)
    observed = [e for e in d.events if e.reason == f"Observed{reason}"]
    assert len(observed) == 1 and "what the fetch said" in observed[0].message
    again = run([p], status=d.status)
    assert [e for e in again.events if e.reason == f"Observed{reason}"] == [], "one event per termination"


# --------------------------------------------------------------------------- an engine whose weights are gone
WEIGHTS_GONE = term(constants.EXIT_WEIGHTS_GONE, wrapper=constants.REASON_WEIGHTS_GONE,
                    detail="the cached model's marker /run/vllm-operator/weights/model/.complete cannot be read (No "
                           "such file or directory): the weights cache entry is gone")


@pytest.mark.parametrize("prometheus", [True, False], ids=["metrics-on", "metrics-off"])
def test_an_engine_whose_weights_are_gone_is_replaced_not_restarted_forever(prometheus: bool) -> None:
    """The fetch is an init container: the kubelet's restarts of the engine never fetch the entry again, so the pod
    would fail at every restart. Its replacement runs the fetch. The termination is the evidence (no metrics
    needed: a pod whose engine cannot start has none); budget and disruption floor apply as for Stalled."""
    gone = pod("a", ready=False, waiting="CrashLoopBackOff", restarts=3, last=WEIGHTS_GONE)
    d = run([gone, pod("b")], {"b": busy("b")} if prometheus else None, prometheus=prometheus)
    assert short(d).diagnosis == constants.REASON_WEIGHTS_GONE
    assert [(x.pod, x.uid) for x in d.deletions] == [("a", "uid-a")]
    assert d.deletions[0].message.startswith("WeightsGone: pod a: WeightsGone: exit code 90")
    assert [e.reason for e in d.events if e.reason.startswith("Replaced")] == ["ReplacedPodWithoutWeights"]
    assert (short(d).restart_budget.used, d.actions) == (1, [("short", "delete_pod")])
    assert cond(d, constants.COND_DEGRADED) == ("True", constants.REASON_WEIGHTS_GONE)
    spent = status_with(restart_budget=RestartBudgetStatus(restarts=[ago(60)] * 3, used=3))
    held = run([gone, pod("b")], {"b": busy("b")} if prometheus else None, status=spent, prometheus=prometheus)
    assert held.deletions == [] and cond(held, constants.COND_REMEDIATING)[1] == "BudgetExhausted"


def test_a_failed_fetch_container_is_not_weights_gone() -> None:
    """FetchFailed of the fetch init container: the kubelet's retries do fetch again; nothing is deleted."""
    from tests.unit.health.builders import fetch_term, fetching

    d = run([fetching("a", waiting="CrashLoopBackOff", restarts=2,
                      last=fetch_term(constants.REASON_FETCH_FAILED, "corrupt after a second fetch"))])
    assert short(d).diagnosis == constants.REASON_FETCH_FAILED and d.deletions == []
