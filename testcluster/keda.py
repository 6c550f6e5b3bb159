"""KEDA on a running testcluster: its operator and metrics server as processes in the cluster's network namespace.

Built by `scripts/build-keda-bin.sh` (make cluster-bin) from the pinned module in cluster/keda; its CRDs and RBAC are
the files of the same module version's `config/` folder, copied next to the binaries. What differs from KEDA's own
manifests, because there are no pods, no kubelet and no cluster DNS here:

- Both binaries run as the `keda/keda-operator` ServiceAccount (a TokenRequest token in a kubeconfig), so KEDA's own
  ClusterRoles decide what they may do, as in a cluster.
- Certificates are made here (one CA, one leaf with the names KEDA's components dial) instead of by KEDA's cert
  rotation, which would write them to a Secret and patch the APIService: the operator's gRPC metrics service and the
  metrics server's client share that leaf (KEDA's mTLS), and the APIService carries the CA as its caBundle.
- The metrics server is reached the way the API server reaches any aggregated API with `--enable-aggregator-routing`:
  through the EndpointSlice of its Service, here a Service without selector and an EndpointSlice that names the
  namespace's address. The API server verifies the serving certificate against the Service's DNS name, which the
  leaf carries; nothing resolves that name.
- The metrics server dials the operator's gRPC service at its real address (`--metrics-service-address`), with the
  name in the certificate as the gRPC authority (`--metrics-service-grpc-authority`) rather than
  `keda-operator.keda.svc.cluster.local`.
- Every port is bound on the namespace's address, clear of the API server's 6443 and of pods' 8080.

The aggregator routing and the request-header (front-proxy) certificates the metrics server needs to trust the API
server are the launcher's own (testcluster/cluster.py); KEDA's metrics server reads them from the
`extension-apiserver-authentication` ConfigMap like any aggregated API server.

Processes are recorded in the cluster's state, so `Cluster.stop()` (and `python -m testcluster down`) stop them by PID
with the rest; `uninstall` stops only these two and removes the APIService, so that discovery does not report an
unavailable external.metrics API to later users of the same cluster.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testcluster import binaries, pki
from testcluster.binaries import ROOT
from testcluster.cluster import Cluster, ClusterError, _Launcher, _save, _tail, stop_processes

BUILD_SCRIPT = ROOT / "scripts" / "build-keda-bin.sh"
NAMESPACE = "keda"
SERVICE_ACCOUNT = "keda-operator"
METRICS_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
# Ports on the namespace's address (the API server has 6443; engine and router pods would use 8000/8080).
GRPC_PORT = 19666
OPERATOR_METRICS_PORT = 18080
OPERATOR_PROBE_PORT = 18081
ADAPTER_PORT = 17443
ADAPTER_METRICS_PORT = 18082
COMPONENTS = ("keda-operator", "keda-metrics-apiserver")


@dataclass(frozen=True)
class Keda:
    """KEDA's build directory (binaries + config/) and the cluster it was installed into."""

    directory: Path
    cluster: Cluster

    @property
    def grpc_address(self) -> str:
        return f"{self.cluster.netns.address}:{GRPC_PORT}"


def locate() -> Path:
    """KEDA's build directory; MissingBinaries naming `make cluster-bin` when it is not built."""
    return binaries.built_directory(BUILD_SCRIPT, "KEDA is", COMPONENTS, "VLLM_OPERATOR_KEDA_BIN")


def crd_files(directory: Path) -> list[Path]:
    return sorted((directory / "config" / "crd" / "bases").glob("*.yaml"))


def install_crds(cluster: Cluster, directory: Path) -> None:
    """KEDA's CRDs only (what a cluster with KEDA serves), Established."""
    for path in crd_files(directory):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in crd_files(directory):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        cluster.wait_established(name)


def _certificates(cluster: Cluster, directory: Path) -> tuple[Path, str]:
    """(cert dir holding ca.crt, tls.crt, tls.key; the CA as base64 for the APIService)."""
    certs = directory / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = pki.Authority(certs, "keda-ca")
    dns = tuple(f"{svc}.{NAMESPACE}.svc{suffix}" for svc in (METRICS_SERVICE, OPERATOR_SERVICE)
                for suffix in ("", ".cluster.local"))
    leaf = ca.issue("keda", OPERATOR_SERVICE, server=True, dns=dns, ips=(cluster.netns.address,))
    for src, dst in ((ca.pair.cert, "ca.crt"), (leaf.cert, "tls.crt"), (leaf.key, "tls.key")):
        (certs / dst).write_bytes(src.read_bytes())
    return certs, base64.b64encode(ca.pair.cert.read_bytes()).decode()


