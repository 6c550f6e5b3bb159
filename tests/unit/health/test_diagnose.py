"""diagnose(): snapshots -> states, as a table. Each row names the evidence that must lead to the state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.unit.health.builders import (
    DEAD,
    ERROR,
    FA3_LINE,
    HOST_OOM,
    KV,
    NOW,
    OOM,
    STARTUP_FAILED,
    busy,
    fetch_term,
    fetching,
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
from vllm_operator.health.diagnose import DESCRIPTIONS, State, classify, diagnose
from vllm_operator.health.snapshot import PodMetrics, PoolMetrics, pod_facts

S = HealthSettings(stall_s=60, window_s=120, oom_window_s=900, interval_s=2)


@dataclass
class Row:
    pods: list[dict[str, Any]]
    metrics: dict[str, PodMetrics] = field(default_factory=dict)
    expect_pod: State | None = None
    expect_pool: State | None = None
    kw: dict[str, Any] = field(default_factory=dict)


ROWS = {
    "healthy-busy": Row([pod("a")], {"a": busy("a")}, State.HEALTHY, State.HEALTHY),
    "healthy-idle-no-requests": Row([pod("a")], {"a": busy("a", running=0.0, running_min=0.0, generated=0.0)},
                                    State.HEALTHY, State.HEALTHY),
    "starting-container-creating": Row([pod("a", ready=False, started_ago=None)], {}, State.STARTING, State.STARTING),
    "starting-loading-model": Row([pod("a", ready=False, started_ago=20)], {}, State.STARTING, State.STARTING),
    "engine-oom-restarting": Row([pod("a", ready=False, started_ago=5, restarts=1, last=OOM)], {},
                                 State.ENGINE_OOM, State.ENGINE_OOM),
    "engine-oom-crashloop-cause-wins": Row([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=4, last=OOM)],
                                           {}, State.ENGINE_OOM, State.ENGINE_OOM),
    "engine-oom-still-terminated": Row([pod("a", ready=False, terminated=OOM)], {}, State.ENGINE_OOM,
                                       State.ENGINE_OOM),
    "engine-oom-by-exit-code-only": Row([pod("a", ready=False, started_ago=5, restarts=1, last=term(87))], {},
                                        State.ENGINE_OOM, State.ENGINE_OOM),
    "old-oom-then-healthy": Row([pod("a", restarts=1, last=term(87, ago=5000))], {"a": busy("a")},
                                State.HEALTHY, State.HEALTHY),
    "recent-oom-but-ready-again": Row([pod("a", started_ago=100, restarts=1, last=OOM)], {"a": busy("a")},
                                      State.HEALTHY, State.ENGINE_OOM),
    "host-oom-killed": Row([pod("a", ready=False, started_ago=5, restarts=1, last=HOST_OOM)], {},
                           State.HOST_OOM_KILLED, State.HOST_OOM_KILLED),
    "kv-cache-too-small": Row([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=2, last=KV)], {},
                              State.KV_CACHE_TOO_SMALL, State.KV_CACHE_TOO_SMALL),
    "startup-failed": Row([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=3, last=STARTUP_FAILED)], {},
                          State.STARTUP_FAILED, State.STARTUP_FAILED),
    "engine-dead": Row([pod("a", ready=False, started_ago=5, restarts=1, last=DEAD)], {}, State.ENGINE_DEAD,
                       State.ENGINE_DEAD),
    "unexpected-exit-zero-is-dead": Row([pod("a", ready=False, started_ago=5, restarts=1, last=term(86))], {},
                                        State.ENGINE_DEAD, State.ENGINE_DEAD),
    "crashloop-generic": Row([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=5,
                                  last=term(1, ago=5000))], {}, State.CRASH_LOOPING, State.CRASH_LOOPING),
    "error-exit-restarting": Row([pod("a", ready=False, started_ago=5, restarts=1, last=ERROR)], {},
                                 State.CRASH_LOOPING, State.CRASH_LOOPING),
    "unschedulable": Row([pod("a", ready=False, unschedulable=True)], {}, State.UNSCHEDULABLE, State.UNSCHEDULABLE),
    "stalled": Row([pod("a")], {"a": stalled("a")}, State.STALLED, State.STALLED),
    "stalled-but-container-too-young": Row([pod("a", started_ago=30)], {"a": stalled("a")}, State.HEALTHY,
                                           State.HEALTHY),
    "stalled-needs-requests-whole-window": Row([pod("a")], {"a": stalled("a", running_min=0.0)}, State.HEALTHY,
                                               State.HEALTHY),
    "stalled-needs-two-samples": Row([pod("a")], {"a": stalled("a", samples=1)}, State.HEALTHY, State.HEALTHY),
    "stalled-unknown-increase-is-not-stalled": Row([pod("a")], {"a": stalled("a", generated=None)}, State.HEALTHY,
                                                   State.HEALTHY),
    "stale-samples-never-stalled": Row([pod("a")], {"a": stalled("a", last_sample_at=NOW - 300)},
                                       State.METRICS_UNAVAILABLE, State.METRICS_UNAVAILABLE),
    "target-down-never-stalled": Row([pod("a")], {"a": stalled("a", up=False)}, State.METRICS_UNAVAILABLE,
                                     State.METRICS_UNAVAILABLE),
    "no-series": Row([pod("a")], {}, State.METRICS_UNAVAILABLE, State.METRICS_UNAVAILABLE),
    "prometheus-unreachable-stalled-hidden": Row([pod("a")], {"a": stalled("a")}, State.HEALTHY,
                                                 State.METRICS_UNAVAILABLE, {"error": "connection refused"}),
    "prometheus-not-configured": Row([pod("a")], {}, State.HEALTHY, State.METRICS_UNAVAILABLE,
                                     {"prometheus": False}),
    "deleting-pod": Row([pod("a", deleting=True)], {"a": busy("a")}, State.STARTING, State.STARTING),
    "kv-pressure": Row([pod("a")], {"a": busy("a", kv_usage_avg=0.97)}, State.HEALTHY, State.KV_PRESSURE),
    "kv-below-pressure": Row([pod("a")], {"a": busy("a", kv_usage_avg=0.90)}, State.HEALTHY, State.HEALTHY),
    "runaway-generation": Row([pod("a")], {"a": busy("a")}, State.HEALTHY, State.RUNAWAY_GENERATION,
                              {"pools": {"short": PoolMetrics(finished=100, finished_length=25)}}),
    "length-share-watch-only": Row([pod("a")], {"a": busy("a")}, State.HEALTHY, State.HEALTHY,
                                   {"pools": {"short": PoolMetrics(finished=100, finished_length=10)}}),
    "length-share-too-few-requests": Row([pod("a")], {"a": busy("a")}, State.HEALTHY, State.HEALTHY,
                                         {"pools": {"short": PoolMetrics(finished=4, finished_length=4)}}),
    "starting-in-a-phase-that-moves": Row([pod("a", ready=False, started_ago=3000)],
                                          {"a": starting("a", "LoadingWeights", since_ago=2900, progress_ago=20)},
                                          State.STARTING, State.STARTING),
    "starting-download-that-moves": Row([pod("a", ready=False, started_ago=3000)],
                                        {"a": starting("a", "Downloading", since_ago=2900, progress_ago=3, limit=600,
                                                       startup_download_bytes=40 * 2**30)},
                                        State.STARTING, State.STARTING),
    "startup-stalled-flag": Row([pod("a", ready=False, started_ago=900)],
                                {"a": starting("a", "ProfilingMemory", flag=True)},
                                State.STARTUP_STALLED, State.STARTUP_STALLED),
    "startup-stalled-past-limit": Row([pod("a", ready=False, started_ago=900)],
                                      {"a": starting("a", "Compiling", since_ago=800, progress_ago=700, limit=600)},
                                      State.STARTUP_STALLED, State.STARTUP_STALLED),
    "startup-stale-wrapper-samples-are-no-evidence": Row(
        [pod("a", ready=False, started_ago=900)],
        {"a": starting("a", "Compiling", progress_ago=700, limit=600, startup_sample_at=NOW - 300)},
        State.STARTING, State.STARTING),
    "startup-stalled-exit-83": Row([pod("a", ready=False, started_ago=5, restarts=1, last=term(
        constants.EXIT_STARTUP_STALLED, wrapper=constants.REASON_STARTUP_STALLED, detail="phase Compiling for 1900s"))],
        {}, State.STARTUP_STALLED, State.STARTUP_STALLED),
    "stall-window-counts-from-serving-not-container-start": Row(
        [pod("a", started_ago=3600)], {"a": stalled("a", **serving_since(30))}, State.HEALTHY, State.HEALTHY),
    "stalled-once-serving-longer-than-the-window": Row(
        [pod("a", started_ago=3600)], {"a": stalled("a", **serving_since(90))}, State.STALLED, State.STALLED),
    "engine-unresponsive-idle-zombie": Row([pod("a")], {"a": zombie("a")}, State.ENGINE_UNRESPONSIVE,
                                           State.ENGINE_UNRESPONSIVE),
    "unresponsive-flag-off-is-healthy": Row([pod("a")], {"a": zombie("a", unresponsive=False)}, State.HEALTHY,
                                            State.HEALTHY),
    "no-probe-series-is-healthy": Row([pod("a")], {"a": zombie("a", unresponsive=None)}, State.HEALTHY,
                                      State.HEALTHY),
    "unresponsive-from-a-stale-wrapper-sample-is-no-evidence": Row(
        [pod("a")], {"a": zombie("a", startup_sample_at=NOW - 300)}, State.HEALTHY, State.HEALTHY),
    "unresponsive-without-wrapper-sample-time-is-no-evidence": Row(
        [pod("a")], {"a": zombie("a", startup_sample_at=None)}, State.HEALTHY, State.HEALTHY),
    "unresponsive-but-stale-vllm-samples-is-metrics-unavailable": Row(
        [pod("a")], {"a": zombie("a", last_sample_at=NOW - 300)}, State.METRICS_UNAVAILABLE,
        State.METRICS_UNAVAILABLE),
    "unresponsive-hidden-while-prometheus-unreachable": Row([pod("a")], {"a": zombie("a")}, State.HEALTHY,
                                                            State.METRICS_UNAVAILABLE, {"error": "refused"}),
    "unresponsive-not-ready-pod-is-starting": Row([pod("a", ready=False, started_ago=20)], {"a": zombie("a")},
                                                  State.STARTING, State.STARTING),
    "fetch-running-is-starting": Row([fetching("a")], {}, State.STARTING, State.STARTING),
    "fetch-hub-unreachable": Row([fetching("a", waiting="CrashLoopBackOff", restarts=2, last=fetch_term(
        constants.REASON_HUB_UNREACHABLE, "test-org/tiny@main: the Hub did not answer (ConnectError)"))], {},
        State.HUB_UNREACHABLE, State.HUB_UNREACHABLE),
    "fetch-access-denied": Row([fetching("a", terminated=fetch_term(
        constants.REASON_MODEL_ACCESS_DENIED, "test-org/gated@main is gated: no token given"))], {},
        State.MODEL_ACCESS_DENIED, State.MODEL_ACCESS_DENIED),
    "fetch-cache-full": Row([fetching("a", waiting="CrashLoopBackOff", restarts=1, last=fetch_term(
        constants.REASON_CACHE_DISK_FULL, "needs 5000 bytes; in use and not evictable: o--m--c"))], {},
        State.CACHE_DISK_FULL, State.CACHE_DISK_FULL),
    "fetch-failed": Row([fetching("a", waiting="CrashLoopBackOff", restarts=1, last=fetch_term(
        constants.REASON_FETCH_FAILED, "model.safetensors: SHA-256 differs after a second fetch"))], {},
        State.FETCH_FAILED, State.FETCH_FAILED),
    "fetch-stalled": Row([fetching("a", waiting="CrashLoopBackOff", restarts=1, last=fetch_term(
        constants.REASON_STARTUP_STALLED, "no new byte of test-org/tiny for 600 s"))], {},
        State.STARTUP_STALLED, State.STARTUP_STALLED),
    "fetch-by-exit-code-alone": Row([fetching("a", waiting="CrashLoopBackOff", restarts=1, last=term(78))], {},
                                    State.HUB_UNREACHABLE, State.HUB_UNREACHABLE),
    "fetch-done-engine-is-read": Row([fetching("a", terminated={"exitCode": 0, "reason": "Completed",
                                                                "finishedAt": "2027-01-15T08:00:00Z"})], {},
                                     State.STARTING, State.STARTING),
    "oom-outranks-stalled-neighbour": Row([pod("a", ready=False, started_ago=5, restarts=1, last=OOM), pod("b")],
                                          {"b": stalled("b")}, State.ENGINE_OOM, State.ENGINE_OOM),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_diagnose_table(row: Row) -> None:
    snap = snapshot(row.pods, row.metrics, **row.kw)
    diag = diagnose(snap, S)
    pool = diag.pools["short"]
    assert pool.pods[0].state is row.expect_pod, pool.pods[0].message
    assert pool.state is row.expect_pool, pool.message


def test_pool_reports_its_least_advanced_start() -> None:
    snap = snapshot([pod("a", ready=False, started_ago=100), pod("b", ready=False, started_ago=100), pod("c")],
                    {"a": starting("a", "KVCacheAllocated", since_ago=4, startup_kv_tokens=65536),
                     "b": starting("b", "LoadingWeights", since_ago=50, progress_ago=2),
                     "c": busy("c", **serving_since(500))}, replicas={"short": 3})
    pool = diagnose(snap, S).pools["short"]
    assert pool.startup is not None and (pool.startup_pod, pool.startup.phase) == ("b", "LoadingWeights")
    assert pool.startup.since == NOW - 50 and pool.startup.progress == "last progress 2s ago (limit 1200s)"
    a = next(p for p in pool.pods if p.pod == "a")
    assert a.startup is not None and a.startup.progress.startswith("KV cache 65,536 tokens")
    assert "phase LoadingWeights for 50s" in pool.message
    all_serving = snapshot([pod("a"), pod("c")], {"a": busy("a", **serving_since(60)),
                                                  "c": busy("c", **serving_since(500))}, replicas={"short": 2})
    pool = diagnose(all_serving, S).pools["short"]
    assert pool.startup is not None and (pool.startup.phase, pool.startup_pod) == ("Serving", "a")


def test_every_state_is_documented() -> None:
    assert set(DESCRIPTIONS) == set(State)
    assert all(len(s.description) > 40 for s in State)


def test_length_watch_flag_and_share() -> None:
    snap = snapshot([pod("a")], {"a": busy("a")}, pools={"short": PoolMetrics(finished=100, finished_length=10)})
    pool = diagnose(snap, S).pools["short"]
    assert pool.length_watch and pool.length_share == pytest.approx(0.10)


def test_observed_kv_tokens_taken_from_fresh_pods() -> None:
    snap = snapshot([pod("a"), pod("b")], {"a": busy("a", kv_cache_tokens=50000), "b": busy("b")})
    assert diagnose(snap, S).pools["short"].observed_kv_tokens == 50000


def test_metrics_condition_reasons() -> None:
    assert diagnose(snapshot([pod("a")], {"a": busy("a")}), S).metrics_reason == "Scraped"
    assert diagnose(snapshot([pod("a")], {}, prometheus=False), S).metrics_reason == "PrometheusNotConfigured"
    assert diagnose(snapshot([pod("a")], {}, error="timeout"), S).metrics_reason == "PrometheusUnreachable"
    assert diagnose(snapshot([pod("a")], {"a": busy("a", up=False)}), S).metrics_reason == "TargetsDown"
    assert diagnose(snapshot([pod("a")], {"a": busy("a", last_sample_at=NOW - 999)}), S).metrics_reason == "Stale"


def test_termination_keys_survive_the_restart() -> None:
    """The same termination read while the container is terminated and after the kubelet restarted it."""
    before = pod_facts(pod("a", ready=False, terminated=OOM, restarts=0))
    after = pod_facts(pod("a", ready=False, started_ago=2, restarts=1, last=OOM))
    assert before.current_termination and after.last_termination
    assert before.current_termination.key("u", "engine") == after.last_termination.key("u", "engine")


@pytest.mark.parametrize(("raw", "expect"), [
    (OOM, State.ENGINE_OOM), (KV, State.KV_CACHE_TOO_SMALL), (HOST_OOM, State.HOST_OOM_KILLED),
    (DEAD, State.ENGINE_DEAD), (ERROR, State.CRASH_LOOPING), (term(0, "Completed"), None),
    (STARTUP_FAILED, State.STARTUP_FAILED), (term(82), State.STARTUP_FAILED),
], ids=["oom", "kv", "host-oom", "dead", "error", "clean", "startup-failed", "startup-failed-code-only"])
def test_classify(raw: dict[str, Any], expect: State | None) -> None:
    facts = pod_facts(pod("a", ready=False, started_ago=2, restarts=1, last=raw))
    assert facts.last_termination is not None
    assert classify(facts.last_termination) is expect


def test_adapters_counted_over_fresh_pods() -> None:
    snap = snapshot([pod("a"), pod("b")], {"a": busy("a", adapters=(("x", True), ("y", False))),
                                           "b": busy("b", adapters=(("x", True), ("y", True)))})
    assert diagnose(snap, S).pools["short"].adapters == (("x", 2), ("y", 1))
    plain = snapshot([pod("a")], {"a": busy("a")})
    assert diagnose(plain, S).pools["short"].adapters is None


def test_a_pool_asleep_at_zero_is_healthy_not_degraded() -> None:
    """A long pool that KEDA scaled to 0 has no pods and wants none: Healthy, so Degraded stays False."""
    snap = snapshot([pod("a")], {"a": busy("a")}, replicas={"short": 1, "long": 0})
    long = diagnose(snap, S).pools["long"]
    assert long.state is State.HEALTHY and long.pods == () and long.desired_replicas == 0
    waking = diagnose(snapshot([pod("a")], {"a": busy("a")}, replicas={"short": 1, "long": 1}), S).pools["long"]
    assert waking.state is State.STARTING, "asked to wake, no pod yet: starting, not failing"


def test_a_startup_failure_names_vllms_error_line() -> None:
    snap = snapshot([pod("a", ready=False, waiting="CrashLoopBackOff", restarts=3, last=STARTUP_FAILED)])
    d = diagnose(snap, S).pools["short"]
    assert d.state is State.STARTUP_FAILED
    assert d.pods[0].message == ("pod a: StartupFailed: exit code 82, reason Error, " + FA3_LINE
                                 + " (waiting: CrashLoopBackOff)")


def test_an_unresponsive_engine_is_not_available_and_named() -> None:
    diag = diagnose(snapshot([pod("a"), pod("b")], {"a": zombie("a"), "b": busy("b")}), S)
    pool = diag.pools["short"]
    a = pool.pods[0]
    assert (a.state, a.available, a.metrics_fresh) == (State.ENGINE_UNRESPONSIVE, False, True)
    assert "probes" in a.message and "/health" in a.message
    assert pool.available == 1 and pool.metrics_fresh


def test_a_failed_fetch_names_its_reason_and_container() -> None:
    """The pod's facts are the fetch container's while it has not finished: its termination keys and message."""
    obj = fetching("a", waiting="CrashLoopBackOff", restarts=3, last=fetch_term(
        constants.REASON_MODEL_ACCESS_DENIED, "test-org/gated@main is gated: the token's account has not been "
                                              "granted access"))
    facts = pod_facts(obj)
    assert facts.container_name == constants.FETCH_CONTAINER and facts.restart_count == 3
    d = diagnose(snapshot([obj]), S).pools["short"]
    assert d.state is State.MODEL_ACCESS_DENIED
    assert d.pods[0].message == ("pod a: ModelAccessDenied: exit code 79, reason Error, test-org/gated@main is "
                                 "gated: the token's account has not been granted access (waiting: "
                                 "CrashLoopBackOff)")
    assert d.terminations[0].key == f"uid-a/{constants.FETCH_CONTAINER}/3"


def test_a_pod_fetching_its_weights_says_so() -> None:
    """Without the fetch's metrics (Prometheus off or not scraped yet), the message still names the fetch."""
    d = diagnose(snapshot([fetching("a")], prometheus=False), S).pools["short"]
    assert d.pods[0].state is State.STARTING
    assert d.pods[0].message == f"pod a is fetching its weights ({constants.FETCH_CONTAINER} running for 10s)"
