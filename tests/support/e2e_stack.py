"""The whole system on the real control plane for the end-to-end tier: testcluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) + real nodes (testcluster.node: kubelet, containerd, runc, kube-proxy) + real
vLLM engines from the engine-cpu image + the router from the router image + real Prometheus discovering the pods from
the API server + the chart's own operator from the operator image, installed by `helm install` and running as a pod
with its health loop, from `examples/cpu-dev.yaml`.

Where things run: the control plane in the cluster's network namespace (testcluster), and so do the stack's threads
(its calls' loop), Prometheus and the test thread while it uses the stack (`Stack.inside`,
`testcluster.netns.entered`: pod addresses exist only in there; the host blackholes them), so the test's clients see
the pods as a pod in a cluster would. `running_stack` keeps the calling thread inside for its block; a stack shared
across modules (tests/e2e/conftest.py's `cpu_dev`) is entered per test instead, so that the tests after it, on the
host's loopback, are not left in the cluster's namespace. Pods run on the nodes `NODES` (each a network namespace of
its own, pods on a CNI bridge), bound by the real scheduler; the real endpointslice controller publishes their IPs,
from which the router discovers the engines. What a test reads of a container comes from the kubelet's status
through the API server and from the container's cgroup on its node (`PodContainer`), its log from `kubectl logs`.

The operator is the chart's (charts/vllm-operator, release `vllm-operator` in `vllm-system`), watching only the
stack's namespace, with its nodeSelector on `cpu-0` and `operator.prometheusUrl` at the stack's Prometheus: it runs
under the ServiceAccount token the kubelet projects, so it acts under the chart's RBAC and the test reads what it did
only through the API (status, events) and its pod's log (in `diagnostics`). The short remediation windows the tier
relies on are cpu-dev.yaml's own (spec.remediation): no operator flag is needed for them.

The model directory (`scripts/make_model.py --shape tiny`) reaches the pods as a PersistentVolume (hostPath) bound
to the PVC `models` that cpu-dev.yaml names; the tokenizer ConfigMap is created from that model's files, as an admin
would with `kubectl create configmap --from-file`. Prometheus' scrape job is derived from the PodMonitor the
operator renders for cpu-dev (`podmonitor_scrape_config`: the selector, ports and relabelings the Prometheus
Operator would turn it into), with kubernetes_sd_configs against the API server as a ServiceAccount that may list
and watch pods.

With `keda=True` the stack also runs KEDA (testcluster/keda.py: its operator and metrics server, installed before the
operator starts, so that the operator finds the ScaledObject CRD), and the pools named `sleeping` are expected asleep
at zero once the stack is Ready (an autoscaled pool with minReplicas 0 starts with one replica and sleeps after its
idleSeconds).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import openai
import tokenizers
import yaml

from testcluster import binaries, imagestore
from testcluster import cluster as testcluster
from testcluster import images as node_images
from testcluster import keda as testkeda
from testcluster import node as real_node
from testcluster.cluster import Cluster
from testcluster.netns import entered
from tests.support import images as built_images
from tests.support.kube import helm
from tests.support.paths import EXAMPLES, ROOT
from tests.support.prometheus import Prometheus
from vllm_operator import constants, names
from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_spec
from vllm_operator.k8s import DEPLOYMENTS, EVENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering.monitoring import pod_monitor

T = TypeVar("T")
ENGINE_CORE_TITLE = b"VLLM::EngineCore"
"""The process title vLLM gives its engine-core child (/proc/PID/cmdline starts with it)."""
EXAMPLE = yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text())
NS, NAME = EXAMPLE["metadata"]["namespace"], EXAMPLE["metadata"]["name"]
TOKENIZER_CONFIGMAP = EXAMPLE["spec"]["model"]["tokenizer"]["configMap"]["name"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ACCESS_LINE = re.compile(r'"GET /(health|metrics|status|startup) HTTP/1\.1" 200')
"""Probe and scrape lines of a pod's access log, left out of a failure's log tails."""
NODE = "cpu-0"
NODES: tuple[tuple[str, Mapping[str, str]], ...] = ((NODE, {}), ("cpu-1", {}))
"""The stack's real nodes (testcluster.node: kubelet, containerd, kube-proxy each). Two, because a real kubelet
reports the machine's own 2 cores as each node's allocatable CPU, and cpu-dev's two engines request one core each
(Guaranteed QoS) beside the router's 250m and the operator's 50m: on one node one engine would stay Pending. Each
node's pods run on a share of the machine's cores of their own (testcluster.node.cpus_of: one core each here), as on
two machines: an engine restarting on one node does not compete with the other node's busy engine; the control
plane, Prometheus and the test run on every core."""
IMAGES = ("operator", "router", "engine-cpu")
"""The images `make images` built (scripts/build-images.sh) that the stack's pods run: the chart's operator pod, the
router, the engines; every node's containerd starts with them (testcluster.imagestore: imported once, shared)."""
HEARTBEATS = testcluster.PROCESS_NODE_HEARTBEATS
"""The cluster's node grace and default toleration, for the stack's real nodes' Lease renewals."""
PROMETHEUS_SA = "prometheus"
OPERATOR_NS, OPERATOR_RELEASE = "vllm-system", "vllm-operator"
OPERATOR_SELECTOR = "app.kubernetes.io/name=vllm-operator"
OPERATOR_READY_TIMEOUT_S = 120.0
"""helm install to the operator pod Ready by its /healthz probe: 10-20 s measured (tests/integration/kube)."""
READY_TIMEOUT_S = 420.0
"""Two engines starting together on a busy 2-core machine: 50-100 s measured, up to ~4 min seen under load."""
RESTART_READY_TIMEOUT_S = 720.0
"""A vLLM that restarts after its engine core was killed: 90-110 s usually, but fresh-clone runs on 2026-12-02 saw
the restarted worker sit 357 s between importing torch and its NUMA binding, and later an API server print nothing
for ~7 min and miss this allowance. The likely cause, found after that run: these VMs page out pages idle for a
minute (DAMON `pageout`), so every start re-reads torch and vLLM from a disk that etcd, Prometheus and the logs share
(24.4 s cold vs 13.5 s warm for the imports alone on an idle machine); tests/e2e/conftest.py now pins those
packages in the page cache, and `machine_snapshot()` opens every failure's diagnostics so the next one shows page
cache, pressure and each big process's wait channel."""


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return dict(next((c for c in (obj or {}).get("status", {}).get("conditions", []) or []
                      if c.get("type") == type_), {}))


