"""The wrapper gives vLLM's processes the AMX tile permission (vllm_operator/engine/amx.py says why), down to the
processes vLLM starts with `spawn` as its CPU build does, and an image's own `sitecustomize` still runs.

The child here is a stand-in with the process shape of vLLM on CPU: a Python process that starts another with the
`spawn` start method (fork + exec, which drops the permission) and both print what `arch_prctl(ARCH_GET_XCOMP_PERM)`
says. On a host whose CPU has no AMX tiles the wrapper must leave the environment alone, and that is checked there
instead; the machines this project runs on have them (Sapphire Rapids and later).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_operator.engine import amx, childsite

pytestmark = pytest.mark.integration

XTILEDATA = 1 << 18
CHILD = r"""
import ctypes, json, multiprocessing, os, sys

def perm():
    value = ctypes.c_ulong(0)
    ctypes.CDLL(None).syscall(158, 0x1022, ctypes.byref(value))  # ARCH_GET_XCOMP_PERM
    return value.value

def report(queue):
    queue.put({"perm": perm(), "image_site": os.environ.get("IMAGE_SITE_RAN")})

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=report, args=(queue,))
    proc.start()
    spawned = queue.get(timeout=60)
    proc.join()
    print("REPORT " + json.dumps({"main": {"perm": perm(), "image_site": os.environ.get("IMAGE_SITE_RAN")},
                                  "spawned": spawned, "pythonpath": os.environ.get("PYTHONPATH", ""),
                                  "amx_switch": os.environ.get("VLLM_OPERATOR_AMX_TILE")}))
"""


def run_wrapped(tmp_path: Path) -> dict[str, object]:
    """The wrapper around CHILD, with an image's own sitecustomize on PYTHONPATH that marks the environment."""
    image_site = tmp_path / "image-site"
    image_site.mkdir()
    (image_site / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE_RAN'] = str(os.getpid())\n")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{Path(amx.__file__).parents[2]}:{image_site}"}
    done = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=off", "--status-port=0",
                           f"--termination-message-path={tmp_path / 'termination-log'}", "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=120, check=False, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, done.stdout + done.stderr
    report: dict[str, object] = json.loads(lines[0].removeprefix("REPORT "))
    report["wrapper_log"] = done.stderr
    return report


def test_vllms_spawned_processes_may_use_amx_tiles_and_the_images_sitecustomize_still_runs(tmp_path: Path) -> None:
    report = run_wrapped(tmp_path)
    main, spawned = report["main"], report["spawned"]
    assert isinstance(main, dict) and isinstance(spawned, dict)
    # the image's own sitecustomize ran in both processes, whatever the CPU
    assert main["image_site"] and spawned["image_site"] and main["image_site"] != spawned["image_site"]
    assert str(report["pythonpath"]).split(":")[0] == str(childsite.SITE_DIR)
    if amx.host_has_amx_tile():
        assert main["perm"] & XTILEDATA, report
        assert spawned["perm"] & XTILEDATA, report
        assert report["amx_switch"] == "1"
        assert "This CPU has AMX tiles" in str(report["wrapper_log"])
    else:
        assert report["amx_switch"] is None, report
