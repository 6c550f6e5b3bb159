"""prometheus-operator on a running testcluster: its operator as a process in the cluster's network namespace.

Built by `scripts/build-prometheus-operator.sh` (make cluster-bin) from the pinned module in
cluster/prometheus-operator; its monitoring.coreos.com CRDs and its ClusterRole are the files of the same module
version (`example/prometheus-operator-crd`, `example/rbac/prometheus-operator`), copied next to the binary. What
differs from the operator's own Deployment, because there are no pods for it here:

- It runs as the `<namespace>/prometheus-operator` ServiceAccount (a TokenRequest token in a kubeconfig, which the
  operator reads from $KUBECONFIG), bound to the upstream ClusterRole unchanged, so the grants it works with are the
  ones a cluster gives it.
- It watches only the namespace it is installed for (`--namespaces`), so tests sharing the cluster do not see each
  other's monitoring objects, and its web server (/healthz, /metrics) is bound on the namespace's address, clear of
  KEDA's ports and of pods' 8000/8080.

What the operator produces for a `Prometheus` object is what the tests read: the generated configuration Secret
(`prometheus-<name>`, key `prometheus.yaml.gz`) and the rule files ConfigMaps (`prometheus-<name>-rulefiles-N`).
The StatefulSet it also writes runs nothing here unless something can run Prometheus' image; tests set
`spec.replicas: 0` and run the built Prometheus themselves on the generated configuration.

The process is recorded in the cluster's state, so `Cluster.stop()` (and `python -m testcluster down`) stops it by PID
with the rest; `uninstall` stops only it and removes the CRDs that `install` created.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries
from testcluster.binaries import ROOT
from testcluster.cluster import Cluster, ClusterError, _Launcher, _save, stop_processes

BUILD_SCRIPT = ROOT / "scripts" / "build-prometheus-operator.sh"
SERVICE_ACCOUNT = "prometheus-operator"
CLUSTER_ROLE = "prometheus-operator"
COMPONENT = "prometheus-operator"
WEB_PORT = 18083
"""On the namespace's address: the API server has 6443, KEDA 18080-18082 and 19666, pods 8000/8080."""


@dataclass(frozen=True)
class PrometheusOperator:
    """The build directory (binary, crd/, rbac/), the cluster and the namespace the operator watches."""

    directory: Path
    cluster: Cluster
    namespace: str
    created_crds: tuple[str, ...] = ()
    """The monitoring.coreos.com CRDs this install created (absent before), which `uninstall` removes again."""

    def generated_config(self, prometheus: str) -> dict[str, Any] | None:
        """The Prometheus configuration the operator generated for `prometheus` (None until it has)."""
        proc = self.cluster.kubectl("get", "secret", f"prometheus-{prometheus}", "-n", self.namespace, "-o", "json",
                                    check=False)
        if proc.returncode != 0:
            return None
        data = (json.loads(proc.stdout).get("data") or {}).get("prometheus.yaml.gz")
        if not data:
            return None
        config: dict[str, Any] = yaml.safe_load(gzip.decompress(base64.b64decode(data)))
        return config

    def rule_files(self, prometheus: str) -> dict[str, str]:
        """Every rule file the operator generated for `prometheus` (file name -> content, from its ConfigMaps)."""
        proc = self.cluster.kubectl("get", "configmaps", "-n", self.namespace, "-o", "json")
        files: dict[str, str] = {}
        for cm in json.loads(proc.stdout)["items"]:
            if cm["metadata"]["name"].startswith(f"prometheus-{prometheus}-rulefiles-"):
                files.update(cm.get("data") or {})
        return files


def locate() -> Path:
    """The build directory; MissingBinaries naming `make cluster-bin` when it is not built."""
    return binaries.built_directory(BUILD_SCRIPT, "prometheus-operator is", (COMPONENT,),
                                    "VLLM_OPERATOR_PROMETHEUS_OPERATOR_BIN")


