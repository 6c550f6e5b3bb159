"""Pods on real nodes (testcluster.node): kubelet v1.37.2 over containerd 1.6 and runc, two nodes of a control plane
of this module's own, a minimal image built here (testcluster.images.busybox). Each test fails when the behaviour it
names is missing: the kubelet enforcing a restricted securityContext, its probes (a slow start is not killed, a hang
is), the kernel's OOM kill under the pod's memory limit and its reason in the status, `terminationMessagePath`,
`kubectl logs` and `kubectl exec` authorized by the kubelet for real, cross-node pod traffic, Services (the API server's
included) through each node's kube-proxy, and a node whose kubelet, kube-proxy, containerd and containers are killed
going NotReady, and each node's pods confined to that node's CPUs.

What each container reports is read back through `kubectl logs`/`exec`, the status through the API server: the same
paths the operator's health loop and its tests read.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import cluster, images, node
from testcluster.cluster import PROCESS_NODE_HEARTBEATS, Cluster
from testcluster.netns import entered
from testcluster.node import Node
from tests.support import kubelet
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NS = "real-node"
IMAGE = images.BUSYBOX_IMAGE


@dataclass
class Nodes:
    kube: Cluster
    a: Node
    b: Node
    kernel: dict[str, str]  # the kernel settings the kubelet wants changed, as the machine had them before


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    root = tmp_path_factory.mktemp("real-node")
    busybox = images.busybox()
    before = set(os.listdir("/run/netns"))
    kernel = {key: Path("/proc/sys", key).read_text() for key in node.KERNEL_TUNABLES}
    with cluster.running(root / "kube", kwok=False, heartbeats=PROCESS_NODE_HEARTBEATS) as kube:
        a = node.start(kube, "node-a", index=0, directory=root / "node-a", archives=[busybox],
                       cpus=node.cpus_of(0, 2))
        try:
            b = node.start(kube, "node-b", index=1, directory=root / "node-b", archives=[busybox],
                           cpus=node.cpus_of(1, 2))
            try:
                kube.kubectl("create", "namespace", NS)
                yield Nodes(kube, a, b, kernel)
            finally:
                b.stop()
        finally:
            a.stop()
    # containerd's per-pod namespaces live in the node's own /run/netns: none is left on the host's
    assert not [n for n in set(os.listdir("/run/netns")) - before if n.startswith("cni-")]



def apply_pod(kube: Cluster, name: str, on: Node, containers: list[dict[str, Any]], **spec: Any) -> None:
    for c in containers:
        c.setdefault("image", IMAGE)
        c.setdefault("imagePullPolicy", "Never")  # no registry: the image was imported into the node's containerd
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": on.name}, "containers": containers,
                    "terminationGracePeriodSeconds": 1, **spec}}
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))


def get_pod(kube: Cluster, name: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("get", "pod", name, "-n", NS, "-o", "json").stdout))


def container_status(kube: Cluster, name: str, container: str | None = None) -> dict[str, Any]:
    statuses = get_pod(kube, name).get("status", {}).get("containerStatuses") or []
    return next((s for s in statuses if container is None or s["name"] == container), {})


def running(kube: Cluster, name: str) -> bool:
    return "running" in container_status(kube, name).get("state", {})


def kexec(kube: Cluster, pod: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("exec", "-n", NS, pod, "--", *cmd, check=check)


def shape(value: Any) -> Any:
    """The keys of a status, nested: what a reader of it can rely on being there."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def assert_kwok_status_has_the_kubelets_shape(kube: Cluster, pod_name: str) -> None:
    """tests/support/kubelet.py writes kwok pods' status for the health tier: for the state this pod's first
    container is in now, its status must have the keys the real kubelet's has (values differ: times, IDs)."""
    pod = get_pod(kube, pod_name)
    real = pod["status"]["containerStatuses"][0]
    state = next(iter(real["state"]))
    last = real["lastState"].get("terminated")
    kept = ("exitCode", "reason", "message")
    report = kubelet.ContainerReport(
        ready=real["ready"], restart_count=real["restartCount"],
        waiting_reason=real["state"]["waiting"]["reason"] if state == "waiting" else None,
        terminated={k: real["state"]["terminated"][k] for k in kept if k in real["state"]["terminated"]}
        if state == "terminated" else None,
        last_terminated={k: last[k] for k in kept if k in last} if last else None)
    written = kubelet.pod_status(pod, report, time.time())
    assert shape(written["containerStatuses"][0]) == shape(real), (written["containerStatuses"][0], real)
    assert [(c["type"], sorted(c)) for c in written["conditions"]] == [
        (c["type"], sorted(c)) for c in pod["status"]["conditions"]]
    assert written["observedGeneration"] == pod["status"]["observedGeneration"]


