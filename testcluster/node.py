"""A real node: containerd + runc + kubelet for one Node of a test cluster, nothing imitated between the API server
and the container.

Network (no default route anywhere; set up fail-closed and proven like the cluster's own, testcluster.netns):

    cluster namespace (API server at 172.29.S.2)  nd<k> 172.29.S.(4k+5)/30 <-veth-> eth0 172.29.S.(4k+6)/30  node k
    node k's namespace: cni0 bridge 172.31.(16S+15-k).1/24 -> pods (CNI bridge + host-local, from containerd's CRI)

The node's namespace routes only the API server's address and the cluster's pod range (other nodes' pods) through
the cluster's namespace, which forwards between its nodes; the host blackholes the pod range as before. Pods get
routes to the API server's address, the pod range and the Service range through their bridge, and no default route.

Services: each node runs kube-proxy (built from the same k8s.io/kubernetes, scripts/build-kube-proxy.sh) in iptables
mode in its namespace, so a pod's KUBERNETES_SERVICE_HOST (the `kubernetes` Service's ClusterIP, which in-cluster
clients use) and every other ClusterIP lead to their endpoints as on any cluster; the node counts as started only
once kube-proxy has written the `kubernetes` Service's rules. No cluster DNS runs: nothing our pods run resolves a
name (the operator and the router reach the API server by KUBERNETES_SERVICE_HOST, engines are addressed by pod
IP). Node k's pod CIDR is counted down from the top of the cluster's pod range, away from kwok's addresses.

Each node has its own containerd (root, state and socket under the node's directory), its own kube-proxy, its own
kubelet (root dir, pod logs, cgroup root `/vllmop-S-<node>`), its own network namespace and its own mount namespace,
which all run in: there the node's /run/containerd (shim sockets), /run/netns (containerd's per-pod network
namespaces) and
/var/log/containers are its own, the kubelet's volume mounts stay inside (gone with the namespace), and the kernel
settings the kubelet insists on (`setupKernelTunables`: vm.overcommit_memory=1, kernel.panic=10,
kernel.panic_on_oops=1) are shown to it by read-only bind mounts over their /proc/sys files, so it never writes them
into the shared machine's kernel: it runs with `protectKernelDefaults: true`, so a value it wants that is not shown
fails its start instead of being set.

Images come from OCI archives (testcluster.images, the built images of scripts/build-images.sh): imported once into
a shared store (testcluster.imagestore) whose containerd root each node's containerd starts on as a copy made of
hard links; nothing is pulled, nothing of an image is copied per node.

Stopping signals only what this node started, by PID: the kubelet, kube-proxy and containerd recorded at start, the
shims whose command line names this node's containerd socket, and the processes in this node's own cgroup tree (its
containers).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testcluster import binaries, images, imagestore, pki
from testcluster.cluster import Cluster, alive, exited, stop_processes, write_kubeconfig
from testcluster.netns import NetnsError, refuse_routes_out

MAX_NODES = 8  # node k's pod CIDR is the (16 - k)th /24 of the cluster's /20; the lower half is kwok's
KUBELET_PORT = 10250
CGROUP_MOUNT = Path("/sys/fs/cgroup")
# What kubelet's setupKernelTunables (pkg/kubelet/cm/container_manager_linux.go, v1.37) wants to read.
KERNEL_TUNABLES = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                   "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}
PROXY_HEALTHZ_PORT = 10256
LEASE_SECONDS = 20  # as the process node's (cluster.PROCESS_NODE_HEARTBEATS): the kubelet renews every 5 s


class NodeError(RuntimeError):
    """The node could not be set up or did not become Ready; the message names the step and ends with a log."""


@dataclass
class NodeState:
    """What `stop` needs, written to `node.json` in the node's directory."""

    name: str
    index: int
    directory: str
    netns: str
    mntns: str
    cgroup_root: str
    socket: str
    pids: dict[str, int] = field(default_factory=dict)
    binaries: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Layout:
    """Node `index`'s addresses in cluster slot `slot`."""

    slot: int
    index: int

    @property
    def cluster_end(self) -> str:
        return f"172.29.{self.slot}.{4 * self.index + 5}"

    @property
    def node_ip(self) -> str:
        return f"172.29.{self.slot}.{4 * self.index + 6}"

    @property
    def api_address(self) -> str:
        return f"172.29.{self.slot}.2"

    @property
    def pod_cidr(self) -> str:
        return f"172.31.{16 * self.slot + 15 - self.index}.0/24"

    @property
    def cluster_link(self) -> str:
        return f"nd{self.index}"


