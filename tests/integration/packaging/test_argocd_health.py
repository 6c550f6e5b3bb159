"""The Argo CD health check (charts/vllm-operator/argocd/health.lua) run by a real Lua 5.4 interpreter.

The script runs the way Argo CD runs it: as a chunk with the global `obj` and only the base, table, string and math
libraries (no os, io, require), so a script that works here does not fail in Argo CD's sandbox for using them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.helm import CHART_DIR

HEALTH_LUA = CHART_DIR / "argocd" / "health.lua"

RUNNER = r"""
local path = arg[1]
local env = {
  obj = OBJ, ipairs = ipairs, pairs = pairs, next = next, type = type, tostring = tostring, tonumber = tonumber,
  select = select, error = error, pcall = pcall, table = table, string = string, math = math,
}
local f = io.open(path, "r")
local source = f:read("a")
f:close()
local chunk, err = load(source, "health.lua", "t", env)
if chunk == nil then
  io.stderr:write(err)
  os.exit(2)
end
local hs = chunk()
io.write(hs.status, "\n", hs.message or "", "\n")
"""


def lua_literal(value: Any) -> str:
    """A Lua table constructor for JSON-like data (what Argo CD hands the script)."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def run_health(obj: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    lua = shutil.which("lua5.4")
    assert lua, "lua5.4 missing: run scripts/install-test-deps.sh"
    runner = tmp_path / "runner.lua"
    runner.write_text(f"OBJ = {lua_literal(obj)}\n{RUNNER}")
    proc = subprocess.run([lua, str(runner), str(HEALTH_LUA)], capture_output=True, text=True, timeout=30,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    status, message = proc.stdout.split("\n", 1)
    return status, message.rstrip("\n")


def cond(type_: str, status: str, reason: str = "", message: str = "", generation: int | None = 3) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message,
                           "lastTransitionTime": "2026-01-01T00:00:00Z"}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def vllmd(conditions: list[dict[str, Any]] | None, *, generation: int = 3, observed: int | None = 3
          ) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMDeployment",
                           "metadata": {"name": "chat", "namespace": "llm", "generation": generation},
                           "spec": {"workloadClass": "chat"}}
    if conditions is not None:
        obj["status"] = {"conditions": conditions, "ready": "2/2"}
        if observed is not None:
            obj["status"]["observedGeneration"] = observed
    return obj


CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "no-status-yet": (vllmd(None), "Progressing", "Waiting for vllm-operator to reconcile"),
    "empty-conditions": (vllmd([]), "Progressing", "Waiting for vllm-operator to reconcile"),
    "ready": (vllmd([cond("Ready", "True", "AllReady", "short 1/1, long 1/1, router 1/1"),
                     cond("Progressing", "False", "Stable"), cond("Degraded", "False", "AsExpected"),
                     cond("SpecValid", "True", "Planned")]),
              "Healthy", "Ready=True (AllReady): short 1/1, long 1/1, router 1/1"),
    "ready-while-remediating": (vllmd([cond("Ready", "True", "AllReady"),
                                       cond("Remediating", "True", "SteppedDown", "short pool at rung 1")]),
                                "Healthy", "Remediating=True (SteppedDown): short pool at rung 1"),
    "rolling-out": (vllmd([cond("Ready", "False", "PodsNotReady", "short 0/1"),
                           cond("Progressing", "True", "RollingOut", "short pool 0/1 ready")]),
                    "Progressing", "Progressing=True (RollingOut): short pool 0/1 ready"),
    "not-ready-no-progressing": (vllmd([cond("Ready", "False", "PodsNotReady", "long 0/1")]),
                                 "Progressing", "Ready=False (PodsNotReady): long 0/1"),
    "spec-refused": (vllmd([cond("SpecValid", "False", "Unplannable",
                                 "spec.pools.long.maxModelLen: needs 16.0 GiB of KV cache"),
                            cond("Ready", "True", "AllReady")]),
                     "Degraded", "SpecValid=False (Unplannable): spec.pools.long.maxModelLen: needs 16.0 GiB"),
    "degraded": (vllmd([cond("Ready", "False", "PodsNotReady"),
                        cond("Degraded", "True", "RestartBudgetExhausted", "short pool: 5 restarts in 30m")]),
                 "Degraded", "Degraded=True (RestartBudgetExhausted): short pool: 5 restarts in 30m"),
    "stale-after-edit": (vllmd([cond("Ready", "True", "AllReady")], generation=4, observed=3),
                         "Progressing", "Waiting for vllm-operator to observe generation 4 (status is for 3)"),
    "stale-from-condition-only": (vllmd([cond("Ready", "True", "AllReady", generation=3)], generation=5,
                                        observed=None),
                                  "Progressing", "observe generation 5"),
    "unknown-ready": (vllmd([cond("Ready", "Unknown", "Reconciling")]), "Progressing", "Ready=Unknown"),
    "quotes-in-message": (vllmd([cond("Degraded", "True", "EngineOOM", 'vLLM said "CUDA out of memory"')]),
                          "Degraded", 'said "CUDA out of memory"'),
}


@pytest.mark.parametrize("obj,status,message", list(CASES.values()), ids=list(CASES))
def test_health(obj: dict[str, Any], status: str, message: str, tmp_path: Path) -> None:
    got_status, got_message = run_health(obj, tmp_path)
    assert got_status == status, got_message
    assert message in got_message


def test_script_uses_no_library_outside_argocd_sandbox() -> None:
    source = HEALTH_LUA.read_text()
    for banned in ("os.", "io.", "require", "dofile", "loadfile"):
        assert banned not in source, banned
