"""What `make demo` and `make test` build, read from make's own dry run (`make -n`, which runs nothing).

Issue 37: `make demo` built KEDA, Prometheus and prometheus-operator (about half of its ~19 cold minutes) for a demo
that runs none of them; testcluster/demo.py starts only the control plane and the operator with --no-health.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT

BUILDS = ("build-cluster-bin.sh", "build-keda-bin.sh", "build-prometheus.sh", "build-prometheus-operator.sh")


def dry_run(target: str) -> list[str]:
    # -B: as on a fresh clone (every prerequisite out of date), so the venv recipe is listed too
    proc = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    return [next((b for b in BUILDS if f"scripts/{b}" in line), "") for line in proc.stdout.splitlines()]


def test_demo_builds_only_the_control_plane() -> None:
    assert [b for b in dry_run("demo") if b] == ["build-cluster-bin.sh"]


@pytest.mark.parametrize("target", ["test", "test-deps", "cluster-bin"])
def test_the_tests_still_build_everything(target: str) -> None:
    assert [b for b in dry_run(target) if b] == list(BUILDS)


def test_demo_imports_nothing_of_keda_or_prometheus() -> None:
    """The demo's own code (testcluster/demo.py and what it imports of testcluster) never reaches the launchers of
    the components `make demo` no longer builds."""
    code = ("import sys, testcluster.demo; print(' '.join(m for m in sys.modules if m.startswith('testcluster')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    loaded = set(proc.stdout.split())
    assert "testcluster.demo" in loaded
    assert loaded.isdisjoint({"testcluster.keda", "testcluster.prometheus", "testcluster.prometheus_operator"})


@pytest.mark.parametrize("target", ["test", "test-deps", "images"])
def test_the_tests_build_the_images(target: str) -> None:
    proc = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert "scripts/build-images.sh" in proc.stdout


def test_demo_builds_no_image() -> None:
    proc = subprocess.run(["make", "-n", "-B", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=True)
    assert "build-images.sh" not in proc.stdout