def crd_files(directory: Path) -> list[Path]:
    return sorted((directory / "crd").glob("*.yaml"))


def _crd_name(path: Path) -> str:
    """metadata.name of a CRD file, read without a YAML parser: these files hold enum values (`=`) that PyYAML's
    YAML 1.1 loader refuses."""
    match = re.search(r"^metadata:\n(?:[ ].*\n)*?  name: (\S+)$", path.read_text(), re.MULTILINE)
    if match is None:
        raise ClusterError(f"{path}: no metadata.name")
    return match.group(1)


def install_crds(cluster: Cluster, directory: Path) -> tuple[str, ...]:
    """The monitoring.coreos.com CRDs of the built version (all of them: the operator checks each kind it serves),
    Established; returns the names of those that were absent."""
    names = [_crd_name(path) for path in crd_files(directory)]
    present = set(cluster.kubectl("get", "crd", "-o", "name").stdout.split())
    for path in crd_files(directory):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for name in names:
        cluster.wait_established(name)
    return tuple(n for n in names if f"customresourcedefinition.apiextensions.k8s.io/{n}" not in present)


def _binding(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{CLUSTER_ROLE}-{namespace}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]}


def install(cluster: Cluster, namespace: str, *, ready_timeout: float = 120) -> PrometheusOperator:
    """CRDs, the upstream ClusterRole bound to a ServiceAccount in `namespace` (which must exist), and the operator
    watching `namespace`; returns once its /healthz answers. On failure the process is stopped and the error carries
    its log's tail."""
    directory = locate()
    work = cluster.directory / f"prometheus-operator-{namespace}"
    work.mkdir(parents=True, exist_ok=True)
    created = install_crds(cluster, directory)
    cluster.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", namespace, check=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                    str(directory / "rbac" / "prometheus-operator-cluster-role.yaml"))
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(_binding(namespace)))
    kubeconfig = cluster.token_kubeconfig(namespace, SERVICE_ACCOUNT, work / "kubeconfig", duration="24h")
    address = cluster.netns.address
    launcher = _Launcher(cluster.netns, cluster.state)
    try:
        proc = launcher.spawn(COMPONENT, [
            str(directory / COMPONENT), f"--namespaces={namespace}", f"--web.listen-address={address}:{WEB_PORT}",
            "--log-level=info", "--log-format=logfmt"], {"KUBECONFIG": str(kubeconfig)})
        launcher.wait(COMPONENT, proc, f"http://{address}:{WEB_PORT}/healthz", ssl.create_default_context(),
                      ready_timeout)
    except BaseException:
        _stop(cluster)
        raise
    return PrometheusOperator(directory, cluster, namespace, created)


def _stop(cluster: Cluster, grace: float = 10) -> None:
    state = cluster.state
    if COMPONENT not in state.pids:
        return
    stop_processes([(state.pids[COMPONENT], state.binaries.get(COMPONENT, ""))], grace=grace)
    state.pids.pop(COMPONENT, None)
    _save(state)


def uninstall(operator: PrometheusOperator) -> None:
    """Stop the operator, remove its binding and the CRDs its install created: other tests of a shared cluster see
    the monitoring.coreos.com group absent, as they did before (the operator drops its PodMonitor then)."""
    cluster = operator.cluster
    _stop(cluster)
    cluster.kubectl("delete", "clusterrolebinding", f"{CLUSTER_ROLE}-{operator.namespace}", "--ignore-not-found",
                    check=False)
    for name in operator.created_crds:
        cluster.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)


@contextlib.contextmanager
def running(cluster: Cluster, namespace: str, **kwargs: float) -> Iterator[PrometheusOperator]:
    operator = install(cluster, namespace, **kwargs)
    try:
        yield operator
    finally:
        uninstall(operator)


__all__ = ["ClusterError", "PrometheusOperator", "crd_files", "install", "install_crds", "locate", "running",
           "uninstall"]
