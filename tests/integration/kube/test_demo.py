"""`make demo`'s job (python -m testcluster.demo) end to end on its own real control plane: every example Ready
under the chart's RBAC, the real `kubectl get vllmd -A`, one edit refused by the API server (CEL) and one by the
operator (SpecValid=False) with the pods untouched, and nothing left running afterwards."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def test_demo_on_the_real_control_plane() -> None:
    proc = subprocess.run([sys.executable, "-m", "testcluster.demo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "All 5 VLLMDeployments Ready" in out
    assert "$ kubectl get vllmd -A\nNAMESPACE   NAME" in out
    assert "The VLLMDeployment \"chat\" is invalid: spec.pools: Invalid value: pools.short.maxModelLen must not " \
           "exceed pools.long.maxModelLen" in out
    assert "SpecValid=False (SpecInvalid): spec.pools.long.maxModelLen" in out
    assert "pods before and after: identical" in out
    netns = re.search(r"network namespace (vllmop-\d+)", out)
    assert netns, out[:500]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    assert netns.group(1) not in listed, "the demo left its network namespace behind"