def _meta(label: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def podmonitor_scrape_config(monitor: Mapping[str, Any], *, api_server: str, ca_file: Path,
                             token_file: Path) -> list[dict[str, Any]]:
    """The Prometheus scrape jobs a PodMonitor stands for, one per podMetricsEndpoint (what the Prometheus
    Operator generates: keep the selected pods' labels and the named port, drop finished pods, then the
    endpoint's own relabelings). The e2e stack runs no prometheus-operator; that every relabeling here is one
    prometheus-operator generates from the same PodMonitor, character for character, is checked by
    tests/integration/kube/test_prometheus_operator.py."""
    spec, meta = monitor["spec"], monitor["metadata"]
    selection: list[dict[str, Any]] = [
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}]
    for key, value in (spec["selector"].get("matchLabels") or {}).items():
        selection.append({"action": "keep", "regex": f"({value});true",
                          "source_labels": [f"__meta_kubernetes_pod_label_{_meta(key)}",
                                            f"__meta_kubernetes_pod_labelpresent_{_meta(key)}"]})
    for expr in spec["selector"].get("matchExpressions") or []:
        if expr["operator"] != "In":
            raise ValueError(f"PodMonitor {meta['name']}: selector operator {expr['operator']} is not translated")
        selection.append({"action": "keep", "regex": f"({'|'.join(expr['values'])});true",
                          "source_labels": [f"__meta_kubernetes_pod_label_{_meta(expr['key'])}",
                                            f"__meta_kubernetes_pod_labelpresent_{_meta(expr['key'])}"]})
    names = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
    jobs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        own = [{("source_labels" if k == "sourceLabels" else "target_label" if k == "targetLabel" else k): v
                for k, v in r.items()} for r in endpoint.get("relabelings") or []]
        jobs.append({
            "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
            "metrics_path": endpoint.get("path", "/metrics"), "scheme": endpoint.get("scheme", "http"),
            "kubernetes_sd_configs": [{"role": "pod", "api_server": api_server,
                                       "tls_config": {"ca_file": str(ca_file)},
                                       "authorization": {"credentials_file": str(token_file)},
                                       "namespaces": {"names": names}}],
            "relabel_configs": [*selection,
                                {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                                 "regex": endpoint["port"]},
                                *own],
        })
    return jobs


def image_archives() -> list[node_images.Archive]:
    """The OCI archives of the stack's images, as `make images` built them for this tree (a test fails, never
    skips, when one is missing: tests/support/images.py)."""
    return [node_images.Archive(built_images.image(n).ref, built_images.image(n).archive) for n in IMAGES]


def engine_image_files() -> list[Path]:
    """What an engine container reads at start-up that is worth holding in the page cache: the engine image's
    torch, vLLM, transformers… (tests/support/vllm_cpu.PINNED_PACKAGES) in the unpacked layers of the shared image
    store, which every node's containers read through hard links (testcluster.imagestore)."""
    from tests.support.vllm_cpu import PINNED_PACKAGES

    store = imagestore.store([node_images.pause(), *image_archives()])
    snapshots = store / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"
    found = [p for name in PINNED_PACKAGES
             for p in snapshots.glob(f"*/fs/opt/vllm/lib/python3*/site-packages/{name}")]
    assert any(p.name == "torch" for p in found) and any(p.name == "vllm" for p in found), \
        f"no torch or vllm under {snapshots}/*/fs/opt/vllm: has the engine-cpu image's layout changed?"
    return found


def cgroup_pids(path: Path) -> list[int]:
    """Every process of a cgroup (v1 pids hierarchy) and the cgroups below it."""
    pids: list[int] = []
    for procs in path.rglob("cgroup.procs") if path.exists() else ():
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def process_argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except OSError:
        return []


