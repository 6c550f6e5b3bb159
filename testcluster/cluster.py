"""Start and stop one upstream control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok).

Every component runs inside the cluster's own network namespace (testcluster.netns), entered through the cluster's
pin of it with `nsenter --net=`, which execs the binary, so the PID recorded in `state.json` is the component's own.
Stopping sends SIGTERM to those PIDs (SIGKILL after a grace period), removes etcd's tmpfs data and the namespace
(if it is still this cluster's); nothing else is signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, pki
from testcluster.netns import Netns, NetnsError, create

API_PORT = 6443
KCM_PORT = 10257
SCHEDULER_PORT = 10259

# kube-controller-manager runs only what the product and its tests rely on.
CONTROLLERS = (
    "deployment-controller", "replicaset-controller", "endpointslice-controller", "garbage-collector-controller",
    "namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller", "disruption-controller", "horizontal-pod-autoscaler-controller",
    "node-lifecycle-controller", "taint-eviction-controller", "job-controller", "persistentvolume-binder-controller",
)


@dataclass(frozen=True)
class Heartbeats:
    """How quickly the control plane gives up on a node: the Lease its agent renews every `renew_s` (for
    `lease_s`), the node-lifecycle controller's grace after the last renewal before it calls the node NotReady
    (checked every `monitor_period_s`), and the API server's default not-ready/unreachable toleration: how long
    pods stay on such a node before the taint-eviction controller evicts them."""

    lease_s: int
    renew_s: float
    monitor_grace_s: int
    toleration_s: int
    monitor_period_s: int = 5


KWOK_HEARTBEATS = Heartbeats(lease_s=40, renew_s=10, monitor_grace_s=40, toleration_s=30)
"""kwokctl's defaults, which a loaded 2-core machine keeps for hundreds of fake nodes: kwok renews each Lease every
lease/4 = 10 s, and a node is unreachable after 40 s (4 renewals). Eviction from a node that did go away comes
quicker from the toleration than from a shorter grace."""
PROCESS_NODE_HEARTBEATS = Heartbeats(lease_s=20, renew_s=4, monitor_grace_s=20, toleration_s=10)
"""For the few real nodes of the e2e tier and the real-node tests (testcluster.node: each kubelet renews its Lease
every 5 s of its 20): NotReady after the 20 s grace, evicted 10 s later, so a node failure costs the tier half a
minute, not 70 s. (Named for the process node these heartbeats were first set for.)"""
# Client-side rate limits off, as kwokctl sets them: the two cores are the limit, not a token bucket per component.
CLIENT_QPS, CLIENT_BURST = 5000, 10000

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],  # each request is logged once, at ResponseComplete (or Panic)
    "rules": [{"level": "Metadata"}],
}


class ClusterError(RuntimeError):
    """A component did not start or become ready; the message names it and ends with its log's tail."""


@dataclass
class State:
    """What `down` needs to stop a cluster started by another process (written to state.json)."""

    slot: int
    directory: str
    etcd_data: str
    pin: str = ""  # the namespace's name of this cluster's own (testcluster.netns); "" in states from before pins
    pids: dict[str, int] = field(default_factory=dict)
    binaries: dict[str, str] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)  # how each was started (Cluster.start_component)


