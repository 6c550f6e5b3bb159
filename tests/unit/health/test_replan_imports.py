"""Re-planning after an engine exit (exit code + termination message → diagnose → decide → plan) is pure code and runs
on a bare Python with the product's pure core: the GPU machine carries neither the Prometheus client nor the
Kubernetes client nor kopf (issue 28: benchmarks/gpu/replan.py failed there, because it took `ladder_views` from
`health/loop.py`, whose readers import `prometheus_api_client`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPLAN = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu" / "replan.py"
ABSENT = ("prometheus_api_client", "kubernetes", "kopf", "aiohttp", "urllib3", "requests")
PROBE = f"""
import importlib.abc, importlib.util, json, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {ABSENT!r}:
            raise ImportError(f"{{name}} is not installed here")
        return None

sys.meta_path.insert(0, Absent())
spec = importlib.util.spec_from_file_location("replan", {str(REPLAN)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import vllm_operator.health.rungs
print(json.dumps(sorted(m for m in sys.modules if m.startswith("vllm_operator."))))
"""


def test_replan_imports_without_the_metrics_and_kubernetes_clients() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "vllm_operator.health.loop" not in loaded
    assert "vllm_operator.health.source" not in loaded
    assert "vllm_operator.health.rungs" in loaded
