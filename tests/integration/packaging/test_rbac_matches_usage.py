"""RBAC equals usage: the chart's operator rules against what the real operator sends to a real API server.

The chart's RBAC objects (`helm template`, webhook off) are applied to a control plane of this module's own and the
operator, run in the test's process, logs in with a TokenRequest token of the chart's ServiceAccount, so the real
RBAC authorizer answers anything no rendered rule allows with 403. The operator then runs a scenario that walks
every code path that touches the API — create, adopt same-named orphans of every child kind (apply over an object
with no owner), patch on spec edits, delete stale owned children of every kind, `accelerator.type: auto` (Node
list), a refused spec (events), monitoring CRDs present (PodMonitor / PrometheusRule), the health loop deleting a
stalled engine's pod (fake engines scraped by a real Prometheus) — and the API server's audit log (Metadata level,
one event per request) gives the (group, resource, verb) triples its ServiceAccount used, and those it was refused.

Checked: nothing the operator sent was denied (the chart grants enough), and the grants equal the used triples plus
GRANT_ONLY, each entry of which says why the operator holds a permission it does not itself use. The router's own
requests are checked the same way against the Role the operator created for it. Non-resource URLs (discovery:
/api, /apis/<group>/<version>) are not in these sets: the built-in system:discovery role grants them to every
authenticated user.

Why a cluster of its own: a cluster-mode operator reconciles every VLLMDeployment in the cluster, and the
monitoring CRDs installed here are cluster-scoped and change what every other test's operator renders.
"""

from __future__ import annotations

import asyncio
import copy
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import cluster
from testcluster.cluster import Cluster
from testcluster.examples import nodes_for
from tests.support.health_harness import engines
from tests.support.helm import by_kind, render
from tests.support.inprocess import running_operator
from tests.support.kube import apply, unique, wait_for
from tests.support.paths import CLASS_CRD_FILE, CRD_FILE, EXAMPLE_FILES
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.router import running_router
from tests.support.waiting import eventually
from vllm_operator import constants, names
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.k8s import CHILD_RESOURCES, VLLM_DEPLOYMENTS, ClientKubeApi, Resource
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import render as render_children
from vllm_operator.router.tokens import TokenCounter

pytestmark = pytest.mark.integration

Triple = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

ROLES = CHILD_RESOURCES[("rbac.authorization.k8s.io/v1", "Role")]
CONFIGMAPS = CHILD_RESOURCES[("v1", "ConfigMap")]
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

# Held by the operator although it never sends these requests itself; each needs a reason.
ROUTER_GRANTS = "granted to the router's Role; Kubernetes' escalation check lets the operator create that Role " \
                "only while it holds the same permissions itself (it holds no bind/escalate)"
KEDA_ELSEWHERE = ("used only where KEDA's CRD is installed, which this module's cluster does not install: "
                  "tests/integration/kube/test_autoscaling.py runs the operator as this chart's ServiceAccount on a "
                  "control plane with KEDA")
GRANT_ONLY: dict[Triple, str] = {
    ("discovery.k8s.io", "endpointslices", "get"): ROUTER_GRANTS,
    ("discovery.k8s.io", "endpointslices", "list"): ROUTER_GRANTS,
    ("discovery.k8s.io", "endpointslices", "watch"): ROUTER_GRANTS,
    **{("keda.sh", "scaledobjects", verb): KEDA_ELSEWHERE for verb in ("list", "create", "patch", "delete")},
    ("autoscaling", "horizontalpodautoscalers", "list"): KEDA_ELSEWHERE,
}
TIMING_DEPENDENT: dict[Triple, str] = {
    (constants.GROUP, constants.PLURAL, "get"):
        "the one status writer (k8s.write_status) re-reads a VLLMDeployment only after a 409 conflict, and class "
        "roll-outs read each dependent fresh; everything else reads the watched object, so whether the scenario uses "
        "it depends on whether a status write met a conflict",
}
"""Granted, needed, and used or not by the same scenario depending on timing: neither required used nor grant-only."""
# The health loop's thresholds, short enough for a stalled engine to be acted on within seconds.
REMEDIATION = {"restartBudget": 3, "thresholds": {"oomCount": 2, "oomWindowSeconds": 600, "stallSeconds": 3,
                                                  "windowSeconds": 6}}