@dataclass
class Cluster:
    """A running control plane. Paths are absolute; `server` is reachable from the host and from the namespace."""

    state: State
    netns: Netns

    @property
    def directory(self) -> Path:
        return Path(self.state.directory)

    @property
    def server(self) -> str:
        return f"https://{self.netns.address}:{API_PORT}"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (system:masters)."""
        return self.directory / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """One JSON line per request (Metadata level): user, verb, resource, response code."""
        return self.directory / "audit.log"

    @property
    def ca_file(self) -> Path:
        return self.directory / "pki" / "ca.crt"

    def log(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    @property
    def cache_dir(self) -> Path:
        """kubectl's discovery cache for this cluster: ~/.kube/cache is keyed by host:port, which the next
        cluster in the same slot reuses with other resources."""
        return self.directory / "kubectl-cache"

    def env(self) -> dict[str, str]:
        """Environment for a child process (kubectl, helm, the operator) that talks to this cluster as admin."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.cache_dir)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster; raises with kubectl's stderr when `check` and it fails."""
        cmd = [binaries.kubectl(), f"--kubeconfig={kubeconfig or self.kubeconfig}", f"--cache-dir={self.cache_dir}",
               *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed (rc={proc.returncode}): {proc.stderr.strip()}")
        return proc

    def wait_established(self, *crds: str, timeout: float = 60) -> None:
        """Wait until each named CRD is Established. `kubectl wait --for=condition=Established` right after the
        apply fails at once ("status.conditions accessor error: <nil>") while the API server has not yet written the
        CRD's first status, which a loaded machine shows; this polls the conditions instead."""
        deadline = time.monotonic() + timeout
        while True:
            got = json.loads(self.kubectl("get", *(f"crd/{c}" for c in crds), "-o", "json").stdout)
            items = got.get("items", [got])
            if len(items) == len(crds) and all(
                    any(c.get("type") == "Established" and c.get("status") == "True"
                        for c in (item.get("status") or {}).get("conditions") or []) for item in items):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRDs {', '.join(crds)} were not Established within {timeout:.0f} s")
            time.sleep(0.2)

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path, *,
                         duration: str = "2h") -> Path:
        """A kubeconfig holding a TokenRequest token for a ServiceAccount (what a pod of it would be given)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, f"--duration={duration}").stdout
        write_kubeconfig(path, self.server, self.ca_file, user=f"{namespace}:{service_account}",
                         token=token.strip(), namespace=namespace)
        return path

    def audit_files(self) -> list[Path]:
        """The audit log and the backups the API server rotated out of it (at 100 MB, its log library's default
        size), oldest first: a long session or a benchmark outgrows one file."""
        backups = sorted(self.directory.glob("audit-*.log"))  # audit-<timestamp>.log sorts by time
        return [*backups, *([self.audit_log] if self.audit_log.exists() else [])]

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event so far (the API server appends as requests complete), rotated backups included."""
        return [json.loads(line) for path in self.audit_files() for line in path.read_text().splitlines()
                if line.strip()]

    def stop(self) -> None:
        stop(self.state)

    def stop_component(self, name: str, *, kill: bool = True, grace: float = 10) -> None:
        """Stop one component (a control-plane fault): SIGKILL by default, as a crash; SIGTERM with `kill=False`.
        Returns once its process is gone; `start_component` starts it again with the same command line."""
        stop_processes([(self.state.pids[name], self.state.binaries[name])],
                       first=signal.SIGKILL if kill else signal.SIGTERM, grace=grace)

    def start_component(self, name: str, *, ready_timeout: float = 120) -> None:
        """Start a component `stop_component` stopped, with its recorded command line, and wait until it is ready
        (etcd healthy; the API server's /readyz; the controller manager's and the scheduler's /healthz)."""
        if _running(self.state.pids[name], self.state.binaries[name]):
            raise ClusterError(f"{name} is still running (pid {self.state.pids[name]})")
        launcher = _Launcher(self.netns, self.state)
        proc = launcher.spawn(name, self.state.argv[name])
        if name == "etcd":
            deadline = time.monotonic() + ready_timeout
            while not _etcd_healthy(self.netns):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"etcd did not come back; its log ends:\n{_tail(self.log('etcd'))}")
                time.sleep(0.2)
            return
        if name == "kube-apiserver":
            context = ssl.create_default_context(cafile=str(self.ca_file))
            admin = self.directory / "pki"
            context.load_cert_chain(str(admin / "admin.crt"), str(admin / "admin.key"))
            launcher.wait(name, proc, f"{self.server}/readyz", context, ready_timeout)
            return
        ports = {"kube-controller-manager": KCM_PORT, "kube-scheduler": SCHEDULER_PORT}
        if name in ports:
            plain = ssl.create_default_context()
            plain.check_hostname = False
            plain.verify_mode = ssl.CERT_NONE
            launcher.wait(name, proc, f"https://{self.netns.address}:{ports[name]}/healthz", plain, ready_timeout)


def write_kubeconfig(path: Path, server: str, ca: Path, *, user: str, cert: pki.Pair | None = None,
                     token: str | None = None, namespace: str = "default") -> None:
    credentials: dict[str, Any] = {"token": token} if token else {
        "client-certificate": str(cert.cert), "client-key": str(cert.key)} if cert else {}
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _get(url: str, context: ssl.SSLContext, timeout: float = 2) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as err:
        return 0, str(err)