def _objects(cluster: Cluster, ca_bundle: str) -> list[dict[str, object]]:
    address = cluster.netns.address
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
         "spec": {"ports": [{"name": "https", "port": 443, "targetPort": ADAPTER_PORT}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE,
                      "labels": {"kubernetes.io/service-name": METRICS_SERVICE}},
         "addressType": "IPv4", "ports": [{"name": "https", "port": ADAPTER_PORT, "protocol": "TCP"}],
         "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": API_SERVICE},
         "spec": {"service": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "port": 443},
                  "group": "external.metrics.k8s.io", "version": "v1beta1", "caBundle": ca_bundle,
                  "groupPriorityMinimum": 100, "versionPriority": 100}},
    ]


def install(cluster: Cluster, *, ready_timeout: float = 120) -> Keda:
    """Install and start KEDA on `cluster`; returns once the external metrics API is served through the aggregator.

    On failure the two processes are stopped and the error names the component with its log's tail.
    """
    directory = locate()
    work = cluster.directory / "keda"
    work.mkdir(parents=True, exist_ok=True)
    install_crds(cluster, directory)
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("create", "serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE, check=False)
    config = directory / "config"
    for path in (config / "rbac" / "role.yaml", config / "rbac" / "role_binding.yaml",
                 config / "metrics-server" / "role.yaml", config / "metrics-server" / "role_binding.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    certs, ca_bundle = _certificates(cluster, work)
    docs = yaml.safe_dump_all(_objects(cluster, ca_bundle), sort_keys=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=docs)
    kubeconfig = cluster.token_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, work / "keda.kubeconfig", duration="24h")
    address = cluster.netns.address
    env = {"KUBECONFIG": str(kubeconfig), "POD_NAMESPACE": NAMESPACE, "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
           "WATCH_NAMESPACE": ""}
    launcher = _Launcher(cluster.netns, cluster.state)
    common = ["--zap-log-level=info", "--zap-encoder=console"]
    try:
        operator = launcher.spawn("keda-operator", [
            str(directory / "keda-operator"), f"--kubeconfig={kubeconfig}", "--leader-elect=false",
            f"--cert-dir={certs}",
            "--enable-cert-rotation=false", "--enable-webhook-patching=false", "--enable-apiservice-patching=false",
            f"--metrics-bind-address={address}:{OPERATOR_METRICS_PORT}",
            f"--health-probe-bind-address={address}:{OPERATOR_PROBE_PORT}",
            f"--metrics-service-bind-address={address}:{GRPC_PORT}", *common], env)
        adapter = launcher.spawn("keda-metrics-apiserver", [
            str(directory / "keda-metrics-apiserver"), f"--kubeconfig={kubeconfig}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--bind-address={address}",
            f"--secure-port={ADAPTER_PORT}", f"--port={ADAPTER_METRICS_PORT}",
            f"--cert-dir={certs}", f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}", f"--client-ca-file={cluster.ca_file}",
            f"--metrics-service-address={address}:{GRPC_PORT}",
            f"--metrics-service-grpc-authority={OPERATOR_SERVICE}.{NAMESPACE}.svc", *common], env)
        plain = ssl.create_default_context()
        plain.check_hostname = False
        plain.verify_mode = ssl.CERT_NONE
        launcher.wait("keda-operator", operator, f"http://{address}:{OPERATOR_PROBE_PORT}/readyz", plain,
                      ready_timeout)
        _wait_external_metrics(cluster, adapter, ready_timeout)
    except BaseException:
        _stop(cluster)
        raise
    return Keda(directory, cluster)


def _wait_external_metrics(cluster: Cluster, adapter: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if adapter.poll() is not None:
            raise ClusterError(f"keda-metrics-apiserver exited with {adapter.returncode}; its log ends:\n"
                               f"{_tail(cluster.log('keda-metrics-apiserver'))}")
        proc = cluster.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1", check=False)
        if proc.returncode == 0:
            return
        last = proc.stderr.strip()[-300:]
        time.sleep(0.5)
    raise ClusterError(f"the external metrics API was not served after {timeout:.0f} s (last: {last}); "
                       f"keda-metrics-apiserver's log ends:\n{_tail(cluster.log('keda-metrics-apiserver'))}")


def _stop(cluster: Cluster, grace: float = 10) -> None:
    """Stop KEDA's two processes (their recorded PIDs, checked to still be KEDA's binaries) and forget them."""
    state = cluster.state
    started = [(n, state.pids[n], state.binaries.get(n, "")) for n in COMPONENTS if n in state.pids]
    stop_processes([(pid, binary) for _, pid, binary in started], grace=grace)
    for name, _, _ in started:
        state.pids.pop(name, None)
    _save(state)


def uninstall(cluster: Cluster) -> None:
    """Stop KEDA and remove its APIService (its CRDs stay, as CRDs of a shared cluster do)."""
    _stop(cluster)
    cluster.kubectl("delete", "apiservice", API_SERVICE, "--ignore-not-found", check=False)


@contextlib.contextmanager
def running(cluster: Cluster, **kwargs: float) -> Iterator[Keda]:
    keda = install(cluster, **kwargs)
    try:
        yield keda
    finally:
        uninstall(cluster)


__all__ = ["Keda", "crd_files", "install", "install_crds", "locate", "running", "uninstall"]