def _run(argv: Sequence[str], what: str, *, timeout: float = 60) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=timeout)
    if proc.returncode != 0:
        raise NodeError(f"{what}: `{' '.join(argv)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Node:
    """A running node. `enter` prefixes a command to run it in the node's network and mount namespaces."""

    cluster: Cluster
    state: NodeState
    layout: Layout

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def directory(self) -> Path:
        return Path(self.state.directory)

    @property
    def ip(self) -> str:
        return self.layout.node_ip

    @property
    def pod_cidr(self) -> str:
        return self.layout.pod_cidr

    def log(self, component: str) -> Path:
        return self.directory / "logs" / f"{component}.log"

    def enter(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.state.netns}", f"--mount={self.state.mntns}", "--"]

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """containerd's own client against this node's containerd, in its CRI namespace."""
        return _run([binaries.CTR, f"--address={self.state.socket}", "--namespace=k8s.io", *args],
                    f"ctr on node {self.name}", timeout=timeout)

    def import_images(self, archives: Iterable[images.Archive]) -> None:
        for archive in archives:
            self.ctr("images", "import", str(archive.path), timeout=600)

    def container_pids(self) -> list[int]:
        return _container_pids(self.state)

    def shim_pids(self) -> list[int]:
        return _shim_pids(self.state)

    def crash(self, wait: float = 15) -> dict[str, list[int]]:
        """The node dies: SIGKILL to its kubelet, kube-proxy, containerd, shims and containers, by PID, all at
        once; returns the PIDs killed once every one has exited (the node's daemons, this process's children,
        reaped). `stop` cleans up what is left (mounts, namespaces, cgroups)."""
        recorded = {name: [pid] if alive(pid, self.state.binaries[name]) else []
                    for name, pid in self.state.pids.items()}
        killed = {"kubelet": recorded.get("kubelet", []), "kube-proxy": recorded.get("kube-proxy", []),
                  "containerd": recorded.get("containerd", []),
                  "shims": self.shim_pids(), "containers": self.container_pids()}
        every = [p for group in killed.values() for p in group]
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while not all(exited(pid) for pid in every) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in ("kubelet", "kube-proxy", "containerd"):
            if name in self.state.pids:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(self.state.pids[name], os.WNOHANG)
        return killed

    def stop(self, grace: float = 10) -> None:
        """Stop the kubelet, then the containers, the shims and containerd (each by PID), then remove the node's
        namespaces and cgroups. Idempotent."""
        stop(self.state, grace=grace)


def _container_pids(state: NodeState) -> list[int]:
    """Every process in the node's cgroup tree (its pods' containers and sandboxes)."""
    root = CGROUP_MOUNT / "pids" / state.cgroup_root.lstrip("/")
    pids: list[int] = []
    for procs in root.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _shim_pids(state: NodeState) -> list[int]:
    """containerd-shim-runc-v2 processes started by the node's containerd: their command line names its socket
    (shims outlive a containerd that dies, as on a real node)."""
    marker = f"\0-address\0{state.socket}\0".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in b"\0" + (proc / "cmdline").read_bytes() + b"\0":
                found.append(int(proc.name))
    return found


def _write_configs(d: Path, layout: Layout, state: NodeState, cluster: Cluster, serving: pki.Pair) -> Path:
    cni_dir = d / "cni"
    cni_dir.mkdir(parents=True, exist_ok=True)
    cluster_pods = cluster.netns.pod_cidr
    (cni_dir / "10-vllmop.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": "vllmop",
        "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "isDefaultGateway": False, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": layout.pod_cidr}]], "dataDir": str(d / "ipam"),
                     "routes": [{"dst": f"{layout.api_address}/32"}, {"dst": cluster_pods},
                                {"dst": cluster.netns.service_cidr}]},
        }],
    }, indent=1))
    containerd_config = f"""version = 2
root = "{d / 'containerd' / 'root'}"
state = "{d / 'containerd' / 'state'}"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.opt",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{state.socket}"

[ttrpc]
  address = "{state.socket}.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # no CAP_SYS_RESOURCE here: without this every sandbox fails in runc ("can't get final child's PID from pipe")
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{binaries.RUNC}"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{binaries.CNI_BIN_DIR}"
    conf_dir = "{cni_dir}"
    max_conf_num = 1
"""
    (d / "containerd.toml").write_text(containerd_config)
    (d / "resolv.conf").write_text("# no DNS: no cluster DNS runs, and no name resolves off the machine\n")
    kubelet_config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # these machines are cgroup v1 (hybrid); kubelet 1.37 refuses v1 unless told not to
        "failCgroupV1": False,
        # containerd 1.6 has no RuntimeConfig: the kubelet uses this, and says so (cri_losing_support, 1.38)
        "cgroupDriver": "cgroupfs", "cgroupRoot": state.cgroup_root, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{state.socket}",
        "address": layout.node_ip, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(cluster.ca_file)}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local", "resolvConf": str(d / "resolv.conf"),
        "protectKernelDefaults": True,  # never write the shared kernel's settings (see the module docstring)
        "oomScoreAdj": 0,  # -999 (the default) needs CAP_SYS_RESOURCE, which these machines lack
        "makeIPTablesUtilChains": False, "failSwapOn": False,
        "podLogsDir": str(d / "pod-logs"),
        # one shared disk with multi-GB images and other clones on it: only a nearly full disk evicts, and image GC
        # never runs (its high threshold is 100 %)
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                         "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "nodeLeaseDurationSeconds": LEASE_SECONDS, "nodeStatusUpdateFrequency": "4s",
        # a changed ConfigMap reaches its mounted files on the pod's next sync (the LoRA adapters' list)
        "syncFrequency": "15s",
        "serializeImagePulls": False, "registerNode": True, "maxPods": 110,
        "shutdownGracePeriod": "0s", "shutdownGracePeriodCriticalPods": "0s",
    }
    path = d / "kubelet.yaml"
    path.write_text(yaml.safe_dump(kubelet_config, sort_keys=False))
    return path