PODS_RES = Resource("", "v1", "pods", "Pod")
DEPLOYMENTS_RES = CHILD_RESOURCES[("apps/v1", "Deployment")]

EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLE_FILES}


def expand(rules: Iterable[Mapping[str, Any]]) -> set[Triple]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@dataclass(frozen=True)
class Request:
    """One audit event of a resource request, in RBAC terms."""

    group: str
    resource: str  # resource[/subresource]
    verb: str
    namespace: str
    code: int
    apply: bool  # a server-side apply PATCH (the only requests of the operator with a fieldManager parameter)


def requests_of(kube: Cluster, user: str, since: datetime) -> list[Request]:
    out = []
    for event in kube.audit_events():
        ref = event.get("objectRef")
        if event["user"].get("username") != user or not ref or not ref.get("resource"):
            continue
        if datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00")) < since:
            continue
        resource = f"{ref['resource']}/{ref['subresource']}" if ref.get("subresource") else ref["resource"]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(event["requestURI"]).query)
        out.append(Request(ref.get("apiGroup", ""), resource, event["verb"], ref.get("namespace", ""),
                           int(event.get("responseStatus", {}).get("code", 0)), "fieldManager" in query))
    return out


def triples(request: Request) -> set[Triple]:
    """What a request is authorized as. A server-side apply PATCH is a patch, and a create as well when the object
    does not exist yet (kube-apiserver checks create for an apply that creates); the operator applies to create and
    to update, so an apply needs both."""
    out = {(request.group, request.resource, request.verb)}
    if request.verb == "patch" and request.apply:
        out.add((request.group, request.resource, "create"))
    return out


@dataclass
class Usage:
    """What one ServiceAccount was granted (the rendered rules) and what the audit log says it sent."""

    kube: Cluster
    user: str
    cluster: set[Triple]
    per_namespace: dict[str, set[Triple]]
    since: datetime = field(default_factory=lambda: datetime.now(UTC))

    def requests(self) -> list[Request]:
        return requests_of(self.kube, self.user, self.since)

    def allowed(self) -> list[Request]:
        return [r for r in self.requests() if r.code != 403]

    def used(self) -> set[Triple]:
        return {t for r in self.allowed() for t in triples(r)}

    def denied_triples(self) -> set[Triple]:
        return {(r.group, r.resource, r.verb) for r in self.requests() if r.code == 403}


