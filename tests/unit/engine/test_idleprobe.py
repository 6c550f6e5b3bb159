"""idleprobe.py's pure parts: reading vLLM's numbers, when a probe is due, and what probes add up to."""

from __future__ import annotations

import pytest

from vllm_operator.engine import idleprobe
from vllm_operator.engine.idleprobe import FAILED, OK, UNSUPPORTED, EngineLoad, IdleProber, ProbeResult, ProbeSettings

METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 7.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
"""

S = ProbeSettings(idle_after_s=60, timeout_s=30, failures=2)
IDLE = EngineLoad(running=0, waiting=0, generated=100)


def test_parse_load_sums_series_and_reads_both_spellings() -> None:
    assert idleprobe.parse_load(METRICS) == EngineLoad(running=3.0, waiting=0.0, generated=1234.0)
    escaped = METRICS.replace("vllm:", "vllm_")
    assert idleprobe.parse_load(escaped) == EngineLoad(running=3.0, waiting=0.0, generated=1234.0)
    assert idleprobe.parse_load("vllm:num_requests_running 0\n") is None  # missing series: nothing to judge


def test_the_probe_ends_as_stop_not_length() -> None:
    """One allowed token that is also a stop token: finished_reason stop, so the RunawayGeneration share (length)
    is not fed by probes."""
    body = idleprobe.probe_body("m")
    assert body["max_tokens"] == 1 and body["allowed_token_ids"] == body["stop_token_ids"] == [0]


def serving(at: float = 0.0, settings: ProbeSettings = S) -> IdleProber:
    p = IdleProber(settings)
    p.start_serving(at)
    p.observe(IDLE, at)
    return p


def fail(p: IdleProber, now: float, generated_meanwhile: bool = False) -> None:
    p.record(ProbeResult(FAILED, "no answer", 30.0), generated_meanwhile, now)


# (events, due at the end?) — events: ("observe", t, running, waiting, generated) | ("ok"|"fail", t)
DUE_ROWS: dict[str, tuple[list[tuple[object, ...]], float, bool]] = {
    "not-before-idle-long-enough": ([], 59, False),
    "idle-long-enough": ([], 60, True),
    "tokens-restart-the-idle-clock": ([("observe", 30, 0, 0, 150)], 80, False),
    "busy-is-never-probed": ([("observe", 30, 1, 0, 100)], 500, False),
    "waiting-is-never-probed": ([("observe", 30, 0, 3, 100)], 500, False),
    "long-prefill-no-tokens-still-not-probed": ([("observe", 10, 1, 0, 100), ("observe", 400, 1, 0, 100)], 400,
                                                False),
    "after-a-success-wait-again": ([("ok", 60)], 100, False),
    "after-a-success-due-again": ([("ok", 60)], 120, True),
    "after-a-failure-at-once": ([("fail", 90)], 91, True),
    "flagged-then-every-idle-period": ([("fail", 90), ("fail", 120)], 150, False),
    "flagged-probes-again-after-idle-period": ([("fail", 90), ("fail", 120)], 180, True),
}


@pytest.mark.parametrize(("events", "at", "due"), DUE_ROWS.values(), ids=DUE_ROWS.keys())
def test_when_a_probe_is_due(events: list[tuple[object, ...]], at: float, due: bool) -> None:
    p = serving()
    for event in events:
        kind, t = event[0], float(event[1])  # type: ignore[arg-type]
        if kind == "observe":
            running, waiting, generated = (float(x) for x in event[2:])  # type: ignore[arg-type]
            p.observe(EngineLoad(running, waiting, generated), t)
        elif kind == "ok":
            p.record(ProbeResult(OK, "one token", 0.1), False, t)
        else:
            fail(p, t)
    assert p.due(at) is due


def test_not_due_before_serving_or_when_off() -> None:
    assert not IdleProber(S).due(1000)
    off = serving(settings=ProbeSettings(idle_after_s=0))
    assert not off.settings.enabled and not off.due(10_000)


def test_failures_in_a_row_flag_the_engine_and_one_success_clears_it() -> None:
    p = serving()
    fail(p, 90)
    assert p.failures == 1 and not p.unresponsive
    fail(p, 121)
    assert p.unresponsive and p.to_json()["unresponsive"] is True
    p.record(ProbeResult(OK, "one token in 0.1s", 0.1), False, 200)
    assert p.failures == 0 and not p.unresponsive and p.last_success_at == 200


def test_a_failed_probe_while_the_engine_generated_is_not_a_failure() -> None:
    """A real request that arrived during the probe and produced tokens proves the engine alive."""
    p = serving()
    fail(p, 90, generated_meanwhile=True)
    fail(p, 130, generated_meanwhile=True)
    assert p.failures == 0 and not p.unresponsive


def test_tokens_seen_between_probes_clear_failures() -> None:
    p = serving()
    fail(p, 90)
    p.observe(EngineLoad(0, 0, 101), 95)
    assert p.failures == 0 and not p.due(96)


def test_an_unsupported_probe_stops_probing_and_never_flags() -> None:
    p = serving()
    p.record(ProbeResult(UNSUPPORTED, "vLLM answered the probe 404", 0.01), False, 60)
    assert not p.due(10_000) and not p.unresponsive
    assert p.to_json()["enabled"] is False and "404" in str(p.to_json()["unsupported"])


@pytest.mark.parametrize(("settings", "field"), [
    (ProbeSettings(idle_after_s=-1), "--idle-probe-after"),
    (ProbeSettings(timeout_s=0), "--idle-probe-timeout"),
    (ProbeSettings(failures=0), "--idle-probe-failures"),
])
def test_bad_settings_name_the_flag(settings: ProbeSettings, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        settings.validate()