def _write_proxy_config(d: Path, layout: Layout, name: str, cluster: Cluster, kubeconfig: Path) -> Path:
    """kube-proxy in iptables mode for the node's namespace, touching nothing outside it: no OOM score (needs
    CAP_SYS_RESOURCE), no conntrack limits or timeouts (the table size is the machine's), no localhost NodePorts
    (route_localnet); metrics and health on the node's own loopback."""
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables", "hostnameOverride": name, "bindAddress": layout.node_ip,
        "healthzBindAddress": f"127.0.0.1:{PROXY_HEALTHZ_PORT}", "metricsBindAddress": "127.0.0.1:10249",
        "clusterCIDR": cluster.netns.pod_cidr, "nodePortAddresses": [f"{layout.node_ip}/32"],
        "iptables": {"localhostNodePorts": False, "syncPeriod": "30s", "minSyncPeriod": "0s"},
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }
    path = d / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def proxies_kubernetes_service(node: Node) -> bool:
    """True once the node's kube-proxy has written the `default/kubernetes` Service's rules: from then on a pod's
    KUBERNETES_SERVICE_HOST:PORT reaches the API server."""
    proc = subprocess.run([*node.enter(), "iptables-save", "-t", "nat"], capture_output=True, text=True,
                          check=False, timeout=30)
    return proc.returncode == 0 and '"default/kubernetes:https"' in proc.stdout and "-j KUBE-SVC-" in proc.stdout


def cpus_of(index: int, nodes: int, allowed: Sequence[int] | None = None) -> str:
    """The CPUs node `index` of `nodes` may run its pods on: the machine's `allowed` CPUs (this process's affinity)
    dealt out in contiguous shares, one share per node (at least one CPU each: with more nodes than CPUs, node k gets
    CPU k mod n; a node started beyond the `nodes` planned shares node `index mod nodes`'s CPUs), as a cpuset list
    ("0", "2,3").

    Why: the nodes of a test cluster are namespaces on one machine, and without this every node's pods run on every
    core. A real kubelet's node owns its cores; here, on 2 cores, an engine restarting on one node competed for both
    cores with the other node's engine serving the fallback traffic, and vLLM's own thread binding put both engines
    on core 0. With a share each, a restart on one node is as fast as on a machine of its own."""
    cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if not cpus or nodes < 1 or index < 0:
        raise NodeError(f"no CPU share for node {index} of {nodes} on CPUs {cpus}")
    if nodes >= len(cpus):
        return str(cpus[index % len(cpus)])
    index %= nodes
    per, extra = divmod(len(cpus), nodes)
    first = index * per + min(index, extra)
    share = cpus[first:first + per + (1 if index < extra else 0)]
    return str(share[0]) if len(share) == 1 else ",".join(str(c) for c in share)


