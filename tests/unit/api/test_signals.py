"""One definition per signal: the health loop's queries and the alert rules read the same PromQL (api/signals.py),
with one range format and one selector builder that escapes what PromQL strings need escaped."""

from __future__ import annotations

import pytest
import yaml

from tests.support.paths import EXAMPLES
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.signals import Signals, duration, quote
from vllm_operator.health import queries
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import alerts


@pytest.mark.parametrize(("seconds", "text"), [(0, "1s"), (0.4, "1s"), (45, "45s"), (60, "1m"), (90, "90s"),
                                               (600, "10m"), (3600, "60m")])
def test_one_range_format(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_values_are_quoted_with_promql_escapes() -> None:
    assert quote('a"b\\c') == '"a\\"b\\\\c"'
    signals = Signals('n"s', "d", "pod, pool")
    assert 'namespace="n\\"s"' in signals.vllm("num_requests_running")
    assert signals.plain("up") == 'up{namespace="n\\"s", vllmdeployment="d", pool!=""}'


def test_the_alert_rules_threshold_the_health_loops_signals() -> None:
    the_plan = plan(parse_resource(yaml.safe_load((EXAMPLES / "chat.yaml").read_text())).spec, None,
                    RemediationState(), name="chat", namespace="ml")
    s = HealthSettings()
    rules = {r["alert"]: r["expr"] for r in alerts.alert_groups(the_plan, s)[0]["rules"]}
    loop = queries.for_deployment("ml", "chat", stall_s=s.stall_s, window_s=s.window_s)
    by = alerts.POD_LABELS
    assert Signals("ml", "chat", by).running_min(s.stall_s) in rules["VLLMNoTokenProgress"]
    assert Signals("ml", "chat", by).generated(s.stall_s) in rules["VLLMNoTokenProgress"]
    assert rules["VLLMKVCacheUsageHigh"] == f"{Signals('ml', 'chat', by).kv_usage_avg(s.window_s)} >= 0.95"
    assert rules["VLLMEngineScrapeDown"] == f"{Signals('ml', 'chat', by).up()} == 0"
    assert rules["VLLMEngineUnresponsive"] == f"{Signals('ml', 'chat', by).unresponsive()} >= 1"
    assert loop["unresponsive"] == Signals("ml", "chat", queries.BY_POD).unresponsive()
    assert "vllm_operator_engine_unresponsive{" in loop["unresponsive"] and 'pool!=""' in loop["unresponsive"]
    # The loop's own are the same expressions, grouped by (pod, pool) instead.
    assert loop["running_min"] == Signals("ml", "chat", queries.BY_POD).running_min(s.stall_s)
    assert loop["kv_usage_avg"].replace(queries.BY_POD, by) in rules["VLLMKVCacheUsageHigh"]
    assert loop["finished_length"].replace("by (pool)", f"by ({alerts.ENGINE_LABELS})") in rules["VLLMLengthShareHigh"]