MONITORING_CRDS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.monitoring.coreos.com"},
     "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
              "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
              "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                  "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for kind, plural in (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules"))]


@pytest.fixture(scope="module")
def rbac_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A control plane of this module's own: the project's CRDs (the class CRD too: the operator lists and
    watches VLLMWorkloadClasses where they exist), the monitoring CRDs, and kwok nodes for every example."""
    with cluster.running(tmp_path_factory.mktemp("rbac")) as kube:
        for crd in (CRD_FILE, CLASS_CRD_FILE):
            kube.kubectl("apply", "--server-side", "-f", str(crd))
        apply(kube, *MONITORING_CRDS)
        for name in (constants.CRD_NAME, constants.CLASS_CRD_NAME, "podmonitors.monitoring.coreos.com",
                     "prometheusrules.monitoring.coreos.com"):
            kube.wait_established(name)
        wait_for("the CRDs' storage", lambda: kube.kubectl(
            "get", f"{constants.PLURAL},{constants.CLASS_PLURAL},podmonitors,prometheusrules", "-A",
            check=False).returncode == 0, timeout=60)
        nodes = nodes_for(list(EXAMPLES.values()))
        for node in nodes:  # room for every test's engines: the tests' objects stay until the module ends
            for key in ("capacity", "allocatable"):
                node["status"][key].update({"cpu": "512", "memory": "4Ti"})
                if "nvidia.com/gpu" in node["status"][key]:
                    node["status"][key]["nvidia.com/gpu"] = "64"
        apply(kube, *nodes)
        yield kube


@dataclass
class Setup:
    kube: Cluster
    usage: Usage
    kubeconfig: Path  # the operator's (the chart ServiceAccount's token)
    ml: str  # the namespaces the examples' "ml" and "dev" become
    dev: str

    def example(self, name: str, **spec: Any) -> dict[str, Any]:
        obj = copy.deepcopy(EXAMPLES[name])
        obj["metadata"]["namespace"] = {"ml": self.ml, "dev": self.dev}[obj["metadata"]["namespace"]]
        obj["spec"].update(spec)
        claim = ((obj["spec"]["model"].get("source") or {}).get("pvc") or {}).get("claimName")
        if claim:  # the real scheduler places no pod whose claim is unbound
            ns = obj["metadata"]["namespace"]
            apply(self.kube,
                  {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-{claim}"},
                   "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                            "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/models/{claim}"},
                            "claimRef": {"namespace": ns, "name": claim}}},
                  {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim, "namespace": ns},
                   "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": f"{ns}-{claim}",
                            "resources": {"requests": {"storage": "1Gi"}}}})
        return obj


def install_rbac(kube: Cluster, tmp_path: Path, values: dict[str, Any]) -> Setup:
    """The chart's RBAC objects for `values` (its operator Deployment left out: the operator runs in the test), with
    namespaces of this test's own for the examples' "ml" and "dev"."""
    ml, dev = unique("ml"), unique("dev")
    for ns in (ml, dev):
        kube.kubectl("create", "namespace", ns)
    watch = values.get("watch")
    if watch and watch.get("namespaces"):
        values = {**values, "watch": {**watch, "namespaces": [{"ml": ml, "dev": dev}[n] for n in watch["namespaces"]]}}
    release, system = unique("vo"), unique("vo-sys")
    kube.kubectl("create", "namespace", system)
    # No admission webhook runs here, and the operator runs without one and the chart without its webhook RBAC
    # (tests/integration/packaging/test_chart.py pins those rules to one Secret and one configuration).
    docs = render(tmp_path, {**values, "webhook": {"enabled": False}}, release=release, namespace=system)
    apply(kube, *(d for d in docs if d["kind"] in RBAC_KINDS))
    cluster_rules: set[Triple] = set()
    for role in by_kind(docs, "ClusterRole"):
        cluster_rules |= expand(role["rules"])
    per_ns: dict[str, set[Triple]] = {}
    for role in by_kind(docs, "Role"):
        per_ns.setdefault(role["metadata"]["namespace"], set()).update(expand(role["rules"]))
    (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    token = kube.token_kubeconfig(system, account, tmp_path / "operator.kubeconfig")
    usage = Usage(kube, f"system:serviceaccount:{system}:{account}", cluster_rules, per_ns)
    return Setup(kube, usage, token, ml, dev)


def offline_children(obj: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(obj)
    the_plan = plan(resource.spec, None, RemediationState.from_status(None), name=resource.metadata.name,
                    namespace=resource.metadata.namespace)
    return render_children(the_plan)


def res_of(manifest: Mapping[str, Any]) -> Resource:
    return CHILD_RESOURCES[(manifest["apiVersion"], manifest["kind"])]


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in (obj or {}).get("status", {}).get("conditions", []) or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}


def printer_columns(kube: Cluster, ns: str, name: str) -> dict[str, str]:
    """`kubectl get vllmd -o wide`: the Table the API server builds from the CRD's printer columns, cut into cells
    at the header's column starts."""
    out = kube.kubectl("get", "vllmd", "-n", ns, name, "-o", "wide").stdout
    head, row = out.splitlines()
    columns = head.split()
    starts: list[int] = []
    for column in columns:
        starts.append(head.index(column, starts[-1] + 1 if starts else 0))
    cells = [row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return dict(zip(columns, cells, strict=True))


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus() as p:
        yield p


HEALTH = {"health_enabled": True, "health_interval_override": 1.0}


async def wait_ready(client: ClientKubeApi, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    """Until the operator has handled the current generation and every child Deployment is fully ready.

    Read from the children rather than from the Ready condition: this test is about permissions, and the
    lifecycle tests own the condition's correctness.
    """
    last: dict[str, Any] = {}

    async def ready() -> dict[str, Any] | None:
        obj = await client.get(VLLM_DEPLOYMENTS, ns, name)
        if not obj or obj.get("status", {}).get("observedGeneration") != obj["metadata"]["generation"]:
            last["status"] = (obj or {}).get("status")
            return None
        deployments = await client.list(DEPLOYMENTS_RES, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
        last["deployments"] = {d["metadata"]["name"]: (d["spec"].get("replicas"),
                                                       (d.get("status") or {}).get("readyReplicas"))
                               for d in deployments}
        expected = {names.router(name)} | {names.pool(name, p) for p in constants.POOLS
                                           if (obj["spec"].get("pools", {}).get(p) or {}).get("enabled", True)}
        complete = set(last["deployments"]) >= expected and all(
            (d.get("status") or {}).get("readyReplicas") == d["spec"].get("replicas") for d in deployments)
        return obj if complete else None

    try:
        result: dict[str, Any] = await eventually(ready, timeout=timeout, interval=0.1)
    except AssertionError as err:
        pods = await client.list(PODS_RES, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
        last["pods"] = [(p["metadata"]["name"], p["spec"].get("nodeName"), (p.get("status") or {}).get("phase"),
                         [(c["type"], c["status"], c.get("message")) for c in (p.get("status") or {}).get(
                             "conditions", [])], p["metadata"].get("deletionTimestamp")) for p in pods]
        raise AssertionError(f"{ns}/{name} not converged within {timeout}s: {last}") from err
    return result


async def operator_scenario(setup: Setup, client: ClientKubeApi) -> None:
    """Every API path of the operator, driven through the test's own (admin) client."""
    chat = setup.example("chat", remediation=REMEDIATION)
    ns, name = chat["metadata"]["namespace"], chat["metadata"]["name"]
    # The weights cache's claim form, so a PersistentVolumeClaim is among the children (on a static volume: the
    # real scheduler places no pod whose claim is unbound).
    claim = names.weights_claim(name)
    chat["spec"]["model"]["cache"] = {"claim": {"size": "1Gi", "storageClassName": "", "volumeName": f"{ns}-{claim}",
                                                "accessMode": "ReadWriteOnce"}}
    apply(setup.kube, {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-{claim}"},
                       "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                                "hostPath": {"path": f"/weights/{ns}"}, "claimRef": {"namespace": ns, "name": claim}}})
    rendered = offline_children(chat)
    assert "PersistentVolumeClaim" in {m["kind"] for m in rendered}
    # 1. Same-named orphans (no labels, no owner) of every child kind: the operator's apply takes them over.
    for manifest in rendered:
        orphan = copy.deepcopy(manifest)
        orphan["metadata"] = {"name": manifest["metadata"]["name"], "namespace": ns}
        await client.create(res_of(manifest), ns, orphan)
    await client.create(VLLM_DEPLOYMENTS, ns, chat)
    current = await wait_ready(client, ns, name)
    uid = current["metadata"]["uid"]
    columns = await asyncio.to_thread(printer_columns, setup.kube, ns, name)
    assert all(value not in ("", "<none>") for value in columns.values()), columns
    assert columns["CLASS"] == "chat" and re.fullmatch(r"\d+/\d+", columns["READY"]), columns
    for manifest in rendered:
        got = await client.get(res_of(manifest), ns, manifest["metadata"]["name"])
        assert got and [r["uid"] for r in got["metadata"].get("ownerReferences", [])] == [uid], manifest["kind"]
    # 2. Stale owned children of every kind (what an older operator version rendered): deleted on the next reconcile,
    #    which a spec edit triggers (and which patches the short pool's Deployment).
    stale = []
    for manifest in {(m["apiVersion"], m["kind"]): m for m in rendered}.values():
        extra = copy.deepcopy(manifest)
        extra["metadata"]["name"] = f"{manifest['metadata']['name']}-stale"[:63]
        extra["metadata"]["ownerReferences"] = [{"apiVersion": constants.API_VERSION, "kind": constants.KIND,
                                                 "name": name, "uid": uid, "controller": True}]
        await client.create(res_of(manifest), ns, extra)
        stale.append((res_of(manifest), extra["metadata"]["name"]))
    edited = await client.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"short": {"replicas": 3}}}})
    assert edited["metadata"]["generation"] == current["metadata"]["generation"] + 1
    await wait_ready(client, ns, name)

    left: list[str] = []

    async def stale_gone() -> bool:
        # Deleted, or deleting: a claim stays until kube-controller-manager's pvc-protection controller drops its
        # kubernetes.io/pvc-protection finalizer
        left[:] = [f"{res.kind}/{n}" for res, n in stale if (got := await client.get(res, ns, n)) is not None
                   and not got["metadata"].get("deletionTimestamp")]
        return not left

    try:
        await eventually(stale_gone, timeout=30, interval=0.1)
    except AssertionError as err:
        raise AssertionError(f"stale owned children not deleted: {left}") from err
    # 3. accelerator auto: the operator lists Nodes and reads GPU feature discovery labels.
    auto = setup.example("chat", accelerator={"type": "auto", "count": 1})
    auto["metadata"]["name"] = "chat-auto"
    await client.create(VLLM_DEPLOYMENTS, ns, auto)
    resolved = await wait_ready(client, ns, "chat-auto")
    assert resolved["status"]["accelerator"]["type"]
    # 4. A refused edit: SpecValid=False and a Warning event, children untouched.
    await client.patch(VLLM_DEPLOYMENTS, ns, "chat-auto", {"spec": {"pools": {"long": {"maxModelLen": 10_000_000}}}})

    async def refused() -> bool:
        obj = await client.get(VLLM_DEPLOYMENTS, ns, "chat-auto")
        return condition(obj, constants.COND_SPEC_VALID).get("status") == "False"

    await eventually(refused, timeout=20, interval=0.1)
    # 5. A CPU deployment in a second namespace.
    cpu = setup.example("cpu-dev")
    await client.create(VLLM_DEPLOYMENTS, cpu["metadata"]["namespace"], cpu)
    await wait_ready(client, cpu["metadata"]["namespace"], cpu["metadata"]["name"])
    # 6. Deleting a child Deployment makes the operator reconcile its parent (as watched) and recreate it.
    await client.delete(DEPLOYMENTS_RES, ns, names.pool(name, "long"))

    async def recreated() -> bool:
        got = await client.get(DEPLOYMENTS_RES, ns, names.pool(name, "long"))
        return got is not None and not got["metadata"].get("deletionTimestamp")

    await asyncio.sleep(0.2)
    await eventually(recreated, timeout=30, interval=0.1)
    await wait_ready(client, ns, name)


async def stalled_pod_is_deleted(client: ClientKubeApi, prom: Prometheus, ns: str, name: str = "chat") -> None:
    """The health loop: engine metrics through a real Prometheus; a stalled engine's pod is deleted.

    Run by a second operator start, once the scenario's deployments are Ready: while pods are still starting, a
    health-loop status patch computed from the timer's (older) body can put back Ready=False after the lifecycle
    handler set Ready=True (conditions are a list, replaced whole by a merge patch), and the scenario's Ready waits
    would then hang — a lost update in the controller, not a permission question.
    """
    specs = []
    for pool in constants.POOLS:
        pods = await client.list(PODS_RES, ns, f"{constants.LABEL_DEPLOYMENT}={name},{constants.LABEL_POOL}={pool}")
        specs += [(p["metadata"]["name"], pool) for p in pods if not p["metadata"].get("deletionTimestamp")]
    async with engines(specs, prom, namespace=ns, deployment=name) as fleet:

        async def scraped() -> bool:
            obj = await client.get(VLLM_DEPLOYMENTS, ns, name)
            pools = (obj or {}).get("status", {}).get("pools", {})
            return (condition(obj, constants.COND_METRICS_AVAILABLE).get("status") == "True"
                    and all(pools.get(p, {}).get("diagnosis") == "Healthy" for p in constants.POOLS))

        await eventually(scraped, timeout=40, interval=0.25)
        victim = fleet[0]
        victim.fake.configure(stall=True)

        async def deleted() -> bool:
            pods = await client.list(PODS_RES, ns)
            return victim.pod not in {p["metadata"]["name"] for p in pods
                                      if not p["metadata"].get("deletionTimestamp")}

        await eventually(deleted, timeout=40, interval=0.25)


CLUSTER_VALUES: dict[str, Any] = {"workloadClasses": {"builtins": False}}
NAMESPACED_VALUES: dict[str, Any] = {"watch": {"mode": "namespaced", "namespaces": ["ml", "dev"]},
                                     "workloadClasses": {"builtins": False}}


async def test_cluster_mode_rules_equal_what_the_operator_uses(rbac_kube: Cluster, tmp_path: Path,
                                                                prom: Prometheus) -> None:
    setup = install_rbac(rbac_kube, tmp_path, CLUSTER_VALUES)
    usage = setup.usage
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig) as client:
        await operator_scenario(setup, client)
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig, prometheus_url=prom.url, **HEALTH) as client:
        await stalled_pod_is_deleted(client, prom, setup.ml)
    assert usage.denied_triples() == set(), "the chart's ClusterRole misses what the operator needs"
    used = usage.used()
    assert not used & set(GRANT_ONLY), f"used, so not grant-only: {sorted(used & set(GRANT_ONLY))}"
    assert set(TIMING_DEPENDENT) <= usage.cluster, "the ClusterRole grants what a conflict's re-read needs"
    unused = usage.cluster - used - set(TIMING_DEPENDENT)
    assert unused == set(GRANT_ONLY), (f"granted but never used: {sorted(unused - set(GRANT_ONLY))}; "
                                       f"used but not granted: {sorted(used - usage.cluster)}")


async def test_namespaced_mode_works_with_roles_and_the_node_reader(rbac_kube: Cluster, tmp_path: Path,
                                                                     prom: Prometheus) -> None:
    setup = install_rbac(rbac_kube, tmp_path, NAMESPACED_VALUES)
    usage = setup.usage
    watched = (setup.ml, setup.dev)
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig, namespaces=watched) as client:
        await operator_scenario(setup, client)
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig, namespaces=watched,
                                prometheus_url=prom.url, **HEALTH) as client:
        await stalled_pod_is_deleted(client, prom, setup.ml)
    assert usage.denied_triples() == set(), "the Roles and ClusterRoles miss what the operator needs"
    allowed = usage.allowed()
    cluster_scoped = {t for r in allowed if not r.namespace for t in triples(r)}
    assert cluster_scoped == usage.cluster, "every cluster-wide grant is used, and only at the cluster scope"
    assert cluster_scoped == {("", "nodes", "list"), ("", "namespaces", "list"), ("", "namespaces", "watch"),
                              ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
                              ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
                              # rbac.workloadClassReader: classes are cluster-scoped, no Role can grant them
                              (constants.GROUP, constants.CLASS_PLURAL, "list"),
                              (constants.GROUP, constants.CLASS_PLURAL, "watch")}
    # The Role is the same in every watched namespace (test_chart checks); the scenario walks its paths in "ml".
    granted = set().union(*usage.per_namespace.values())
    used = {t for r in allowed if r.namespace for t in triples(r)}
    unused = granted - used - set(TIMING_DEPENDENT)
    assert unused == set(GRANT_ONLY), sorted(unused - set(GRANT_ONLY))
    assert set(TIMING_DEPENDENT) <= granted, "the Role grants what a conflict's re-read needs"
    assert used <= granted, sorted(used - granted)