class _Launcher:
    def __init__(self, netns: Netns, state: State) -> None:
        self.netns = netns
        self.state = state
        self.dir = Path(state.directory)
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.dir / "logs" / f"{name}.log").open("ab")
        proc = subprocess.Popen([*self.netns.exec_prefix(), *argv], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **env} if env is not None else None)
        log.close()
        self.state.pids[name] = proc.pid
        self.state.binaries[name] = str(argv[0])
        self.state.argv[name] = [str(a) for a in argv]
        _save(self.state)
        return proc

    def wait(self, name: str, proc: subprocess.Popen[bytes], url: str, context: ssl.SSLContext,
             timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode} before it was ready; its log ends:\n"
                                   f"{_tail(self.dir / 'logs' / f'{name}.log')}")
            code, body = _get(url, context)
            if code == 200:
                return
            last = f"{code} {body[:300]}"
            time.sleep(0.2)
        raise ClusterError(f"{name} was not ready at {url} after {timeout:.0f} s (last: {last}); its log ends:\n"
                           f"{_tail(self.dir / 'logs' / f'{name}.log')}")


def _save(state: State) -> None:
    path = Path(state.directory) / "state.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=1))
    tmp.replace(path)


def load(directory: Path) -> Cluster:
    """The cluster whose state is in `directory` (started by `start`, possibly in another process)."""
    raw = json.loads((directory / "state.json").read_text())
    state = State(**raw)
    return Cluster(state=state, netns=Netns(state.slot, pin_name=state.pin))


def start(directory: Path, *, kwok: bool = True, ready_timeout: float = 120,
          heartbeats: Heartbeats = KWOK_HEARTBEATS) -> Cluster:
    """Build the isolated network, then start etcd, the API server, the controller manager, the scheduler and kwok.

    Blocks until the API server's /readyz passes, the controller manager and the scheduler answer /healthz and the
    default ServiceAccount exists (the service-account controllers work). On any failure everything started so far
    is stopped and the error raised.
    """
    bins = binaries.locate()  # before the network: a missing build is the commonest failure
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    netns = create()  # raises NetnsError (fail closed) before anything starts
    etcd_data = tempfile.mkdtemp(prefix=f"vllmop-etcd-{netns.slot}-", dir="/dev/shm")
    state = State(slot=netns.slot, directory=str(directory), etcd_data=etcd_data, pin=netns.pin_name)
    _save(state)
    try:
        _start(_Launcher(netns, state), bins, kwok=kwok, ready_timeout=ready_timeout, heartbeats=heartbeats)
    except BaseException:
        stop(state)
        raise
    return Cluster(state=state, netns=netns)