@dataclass
class PodContainer:
    """One container of a pod on a real node, as the kubelet reports it through the API server (restarts, last
    termination, readiness) and as the kernel shows it (its processes, read from the container's cgroup under the
    node's cgroup root: the PIDs are the host's, the test runs on the host)."""

    stack: Stack
    namespace: str
    pod: str
    container: str = "engine"

    def obj(self) -> dict[str, Any]:
        found = self.stack.call(lambda k: k.get(PODS, self.namespace, self.pod))
        assert found is not None, f"pod {self.namespace}/{self.pod} is gone"
        return found

    def status(self) -> dict[str, Any]:
        """The container's status as the kubelet last wrote it ({} before it has one, or once the pod is gone)."""
        found = self.stack.call(lambda k: k.get(PODS, self.namespace, self.pod))
        statuses = ((found or {}).get("status") or {}).get("containerStatuses") or []
        return dict(next((c for c in statuses if c["name"] == self.container), {}))

    @property
    def ip(self) -> str:
        return str(self.obj()["status"]["podIP"])

    @property
    def restart_count(self) -> int:
        return int(self.status().get("restartCount", 0))

    @property
    def last_terminated(self) -> dict[str, Any] | None:
        return (self.status().get("lastState") or {}).get("terminated")

    @property
    def ready(self) -> bool:
        return bool(self.status().get("ready"))

    @property
    def grace_s(self) -> float:
        return float(self.obj()["spec"].get("terminationGracePeriodSeconds", 30))

    def node(self) -> real_node.Node:
        name = self.obj()["spec"]["nodeName"]
        return next(n for n in self.stack.nodes if n.name == name)

    def cgroup(self, node: real_node.Node | None = None, pod_uid: str | None = None,
               hierarchy: str = "pids") -> Path | None:
        """The container's cgroup (in the `hierarchy` of cgroup v1: pids, memory...), None while it has no running
        container."""
        node = node or self.node()
        pod_uid = pod_uid or self.obj()["metadata"]["uid"]
        cid = self.status().get("containerID", "").rpartition("//")[2]
        if not cid:
            return None
        root = real_node.CGROUP_MOUNT / hierarchy / node.state.cgroup_root.lstrip("/")
        return next(iter(root.glob(f"kubepods*/**/pod{pod_uid}/{cid}")), None)

    def pids(self) -> list[int]:
        found = self.cgroup()
        return cgroup_pids(found) if found is not None else []

    def main_pid(self) -> int:
        """The container's first process (its command: for an engine, the wrapper)."""
        pids = self.pids()
        assert pids, f"no process in {self.namespace}/{self.pod}'s {self.container} container"
        return min(pids, key=lambda p: (_start_time(p), p))

    def env(self) -> dict[str, str]:
        raw = Path(f"/proc/{self.main_pid()}/environ").read_bytes()
        return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)

    def log(self, tail: int = 200, previous: bool = False, timestamps: bool = False) -> str:
        """`kubectl logs` of the container (through the API server and the node's kubelet, as a user reads it);
        `timestamps`: each line starts with the time the runtime read it (RFC 3339, nanoseconds)."""
        assert self.stack.kube_cluster is not None
        proc = self.stack.kube_cluster.kubectl(
            "logs", "-n", self.namespace, self.pod, "-c", self.container, f"--tail={tail}",
            *(["--previous"] if previous else []), *(["--timestamps"] if timestamps else []), check=False,
            timeout=30)
        return proc.stdout if proc.returncode == 0 else f"(kubectl logs failed: {proc.stderr.strip()})"