async def test_without_the_node_reader_auto_is_refused_and_named_types_work(rbac_kube: Cluster,
                                                                           tmp_path: Path) -> None:
    setup = install_rbac(rbac_kube, tmp_path, {**NAMESPACED_VALUES, "rbac": {"nodeReader": False}})
    usage = setup.usage
    assert ("", "nodes", "list") not in usage.cluster
    auto = setup.example("chat", accelerator={"type": "auto", "count": 1})
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig, namespaces=(setup.ml, setup.dev)) as client:
        await client.create(VLLM_DEPLOYMENTS, setup.ml, auto)
        cpu = setup.example("cpu-dev")
        await client.create(VLLM_DEPLOYMENTS, setup.dev, cpu)
        await wait_ready(client, setup.dev, cpu["metadata"]["name"])

        async def refused() -> dict[str, Any] | None:
            cond = condition(await client.get(VLLM_DEPLOYMENTS, setup.ml, "chat"), constants.COND_SPEC_VALID)
            return cond if cond.get("status") == "False" else None

        cond = await eventually(refused, timeout=20, interval=0.1)
    assert "spec.accelerator.type" in cond["message"] and "read access to Nodes" in cond["message"]
    assert usage.denied_triples() == {("", "nodes", "list")}


async def test_router_requests_equal_its_rendered_role(rbac_kube: Cluster, tmp_path: Path) -> None:
    """The router, configured with the router.json the operator rendered and logged in with a token of the
    ServiceAccount the operator created for it, watches EndpointSlices under the Role the operator created for it
    — and needs nothing else."""
    setup = install_rbac(rbac_kube, tmp_path, NAMESPACED_VALUES)
    chat = setup.example("chat")
    ns, name = chat["metadata"]["namespace"], chat["metadata"]["name"]
    role = next(m for m in offline_children(chat) if m["kind"] == "Role")
    router_rules = expand(role["rules"])
    since = datetime.now(UTC)
    user = f"system:serviceaccount:{ns}:{names.router(name)}"
    async with running_operator(setup.kubeconfig, rbac_kube.kubeconfig, namespaces=(ns,)) as client:
        await client.create(VLLM_DEPLOYMENTS, ns, chat)
        await wait_ready(client, ns, name)
        created_role = await client.get(ROLES, ns, role["metadata"]["name"])
        assert created_role is not None and expand(created_role["rules"]) == router_rules
        configmap = await client.get(CONFIGMAPS, ns, names.router(name))
        assert configmap is not None
        config = RouterConfig.model_validate_json(configmap["data"][constants.ROUTER_CONFIG_KEY])
        config = config.model_copy(update={"api_keys_dir": None, "tokenizer": config.tokenizer.model_copy(
            update={"hf_repo": None, "hf_token_file": None, "path": None})})
        kubeconfig = rbac_kube.token_kubeconfig(ns, names.router(name), tmp_path / "router.kubeconfig")
        async with running_router(config, TokenCounter(None), kubeconfig=str(kubeconfig)) as (_, metrics):

            async def synced() -> bool:
                values = [metrics.registry.get_sample_value("vllm_operator_router_discovery_synced",
                                                            {"pool": p}) for p in constants.POOLS]
                return all(v == 1 for v in values)

            await eventually(synced, timeout=20, interval=0.1)

            def watching() -> bool:
                return any(r.verb == "watch" for r in requests_of(rbac_kube, user, since))

            await asyncio.to_thread(wait_for, "the router's watches in the audit log", watching, 20)
    requests = requests_of(rbac_kube, user, since)
    assert [r for r in requests if r.code == 403] == [], "the router was refused"
    used = {t for r in requests for t in triples(r)}
    assert used == {("discovery.k8s.io", "endpointslices", "list"), ("discovery.k8s.io", "endpointslices", "watch")}
    # The renderer also grants `get`, which the router never sends (it lists and watches by label selector).
    assert router_rules - used == {("discovery.k8s.io", "endpointslices", "get")}
    assert {r.namespace for r in requests} == {ns}
