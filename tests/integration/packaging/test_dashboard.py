"""The Grafana dashboard: every PromQL expression parses with the real promtool, every panel follows the label
contract, vLLM metric names match both spellings, and the key expressions compute the right numbers
(`promtool test rules` on synthetic series, half of them stored under the underscore names)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.helm import CHART_DIR

DASHBOARD = CHART_DIR / "dashboards" / "vllm-deployment.json"
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$namespace": "ns",
                "$vllmdeployment": "dep"}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panel_targets() -> list[tuple[str, str]]:
    """(panel title/refId, expr) of every panel query."""
    out = []
    for panel in load()["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']}/{target['refId']}", target["expr"]))
    return out


def all_exprs() -> list[tuple[str, str]]:
    """Panel queries, annotation queries and the selectors inside templating label_values()."""
    data = load()
    exprs = panel_targets()
    exprs += [(f"annotation {a['name']}", a["expr"]) for a in data["annotations"]["list"]]
    for var in data["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+), *(\w+)\)", var["query"]["query"])
            assert match, var["name"]
            exprs.append((f"variable {var['name']}", match.group(1)))
    return exprs


def substitute(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, check=False, timeout=60)


def test_every_expression_parses_with_promtool(tmp_path: Path) -> None:
    exprs = all_exprs()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": substitute(expr)} for i, (_, expr) in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


@pytest.mark.parametrize("where,expr", panel_targets(), ids=[w for w, _ in panel_targets()])
def test_every_panel_is_scoped_by_the_label_contract(where: str, expr: str) -> None:
    assert 'vllmdeployment="$vllmdeployment"' in expr, where
    assert 'namespace="$namespace"' in expr, where  # target_namespace for the operator's own series
    assert re.search(r"by \((?:[^)]*\b)?pool\b", expr) or "by (reason)" in expr, f"{where}: not split by pool"


def test_vllm_metric_names_match_both_spellings() -> None:
    for where, expr in all_exprs():
        for alternation in re.findall(r'__name__=~"([^"]+)"', expr):
            names = set(alternation.split("|"))
            for name in names:
                assert name.startswith(("vllm:", "vllm_")), (where, name)
                twin = name.replace("vllm:", "vllm_", 1) if name.startswith("vllm:") else "vllm:" + name[5:]
                assert twin in names, f"{where}: {name} without {twin}"
        assert not re.search(r"(?<![\"|~])vllm:\w+", expr.replace('=~"', '=~"|')), f"{where}: bare colon name"


def test_panels_cover_the_issue_list() -> None:
    titles = " / ".join(p["title"].lower() for p in load()["panels"])
    for needed in ("finished_reason", "length share", "time to first token", "inter-token", "kv cache usage",
                   "preemptions", "engine restarts", "step-down", "clamps", "refusals"):
        assert needed in titles, needed


def find_expr(title: str) -> str:
    (expr,) = [e for w, e in panel_targets() if w.startswith(title + "/")]
    return substitute(expr)


def test_key_expressions_compute_the_right_numbers(tmp_path: Path) -> None:
    """Short pool stored as `vllm:` names, long pool as `vllm_` names: both come out right."""
    base = 'namespace="ns", vllmdeployment="dep"'
    other = 'namespace="ns", vllmdeployment="other"'
    rules = {"groups": [{"name": "t", "rules": [
        {"record": "dashboard:length_share", "expr": find_expr("Length share per pool")},
        {"record": "dashboard:kv_usage", "expr": find_expr("KV cache usage per pod")},
    ]}]}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'vllm:request_success_total{{{base}, pool="short", finished_reason="length"}}',
                 "values": "0+60x20"},
                {"series": f'vllm:request_success_total{{{base}, pool="short", finished_reason="stop"}}',
                 "values": "0+180x20"},
                {"series": f'vllm_request_success_total{{{base}, pool="long", finished_reason="length"}}',
                 "values": "0+30x20"},
                {"series": f'vllm_request_success_total{{{base}, pool="long", finished_reason="stop"}}',
                 "values": "0+30x20"},
                {"series": f'vllm:request_success_total{{{other}, pool="short", finished_reason="length"}}',
                 "values": "0+600x20"},
                {"series": f'vllm:kv_cache_usage_perc{{{base}, pool="short", pod="s-0"}}', "values": "0.5x20"},
                {"series": f'vllm_gpu_cache_usage_perc{{{base}, pool="long", pod="l-0"}}', "values": "0.75x20"},
            ],
            "promql_expr_test": [
                {"expr": "dashboard:length_share", "eval_time": "10m", "exp_samples": [
                    {"labels": 'dashboard:length_share{pool="short"}', "value": 0.25},
                    {"labels": 'dashboard:length_share{pool="long"}', "value": 0.5}]},
                {"expr": "dashboard:kv_usage", "eval_time": "10m", "exp_samples": [
                    {"labels": 'dashboard:kv_usage{pool="short", pod="s-0"}', "value": 0.5},
                    {"labels": 'dashboard:kv_usage{pool="long", pod="l-0"}', "value": 0.75}]},
            ],
        }],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = promtool("test", "rules", str(tmp_path / "tests.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