RESTRICTED = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def test_nodes_run_the_real_kubelet_over_containerd(nodes: Nodes) -> None:
    for n in (nodes.a, nodes.b):
        obj = json.loads(nodes.kube.kubectl("get", "node", n.name, "-o", "json").stdout)
        info = obj["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://1.6."), info
        assert {"type": "InternalIP", "address": n.ip} in obj["status"]["addresses"]
        assert obj["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == node.KUBELET_PORT
        routes = subprocess.run([*n.enter(), "ip", "-o", "route", "show", "table", "all"], capture_output=True,
                                text=True, check=True).stdout
        assert "default" not in routes, routes
        conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
        assert conditions == {"MemoryPressure": "False", "DiskPressure": "False", "PIDPressure": "False",
                              "Ready": "True"}, conditions
        # the configuration in effect, read through the API server's proxy to the kubelet's own API
        config = json.loads(nodes.kube.kubectl("get", "--raw", f"/api/v1/nodes/{n.name}/proxy/configz").stdout)
        kubelet = config["kubeletconfig"]
        assert kubelet["imageGCHighThresholdPercent"] == 100 and kubelet["evictionHard"]["imagefs.available"] == "1%"
        assert kubelet["failCgroupV1"] is False and kubelet["protectKernelDefaults"] is True
    # the kubelet changed none of the shared machine's kernel settings
    assert {key: Path("/proc/sys", key).read_text() for key in node.KERNEL_TUNABLES} == nodes.kernel


def test_nodes_share_one_image_store_by_hard_links(nodes: Nodes) -> None:
    """Each node's containerd root is a hard-linked copy of one imported store (testcluster.imagestore): an unpacked
    image file is one inode for both nodes (no disk, one page cache), each node's bolt databases are its own."""
    def files(n: Node, pattern: str) -> dict[str, os.stat_result]:
        root = n.directory / "containerd" / "root"
        return {str(p.relative_to(root)): p.stat() for p in root.glob(pattern)}

    busybox_a = files(nodes.a, "io.containerd.snapshotter.v1.overlayfs/snapshots/*/fs/bin/busybox")
    busybox_b = files(nodes.b, "io.containerd.snapshotter.v1.overlayfs/snapshots/*/fs/bin/busybox")
    assert busybox_a and busybox_a.keys() == busybox_b.keys(), (busybox_a, busybox_b)
    assert all(busybox_a[k].st_ino == busybox_b[k].st_ino and busybox_a[k].st_nlink >= 3 for k in busybox_a)
    dbs_a, dbs_b = files(nodes.a, "**/*.db"), files(nodes.b, "**/*.db")
    assert "io.containerd.metadata.v1.bolt/meta.db" in dbs_a and dbs_a.keys() == dbs_b.keys()
    assert all(dbs_a[k].st_ino != dbs_b[k].st_ino and dbs_a[k].st_nlink == 1 for k in dbs_a)


def test_restricted_security_context_is_enforced_and_logs_and_exec_work(nodes: Nodes) -> None:
    kube = nodes.kube
    apply_pod(kube, "restricted", nodes.a, [{
        "name": "main", "command": ["sh", "-c", "echo started as $(id -u); exec sleep 3600"],
        "securityContext": RESTRICTED}])
    wait_for("the restricted pod running", lambda: running(kube, "restricted"))
    assert kexec(kube, "restricted", "id", "-u").stdout.strip() == str(images.TEST_UID)
    # the image says USER 65532:65532, but the kubelet passes the runtime only the image's uid (RunAsUser) and the
    # runtime looks the group up in the image's /etc/passwd: none, so group 0. A pod that wants the image's group
    # must say runAsGroup (the operator's rendered pods do; the process node ran everything as the test runner)
    assert kexec(kube, "restricted", "id", "-g").stdout.strip() == "0"
    write = kexec(kube, "restricted", "sh", "-c", "touch /probe", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    caps = kexec(kube, "restricted", "grep", "^Cap", "/proc/self/status").stdout
    assert {line.split()[0]: line.split()[1] for line in caps.splitlines()}["CapEff:"] == "0" * 16, caps
    no_new_privs = kexec(kube, "restricted", "grep", "NoNewPrivs", "/proc/self/status").stdout.split()
    assert no_new_privs == ["NoNewPrivs:", "1"]
    seccomp = kexec(kube, "restricted", "grep", "^Seccomp:", "/proc/self/status").stdout.split()
    assert seccomp == ["Seccomp:", "2"]  # filter mode: the runtime's default profile
    # the projected ServiceAccount token volume, mounted by the kubelet
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert kexec(kube, "restricted", "cat", f"{sa}/namespace").stdout == NS
    assert kexec(kube, "restricted", "cat", f"{sa}/token").stdout.count(".") == 2
    assert f"started as {images.TEST_UID}" in kube.kubectl("logs", "-n", NS, "restricted").stdout


def test_each_nodes_pods_run_on_that_nodes_cpus_only(nodes: Nodes) -> None:
    """A node started with `cpus` runs its pods there (containerd's affinity, inherited by every container), as a
    machine of its own would: two nodes' shares do not overlap while the machine has a CPU for each."""
    kube = nodes.kube
    allowed: dict[str, str] = {}
    for n in (nodes.a, nodes.b):
        pod = f"cpus-{n.name}"
        apply_pod(kube, pod, n, [{"name": "main", "command": ["sleep", "3600"], "securityContext": RESTRICTED}])
        wait_for(f"pod {pod} running", functools.partial(running, kube, pod))
        line = kexec(kube, pod, "grep", "^Cpus_allowed_list:", "/proc/self/status").stdout.split()
        allowed[n.name] = line[1]
        kube.kubectl("delete", "pod", "-n", NS, pod, "--wait=false")
    assert allowed == {"node-a": node.cpus_of(0, 2), "node-b": node.cpus_of(1, 2)}, allowed
    if len(os.sched_getaffinity(0)) >= 2:
        assert allowed["node-a"] != allowed["node-b"]


def test_running_as_root_is_refused_under_run_as_non_root(nodes: Nodes) -> None:
    kube = nodes.kube
    apply_pod(kube, "wants-root", nodes.a, [{
        "name": "main", "command": ["sleep", "3600"],
        "securityContext": {**RESTRICTED, "runAsUser": 0}}])
    waiting = wait_for("the kubelet refusing root", lambda: container_status(kube, "wants-root").get(
        "state", {}).get("waiting", {}).get("reason") == "CreateContainerConfigError" and container_status(
        kube, "wants-root")["state"]["waiting"])
    assert "non-root" in waiting["message"], waiting


def test_kubelet_api_authorizes_each_request(nodes: Nodes) -> None:
    """The kubelet's own API (what logs and exec go through) authenticates by the cluster CA and authorizes by a
    SubjectAccessReview: anonymous is refused, and a node's identity is not allowed another kubelet's logs."""
    pki = nodes.kube.directory / "pki"
    url = f"https://{nodes.b.ip}:{node.KUBELET_PORT}/pods"  # nodes/proxy, as logs, exec and the rest

    def get(*cert: Path) -> tuple[int, str]:
        """GET `url` from inside the cluster's namespace, verifying the kubelet's certificate by the cluster CA."""
        code = ("import ssl, sys, urllib.request, urllib.error\n"
                f"ctx = ssl.create_default_context(cafile={str(pki / 'ca.crt')!r})\n"
                f"ctx.load_cert_chain(*{[str(c) for c in cert]!r}) if {bool(cert)} else None\n"
                "try:\n"
                f"    r = urllib.request.urlopen({url!r}, context=ctx, timeout=10)\n"
                "    print(r.status, r.read().decode())\n"
                "except urllib.error.HTTPError as e:\n"
                "    print(e.code, e.read().decode())\n")
        out = subprocess.run([*nodes.kube.netns.exec_prefix(), sys.executable, "-c", code], capture_output=True,
                             text=True, check=True).stdout
        status, _, body = out.partition(" ")
        return int(status), body

    assert get()[0] == 401  # anonymous
    status, body = get(pki / "node-node-a.crt", pki / "node-node-a.key")
    assert status == 403 and "system:node:node-a" in body, body
    status, body = get(pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key")
    assert status == 200 and '"kind":"PodList"' in body, body  # the API server's own identity (kubectl logs)


def test_node_credentials_are_limited_by_the_node_authorizer_and_node_restriction(nodes: Nodes) -> None:
    kube, own = nodes.kube, nodes.a.directory / "kubelet.kubeconfig"
    labelled = kube.kubectl("label", "node", nodes.a.name, "node-restriction.kubernetes.io/pool=x", check=False,
                            kubeconfig=own)
    assert labelled.returncode != 0 and "is not allowed to modify labels" in labelled.stderr, labelled  # admission
    other = kube.kubectl("label", "node", nodes.b.name, "example.com/touched=yes", check=False, kubeconfig=own)
    assert other.returncode != 0 and "forbidden" in other.stderr.lower(), other
    secrets = kube.kubectl("get", "secrets", "-n", NS, check=False, kubeconfig=own)
    assert secrets.returncode != 0 and "forbidden" in secrets.stderr.lower(), secrets  # the Node authorizer


def test_probes_a_slow_start_is_not_killed_and_a_hang_is(nodes: Nodes) -> None:
    kube = nodes.kube
    http = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "timeoutSeconds": 1}
    apply_pod(kube, "probed", nodes.b, [{
        "name": "main",
        # 6 s before it serves: longer than liveness would allow (2 failures), shorter than the startup probe's 20
        "command": ["sh", "-c", "mkdir -p /tmp/www && echo ok > /tmp/www/index.html && sleep 6 && "
                                "httpd -f -p 8080 -h /tmp/www & wait"],
        "startupProbe": {**http, "failureThreshold": 20},
        "livenessProbe": {**http, "failureThreshold": 2},
        "readinessProbe": {**http, "failureThreshold": 1},
        "securityContext": {**RESTRICTED, "readOnlyRootFilesystem": False}}])
    started = time.monotonic()
    wait_for("the slow starter ready", lambda: container_status(kube, "probed").get("ready"), timeout=60)
    assert time.monotonic() - started >= 5
    assert container_status(kube, "probed")["restartCount"] == 0, "the slow start was killed"
    kexec(kube, "probed", "sh", "-c", "kill -STOP $(pidof httpd)")  # hangs: accepts nothing, answers nothing
    restarted = wait_for("the kubelet restarting the hung container",
                         lambda: container_status(kube, "probed").get("restartCount", 0) >= 1
                         and container_status(kube, "probed"), timeout=60)
    terminated = restarted["lastState"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] == "Error", terminated
    events = kube.kubectl("get", "events", "-n", NS, "--field-selector", "involvedObject.name=probed", "-o",
                          "json").stdout
    assert "Liveness probe failed" in events and "Readiness probe failed" in events


def test_over_its_memory_limit_a_container_is_oom_killed_by_the_kernel(nodes: Nodes) -> None:
    kube = nodes.kube
    apply_pod(kube, "hog", nodes.a, [{
        "name": "main", "command": ["sh", "-c", "echo allocating; x=x; while :; do x=$x$x; done"],
        "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
        "securityContext": RESTRICTED}])
    status = wait_for("the OOM kill", lambda: container_status(kube, "hog").get("lastState", {}).get("terminated")
                      and container_status(kube, "hog"), timeout=90)
    terminated = status["lastState"]["terminated"]
    assert terminated["reason"] == "OOMKilled" and terminated["exitCode"] == 137, terminated
    assert_kwok_status_has_the_kubelets_shape(kube, "hog")
    cgroup = kexec(kube, "hog", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes", check=False)
    if cgroup.returncode == 0:  # the restarted container is allocating again; its limit is the pod spec's
        assert cgroup.stdout.strip() == str(64 * 2**20)


def test_termination_message_reaches_last_state(nodes: Nodes) -> None:
    kube = nodes.kube
    apply_pod(kube, "last-words", nodes.b, [
        {"name": "file", "command": ["sh", "-c", "echo 'engine died: KV cache exhausted' > /dev/termination-log; "
                                                  "exit 3"],
         "securityContext": RESTRICTED},
        {"name": "logs", "terminationMessagePolicy": "FallbackToLogsOnError",
         "command": ["sh", "-c", "echo 'the last line of the log'; exit 4"], "securityContext": RESTRICTED}])

    def both_terminated() -> dict[str, dict[str, Any]] | None:
        got = {c: container_status(kube, "last-words", c).get("lastState", {}).get("terminated")
               for c in ("file", "logs")}
        return got if all(got.values()) else None

    last = wait_for("both containers terminated once", both_terminated, timeout=90)
    assert last["file"]["message"] == "engine died: KV cache exhausted\n" and last["file"]["exitCode"] == 3
    assert last["file"]["reason"] == "Error"
    assert last["logs"]["message"] == "the last line of the log\n" and last["logs"]["exitCode"] == 4
    assert_kwok_status_has_the_kubelets_shape(kube, "last-words")
    # and once the kubelet is backing off the restarts
    wait_for("CrashLoopBackOff", lambda: container_status(kube, "last-words", "file").get("state", {}).get(
        "waiting", {}).get("reason") == "CrashLoopBackOff", timeout=90)
    assert_kwok_status_has_the_kubelets_shape(kube, "last-words")


def test_pods_on_different_nodes_reach_each_other(nodes: Nodes) -> None:
    kube = nodes.kube
    apply_pod(kube, "server", nodes.a, [{
        "name": "main", "command": ["sh", "-c", "mkdir -p /tmp/www && echo from-a > /tmp/www/index.html && "
                                                "exec httpd -f -p 8080 -h /tmp/www"],
        "securityContext": {**RESTRICTED, "readOnlyRootFilesystem": False}}])
    apply_pod(kube, "client", nodes.b, [{"name": "main", "command": ["sleep", "3600"], "securityContext": RESTRICTED}])
    wait_for("both pods running", lambda: running(kube, "server") and running(kube, "client"))
    server = get_pod(kube, "server")["status"]
    assert server["podIP"].startswith(nodes.a.pod_cidr.rsplit(".", 2)[0]) and server["hostIP"] == nodes.a.ip
    # busybox's nc, not its wget: static glibc's getservbyname wants NSS modules the image does not have (SIGSEGV)
    get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {server['podIP']} 8080"
    got = wait_for("an answer across nodes", lambda: kexec(kube, "client", "sh", "-c", get, check=False).stdout)
    assert got.startswith("HTTP/1.1 200") and got.endswith("from-a\n"), got
    # from the cluster's namespace, where the API server (webhook calls), Prometheus (scrapes) and the e2e tier's
    # clients run: the pod's answer must find its way back (the pod routes only the API server's address)
    with entered(kube.netns.pin_name), urllib.request.urlopen(f"http://{server['podIP']}:8080/", timeout=5) as resp:
        assert resp.read() == b"from-a\n"
    # the API server by its own address, nothing outside
    api = kexec(kube, "client", "sh", "-c", f"nc -w 2 {nodes.kube.netns.address} 6443 </dev/null", check=False)
    assert api.returncode == 0, api
    routes = kexec(kube, "client", "ip", "route").stdout
    assert "default" not in routes, routes
    out = kexec(kube, "client", "sh", "-c", "nc -w 2 1.1.1.1 80 </dev/null", check=False)
    assert out.returncode != 0 and "unreachable" in out.stderr, out


def test_services_lead_to_their_endpoints_through_each_nodes_kube_proxy(nodes: Nodes) -> None:
    """In-cluster clients (the operator's kopf, the router's discovery) reach the API server at
    KUBERNETES_SERVICE_HOST:PORT, the `kubernetes` Service's ClusterIP: without a Service proxy on the node that
    address leads nowhere. And a Service of our own, from a pod on the other node."""
    kube = nodes.kube
    apply_pod(kube, "web", nodes.a, [{
        "name": "main", "command": ["sh", "-c", "mkdir -p /tmp/www && echo via-service > /tmp/www/index.html && "
                                                "exec httpd -f -p 8080 -h /tmp/www"],
        "securityContext": {**RESTRICTED, "readOnlyRootFilesystem": False}}])
    kube.kubectl("label", "pod", "web", "-n", NS, "app=web")
    kube.kubectl("create", "service", "clusterip", "web", "-n", NS, "--tcp=80:8080")
    apply_pod(kube, "svc-client", nodes.b, [{"name": "main", "command": ["sleep", "3600"],
                                             "securityContext": RESTRICTED}])
    wait_for("both pods running", lambda: running(kube, "web") and running(kube, "svc-client"))
    env = dict(line.split("=", 1) for line in kexec(kube, "svc-client", "env").stdout.splitlines() if "=" in line)
    service_ip = json.loads(kube.kubectl("get", "service", "kubernetes", "-o", "json").stdout)["spec"]["clusterIP"]
    assert env["KUBERNETES_SERVICE_HOST"] == service_ip and env["KUBERNETES_SERVICE_PORT"] == "443", env
    # plain HTTP to the API server's TLS port: Go's server answers it in plain text, so the answer is the API server's
    plain = kexec(kube, "svc-client", "sh", "-c", "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | "
                  "nc -w 2 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT", check=False)
    assert "Client sent an HTTP request to an HTTPS server" in plain.stdout, plain
    web_ip = json.loads(kube.kubectl("get", "service", "web", "-n", NS, "-o", "json").stdout)["spec"]["clusterIP"]
    get = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {web_ip} 80"
    got = wait_for("an answer through the Service", lambda: kexec(kube, "svc-client", "sh", "-c", get,
                                                                  check=False).stdout)
    assert got.startswith("HTTP/1.1 200") and got.endswith("via-service\n"), got


def test_a_killed_node_goes_not_ready(nodes: Nodes) -> None:
    """The last test: node b's kubelet, containerd, shims and containers all SIGKILLed by PID."""
    kube = nodes.kube
    apply_pod(kube, "doomed", nodes.b, [{"name": "main", "command": ["sleep", "3600"], "securityContext": RESTRICTED}])
    wait_for("the doomed pod running", lambda: running(kube, "doomed"))
    killed = nodes.b.crash()
    assert killed["containers"] and killed["shims"] and killed["kube-proxy"], killed
    # dead: gone, or a zombie that init (PID 1) has yet to reap
    assert [p for group in killed.values() for p in group if not cluster.exited(p)] == [], killed
    started = time.monotonic()
    wait_for("node-b NotReady", lambda: not node.node_ready(kube, nodes.b.name), timeout=60)
    lost = time.monotonic() - started
    assert lost <= PROCESS_NODE_HEARTBEATS.monitor_grace_s + 2 * PROCESS_NODE_HEARTBEATS.monitor_period_s + 5
    assert node.node_ready(kube, nodes.a.name), "node-a went down with node-b"
    reason = next(c for c in json.loads(kube.kubectl("get", "node", nodes.b.name, "-o", "json").stdout)["status"][
        "conditions"] if c["type"] == "Ready")["reason"]
    assert reason == "NodeStatusUnknown", reason
