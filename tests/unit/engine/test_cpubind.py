"""engine/cpubind.py: a CPU engine without cores of its own leaves its OpenMP threads to the kernel, as many as its
CPU limit; one with a cpuset of its own (the static CPU manager) keeps vLLM's binding."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_operator.engine import cpubind

CPU = {"VLLM_TARGET_DEVICE": "cpu"}


@pytest.mark.parametrize(("env", "allowed", "quota", "expect"), [
    (CPU, 2, 1.0, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}),
    (CPU, 64, 4.0, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "4"}),
    (CPU, 64, 2.5, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"}),
    (CPU, 8, 0.5, {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}),
    (CPU, 4, 4.0, None),  # the static CPU manager's cpuset: exactly its cores
    (CPU, 2, None, None),  # no CPU limit
    ({}, 64, 4.0, None),  # a GPU engine (no VLLM_TARGET_DEVICE=cpu)
    ({**CPU, "VLLM_CPU_OMP_THREADS_BIND": "0-3"}, 64, 4.0, None),  # the pod's own choice
    ({**CPU, "OMP_NUM_THREADS": "8"}, 64, 4.0, None),
    ({**CPU, "VLLM_OPERATOR_CPU_BIND": "0"}, 64, 4.0, None),  # turned off
], ids=["e2e-node", "big-node", "fractional", "below-one", "own-cpuset", "no-limit", "gpu", "pod-binds", "pod-threads",
        "off"])
def test_binding(env: dict[str, str], allowed: int, quota: float | None, expect: dict[str, str] | None) -> None:
    found = cpubind.binding(env, allowed, quota)
    assert (None if found is None else dict(found.env)) == expect
    if found is not None:
        assert f"{allowed} CPUs" in found.reason


def test_quota_is_read_from_cgroup_v1_and_v2(tmp_path: Path) -> None:
    v1 = tmp_path / "v1" / "cpu,cpuacct"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpubind.quota_cpus(tmp_path / "v1") == 1.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpubind.quota_cpus(tmp_path / "v1") is None
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("200000 100000\n")
    assert cpubind.quota_cpus(v2) == 2.0
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpubind.quota_cpus(v2) is None
    assert cpubind.quota_cpus(tmp_path / "none") is None


def test_child_env_adds_the_binding_to_vllms_environment(tmp_path: Path) -> None:
    v2 = tmp_path / "cg"
    v2.mkdir()
    (v2 / "cpu.max").write_text("50000 100000\n")
    env, found = cpubind.child_env({**CPU, "PATH": "/bin"}, v2)  # any process may run on at least 1 CPU > 0.5
    assert found is not None and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"] == "/bin"
