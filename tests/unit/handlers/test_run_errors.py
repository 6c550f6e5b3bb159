"""`vllm-operator run` set-up mistakes are one line on stderr and exit 2, never a chained traceback: no credentials
(no service account, no kubeconfig), an unusable kubeconfig, and a /healthz port another process holds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT

# Points at a loopback port nothing serves; the operator must stop before it ever connects.
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: t}}]
current-context: c
"""


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}}
    return subprocess.run([sys.executable, "-m", "vllm_operator.cli", "run", *args], cwd=ROOT,
                          env={**base, **env}, capture_output=True, text=True, timeout=60, check=False)


def assert_one_line(res: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert res.stderr.startswith("vllm-operator run: ")
    for text in expected:
        assert text in res.stderr, res.stderr


def test_no_kubeconfig_is_one_line(tmp_path: Path) -> None:
    res = run({"HOME": str(tmp_path)}, "--port", "0")
    assert_one_line(res, "no Kubernetes credentials", "~/.kube/config does not exist", "KUBECONFIG")


def test_unusable_kubeconfig_is_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("clusters: [\n")
    assert_one_line(run({"KUBECONFIG": str(broken)}, "--port", "0"), f"{broken} is unusable")
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    assert_one_line(run({"KUBECONFIG": str(empty)}, "--port", "0"), f"{empty} is unusable")


def test_busy_health_port_is_one_line_naming_the_port(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        res = run({"KUBECONFIG": str(kubeconfig)}, "--port", str(port), "--no-health")
    assert_one_line(res, f"cannot listen on 0.0.0.0:{port}", "already in use", "--port")