def _make_cgroups(root: str) -> None:
    """The node's cgroup root in every mounted hierarchy (the kubelet requires it to exist); cpuset's needs the
    parent's CPUs and memory nodes before anything can join it."""
    hierarchies = sorted(p for p in CGROUP_MOUNT.iterdir() if p.is_dir() and os.path.ismount(p))
    if not {CGROUP_MOUNT / "pids", CGROUP_MOUNT / "memory"} <= set(hierarchies):
        raise NodeError(f"no cgroup v1 pids and memory hierarchies under {CGROUP_MOUNT} (found "
                        f"{[p.name for p in hierarchies]}): the node launcher knows the cgroup v1 (hybrid) layout of "
                        "these machines only; on cgroup v2 its cgroup root and container PIDs would be elsewhere")
    for hierarchy in hierarchies:
        target = hierarchy / root.lstrip("/")
        target.mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (target / knob).write_text((hierarchy / knob).read_text())


def _remove_cgroups(root: str, timeout: float = 10) -> None:
    """rmdir the node's cgroup tree, deepest first, in every hierarchy; retried while the kernel is still freeing
    the cgroups of processes that just died."""
    deadline = time.monotonic() + timeout
    for hierarchy in sorted(p for p in CGROUP_MOUNT.iterdir() if p.is_dir() and os.path.ismount(p)):
        top = hierarchy / root.lstrip("/")
        if not top.exists():
            continue
        for directory in [*sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)), top]:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)


def _save(state: NodeState) -> None:
    path = Path(state.directory) / "node.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=1))
    tmp.replace(path)


