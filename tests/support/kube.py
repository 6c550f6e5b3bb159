"""Pytest wiring for the real control plane (testcluster): one cluster per test session, shared by every test.

Cluster-scoped objects (Nodes, the CRD, ClusterRoles) are shared, so tests isolate by namespace and by name: each
test makes its own namespaces (`unique`), gives its kwok nodes labels of its own and points its engine pods at them.
The operator under test runs as a subprocess with the ServiceAccount token the chart's RBAC binds
(`operator_process`), so anything outside the chart's rules is a real 403.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import binaries, cluster, nodes
from testcluster.cluster import Cluster, stop_child
from tests.support.paths import ROOT


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's real control plane (started on first use, stopped at the end of the session)."""
    with cluster.running(tmp_path_factory.mktemp("kube")) as running:
        yield running


def unique(prefix: str) -> str:
    """A DNS-1123 name no other test uses."""
    return f"{prefix}-{secrets.token_hex(3)}"


def helm(kube: Cluster, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([binaries.helm(), f"--kubeconfig={kube.kubeconfig}", *args], capture_output=True,
                          text=True, check=False, timeout=timeout, env=kube.env())
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def apply(kube: Cluster, *objects: dict[str, Any], namespace: str | None = None) -> str:
    """Server-side apply of objects as admin; returns kubectl's output."""
    ns = [f"--namespace={namespace}"] if namespace else []
    docs = yaml.safe_dump_all(list(objects), sort_keys=False)
    return kube.kubectl("apply", "--server-side", "--field-manager=tests", *ns, "-f", "-", input=docs).stdout


def add_gpu_nodes(kube: Cluster, prefix: str, count: int, *, label: dict[str, str], gpus: int = 4,
                  product: str = "NVIDIA-L4", memory_mib: int = 23034) -> list[str]:
    """kwok nodes labelled as GPU feature discovery labels real ones, plus the test's own label."""
    names = [f"{prefix}-{i}" for i in range(count)]
    apply(kube, *(nodes.node(name, labels=label, gpus=gpus, gpu_product=product, gpu_memory_mib=memory_mib)
                  for name in names))
    return names


def wait_for(what: str, check: Any, timeout: float = 60, interval: float = 0.25) -> Any:
    """Poll `check()` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@contextlib.contextmanager
def operator_process(kube: Cluster, kubeconfig: Path, log_path: Path, *args: str,
                     source: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """`vllm-operator run` as its own process with `kubeconfig` (a ServiceAccount token); stopped by its PID.
    `source`: another checkout whose `operator/` package runs instead of this one's (a benchmark's baseline)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1"}
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source / "operator"), *filter(None, [env.get("PYTHONPATH")])])
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "vllm_operator.cli", "run", "--port=0", *args],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        yield proc
    finally:
        stop_child(proc)


@dataclasses.dataclass(frozen=True)
class NamespacedRelease:
    """A `helm install` of the chart watching one namespace of its own, and its ServiceAccount's token."""

    name: str
    system: str  # where the chart lives
    watched: str  # the one namespace it watches
    kubeconfig: Path  # a TokenRequest token of the chart's ServiceAccount

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.system}:{self.name}-vllm-operator"


@contextlib.contextmanager
def namespaced_release(kube: Cluster, prefix: str, token_dir: Path) -> Iterator[NamespacedRelease]:
    """The chart namespaced to a fresh namespace (no built-in classes: other tests' releases own them), as the
    operator under test needs it on the shared cluster; uninstalled and both namespaces deleted afterwards."""
    name, system, watched = unique(f"vo{prefix}"), unique(f"vo{prefix}-sys"), unique(prefix)
    kube.kubectl("create", "namespace", watched)
    helm(kube, "install", name, str(ROOT / "charts" / "vllm-operator"), "--namespace", system, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}",
         "--set", "workloadClasses.builtins=false")
    token = kube.token_kubeconfig(system, f"{name}-vllm-operator", token_dir / "operator.kubeconfig")
    try:
        yield NamespacedRelease(name, system, watched, token)
    finally:
        helm(kube, "uninstall", name, "--namespace", system, check=False)
        kube.kubectl("delete", "namespace", watched, system, "--wait=false", check=False)