def readable_by_pods(directory: Path) -> None:
    """The `models` PV's directory (a hostPath) readable by the engines' uid 2000, as a model volume is: pytest's
    temporary directories are the root user's alone (0700), and the process node ran engines as root."""
    for path in [directory, *directory.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def _start_time(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 1 << 62


def _established(kube: Cluster) -> bool:
    items = json.loads(kube.kubectl("get", "crd", "-o", "json").stdout)["items"]
    return bool(items) and all(any(c["type"] == "Established" and c["status"] == "True"
                                   for c in (i.get("status") or {}).get("conditions") or []) for i in items)


class Stack:
    """A running system; API reads and writes go through `call` (a loop thread of the test's own)."""

    def __init__(self, root: Path, model_dir: Path, example: dict[str, Any] | None = None, *, keda: bool = False,
                 sleeping: Sequence[str] = (), nodes: Sequence[tuple[str, Mapping[str, str]]] = NODES,
                 own_cores: bool = True) -> None:
        self.example = example if example is not None else EXAMPLE
        self.node_specs = tuple(nodes)
        self.own_cores = own_cores
        """Each node's pods on a share of the machine's CPUs of their own (NODES); False: on every CPU, as the stack
        ran before (a benchmark's baseline)."""
        self.nodes: list[real_node.Node] = []
        """The real nodes running, in start order (`nodes` first, then those of `start_node`)."""
        self.with_keda = keda
        self.sleeping = tuple(sleeping)
        """Pools expected at zero replicas (asleep) whenever the stack is Ready."""
        self.keda: testkeda.Keda | None = None
        self.root = root
        self.model_dir = model_dir
        self.kube_cluster: Cluster | None = None
        self.prom: Prometheus | None = None
        self.kube: ClientKubeApi | None = None
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="e2e-calls", daemon=True)
        self._exits = contextlib.ExitStack()
        """What was started inside the cluster's namespace, stopped from inside it."""
        self._cluster_exits = contextlib.ExitStack()
        """The cluster (and its namespace), stopped last, from the host."""

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        readable_by_pods(self.model_dir.parent)
        kube = testcluster.start(self.root / "kube", kwok=False, heartbeats=HEARTBEATS)  # on the host: makes the netns
        self._cluster_exits.callback(kube.stop)
        self.kube_cluster = kube
        with self.inside():  # the threads and processes started here stay in there
            self._start_inside(kube)

    def _start_inside(self, kube: Cluster) -> None:
        self._admin_objects(kube)
        if self.with_keda:
            self.keda = self._exits.enter_context(testkeda.running(kube))
        from tests.support.vllm_cpu import pinned_in_page_cache

        self._exits.enter_context(pinned_in_page_cache(engine_image_files()))
        for name, labels in self.node_specs:
            self.start_node(name, labels)
        self.prom = self._prometheus(kube)
        self._loop_thread.start()
        self._exits.callback(lambda: (self.loop.call_soon_threadsafe(self.loop.stop), self._loop_thread.join(10)))
        self.kube = self.run(ClientKubeApi.from_environment(kubeconfig=str(kube.kubeconfig)))  # in the calls' loop
        self._exits.callback(lambda: self.run(self.kube.close()) if self.kube is not None else None)
        self._install_operator(kube)
        self.call(lambda k: k.create(VLLM_DEPLOYMENTS, NS, copy.deepcopy(self.example)))

    def start_node(self, name: str, labels: Mapping[str, str]) -> real_node.Node:
        """A real node (testcluster.node) with the stack's images, its Node Ready; stopped with the stack."""
        assert self.kube_cluster is not None
        index = len(self.nodes)
        node = real_node.start(self.kube_cluster, name, index=index, directory=self.root / f"node-{name}",
                               archives=image_archives(), labels=dict(labels),
                               cpus=real_node.cpus_of(index, len(self.node_specs)) if self.own_cores else None)
        self.nodes.append(node)
        self._exits.callback(node.stop)
        return node

    def stop(self) -> None:
        try:
            if self.kube_cluster is not None:
                with self.inside():
                    self._exits.close()
            else:
                self._exits.close()
        finally:
            self._cluster_exits.close()

    def inside(self) -> contextlib.AbstractContextManager[None]:
        """This thread in the cluster's network namespace for the block (threads it starts there inherit it)."""
        assert self.kube_cluster is not None, "the stack has not started"
        return entered(self.kube_cluster.netns.pin_name)

    def node_ready(self, name: str) -> bool | None:
        """The Node's Ready condition: True, False (False or Unknown), None while the Node does not exist."""
        assert self.kube_cluster is not None
        proc = self.kube_cluster.kubectl("get", "node", name, "-o", "json", check=False)
        if proc.returncode != 0:
            return None
        status = cond(json.loads(proc.stdout), "Ready").get("status")
        return True if status == "True" else False if status in ("False", "Unknown") else None

    def _install_operator(self, kube: Cluster) -> None:
        """`helm install` of the chart (its CRDs included), then wait for the operator pod Ready on `cpu-0`; the
        VLLMDeployment is created after that, so the chart's admission webhook checks it as in a cluster."""
        values = {"watch": {"mode": "namespaced", "namespaces": [NS]},
                  "nodeSelector": {"kubernetes.io/hostname": NODE},
                  "operator": {"health": True, "prometheusUrl": self.prom.url if self.prom else ""}}
        values_file = self.root / "operator-values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        helm(kube, "install", OPERATOR_RELEASE, str(ROOT / "charts" / "vllm-operator"), "--namespace", OPERATOR_NS,
             "--create-namespace", "-f", str(values_file))
        deadline = time.monotonic() + 60
        while not _established(kube):
            if time.monotonic() > deadline:
                raise AssertionError("the chart's CRDs were not Established within 60 s")
            time.sleep(0.2)
        self.wait(lambda: (pod := self.operator_pod()) is not None and cond(pod, "Ready").get("status") == "True",
                  OPERATOR_READY_TIMEOUT_S, what="the chart's operator pod Ready")

    def _admin_objects(self, kube: Cluster) -> None:
        docs = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": TOKENIZER_CONFIGMAP, "namespace": NS},
             "data": {f: (self.model_dir / f).read_text() for f in TOKENIZER_FILES}},
            {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "models-dev"},
             "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                      "persistentVolumeReclaimPolicy": "Retain",
                      "hostPath": {"path": str(self.model_dir.parent), "type": "Directory"},
                      "claimRef": {"namespace": NS, "name": "models"}}},
            {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": NS},
             "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": "models-dev",
                      "resources": {"requests": {"storage": "1Gi"}}}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": PROMETHEUS_SA, "namespace": NS}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "e2e-prometheus"},
             "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "e2e-prometheus"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-prometheus"},
             "subjects": [{"kind": "ServiceAccount", "name": PROMETHEUS_SA, "namespace": NS}]},
        ]
        kube.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", "-", input=yaml.safe_dump_all(docs))

    def _prometheus(self, kube: Cluster) -> Prometheus:
        root = self.root / "prometheus"
        root.mkdir(parents=True, exist_ok=True)
        token = root / "token"
        token.write_text(kube.kubectl("create", "token", PROMETHEUS_SA, "-n", NS, "--duration=4h").stdout.strip())
        jobs = podmonitor_scrape_config(pod_monitor(the_plan(self.example)), api_server=kube.server,
                                        ca_file=kube.ca_file, token_file=token)
        (root / "jobs.json").write_text(json.dumps(jobs, indent=1))
        prom = Prometheus(root, scrape_configs=jobs, host=kube.netns.address,
                          executable=str(binaries.prometheus()))
        prom.start()
        self._exits.callback(prom.stop)
        return prom

    # -- access ------------------------------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[ClientKubeApi], Awaitable[T]], timeout: float = 60.0) -> T:
        assert self.kube is not None
        kube = self.kube

        async def go() -> T:
            return await fn(kube)

        return self.run(go(), timeout)

    def obj(self) -> dict[str, Any]:
        found = self.call(lambda k: k.get(VLLM_DEPLOYMENTS, NS, NAME))
        assert found is not None
        return found

    def pods(self, pool: str | None = None, component: str = constants.COMPONENT_ENGINE, *,
             terminating: bool = False) -> list[dict[str, Any]]:
        """The pods of a pool (or component), without those being deleted unless `terminating`."""
        selector = f"{constants.LABEL_DEPLOYMENT}={NAME},{constants.LABEL_COMPONENT}={component}"
        if pool is not None:
            selector += f",{constants.LABEL_POOL}={pool}"
        pods = self.call(lambda k: k.list(PODS, NS, selector))
        return sorted((p for p in pods if terminating or not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: p["metadata"]["name"])

    def operator_pod(self) -> dict[str, Any] | None:
        """The chart's operator pod (None unless exactly one, not being deleted)."""
        pods = [p for p in self.call(lambda k: k.list(PODS, OPERATOR_NS, OPERATOR_SELECTOR))
                if not p["metadata"].get("deletionTimestamp")]
        return pods[0] if len(pods) == 1 else None

    def operator_log(self) -> str:
        """The operator pod's log, as its container wrote it (empty before the pod ran)."""
        pod = self.operator_pod()
        if pod is None:
            return ""
        return PodContainer(self, OPERATOR_NS, pod["metadata"]["name"], "operator").log(tail=-1)

    def events(self) -> list[dict[str, Any]]:
        return self.call(lambda k: k.list(EVENTS, NS))

    def container(self, pod: str) -> PodContainer:
        """An engine pod's container."""
        return PodContainer(self, NS, pod)

    def engine(self, pool: str) -> PodContainer:
        """The (single) engine pod's container of a pool."""
        pods = self.pods(pool)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return self.container(pods[0]["metadata"]["name"])

    def router_url(self) -> str:
        pods = self.pods(component=constants.COMPONENT_ROUTER)
        assert len(pods) == 1
        return f"http://{pods[0]['status']['podIP']}:{constants.ROUTER_PORT}"

    def replicas(self, pool: str) -> int | None:
        """The pool Deployment's spec.replicas (None while it does not exist)."""
        dep = self.call(lambda k: k.get(DEPLOYMENTS, NS, pool_service(pool)))
        return None if dep is None else int(dep.get("spec", {}).get("replicas", 1))

    def ready(self) -> bool:
        """VLLMDeployment Ready, one Ready engine pod per awake pool, each sleeping pool at 0 replicas with no pod
        left (a terminating one included: its engine still runs on the node), the router pod Ready and serving."""
        if cond(self.obj(), constants.COND_READY).get("status") != "True":
            return False
        if any(self.replicas(p) != 0 or self.pods(p, terminating=True) for p in self.sleeping):
            return False
        awake = [p for p in ("short", "long") if p not in self.sleeping]
        pods = [pod for p in awake for pod in self.pods(p)] + self.pods(component=constants.COMPONENT_ROUTER)
        if len(pods) != len(awake) + 1 or not all(cond(p, "Ready").get("status") == "True" for p in pods):
            return False
        return http_status(self.router_url() + "/health") == 200

    def wait(self, check: Callable[[], T | None], timeout: float, interval: float = 0.5, what: str = "") -> T:
        """Poll `check` until it returns something truthy; fail naming `what` with every pod's log tail."""
        deadline = time.monotonic() + timeout
        last: T | None = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"{what or check} not met within {timeout:.0f} s (last: {last!r}); "
                             f"{self.diagnostics()}")

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        asleep = f" ({', '.join(self.sleeping)} asleep at 0)" if self.sleeping else ""
        self.wait(self.ready, timeout, interval=1.0, what=f"the pools and the router Ready{asleep}")

    def diagnostics(self) -> str:
        """What a failed wait shows: the VLLMDeployment's status and recent events (the operator's decisions), then
        each pod's log tail without the probe and scrape access lines that would fill it; the operator pod's tail is
        longer (its decisions and errors are what a failed wait most often needs)."""
        parts = [machine_snapshot()]
        with contextlib.suppress(Exception):
            status = self.obj().get("status", {})
            parts.append(f"\n--- {NAME} status.conditions: {status.get('conditions')}\n"
                         f"--- {NAME} status.pools: {status.get('pools')}")
        with contextlib.suppress(Exception):
            events = sorted(self.events(), key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            parts.append("\n--- events (newest 15):\n" + "\n".join(
                f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')}: {e.get('message')}"
                for e in events[-15:]))
        with contextlib.suppress(Exception):
            parts.append(self._real_pod_logs())
        return "".join(parts)

    def _real_pod_logs(self) -> str:
        """Every pod's containers on the real nodes: where, state, restarts, last termination, and the log tail
        (`kubectl logs`, the previous run's too after a restart); then each node's kubelet log tail."""
        if self.kube is None:
            return ""
        parts = []
        for ns in (OPERATOR_NS, NS):
            for pod in self.call(lambda k, ns=ns: k.list(PODS, ns, None)):  # type: ignore[misc]
                meta, status = pod["metadata"], pod.get("status") or {}
                for cs in status.get("containerStatuses") or []:
                    c = PodContainer(self, ns, meta["name"], cs["name"])
                    keep = 60 if ns == OPERATOR_NS else 25
                    head = (f"\n--- {ns}/{meta['name']}/{cs['name']} on {pod['spec'].get('nodeName')} "
                            f"({status.get('podIP')}, {status.get('phase')}, state {cs.get('state')}, restarts "
                            f"{cs.get('restartCount')}, last {cs.get('lastState')}) log tail:\n")
                    previous = ""
                    if cs.get("restartCount"):
                        kept = [ln for ln in c.log(200, previous=True).splitlines() if not ACCESS_LINE.search(ln)]
                        previous = "(previous run)\n" + "\n".join(kept[-keep:]) + "\n(this run)\n"
                    kept = [ln for ln in c.log(400).splitlines() if not ACCESS_LINE.search(ln)]
                    parts.append(head + previous + "\n".join(kept[-keep:]))
        for node in self.nodes:
            lines = [ln for ln in node.log("kubelet").read_text(errors="replace").splitlines()
                     if ln[:1] in ("E", "W")]
            parts.append(f"\n--- node {node.name}: kubelet warnings and errors (last 15):\n" + "\n".join(lines[-15:]))
        return "".join(parts)


def machine_snapshot(top: int = 14) -> str:
    """The machine's state when a wait fails, first in the diagnostics (CI keeps a log's head and tail): memory and
    page cache, pressure stall figures, load, and the largest processes with their state and kernel wait channel.
    A vLLM restart that printed nothing for minutes (issue 19) shows here whether it waited on the disk (state D,
    io pressure, little page cache), on the CPU (R, cpu pressure) or on something else (S with its wait channel)."""
    lines = ["\n--- machine:"]
    with contextlib.suppress(OSError):
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        lines.append("  " + ", ".join(f"{k} {meminfo[k].strip()}" for k in
                                      ("MemTotal", "MemAvailable", "Cached", "Shmem", "Dirty") if k in meminfo))
    with contextlib.suppress(OSError):
        lines.append(f"  loadavg {Path('/proc/loadavg').read_text().strip()}")
    for kind in ("cpu", "io", "memory"):
        with contextlib.suppress(OSError):
            lines.append(f"  pressure {kind}: {Path(f'/proc/pressure/{kind}').read_text().splitlines()[0]}")
    procs = []
    page_kib, ticks = os.sysconf("SC_PAGE_SIZE") // 1024, os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            rss_kib = int(fields[21]) * page_kib
            cpu_s = (int(fields[11]) + int(fields[12])) / ticks
            wchan = (entry / "wchan").read_text().strip() or "-"
            raw = (entry / "cmdline").read_bytes().replace(b"\0", b" ").replace(b"\n", b" ")
            cmd = raw.decode(errors="replace").strip()[:140]
            procs.append((rss_kib, f"  pid {entry.name} {fields[0]} wchan {wchan} rss {rss_kib // 1024} MiB "
                                   f"cpu {cpu_s:.0f} s: {cmd}"))
    lines += [text for _, text in sorted(procs, reverse=True)[:top]]
    return "\n".join(lines)


def http_status(url: str, timeout: float = 3.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, TimeoutError):
        return None


@contextlib.contextmanager
def running_stack(root: Path, model_dir: Path, example: dict[str, Any] | None = None, *, keda: bool = False,
                  sleeping: Sequence[str] = (), inside: bool = True, own_cores: bool = True) -> Iterator[Stack]:
    """The stack, cpu-dev.yaml (or `example`, a variant of it) applied and Ready (or a failure with every pod's log
    tail); stopped afterwards. `keda` and `sleeping`: see the module's docstring; `own_cores`: `Stack`'s. With
    `inside` the calling thread stays in the cluster's namespace for the block; without, it is back on the host
    (enter with `Stack.inside`)."""
    stack = Stack(root, model_dir, example, keda=keda, sleeping=sleeping, own_cores=own_cores)
    try:
        stack.start()
        with stack.inside():
            stack.wait_ready()
        with stack.inside() if inside else contextlib.nullcontext():
            yield stack
    finally:
        stack.stop()


def pool_service(pool: str) -> str:
    return names.pool(NAME, pool)


def the_plan(example: Mapping[str, Any] | None = None) -> Plan:
    """What the operator plans for cpu-dev.yaml (or `example`) with no remediation applied."""
    spec = (example if example is not None else EXAMPLE)["spec"]
    return plan(parse_spec(spec), None, RemediationState(pools={}), name=NAME, namespace=NS)


def metrics_text(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def engine_url(stack: Stack, pool: str) -> str:
    return f"http://{stack.engine(pool).ip}:{constants.ENGINE_PORT}"


def counter(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels` (tolerates `vllm_` for `vllm:`)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name).replace(':', '[:_]')}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def prompt_of(tokenizer: tokenizers.Tokenizer, n_tokens: int, salt: int = 0) -> str:
    """A completions prompt that the model's tokenizer (BOS included) turns into exactly n_tokens tokens; another
    `salt` gives another prompt of the same length (no prefix shared with the first, for vLLM's prefix cache)."""
    words = " ".join(f"w{(i + salt * 31) % 97}" for i in range(n_tokens * 2))
    ids = tokenizer.encode(words, add_special_tokens=False).ids[: n_tokens - 1]
    text = tokenizer.decode(ids)
    assert len(tokenizer.encode(text).ids) == n_tokens, "prompt construction drifted"
    return text


def model_name() -> str:
    return str(the_plan().router.model)


def engine_core_pid(stack: Stack, pool: str) -> int:
    container = stack.engine(pool)
    for pid in container.pids():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(ENGINE_CORE_TITLE):
                return pid
        except OSError:
            continue
    raise LookupError(f"no {ENGINE_CORE_TITLE.decode()} in the engine container of {container.pod}")


@dataclass(frozen=True)
class Answer:
    """One request of `Traffic`: when it was sent and answered (monotonic), its status (0: no answer) and pool."""

    sent: float
    answered: float
    status: int
    pool: str


class Termination:
    """The first termination of a container with `reason`, from a watch of its pod started on entering: every status
    the kubelet writes arrives, in order, also when the pod is deleted right after (a pool on a ladder rung rolls
    without a surge pod, so the step-down deletes the OOMKilled pod seconds after the kubelet reported it, before a
    later look could see it). Both places the kubelet writes it count: `state.terminated` (not restarted yet) and
    `lastState.terminated`. `found` raises if the watch failed, rather than leaving a wait to time out."""

    def __init__(self, container: PodContainer, reason: str) -> None:
        self.container, self.reason = container, reason
        self._found: dict[str, Any] | None = None
        self._watch: concurrent.futures.Future[None] | None = None

    @property
    def found(self) -> dict[str, Any] | None:
        if self._watch is not None and self._watch.done() and not self._watch.cancelled():
            error = self._watch.exception()
            if error is not None:
                raise AssertionError(f"the watch of pod {self.container.namespace}/{self.container.pod} failed: "
                                     f"{error!r}") from error
        return self._found

    def _look(self, pod: Mapping[str, Any]) -> bool:
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        status: dict[str, Any] = next((c for c in statuses if c["name"] == self.container.container), {})
        for terminated in ((status.get("state") or {}).get("terminated"),
                           (status.get("lastState") or {}).get("terminated")):
            if terminated and terminated.get("reason") == self.reason:
                self._found = dict(terminated)
                return True
        return False

    async def _follow(self) -> None:
        c, kube = self.container, self.container.stack.kube
        assert kube is not None, "the stack has not started"
        pod = await kube.get(PODS, c.namespace, c.pod)
        if pod is None or self._look(pod):
            return
        version = str(pod["metadata"]["resourceVersion"])
        while True:  # the server ends a watch after its timeout: resume where it stopped
            async for event in kube.watch(PODS, c.namespace, resource_version=version,
                                          field_selector=f"metadata.name={c.pod}"):
                version = event.resource_version or version
                if event.type != "BOOKMARK" and (self._look(event.object) or event.type == "DELETED"):
                    return

    def __enter__(self) -> Termination:
        self._watch = asyncio.run_coroutine_threadsafe(self._follow(), self.container.stack.loop)
        return self

    def __exit__(self, *_: object) -> None:
        assert self._watch is not None
        self._watch.cancel()


class Traffic:
    """Short prompts through the router from a background thread; every answer recorded with its time and pool."""

    def __init__(self, stack: Stack, *, max_tokens: int = 4, threads: int = 1, timeout: float = 60.0) -> None:
        self.url = stack.router_url()
        self.model = model_name()
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.results: list[Answer] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        oai = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=self.timeout)
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                raw = oai.completions.with_raw_response.create(model=self.model, prompt="Hello short pool",
                                                               max_tokens=self.max_tokens,
                                                               extra_body={"ignore_eos": True})
                self.results.append(Answer(sent, time.monotonic(), raw.status_code,
                                           raw.headers.get("x-vllm-operator-pool", "")))
            except openai.APIStatusError as err:
                self.results.append(Answer(sent, time.monotonic(), err.status_code, ""))
            except openai.APIError:
                self.results.append(Answer(sent, time.monotonic(), 0, ""))
            time.sleep(0.1)

    def __enter__(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def first(self, after: float, pool: str) -> float | None:
        """When the first request sent after `after` was answered 200 by `pool` (None: not yet)."""
        times = [a.answered for a in list(self.results) if a.sent > after and a.status == 200 and a.pool == pool]
        return min(times) if times else None

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout + 10)


def router_metric(stack: Stack, name: str, **labels: str) -> float:
    return counter(metrics_text(stack.router_url()), name, **labels)


@dataclass(frozen=True)
class CoreKill:
    """When a pool's engine core was SIGKILLed and when the two fast reactions to it came (monotonic, like
    `Traffic`'s answers)."""

    killed: float
    unhealthy: float
    """The engine's /health answered 503 (or no longer answered)."""
    ejected: float
    """The router counted one more ejection for the pool."""


def kill_engine_core(stack: Stack, pool: str) -> CoreKill:
    """SIGKILL `pool`'s vLLM engine core and wait for /health to fail and the router to eject the engine: the
    first steps of the engine-death fault, shared by the self-healing test and benchmarks/e2e/faults.py."""
    ejections = router_metric(stack, "vllm_operator_router_ejections_total", pool=pool)
    core = engine_core_pid(stack, pool)
    killed = time.monotonic()
    os.kill(core, signal.SIGKILL)
    stack.wait(lambda: http_status(engine_url(stack, pool) + "/health") in (503, None), 30, interval=0.05,
               what="/health 503")
    unhealthy = time.monotonic()
    stack.wait(lambda: router_metric(stack, "vllm_operator_router_ejections_total", pool=pool) > ejections, 60,
               interval=0.05, what="router ejected the engine")
    return CoreKill(killed=killed, unhealthy=unhealthy, ejected=time.monotonic())


ALLOCATE = """
import sys, time
need, chunk, held = int(sys.argv[1]), 32 << 20, []
while len(held) * chunk < need:
    block = bytearray(chunk)
    block[::4096] = b"\\x01" * (chunk // 4096)
    held.append(block)
print("allocated", len(held) * chunk, flush=True)
time.sleep(3600)
"""
"""What `exceed_memory_limit` runs in the engine container: touch `need` bytes (every page written, so every page
is charged to the container's memory cgroup), then hold them."""
OOM_MARGIN_BYTES = 256 << 20
"""How far past the limit the container's unreclaimable memory is taken: the page cache it holds is reclaimed first,
so only what no reclaim frees counts."""


def _rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        return f"({err.strerror})"


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X")


@dataclass(frozen=True)
class MemoryKill:
    """The kernel's OOM kill of one of vLLM's processes in an engine container (`exceed_memory_limit`)."""

    started: float
    """`kubectl exec` of the allocation began (monotonic)."""
    killed: float
    """The victim was gone (monotonic)."""
    victim: int
    victim_title: str
    allocated_bytes: int


def exceed_memory_limit(stack: Stack, pool: str) -> MemoryKill:
    """Take `pool`'s engine container past its memory limit (the pod's `resources.limits.memory`, the memory
    cgroup's limit on the node) so that the kernel's OOM killer kills one of vLLM's processes, as when vLLM itself
    outgrows the limit: a process started in the container through `kubectl exec` (the kubelet's exec path, so it
    is charged to the container's cgroup) touches as many bytes as take the cgroup's unreclaimable memory (rss and
    shmem, as its memory.stat counts them) `OOM_MARGIN_BYTES` past the limit, and holds them.

    The kernel kills the cgroup's process with the highest badness (its size plus its oom_score_adj share). vLLM's
    largest process is the worker holding the KV cache, but the allocator grows towards the victim's size; so that
    the kernel's choice does not depend on that race, the victim's oom_score_adj is raised to 1000 from the host
    first (raising it needs no privilege). Waits until the victim is gone; the container then ends as vLLM does
    after losing a process, and the runtime reports it OOMKilled (an OOM event in its cgroup)."""
    container = stack.engine(pool)
    memcg = container.cgroup(hierarchy="memory")
    assert memcg is not None, f"no memory cgroup for {container.pod}'s engine container"
    limit = int((memcg / "memory.limit_in_bytes").read_text())
    stat = dict(line.split() for line in (memcg / "memory.stat").read_text().splitlines() if " " in line)
    held = int(stat.get("total_rss", stat.get("rss", 0))) + int(stat.get("total_shmem", stat.get("shmem", 0)))
    need = max(0, limit - held) + OOM_MARGIN_BYTES
    wrapper = container.main_pid()
    vllm = [p for p in container.pids() if p != wrapper]
    assert vllm, f"no vLLM process under the wrapper in {container.pod}"
    victim = max(vllm, key=_rss_bytes)
    title = " ".join(process_argv(victim))[:80]
    Path(f"/proc/{victim}/oom_score_adj").write_text("1000")
    python = process_argv(wrapper)[0]
    kube = stack.kube_cluster
    assert kube is not None
    cmd = [binaries.kubectl(), f"--kubeconfig={kube.kubeconfig}", f"--cache-dir={kube.cache_dir}", "exec", "-n",
           container.namespace, container.pod, "-c", container.container, "--", python, "-c", ALLOCATE, str(need)]
    started = time.monotonic()
    exec_proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not _gone(victim):
        if time.monotonic() > deadline or exec_proc.poll() is not None:
            exec_proc.kill()
            out = exec_proc.communicate()[0]
            memory = {}
            for name in ("memory.usage_in_bytes", "memory.failcnt", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    memory[name] = (memcg / name).read_text().split()
            raise AssertionError(f"no OOM kill of {title} (pid {victim}, oom_score_adj "
                                 f"{_read(f'/proc/{victim}/oom_score_adj')}) in {container.pod} (limit {limit}, "
                                 f"unreclaimable {held}, allocating {need}): kubectl exec said {out!r}, exit "
                                 f"{exec_proc.returncode}; {memory}; {stack.diagnostics()}")
        time.sleep(0.05)
    killed = time.monotonic()
    try:  # the allocation ends with the container, which ends with vLLM
        exec_proc.wait(60)
    except subprocess.TimeoutExpired:
        exec_proc.kill()
        exec_proc.wait()
    return MemoryKill(started=started, killed=killed, victim=victim, victim_title=title, allocated_bytes=need)