def _start(launcher: _Launcher, bins: binaries.Binaries, *, kwok: bool, ready_timeout: float,
           heartbeats: Heartbeats) -> None:
    netns, d = launcher.netns, launcher.dir
    keys = pki.make_pki(d / "pki", advertise_address=netns.address, service_ip=netns.first_service_ip)
    server = f"https://{netns.address}:{API_PORT}"
    kubeconfigs = {}
    for user, pair in keys.users.items():
        path = d / f"{pki.USERS[user][0]}.kubeconfig"
        write_kubeconfig(path, server, keys.ca.cert, user=user, cert=pair)
        kubeconfigs[user] = path
    (d / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

    etcd = launcher.spawn("etcd", [
        str(bins.etcd), f"--data-dir={launcher.state.etcd_data}", "--unsafe-no-fsync",
        "--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=default=http://127.0.0.1:2380", "--listen-metrics-urls=http://127.0.0.1:2381",
        "--quota-backend-bytes=4294967296", "--log-level=warn",
    ])
    plain = ssl.create_default_context()
    plain.check_hostname = False
    plain.verify_mode = ssl.CERT_NONE
    # etcd listens on the namespace's loopback only; probe its /health from inside.
    deadline = time.monotonic() + 30
    while not _etcd_healthy(netns):
        if etcd.poll() is not None:
            raise ClusterError(f"etcd exited with {etcd.returncode}; its log ends:\n{_tail(d / 'logs' / 'etcd.log')}")
        if time.monotonic() > deadline:
            raise ClusterError(f"etcd was not healthy after 30 s; its log ends:\n{_tail(d / 'logs' / 'etcd.log')}")
        time.sleep(0.2)

    apiserver = launcher.spawn("kube-apiserver", [
        str(bins.kube_apiserver),
        "--etcd-servers=http://127.0.0.1:2379",
        f"--advertise-address={netns.address}", "--bind-address=0.0.0.0", f"--secure-port={API_PORT}",
        f"--tls-cert-file={keys.apiserver.cert}", f"--tls-private-key-file={keys.apiserver.key}",
        f"--client-ca-file={keys.ca.cert}",
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
        # a real kubelet (testcluster.node) is reached at its InternalIP (its name resolves nowhere), its serving
        # certificate verified against the cluster CA, with a client certificate of the API server's own
        "--kubelet-preferred-address-types=InternalIP", f"--kubelet-certificate-authority={keys.ca.cert}",
        f"--kubelet-client-certificate={keys.kubelet_client.cert}",
        f"--kubelet-client-key={keys.kubelet_client.key}",
        f"--service-cluster-ip-range={netns.service_cidr}",
        f"--service-account-key-file={keys.service_account_pub}",
        f"--service-account-signing-key-file={keys.service_account_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--enable-aggregator-routing=true",
        f"--requestheader-client-ca-file={keys.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={keys.front_proxy_client.cert}",
        f"--proxy-client-key-file={keys.front_proxy_client.key}",
        f"--audit-policy-file={d / 'audit-policy.yaml'}", f"--audit-log-path={d / 'audit.log'}",
        "--audit-log-mode=blocking",
        f"--default-not-ready-toleration-seconds={heartbeats.toleration_s}",
        f"--default-unreachable-toleration-seconds={heartbeats.toleration_s}",
        "--profiling=false", "--v=1",
    ])
    admin_ctx = ssl.create_default_context(cafile=str(keys.ca.cert))
    admin_ctx.load_cert_chain(str(keys.users["admin"].cert), str(keys.users["admin"].key))
    launcher.wait("kube-apiserver", apiserver, f"{server}/readyz", admin_ctx, ready_timeout)

    kcm_kc, sched_kc = kubeconfigs["system:kube-controller-manager"], kubeconfigs["system:kube-scheduler"]
    kcm = launcher.spawn("kube-controller-manager", [
        str(bins.kube_controller_manager),
        f"--kubeconfig={kcm_kc}", f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--bind-address={netns.address}", f"--secure-port={KCM_PORT}", f"--cert-dir={d / 'kcm-certs'}",
        f"--controllers={','.join(CONTROLLERS)}",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={keys.service_account_key}", f"--root-ca-file={keys.ca.cert}",
        f"--service-cluster-ip-range={netns.service_cidr}",
        "--leader-elect=false",
        "--horizontal-pod-autoscaler-sync-period=2s",
        f"--node-monitor-period={heartbeats.monitor_period_s}s",
        f"--node-monitor-grace-period={heartbeats.monitor_grace_s}s",
        f"--kube-api-qps={CLIENT_QPS}", f"--kube-api-burst={CLIENT_BURST}",
        "--profiling=false", "--v=1",
    ])
    scheduler_config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(sched_kc), "qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "leaderElection": {"leaderElect": False},
    }
    (d / "scheduler.yaml").write_text(yaml.safe_dump(scheduler_config))
    scheduler = launcher.spawn("kube-scheduler", [
        str(bins.kube_scheduler), f"--config={d / 'scheduler.yaml'}",
        f"--authentication-kubeconfig={sched_kc}", f"--authorization-kubeconfig={sched_kc}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--bind-address={netns.address}", f"--secure-port={SCHEDULER_PORT}", f"--cert-dir={d / 'scheduler-certs'}",
        "--profiling=false", "--v=1",
    ])
    if kwok:
        launcher.spawn("kwok", [
            str(bins.kwok), f"--kubeconfig={kubeconfigs['kwok']}",
            *(f"--config={path}" for path in bins.kwok_stages()),
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--cidr={netns.pod_cidr}", f"--node-ip={netns.address}",
            f"--node-lease-duration-seconds={heartbeats.lease_s}",
        ])
    launcher.wait("kube-controller-manager", kcm, f"https://{netns.address}:{KCM_PORT}/healthz", plain, 60)
    launcher.wait("kube-scheduler", scheduler, f"https://{netns.address}:{SCHEDULER_PORT}/healthz", plain, 60)
    _wait_default_service_account(server, admin_ctx, launcher)


def _etcd_healthy(netns: Netns) -> bool:
    proc = subprocess.run([*netns.exec_prefix(), sys.executable, "-c",
                           "import urllib.request,sys;"
                           "sys.exit(0 if b'true' in urllib.request.urlopen('http://127.0.0.1:2379/health',"
                           "timeout=1).read() else 1)"],
                          capture_output=True, check=False)
    return proc.returncode == 0


