"""The rendered PrometheusRule against the real promtool: every example's rules load (`promtool check rules`), and each
of the six alerts fires on synthetic series and stays quiet on healthy ones (`promtool test rules`), with vLLM series
under both the `vllm:` and the escaped `vllm_` spelling and the OOM alert from either the operator's restart counter
or kube-state-metrics."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLE_FILES
from tests.unit.rendering.plans import make_plan
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.rendering import alerts, cli

SEL = 'namespace="ml",vllmdeployment="chat"'


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_rules_load(example: Path, tmp_path: Path) -> None:
    objects, _ = cli.render_documents(cli.load_documents(str(example)))
    rule = next(o for o in objects if o["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 6 rules found" in proc.stdout


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{labels}}}", "values": values}


def expect(alert: str, at: str, *labels: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": lab} for lab in labels]}


ENGINE = {"namespace": "ml", "vllmdeployment": "chat"}


def test_alerts_fire_and_stay_quiet(tmp_path: Path) -> None:
    plan = make_plan()  # chat in ml, both pools enabled
    rules = tmp_path / "rules.yaml"
    # promtool compares annotations too when given; leave them out of the expectations by dropping them here.
    groups = alerts.alert_groups(plan)
    for rule in groups[0]["rules"]:
        rule.pop("annotations")
    rules.write_text(yaml.safe_dump({"groups": groups}))
    short_p1 = f'{SEL},pool="short",pod="p1"'
    long_p2 = f'{SEL},pool="long",pod="p2"'
    router = f'{SEL},pod="router-1"'  # no pool label: never an engine alert
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            # OOM: the operator's counter (long pool, EngineOOM) and kube-state-metrics only (short pool).
            series("vllm_operator_engine_restarts_total",
                   'namespace="ops",target_namespace="ml",vllmdeployment="chat",pool="long",reason="EngineOOM"',
                   "0+1x30"),
            series("kube_pod_container_status_restarts_total",
                   'namespace="ml",container="engine",pod="chat-short-7d9f8b6c4-x2k9p"', "0+1x30"),
            series("kube_pod_container_status_last_terminated_reason",
                   'namespace="ml",container="engine",pod="chat-short-7d9f8b6c4-x2k9p",reason="OOMKilled"', "1x30"),
            # Scrape down: p2 from minute 20; the router target is down too but is not an engine.
            series("up", long_p2, "1x19 0x10"),
            series("up", short_p1, "1x30"),
            series("up", router, "0x30"),
            # Stall on p1 (colon spelling): requests running, tokens flat from minute 10.
            series("vllm:num_requests_running", short_p1, "2x30"),
            series("vllm:generation_tokens_total", short_p1, "0+100x10 1000x20"),
            # p3 idles (no requests, no tokens) until a request arrives at minute 20 and makes no progress.
            series("vllm:num_requests_running", f'{SEL},pool="short",pod="p3"', "0x19 1x11"),
            series("vllm:generation_tokens_total", f'{SEL},pool="short",pod="p3"', "0x30"),
            # Length share on p2 (underscore spelling): 3 of 10 finished requests hit the cap; p1 0 of 10.
            series("vllm_request_success_total", f'{long_p2},finished_reason="length"', "0+3x30"),
            series("vllm_request_success_total", f'{long_p2},finished_reason="stop"', "0+7x30"),
            series("vllm:request_success_total", f'{short_p1},finished_reason="length"', "0x30"),
            series("vllm:request_success_total", f'{short_p1},finished_reason="stop"', "0+10x30"),
            # KV usage, judged as the health loop judges it (the mean over windowSeconds, 10m, at 0.95 or above):
            # p2 moderate, then full from minute 10; p4 swings between 100 % and 93 % at every scrape (mean 96.5 %),
            # which an instant value held for 10m never caught; p1 moderate.
            series("vllm_kv_cache_usage_perc", long_p2, "0.5x9 0.97x21"),
            series("vllm:kv_cache_usage_perc", f'{SEL},pool="short",pod="p4"', " ".join(["1 0.93"] * 16)),
            series("vllm:kv_cache_usage_perc", short_p1, "0.5x30"),
            # The wrapper's idle probe: p5 flagged unresponsive from minute 15; the router target's 1 never counts.
            series("vllm_operator_engine_unresponsive", f'{SEL},pool="long",pod="p5"', "0x14 1x16"),
            series("vllm_operator_engine_unresponsive", short_p1, "0x30"),
            series("vllm_operator_engine_unresponsive", router, "1x30"),
        ],
        "alert_rule_test": [
            expect("VLLMEngineOOMRestarts", "1m"),  # one OOM restart: below oomCount (2)
            expect("VLLMEngineOOMRestarts", "6m",
                   {"severity": "warning", "target_namespace": "ml", "vllmdeployment": "chat", "pool": "long"},
                   {"severity": "warning", "target_namespace": "ml", "vllmdeployment": "chat", "pool": "short"}),
            expect("VLLMEngineScrapeDown", "19m"),
            expect("VLLMEngineScrapeDown", "21m", {"severity": "critical", **ENGINE, "pool": "long", "pod": "p2"}),
            expect("VLLMNoTokenProgress", "9m"),
            expect("VLLMNoTokenProgress", "11m"),  # tokens flat only since minute 10: not yet a whole window
            expect("VLLMNoTokenProgress", "12m", {"severity": "critical", **ENGINE, "pool": "short", "pod": "p1"}),
            # p3: the request that arrived at an idle engine is not a stall at once, only after a whole window.
            expect("VLLMNoTokenProgress", "20m", {"severity": "critical", **ENGINE, "pool": "short", "pod": "p1"}),
            expect("VLLMNoTokenProgress", "22m", {"severity": "critical", **ENGINE, "pool": "short", "pod": "p1"},
                   {"severity": "critical", **ENGINE, "pool": "short", "pod": "p3"}),
            expect("VLLMEngineUnresponsive", "14m"),
            expect("VLLMEngineUnresponsive", "15m", {"severity": "critical", **ENGINE, "pool": "long", "pod": "p5"}),
            expect("VLLMLengthShareHigh", "8m"),  # above the share, but not yet for 10 minutes
            expect("VLLMLengthShareHigh", "16m", {"severity": "warning", **ENGINE, "pool": "long"}),
            # p2: one moderate sample left in the window at 18m keeps the mean below; a full window at 20m fires.
            expect("VLLMKVCacheUsageHigh", "18m", {"severity": "info", **ENGINE, "pool": "short", "pod": "p4"}),
            expect("VLLMKVCacheUsageHigh", "20m", {"severity": "info", **ENGINE, "pool": "long", "pod": "p2"},
                   {"severity": "info", **ENGINE, "pool": "short", "pod": "p4"}),
        ],
    }, {
        # Pods of another deployment whose name shares the prefix, and OOMs of another container, never count.
        "interval": "1m",
        "input_series": [
            series("kube_pod_container_status_restarts_total",
                   'namespace="ml",container="engine",pod="chatty-short-7d9f8b6c4-aaaaa"', "0+5x30"),
            series("kube_pod_container_status_last_terminated_reason",
                   'namespace="ml",container="engine",pod="chatty-short-7d9f8b6c4-aaaaa",reason="OOMKilled"', "1x30"),
            series("kube_pod_container_status_restarts_total",
                   'namespace="ml",container="sidecar",pod="chat-short-7d9f8b6c4-bbbbb"', "0+5x30"),
            series("kube_pod_container_status_last_terminated_reason",
                   'namespace="ml",container="sidecar",pod="chat-short-7d9f8b6c4-bbbbb",reason="OOMKilled"', "1x30"),
            series("vllm_operator_engine_restarts_total",
                   'namespace="ops",target_namespace="ml",vllmdeployment="chat",pool="long",reason="Error"',
                   "0+5x30"),
        ],
        "alert_rule_test": [expect("VLLMEngineOOMRestarts", "6m")],
    }, {
        # kube-state-metrics only, operator down: the wrapper's EngineOOM exit code 87 (the kubelet says "Error").
        "interval": "1m",
        "input_series": [
            series("kube_pod_container_status_restarts_total",
                   'namespace="ml",container="engine",pod="chat-long-5f6d7c8b9-ccccc"', "0+1x30"),
            series("kube_pod_container_status_last_terminated_reason",
                   'namespace="ml",container="engine",pod="chat-long-5f6d7c8b9-ccccc",reason="Error"', "1x30"),
            series("kube_pod_container_status_last_terminated_exitcode",
                   'namespace="ml",container="engine",pod="chat-long-5f6d7c8b9-ccccc"', "87x30"),
            # An engine that exits 1 (not an OOM) restarting as often never counts.
            series("kube_pod_container_status_restarts_total",
                   'namespace="ml",container="engine",pod="chat-short-7d9f8b6c4-ddddd"', "0+1x30"),
            series("kube_pod_container_status_last_terminated_exitcode",
                   'namespace="ml",container="engine",pod="chat-short-7d9f8b6c4-ddddd"', "1x30"),
        ],
        "alert_rule_test": [
            expect("VLLMEngineOOMRestarts", "1m"),
            expect("VLLMEngineOOMRestarts", "2m",
                   {"severity": "warning", "target_namespace": "ml", "vllmdeployment": "chat", "pool": "long"}),
        ],
    }]}
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    proc = promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_oom_alert_uses_the_remediation_count_and_window(tmp_path: Path) -> None:
    """oomCount 3 within oomWindowSeconds 300: two OOMs in the window are quiet, the third fires, and OOMs that left
    the window stop counting — the health loop's step-down rule, not a constant of the renderer."""
    groups = alerts.alert_groups(make_plan(), HealthSettings(oom_count=3, oom_window_s=300))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{**groups[0], "rules": [
        {k: v for k, v in r.items() if k != "annotations"} for r in groups[0]["rules"]
        if r["alert"] == "VLLMEngineOOMRestarts"]}]}))
    labels = 'namespace="ops",target_namespace="ml",vllmdeployment="chat",pool="long",reason="EngineOOM"'
    fired = {"severity": "warning", "target_namespace": "ml", "vllmdeployment": "chat", "pool": "long"}
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        # One OOM a minute for three minutes (minutes 1-3), then none.
        "input_series": [series("vllm_operator_engine_restarts_total", labels, "0 1 2 3x30")],
        "alert_rule_test": [expect("VLLMEngineOOMRestarts", "2m"), expect("VLLMEngineOOMRestarts", "3m", fired),
                            expect("VLLMEngineOOMRestarts", "5m", fired), expect("VLLMEngineOOMRestarts", "9m")],
    }]}
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(tests))
    proc = promtool("test", "rules", str(test_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
