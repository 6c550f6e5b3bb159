"""The process node agent on the real control plane: its Node and Lease, pods the real scheduler binds to it running
as processes in network namespaces of their own, their IPs published by the real endpointslice controller, no route
out of a pod, restarts with termination messages, an image it cannot run, and graceful deletion.

The node is tainted so that no other test's pods land on it; these pods tolerate the taint and select it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from processnode.agent import AgentThread, NodeConfig, node_pod_cidr
from processnode.network import node_tag
from processnode.processes import descendants
from testcluster.cluster import Cluster
from tests.support.kube import apply, unique, wait_for
from tests.support.paths import ROOT
from tests.support.procnode import running_node
from vllm_operator import constants

pytestmark = pytest.mark.integration
TAINT = {"key": "vllm-operator.dev/process-node", "value": "test", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def node(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentThread]:
    name = unique("procnode")
    stale = f"vp{node_tag(name)}beef0"  # a link an earlier run of this node left behind
    proc = kube.netns.run("ip", "link", "add", stale, "type", "veth", "peer", "name", f"vq{node_tag(name)}beef0")
    assert proc.returncode == 0, proc.stderr
    with running_node(kube, tmp_path_factory.mktemp("procnode"), prefix="procnode", cidr_index=7, taint=TAINT,
                      runtime={"backoff_initial_s": 1.0, "max_grace_s": 5.0}, name=name) as agent:
        yield agent


def _get(kube: Cluster, *args: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("get", *args, "-o", "json").stdout))


def _pod(name: str, node: str, command: list[str], *, image: str = "python:3.11",
         probe_port: int | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": image, "command": command,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "terminationMessagePolicy": "FallbackToLogsOnError"}
    if probe_port is not None:
        container["ports"] = [{"name": "http", "containerPort": probe_port}]
        container["readinessProbe"] = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": {"nodeSelector": {"vllm-operator.dev/test-node": node},
                     "tolerations": [{**TAINT, "operator": "Equal"}], "terminationGracePeriodSeconds": 5,
                     "containers": [container]}}


def _condition(obj: dict[str, Any], kind: str) -> str:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) or [] if c["type"] == kind), "")


def test_node_registers_renews_its_lease_and_stays_ready(kube: Cluster, node: AgentThread) -> None:
    name = node.config.name
    obj = _get(kube, "node", name)
    assert obj["spec"]["podCIDR"] == node.config.pod_cidr
    assert {"type": "InternalIP", "address": kube.netns.address} in obj["status"]["addresses"]
    assert obj["status"]["allocatable"]["cpu"] == node.config.capacity["cpu"]
    wait_for("the node Ready", lambda: _condition(_get(kube, "node", name), "Ready") == "True")
    first = _get(kube, "lease", name, "-n", "kube-node-lease")["spec"]["renewTime"]
    wait_for("a Lease renewal", lambda: _get(kube, "lease", name, "-n", "kube-node-lease")["spec"]["renewTime"]
             != first, timeout=3 * node.config.renew_s)
    links = kube.netns.run("ip", "-o", "link", "show").stdout
    assert f"vp{node_tag(name)}beef0" not in links, "the earlier run's link was removed at start"


def test_pod_runs_in_its_own_namespace_and_its_ip_is_published(kube: Cluster, node: AgentThread,
                                                                tmp_path: Path) -> None:
    ns = unique("procnode")
    kube.kubectl("create", "namespace", ns)
    pod = _pod("web", node.config.name, ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"], probe_port=8080)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"clusterIP": "None", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080}]}}
    apply(kube, pod, service, namespace=ns)
    ready = wait_for("the pod Ready", lambda: (p := _get(kube, "pod", "web", "-n", ns)) and
                     _condition(p, "Ready") == "True" and p, timeout=60)
    ip = ready["status"]["podIP"]
    assert ready["spec"]["nodeName"] == node.config.name, "bound by the real scheduler"
    assert ip.startswith(node.config.pod_cidr.rsplit(".", 2)[0]), (ip, node.config.pod_cidr)
    assert ready["status"]["hostIP"] == kube.netns.address

    def published() -> list[str]:
        slices = _get(kube, "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web")["items"]
        return [a for s in slices for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")
                for a in e["addresses"]]
    assert wait_for("the endpointslice controller to publish the pod IP", published) == [ip]

    served = kube.netns.run("python3", "-c", f"import urllib.request; print(urllib.request.urlopen("
                                              f"'http://{ip}:8080/', timeout=5).status)")
    assert served.stdout.strip() == "200", served.stderr

    container = node.agent.runtime.containers[(ns, "web")]  # type: ignore[union-attr]
    assert container.sandbox is not None and container.proc is not None
    server = descendants(container.proc.pid)
    pod_netns = {os.readlink(f"/proc/{pid}/ns/net") for pid in server}
    assert pod_netns == {os.readlink(container.sandbox.netns_path)}, "the container runs in the pod's namespace"
    assert os.readlink("/proc/self/ns/net") not in pod_netns
    assert os.readlink(f"/proc/{container.proc.pid}/ns/pid") != os.readlink(f"/proc/{server[0]}/ns/pid"), \
        "the container has a PID namespace of its own"
    routes = subprocess.run(["nsenter", f"--net={container.sandbox.netns_path}", "ip", "route", "get", "1.1.1.1"],
                            capture_output=True, text=True, check=False)
    assert routes.returncode != 0, f"the pod's namespace routes off the machine: {routes.stdout}"

    kube.kubectl("delete", "pod", "web", "-n", ns, "--timeout=60s")  # returns once the agent finished deleting
    assert not [pid for pid in server if Path(f"/proc/{pid}").exists()], "the pod's processes outlived it"
    assert (ns, "web") not in node.agent.runtime.containers  # type: ignore[union-attr]
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_no_route_out_restart_back_off_and_termination_message(kube: Cluster, node: AgentThread) -> None:
    ns = unique("procnode")
    kube.kubectl("create", "namespace", ns)
    script = textwrap.dedent("""
        import socket, sys
        try:
            socket.create_connection(("1.1.1.1", 443), timeout=5)
        except OSError as err:
            print(f"dial out failed: {err}", flush=True)
            sys.exit(3)
        print("dial out worked", flush=True)
    """)
    apply(kube, _pod("dialer", node.config.name, ["python", "-c", script]), namespace=ns)

    def restarted() -> dict[str, Any] | None:
        statuses = _get(kube, "pod", "dialer", "-n", ns).get("status", {}).get("containerStatuses") or [{}]
        return statuses[0] if statuses[0].get("restartCount", 0) >= 2 else None
    status = wait_for("two restarts", restarted, timeout=60)
    terminated = status["lastState"]["terminated"]
    assert terminated["exitCode"] == 3, terminated
    assert "dial out failed" in terminated["message"] and "unreachable" in terminated["message"], terminated

    # the kubelet's back-off: the first exit restarts at once, the second after the initial back-off (1 s here)
    history = node.agent.runtime.containers[(ns, "dialer")].history  # type: ignore[union-attr]
    wait_for("the third start", lambda: sum(e["event"] == "started" for e in history) >= 3, timeout=30)
    starts = [e["t"] for e in history if e["event"] == "started"]
    exits = [e["t"] for e in history if e["event"] == "exited"]
    assert starts[1] - exits[0] < 0.5, history
    assert starts[2] - exits[1] >= 1.0, history
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_an_engine_container_runs_on_cores_of_its_own(kube: Cluster, node: AgentThread) -> None:
    """An engine container with `limits.cpu: 1` runs, with every process it starts, on one core of its own (the
    static CPU manager's cpuset), and `VLLM_CPU_OMP_THREADS_BIND` names that core."""
    ns = unique("procnode")
    kube.kubectl("create", "namespace", ns)
    script = textwrap.dedent("""
        import json, os, subprocess, sys
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True).stdout.strip()
        print(json.dumps({"own": sorted(os.sched_getaffinity(0)), "child": json.loads(child),
                          "omp": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}), flush=True)
        sys.exit(5)
    """)
    pod = _pod("engine", node.config.name, ["python", "-c", script])
    pod["metadata"]["labels"][constants.LABEL_COMPONENT] = constants.COMPONENT_ENGINE
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1", "memory": "256Mi"},
                                                  "requests": {"cpu": "1", "memory": "256Mi"}}
    apply(kube, pod, namespace=ns)

    def terminated() -> dict[str, Any] | None:
        statuses = _get(kube, "pod", "engine", "-n", ns).get("status", {}).get("containerStatuses") or [{}]
        return (statuses[0].get("lastState") or {}).get("terminated")
    seen = json.loads(wait_for("the engine's first exit", terminated, timeout=60)["message"].splitlines()[-1])
    assert len(seen["own"]) == 1, seen
    assert seen["child"] == seen["own"], "a process the container starts inherits its cores"
    assert seen["omp"] == str(seen["own"][0]), seen
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_an_image_it_cannot_run_is_a_pod_failure(kube: Cluster, node: AgentThread) -> None:
    ns = unique("procnode")
    kube.kubectl("create", "namespace", ns)
    apply(kube, _pod("nginx", node.config.name, ["nginx"], image="nginx:1.27"), namespace=ns)

    def waiting() -> dict[str, Any] | None:
        statuses = _get(kube, "pod", "nginx", "-n", ns).get("status", {}).get("containerStatuses") or [{}]
        return (statuses[0].get("state") or {}).get("waiting")
    state = wait_for("the pod's waiting state", lambda: (w := waiting()) and w.get("reason") != "ContainerCreating"
                     and w, timeout=30)
    assert state["reason"] == "ErrImageNeverPull", state
    assert "'nginx:1.27'" in state["message"] and "ghcr.io/vllm-operator/engine-cpu" in state["message"], state
    kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_dead_node_agent_gets_its_pods_evicted_and_rescheduled_on_another(kube: Cluster, tmp_path: Path) -> None:
    """Node failure: the agent of node A is SIGKILLed (its Lease stops being renewed, its pods' processes die with
    it); the node-lifecycle controller marks A NotReady and taints it, the taint-eviction controller evicts its
    pods after the API server's default toleration seconds, and the ReplicaSet's replacements run on node B, whose
    address the endpointslice controller publishes. The figures printed are what each step took."""
    group = unique("nodefail")
    ns = group
    kube.kubectl("create", "namespace", ns)
    label = {"vllm-operator.dev/test-node": group}
    name_a, name_b = f"{group}-a", f"{group}-b"
    cidr_a, cidr_b = node_pod_cidr(kube.netns.pod_cidr, 8), node_pod_cidr(kube.netns.pod_cidr, 9)
    log_a = tmp_path / "agent-a.log"
    argv = [*kube.netns.exec_prefix(), sys.executable, "-m", "processnode", f"--kubeconfig={kube.kubeconfig}",
            f"--name={name_a}", f"--node-ip={kube.netns.address}", f"--pod-cidr={cidr_a}",
            f"--cluster-pod-cidr={kube.netns.pod_cidr}", f"--work-dir={tmp_path / 'a'}",
            f"--label=vllm-operator.dev/test-node={group}", f"--taint={TAINT['key']}={TAINT['value']}:NoSchedule"]
    with log_a.open("w") as log:
        agent_a = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    node_b: AgentThread | None = None
    try:
        wait_for("node A Ready", lambda: _node_ready(kube, name_a) or agent_a.poll() is not None, timeout=60)
        assert agent_a.poll() is None, f"node A's agent exited: {log_a.read_text()[-2000:]}"
        template = _pod("web", group, ["python", "-m", "http.server", "8080", "--bind", "$(POD_IP)"],
                        probe_port=8080)
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                      "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                               "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]}}}
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"clusterIP": "None", "selector": {"app": "web"},
                            "ports": [{"name": "http", "port": 8080}]}}
        apply(kube, deployment, service, namespace=ns)
        first = wait_for("the pod Ready on node A", lambda: _ready_pods(kube, ns), timeout=60)[0]
        assert first["spec"]["nodeName"] == name_a
        config_b = NodeConfig(name=name_b, node_ip=kube.netns.address, pod_cidr=cidr_b,
                              cluster_pod_cidr=kube.netns.pod_cidr, work_dir=tmp_path / "b",
                              run_id=secrets.token_hex(2), api_host=kube.netns.address, api_port=6443,
                              labels=label, taints=[TAINT], runtime={"max_grace_s": 5.0})
        node_b = AgentThread(config_b, kube.kubeconfig, kube.netns.pin_name).start()
        wait_for("node B Ready", lambda: _node_ready(kube, name_b), timeout=60)

        killed = time.monotonic()
        agent_a.kill()
        agent_a.wait(10)
        probe = ("import urllib.request; urllib.request.urlopen("
                 f"'http://{first['status']['podIP']}:8080/', timeout=3)")
        wait_for("the pod's processes to die with its node agent (parent-death signals)",
                 lambda: kube.netns.run("python3", "-c", probe).returncode != 0, timeout=15)
        wait_for("node A NotReady", lambda: _node_ready(kube, name_a) is False, timeout=120)
        not_ready = time.monotonic()
        # The node-lifecycle controller taints in two passes: unreachable:NoSchedule first (from the condition),
        # unreachable:NoExecute from its rate-limited eviction queue (--node-eviction-rate); only the second evicts.
        wait_for("node A tainted unreachable:NoExecute", lambda: [
            t for t in _get(kube, "node", name_a)["spec"].get("taints") or []
            if t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute"], timeout=60)
        wait_for("the pod on node A evicted", lambda: _get(kube, "pod", first["metadata"]["name"], "-n", ns)
                 ["metadata"].get("deletionTimestamp"), timeout=120)
        evicted = time.monotonic()
        second = wait_for("a replacement Ready on node B", lambda: [
            p for p in _ready_pods(kube, ns) if p["spec"]["nodeName"] == name_b], timeout=90)[0]
        rescheduled = time.monotonic()

        def published() -> list[str]:
            slices = _get(kube, "endpointslices", "-n", ns, "-l", "kubernetes.io/service-name=web")["items"]
            return [a for s in slices for e in s.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")
                    for a in e["addresses"]]
        assert wait_for("the replacement's IP published", lambda: published() == [second["status"]["podIP"]]
                        and published(), timeout=30)
        print(f"node failure: NotReady after {not_ready - killed:.1f} s, evicted after {evicted - killed:.1f} s, "
              f"replacement Ready on node B after {rescheduled - killed:.1f} s")
    finally:
        if agent_a.poll() is None:
            agent_a.kill()
            agent_a.wait(10)
        if node_b is not None:
            node_b.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        kube.kubectl("delete", "node", name_a, name_b, "--wait=false", check=False)


def _node_ready(kube: Cluster, name: str) -> bool | None:
    proc = kube.kubectl("get", "node", name, "-o", "json", check=False)
    status = _condition(json.loads(proc.stdout), "Ready") if proc.returncode == 0 else ""
    return True if status == "True" else False if status in ("False", "Unknown") else None


def _ready_pods(kube: Cluster, ns: str) -> list[dict[str, Any]]:
    pods = _get(kube, "pods", "-n", ns, "-l", "app=web")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp") and _condition(p, "Ready") == "True"]