def _wait_default_service_account(server: str, context: ssl.SSLContext, launcher: _Launcher) -> None:
    deadline = time.monotonic() + 60
    url = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
    while time.monotonic() < deadline:
        if _get(url, context)[0] == 200:
            return
        time.sleep(0.2)
    kcm_log = _tail(launcher.dir / "logs" / "kube-controller-manager.log")
    raise ClusterError("the default ServiceAccount did not appear in 60 s (serviceaccount-controller); "
                       f"kube-controller-manager's log ends:\n{kcm_log}")


def _alive(pid: int, binary: str) -> bool:
    """True while `pid` is still the process we started (same executable), so a reused PID is never signalled."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return Path(exe).name == Path(binary).name


def _exiting(pid: int) -> bool:
    """True while a process whose executable is no longer readable still has a thread running: a multithreaded
    process (every Go binary) killed with SIGKILL loses its leader's memory map, and with it /proc/PID/exe, before
    its other threads have exited and closed its files. Seen: kube-apiserver restarted right after a kill failed
    with "bind: address already in use" on 6443, the dead one's listener still open."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "ZX":
            return True
    return False


def alive(pid: int, binary: str) -> bool:
    """True while `pid` still runs `binary` (a PID recorded at start, checked before it is signalled)."""
    return _alive(pid, binary)


def exited(pid: int) -> bool:
    """True once no thread of `pid` runs (gone, or a zombie whose parent has yet to reap it)."""
    return not _exiting(pid)


def _running(pid: int, binary: str) -> bool:
    """Still ours and running, or ours and not yet finished exiting (what a wait must wait for)."""
    if _alive(pid, binary):
        return True
    try:
        os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return _exiting(pid)
    return False  # readable and another program: the PID was reused


def stop_child(proc: subprocess.Popen[Any], grace: float = 20) -> None:
    """Stop a child this process started (its Popen, so the PID is ours and reaped): SIGTERM, up to `grace`
    seconds, then SIGKILL. The demo's operator and the tests' operator and vmtouch processes stop this way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_processes(procs: Sequence[tuple[int, str]], *, first: signal.Signals = signal.SIGTERM,
                   grace: float = 10, kill_wait: float = 5) -> None:
    """Stop recorded processes, each a (pid, binary) checked to still run that binary so a reused PID is never
    signalled: `first` to every one still alive, up to `grace` seconds for all of them to exit, SIGKILL for the
    rest, and up to `kill_wait` more for those to go (each reaped when it is our child). The launcher, a single
    component's stop and KEDA's processes all stop this way."""
    for pid, binary in procs:
        if _alive(pid, binary):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, first)
    deadline = time.monotonic() + grace
    for pid, binary in procs:
        while _running(pid, binary) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _alive(pid, binary):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait
    for pid, binary in procs:
        while _running(pid, binary) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        _reap(pid)


def stop(state: State, grace: float = 10) -> None:
    """Stop the recorded PIDs one at a time in reverse start order, each gone before the next is signalled; remove
    etcd's data and the network namespace if it is still this cluster's (a stale state's stop, or a second stop,
    leaves a slot another cluster has claimed since alone).

    One at a time because of etcd: signalled together, kube-apiserver never finishes its shutdown once etcd is gone
    (it waited out the grace and was killed) and etcd took 7 s to close with the API server's connections open, so
    every stop cost the whole grace; in order, all five components are gone in well under a second."""
    for name in reversed(list(state.pids)):
        stop_processes([(state.pids[name], state.binaries.get(name, ""))], grace=grace)
    shutil.rmtree(state.etcd_data, ignore_errors=True)
    Netns(state.slot, pin_name=state.pin).teardown()  # only if the slot is still this cluster's
    state.pids.clear()
    with contextlib.suppress(OSError):
        _save(state)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def running(directory: Path, **kwargs: Any) -> Iterator[Cluster]:
    """`start` as a context manager that always stops what it started."""
    cluster = start(directory, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


__all__ = ["CONTROLLERS", "KWOK_HEARTBEATS", "PROCESS_NODE_HEARTBEATS", "Cluster", "ClusterError", "Heartbeats",
           "NetnsError", "State", "load", "running", "start", "stop",
           "write_kubeconfig"]