def _spawn(node: Node, name: str, argv: Sequence[str], *, cpus: str | None = None) -> subprocess.Popen[bytes]:
    """Start a component of the node in its namespaces (on `cpus` only, when given), its output to its log."""
    log = node.log(name).open("ab")
    pinned = ["taskset", "--cpu-list", cpus] if cpus is not None else []
    proc = subprocess.Popen([*node.enter(), *pinned, *argv], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    node.state.pids[name] = proc.pid  # nsenter (and taskset) exec the command: the PID is the component's own
    node.state.binaries[name] = str(argv[0])
    _save(node.state)
    return proc


def _network(cluster: Cluster, layout: Layout, netns_name: str) -> None:
    """The node's namespace, its veth into the cluster's, addresses, the routes described above; proven closed."""
    c = cluster.netns.pin_name
    _run(["ip", "netns", "add", netns_name], "create the node's network namespace")
    _run(["ip", "-n", netns_name, "link", "set", "lo", "up"], "node lo up")
    _run(["ip", "-n", c, "link", "add", layout.cluster_link, "type", "veth", "peer", "name", "eth0", "netns",
          netns_name], "the node's veth")
    _run(["ip", "-n", c, "addr", "add", f"{layout.cluster_end}/30", "dev", layout.cluster_link], "cluster-side address")
    _run(["ip", "-n", c, "link", "set", layout.cluster_link, "up"], "cluster-side link up")
    _run(["ip", "-n", netns_name, "addr", "add", f"{layout.node_ip}/30", "dev", "eth0"], "node address")
    _run(["ip", "-n", netns_name, "link", "set", "eth0", "up"], "node link up")
    _run(["ip", "-n", netns_name, "route", "add", f"{layout.api_address}/32", "via", layout.cluster_end],
         "node route to the API server")
    _run(["ip", "-n", netns_name, "route", "add", cluster.netns.pod_cidr, "via", layout.cluster_end],
         "node route to other nodes' pods")
    # from the API server's address: a pod routes only that one back (webhook calls, Prometheus' scrapes)
    _run(["ip", "-n", c, "route", "replace", layout.pod_cidr, "via", layout.node_ip, "src", layout.api_address],
         "cluster route to the pods")
    for ns in (c, netns_name):
        _run(["nsenter", f"--net=/run/netns/{ns}", "--", "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
             f"forwarding in {ns}")
    prefix = ["nsenter", f"--net=/run/netns/{netns_name}", "--"]
    refuse_routes_out(prefix, f"node namespace {netns_name}")
    got = subprocess.run([*prefix, "ip", "route", "get", layout.api_address], capture_output=True, text=True,
                         check=False)
    if got.returncode != 0 or "dev eth0" not in got.stdout:
        raise NetnsError(f"node namespace {netns_name} does not reach the API server {layout.api_address} through "
                         f"eth0: {(got.stdout or got.stderr).strip()}")


def _mount_namespace(state: NodeState) -> None:
    """The node's own mount namespace (see the module docstring), held by a bind mount at `state.mntns`."""
    d = Path(state.directory)
    Path(state.mntns).touch()
    _run(["unshare", f"--mount={state.mntns}", "--propagation=private", "true"], "the node's mount namespace")
    enter = ["nsenter", f"--mount={state.mntns}", "--"]
    for host_dir in ("/run/containerd", "/var/log/containers"):
        os.makedirs(host_dir, exist_ok=True)  # mount points on the host; the node mounts its own over them
    (d / "var-log-containers").mkdir(exist_ok=True)
    # containerd names each pod's network namespace in /run/netns: a directory of the node's own, or the files it
    # leaves when it is killed would litter the host's (`ip netns list`)
    for tmpfs in ("/run/containerd", "/run/netns"):
        _run([*enter, "mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", tmpfs], f"the node's {tmpfs}")
    _run([*enter, "mount", "--bind", str(d / "var-log-containers"), "/var/log/containers"],
         "the node's /var/log/containers")
    shown = d / "sysctl"
    shown.mkdir(exist_ok=True)
    for key, wanted in KERNEL_TUNABLES.items():
        real = Path("/proc/sys", key)
        if int(real.read_text().split()[0]) == wanted:
            continue
        fake = shown / key.replace("/", ".")
        fake.write_text(f"{wanted}\n")
        _run([*enter, "mount", "--bind", "-o", "ro", str(fake), str(real)], f"show the kubelet {key}={wanted}")
        _run([*enter, "mount", "-o", "remount,bind,ro", str(real)], f"{key} read-only")


def start(cluster: Cluster, name: str, *, index: int, directory: Path,
          archives: Sequence[images.Archive] = (), labels: dict[str, str] | None = None,
          taints: Sequence[dict[str, str]] = (), cpus: str | None = None, ready_timeout: float = 180) -> Node:
    """Start node `name` (the `index`th of the cluster, 0..MAX_NODES-1) with `archives` imported, and wait until its
    Node is Ready. `taints` ({key, value, effect}) are registered with the Node (a node on a shared cluster takes only
    the pods that tolerate them). `cpus` (a CPU list, `cpus_of`) confines the node's pods to those CPUs: the node's
    containerd starts with that CPU affinity, which its shims, runc and so every container inherit (a cpuset on the
    node's cgroup root cannot do it: the kubelet's default CPU manager policy writes every CPU of the machine into
    its `kubepods` cpuset, which the kernel refuses under a smaller parent, and the kubelet then does not start);
    None lets them run on every CPU. On any failure everything started so far is stopped and `NodeError`/`NetnsError`
    raised."""
    if not 0 <= index < MAX_NODES:
        raise NodeError(f"node index {index} is outside 0..{MAX_NODES - 1} (each node takes one /24 of the "
                        f"cluster's pod range {cluster.netns.pod_cidr})")
    kubelet_dir = binaries.kubelet_directory()
    binaries.node_runtime()
    pause = images.pause()
    d = directory.resolve()
    (d / "logs").mkdir(parents=True, exist_ok=True)
    layout = Layout(cluster.netns.slot, index)
    state = NodeState(name=name, index=index, directory=str(d), netns=f"{cluster.netns.pin_name}-n{index}",
                      mntns=str(d / "mntns"), cgroup_root=f"/vllmop-{cluster.netns.slot}-{name}",
                      socket=str(d / "containerd.sock"))
    _save(state)
    node = Node(cluster, state, layout)
    try:
        _network(cluster, layout, state.netns)
        _make_cgroups(state.cgroup_root)
        _mount_namespace(state)
        client, serving = pki.node_credentials(cluster.directory / "pki", name, layout.node_ip)
        kubeconfig = d / "kubelet.kubeconfig"
        write_kubeconfig(kubeconfig, cluster.server, cluster.ca_file, user=f"system:node:{name}", cert=client)
        config = _write_configs(d, layout, state, cluster, serving)
        t0 = time.monotonic()
        how = imagestore.copy(imagestore.store([pause, *archives]), d / "containerd" / "root")
        with node.log("images").open("a") as log:
            log.write(f"containerd root from the image store ({how}) in {time.monotonic() - t0:.1f} s: "
                      f"{', '.join(a.name for a in [pause, *archives])}\n")
        containerd = _spawn(node, "containerd", [binaries.CONTAINERD, f"--config={d / 'containerd.toml'}"],
                            cpus=cpus)
        # CRI answers "server is not initialized yet" until it has recovered its images and containers, later than
        # containerd's own API: a kubelet started before that exits at once
        _wait(lambda: _containerd_up(node) and "Start streaming server" in _tail(node.log("containerd"), 200),
              containerd, node, "containerd", 60)
        node_labels = ",".join(f"{k}={v}" for k, v in (labels or {}).items())
        node_taints = ",".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in taints)
        kubelet = _spawn(node, "kubelet", [
            str(kubelet_dir / "kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={name}", f"--node-ip={layout.node_ip}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}", *([f"--node-labels={node_labels}"] if node_labels else []),
            *([f"--register-with-taints={node_taints}"] if node_taints else []), "--v=1",
        ])
        _wait(lambda: node_ready(cluster, name), kubelet, node, "kubelet", ready_timeout)
        proxy_kubeconfig = d / "kube-proxy.kubeconfig"
        write_kubeconfig(proxy_kubeconfig, cluster.server, cluster.ca_file, user="system:kube-proxy",
                         cert=pki.proxy_credentials(cluster.directory / "pki", name))
        proxy = _spawn(node, "kube-proxy", [
            str(binaries.kube_proxy()), f"--config={_write_proxy_config(d, layout, name, cluster, proxy_kubeconfig)}",
            "--v=1"])
        _wait(lambda: proxies_kubernetes_service(node), proxy, node, "kube-proxy", 60)
    except BaseException:
        stop(state)
        raise
    return node


def _containerd_up(node: Node) -> bool:
    proc = subprocess.run([binaries.CTR, f"--address={node.state.socket}", "version"], capture_output=True,
                          check=False, timeout=10)
    return proc.returncode == 0


def node_ready(cluster: Cluster, name: str) -> bool:
    proc = cluster.kubectl("get", "node", name, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    conditions = json.loads(proc.stdout).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _wait(check: Any, proc: subprocess.Popen[bytes], node: Node, component: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise NodeError(f"{component} of node {node.name} exited with {proc.returncode}; its log ends:\n"
                            f"{_tail(node.log(component))}")
        if time.monotonic() > deadline:
            raise NodeError(f"{component} of node {node.name} was not ready after {timeout:.0f} s; its log ends:\n"
                            f"{_tail(node.log(component))}")
        time.sleep(0.5)


def load(directory: Path, cluster: Cluster) -> Node:
    state = NodeState(**json.loads((directory / "node.json").read_text()))
    return Node(cluster, state, Layout(cluster.netns.slot, state.index))


def stop(state: NodeState, grace: float = 10) -> None:
    """Stop what `start` started, by PID, and remove the node's namespaces and cgroups. Idempotent."""
    for component in ("kubelet", "kube-proxy"):
        if component in state.pids:
            stop_processes([(state.pids[component], state.binaries[component])], grace=grace)
    containers = _container_pids(state)
    for pid in containers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if "containerd" in state.pids:
        stop_processes([(state.pids["containerd"], state.binaries["containerd"])], grace=grace)
    for pid in _shim_pids(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while (_container_pids(state) or _shim_pids(state)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.path.ismount(state.mntns):
        subprocess.run(["umount", state.mntns], capture_output=True, check=False)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state.mntns)
    subprocess.run(["ip", "netns", "del", state.netns], capture_output=True, check=False)
    _remove_cgroups(state.cgroup_root)
    state.pids.clear()
    with contextlib.suppress(OSError):
        _save(state)


__all__ = ["MAX_NODES", "Layout", "Node", "NodeError", "NodeState", "load", "node_ready", "start", "stop"]
