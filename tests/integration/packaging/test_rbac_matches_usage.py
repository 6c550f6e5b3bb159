"""RBAC equals usage: the chart's operator rules against what the real operator sends to the simulated cluster.

The emulator gets an authorizer (its fault hook) built from the rules `helm template` renders: a request from the
operator's clients (kopf's and k8s.ClientKubeApi's user agents) that no rendered rule allows is answered 403, as
kube-apiserver would answer it. Then the operator runs a scenario that walks every code path that touches the API —
create, adopt same-named orphans of every child kind (create -> 409 -> get -> patch), patch on spec edits, delete
stale owned children of every kind, `accelerator.type: auto` (Node list), a refused spec (events), monitoring CRDs
present (PodMonitor / PrometheusRule), the health loop deleting a stalled engine's pod (fake engines scraped by a
real Prometheus) — and the request log gives the (group, resource, verb) triples it used.

Checked: nothing the operator sent was denied (the chart grants enough), and the grants equal the used triples plus
GRANT_ONLY, each entry of which says why the operator holds a permission it does not itself use. The router's own
requests are checked the same way against the Role the renderer produces for it. Non-resource URLs (discovery:
/api, /apis/<group>/<version>) are not in these sets: the built-in system:discovery role grants them to every
authenticated user.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.health_harness import engines
from tests.support.helm import by_kind, render
from tests.support.operator import running_operator
from tests.support.paths import CLASS_CRD_FILE, CRD_FILE, EXAMPLE_FILES
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.router import running_router
from tests.support.waiting import eventually
from vllm_operator import constants, names
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.demo import nodes_for
from vllm_operator.k8s import APPLY_PATCH, CHILD_RESOURCES, VLLM_DEPLOYMENTS, Resource
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering import render as render_children
from vllm_operator.router.tokens import TokenCounter
from vllm_operator.sim.apiserver import ApiServer
from vllm_operator.sim.cluster import SimCluster
from vllm_operator.sim.faults import Fault
from vllm_operator.sim.requestlog import RequestRecord

Triple = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# kopf's aiohttp session ("kopf/<version>") and k8s.ClientKubeApi ("vllm-operator/<version>").
OPERATOR_AGENTS = ("kopf/", f"{constants.APP_NAME}/")
ROUTER_AGENT = "aiohttp/"  # the router's aiohttp session (Python/3.x aiohttp/3.x)
RELEASE_NS = "vllm-system"
SERVICE_ACCOUNT = f"system:serviceaccount:{RELEASE_NS}:vo-vllm-operator"
NAMESPACES_RES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
ROLES = CHILD_RESOURCES[("rbac.authorization.k8s.io/v1", "Role")]
CONFIGMAPS = CHILD_RESOURCES[("v1", "ConfigMap")]

# Held by the operator although it never sends these requests itself; each needs a reason.
ROUTER_GRANTS = "granted to the router's Role; Kubernetes' escalation check lets the operator create that Role " \
                "only while it holds the same permissions itself (it holds no bind/escalate)"
KEDA_ON_THE_REAL_CLUSTER = ("used only where KEDA's CRD is installed, which the emulator has no counterpart for: "
                            "tests/integration/kube/test_autoscaling.py runs the operator as this chart's "
                            "ServiceAccount on the real control plane with KEDA")
GRANT_ONLY: dict[Triple, str] = {
    ("discovery.k8s.io", "endpointslices", "get"): ROUTER_GRANTS,
    ("discovery.k8s.io", "endpointslices", "list"): ROUTER_GRANTS,
    ("discovery.k8s.io", "endpointslices", "watch"): ROUTER_GRANTS,
    **{("keda.sh", "scaledobjects", verb): KEDA_ON_THE_REAL_CLUSTER for verb in ("list", "create", "patch", "delete")},
    ("autoscaling", "horizontalpodautoscalers", "list"): KEDA_ON_THE_REAL_CLUSTER,
}
# The health loop's thresholds, short enough for a stalled engine to be acted on within seconds.
REMEDIATION = {"restartBudget": 3, "thresholds": {"oomCount": 2, "oomWindowSeconds": 600, "stallSeconds": 3,
                                                  "windowSeconds": 6}}
PODS_RES = Resource("", "v1", "pods", "Pod")

EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLE_FILES}


def expand(rules: Iterable[Mapping[str, Any]]) -> set[Triple]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def triples(record: RequestRecord) -> set[Triple]:
    """What a request is authorized as. A server-side apply PATCH is a patch, and a create as well when the object
    does not exist yet (kube-apiserver checks create for an apply that creates); the operator applies to create and
    to update, so an apply needs both."""
    resource = f"{record.resource}/{record.subresource}" if record.subresource else record.resource
    out = {(record.group, resource, record.verb)}
    if record.verb == "patch" and record.content_type == APPLY_PATCH:
        out.add((record.group, resource, "create"))
    return out


class Authorizer:
    """RBAC for the requests of one component (by user agent): cluster-wide rules plus per-namespace rules."""

    def __init__(self, agents: tuple[str, ...], cluster: set[Triple], per_namespace: Mapping[str, set[Triple]],
                 user: str) -> None:
        self.agents = agents
        self.cluster = cluster
        self.per_namespace = per_namespace
        self.user = user
        self.allowed: list[RequestRecord] = []
        self.denied: list[RequestRecord] = []

    def applies(self, record: RequestRecord) -> bool:
        return bool(record.resource) and any(a in record.user_agent for a in self.agents)

    def __call__(self, record: RequestRecord) -> Fault | None:
        if not self.applies(record):
            return None
        needed = triples(record)
        missing = needed - self.cluster - (self.per_namespace.get(record.namespace, set()) if record.namespace
                                           else set())
        if not missing:
            self.allowed.append(record)
            return None
        wanted = sorted(missing)[0]
        self.denied.append(record)
        group = f".{record.group}" if record.group else ""
        scope = f' in the namespace "{record.namespace}"' if record.namespace else " at the cluster scope"
        return Fault(status=403, message=f'{record.resource}{group} is forbidden: User "{self.user}" cannot '
                                         f'{wanted[2]} resource "{wanted[1]}" in API group "{record.group}"{scope}')

    def used(self) -> set[Triple]:
        return {t for r in self.allowed for t in triples(r)}

    def denied_triples(self) -> set[Triple]:
        return {t for r in self.denied for t in triples(r)}


def chart_rules(tmp_path: Path, values: dict[str, Any]) -> tuple[set[Triple], dict[str, set[Triple]]]:
    # The emulator calls no admission webhooks, so the operator runs here without one and the chart without its
    # webhook RBAC (tests/integration/packaging/test_chart.py pins those rules to one Secret and one configuration).
    docs = render(tmp_path, {**values, "webhook": {"enabled": False}}, namespace=RELEASE_NS)
    cluster: set[Triple] = set()
    for role in by_kind(docs, "ClusterRole"):
        cluster |= expand(role["rules"])
    per_ns: dict[str, set[Triple]] = {}
    for role in by_kind(docs, "Role"):
        per_ns.setdefault(role["metadata"]["namespace"], set()).update(expand(role["rules"]))
    return cluster, per_ns


MONITORING_CRDS = [
    {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
     "metadata": {"name": f"{plural}.monitoring.coreos.com"},
     "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
              "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
              "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                  "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    for kind, plural in (("PodMonitor", "podmonitors"), ("PrometheusRule", "prometheusrules"))]


def crd_files(tmp_path: Path) -> tuple[Path, ...]:
    monitoring = tmp_path / "monitoring-crds.yaml"
    monitoring.write_text(yaml.safe_dump_all(MONITORING_CRDS))
    # The class CRD too: the operator lists and watches VLLMWorkloadClasses (cluster-scoped) where they exist.
    return CRD_FILE, CLASS_CRD_FILE, monitoring


def example(name: str, **spec: Any) -> dict[str, Any]:
    obj = copy.deepcopy(EXAMPLES[name])
    obj["spec"].update(spec)
    return obj


def offline_children(obj: dict[str, Any]) -> list[dict[str, Any]]:
    resource = parse_resource(obj)
    the_plan = plan(resource.spec, None, RemediationState.from_status(None), name=resource.metadata.name,
                    namespace=resource.metadata.namespace)
    return render_children(the_plan)


def res_of(manifest: Mapping[str, Any]) -> Resource:
    return CHILD_RESOURCES[(manifest["apiVersion"], manifest["kind"])]


_FILTER = re.compile(r'^\.(?P<list>[\w.]+)\[\?\(@\.(?P<key>\w+)=="(?P<value>[^"]*)"\)\]\.(?P<field>\w+)$')


def _path(value: Any, dotted: str) -> Any:
    for part in dotted.lstrip(".").split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def printer_columns(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The CRD's additionalPrinterColumns evaluated on `obj` (plain `.a.b` paths, and `.list[?(@.k=="v")].f` for
    the SpecValid condition; tests/integration/controller/test_first_hour.py checks them with the real kubectl)."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    out: dict[str, Any] = {}
    for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        match = _FILTER.match(column["jsonPath"])
        if match:
            items = _path(obj, match["list"]) or []
            found = [i.get(match["field"]) for i in items if i.get(match["key"]) == match["value"]]
            out[column["name"]] = found[0] if found else None
        else:
            out[column["name"]] = _path(obj, column["jsonPath"])
    return out


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in (obj or {}).get("status", {}).get("conditions", []) or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus() as p:
        yield p


HEALTH = {"health_enabled": True, "health_interval_override": 1.0}


@pytest.fixture
async def authorized_cluster(tmp_path: Path, request: pytest.FixtureRequest
                             ) -> AsyncIterator[tuple[SimCluster, Authorizer]]:
    values: dict[str, Any] = request.param
    cluster_rules, per_ns = chart_rules(tmp_path, values)
    auth = Authorizer(OPERATOR_AGENTS, cluster_rules, per_ns, SERVICE_ACCOUNT)
    async with SimCluster(api=ApiServer(faults=auth), nodes=nodes_for(list(EXAMPLES.values())),
                          crds=crd_files(tmp_path)) as sim:
        assert sim.client is not None
        for ns in ("ml", "dev"):
            await sim.client.create(NAMESPACES_RES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                           "metadata": {"name": ns}})
        yield sim, auth
    assert sim.controller_errors == []
    assert sim.api.internal_errors == []


async def wait_ready(sim: SimCluster, ns: str, name: str, timeout: float = 40) -> dict[str, Any]:
    """Until the operator has handled the current generation and every child Deployment is fully ready.

    Read from the children rather than from the Ready condition: this test is about permissions, and the condition
    can lag (a reconcile's status write computed before the pods were ready can land after the child-event refresh
    that saw them ready; see the packaging report) — the lifecycle tests own the condition's correctness.
    """
    assert sim.client is not None
    client = sim.client
    deployments_res = CHILD_RESOURCES[("apps/v1", "Deployment")]
    last: dict[str, Any] = {}

    async def ready() -> dict[str, Any] | None:
        obj = await client.get(VLLM_DEPLOYMENTS, ns, name)
        if not obj or obj.get("status", {}).get("observedGeneration") != obj["metadata"]["generation"]:
            last["status"] = (obj or {}).get("status")
            return None
        deployments, _ = await client.list(deployments_res, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
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
        raise AssertionError(f"{ns}/{name} not converged within {timeout}s: {last}") from err
    return result


async def operator_scenario(sim: SimCluster) -> None:
    """Every API path of the operator, driven through the test's own client (user agent sim-cluster)."""
    assert sim.client is not None
    client = sim.client
    chat = example("chat", remediation=REMEDIATION)
    ns, name = chat["metadata"]["namespace"], chat["metadata"]["name"]
    rendered = offline_children(chat)
    # 1. Same-named orphans (no labels, no owner) of every child kind: the operator's create gets 409, reads the
    #    object and adopts it with a patch.
    for manifest in rendered:
        orphan = copy.deepcopy(manifest)
        orphan["metadata"] = {"name": manifest["metadata"]["name"], "namespace": ns}
        await client.create(res_of(manifest), ns, orphan)
    await client.create(VLLM_DEPLOYMENTS, ns, chat)
    current = await wait_ready(sim, ns, name)
    uid = current["metadata"]["uid"]
    columns = printer_columns(current)  # `kubectl get vllmd` (the emulator serves no Table, so read the paths)
    assert all(value not in (None, "") for value in columns.values()), columns
    assert columns["Class"] == "chat" and re.fullmatch(r"\d+/\d+", columns["Ready"]), columns
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
    await wait_ready(sim, ns, name)

    left: list[str] = []

    async def stale_gone() -> bool:
        left[:] = [f"{res.kind}/{n}" for res, n in stale if await client.get(res, ns, n) is not None]
        return not left

    try:
        await eventually(stale_gone, timeout=30, interval=0.1)
    except AssertionError as err:
        raise AssertionError(f"stale owned children not deleted: {left}") from err
    # 3. accelerator auto: the operator lists Nodes and reads GPU feature discovery labels.
    auto = example("chat", accelerator={"type": "auto", "count": 1})
    auto["metadata"]["name"] = "chat-auto"
    await client.create(VLLM_DEPLOYMENTS, ns, auto)
    resolved = await wait_ready(sim, ns, "chat-auto")
    assert resolved["status"]["accelerator"]["type"]
    # 4. A refused edit: SpecValid=False and a Warning event, children untouched.
    await client.patch(VLLM_DEPLOYMENTS, ns, "chat-auto", {"spec": {"pools": {"long": {"maxModelLen": 10_000_000}}}})

    async def refused() -> bool:
        obj = await client.get(VLLM_DEPLOYMENTS, ns, "chat-auto")
        return condition(obj, constants.COND_SPEC_VALID).get("status") == "False"

    await eventually(refused, timeout=20, interval=0.1)
    # 5. A CPU deployment in a second namespace.
    cpu = example("cpu-dev")
    await client.create(VLLM_DEPLOYMENTS, cpu["metadata"]["namespace"], cpu)
    await wait_ready(sim, cpu["metadata"]["namespace"], cpu["metadata"]["name"])
    # 6. Deleting a child Deployment makes the operator re-read its parent and recreate it.
    deployments = CHILD_RESOURCES[("apps/v1", "Deployment")]
    await client.delete(deployments, ns, names.pool(name, "long"))

    async def recreated() -> bool:
        return await client.get(deployments, ns, names.pool(name, "long")) is not None

    await asyncio.sleep(0.2)
    await eventually(recreated, timeout=20, interval=0.1)
    await wait_ready(sim, ns, name)


async def stalled_pod_is_deleted(sim: SimCluster, prom: Prometheus, ns: str = "ml", name: str = "chat") -> None:
    """The health loop: engine metrics through a real Prometheus; a stalled engine's pod is deleted.

    Run by a second operator start, once the scenario's deployments are Ready: while pods are still starting, a
    health-loop status patch computed from the timer's (older) body can put back Ready=False after the lifecycle
    handler set Ready=True (conditions are a list, replaced whole by a merge patch), and the scenario's Ready waits
    would then hang — a lost update in the controller, not a permission question.
    """
    assert sim.client is not None
    client = sim.client
    specs = []
    for pool in constants.POOLS:
        pods, _ = await client.list(PODS_RES, ns, f"{constants.LABEL_DEPLOYMENT}={name},{constants.LABEL_POOL}={pool}")
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
            pods, _ = await client.list(PODS_RES, ns)
            return victim.pod not in {p["metadata"]["name"] for p in pods}

        await eventually(deleted, timeout=40, interval=0.25)


CLUSTER_VALUES: dict[str, Any] = {}
NAMESPACED_VALUES: dict[str, Any] = {"watch": {"mode": "namespaced", "namespaces": ["ml", "dev"]}}


@pytest.mark.parametrize("authorized_cluster", [CLUSTER_VALUES], indirect=True, ids=["cluster-mode"])
async def test_cluster_mode_rules_equal_what_the_operator_uses(
        authorized_cluster: tuple[SimCluster, Authorizer], prom: Prometheus) -> None:
    sim, auth = authorized_cluster
    async with running_operator(sim):
        await operator_scenario(sim)
    async with running_operator(sim, prometheus_url=prom.url, **HEALTH):
        await stalled_pod_is_deleted(sim, prom)
    assert auth.denied_triples() == set(), "the chart's ClusterRole misses what the operator needs"
    used = auth.used()
    assert not used & set(GRANT_ONLY), f"used, so not grant-only: {sorted(used & set(GRANT_ONLY))}"
    unused = auth.cluster - used
    assert unused == set(GRANT_ONLY), (f"granted but never used: {sorted(unused - set(GRANT_ONLY))}; "
                                       f"used but not granted: {sorted(used - auth.cluster)}")


@pytest.mark.parametrize("authorized_cluster", [NAMESPACED_VALUES], indirect=True, ids=["namespaced-mode"])
async def test_namespaced_mode_works_with_roles_and_the_node_reader(
        authorized_cluster: tuple[SimCluster, Authorizer], prom: Prometheus) -> None:
    sim, auth = authorized_cluster
    async with running_operator(sim, namespaces=("ml", "dev")):
        await operator_scenario(sim)
    async with running_operator(sim, namespaces=("ml", "dev"), prometheus_url=prom.url, **HEALTH):
        await stalled_pod_is_deleted(sim, prom)
    assert auth.denied_triples() == set(), "the Roles and ClusterRoles miss what the operator needs"
    cluster_scoped = {t for r in auth.allowed if not r.namespace for t in triples(r)}
    assert cluster_scoped == auth.cluster, "every cluster-wide grant is used, and only at the cluster scope"
    assert cluster_scoped == {("", "nodes", "list"), ("", "namespaces", "list"), ("", "namespaces", "watch"),
                              ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
                              ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
                              # rbac.workloadClassReader: classes are cluster-scoped, no Role can grant them
                              (constants.GROUP, constants.CLASS_PLURAL, "list"),
                              (constants.GROUP, constants.CLASS_PLURAL, "watch")}
    # The Role is the same in every watched namespace (test_chart checks); the scenario walks its paths in "ml".
    granted = set().union(*auth.per_namespace.values())
    used = {t for r in auth.allowed if r.namespace for t in triples(r)}
    assert granted - used == set(GRANT_ONLY), sorted(granted - used - set(GRANT_ONLY))


@pytest.mark.parametrize("authorized_cluster", [{**NAMESPACED_VALUES, "rbac": {"nodeReader": False}}],
                         indirect=True, ids=["namespaced-without-node-reader"])
async def test_without_the_node_reader_auto_is_refused_and_named_types_work(
        authorized_cluster: tuple[SimCluster, Authorizer]) -> None:
    sim, auth = authorized_cluster
    assert sim.client is not None
    assert ("", "nodes", "list") not in auth.cluster
    auto = example("chat", accelerator={"type": "auto", "count": 1})
    async with running_operator(sim, namespaces=("ml", "dev")):
        await sim.client.create(VLLM_DEPLOYMENTS, "ml", auto)
        cpu = example("cpu-dev")
        await sim.client.create(VLLM_DEPLOYMENTS, "dev", cpu)
        await wait_ready(sim, "dev", cpu["metadata"]["name"])

        async def refused() -> dict[str, Any]:
            return condition(await sim.client.get(VLLM_DEPLOYMENTS, "ml", "chat"),  # type: ignore[union-attr]
                             constants.COND_SPEC_VALID)

        cond = await eventually(lambda: _false(refused), timeout=20, interval=0.1)
    assert "spec.accelerator.type" in cond["message"] and "read access to Nodes" in cond["message"]
    assert auth.denied_triples() == {("", "nodes", "list")}


async def _false(check: Any) -> dict[str, Any] | None:
    cond: dict[str, Any] = await check()
    return cond if cond.get("status") == "False" else None


async def test_router_requests_equal_its_rendered_role(tmp_path: Path) -> None:
    """The router, configured with the router.json the operator rendered, watches EndpointSlices under the Role
    the operator created for it — and needs nothing else."""
    chat = example("chat")
    ns, name = chat["metadata"]["namespace"], chat["metadata"]["name"]
    role = next(m for m in offline_children(chat) if m["kind"] == "Role")
    router_rules = expand(role["rules"])
    auth = Authorizer((ROUTER_AGENT,), set(), {ns: router_rules}, f"system:serviceaccount:{ns}:{name}-router")
    async with SimCluster(api=ApiServer(faults=auth), nodes=nodes_for([chat])) as sim:
        assert sim.client is not None
        await sim.client.create(NAMESPACES_RES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}})
        async with running_operator(sim):
            await sim.client.create(VLLM_DEPLOYMENTS, ns, chat)
            await wait_ready(sim, ns, name)
            created_role = await sim.client.get(ROLES, ns, role["metadata"]["name"])
            assert created_role is not None and expand(created_role["rules"]) == router_rules
            configmap = await sim.client.get(CONFIGMAPS, ns, names.router(name))
            assert configmap is not None
            config = RouterConfig.model_validate_json(configmap["data"][constants.ROUTER_CONFIG_KEY])
            config = config.model_copy(update={"api_keys_dir": None, "tokenizer": config.tokenizer.model_copy(
                update={"hf_repo": None, "hf_token_file": None, "path": None})})
            async with running_router(config, TokenCounter(None), kubeconfig=str(sim.kubeconfig)) as (_, metrics):

                async def synced() -> bool:
                    values = [metrics.registry.get_sample_value("vllm_operator_router_discovery_synced",
                                                                {"pool": p}) for p in constants.POOLS]
                    return all(v == 1 for v in values)

                await eventually(synced, timeout=20, interval=0.1)
                await asyncio.sleep(0.3)  # the watches that follow the initial lists are open now
        assert sim.controller_errors == [] and sim.api.internal_errors == []
    assert auth.denied == [], [triples(r) for r in auth.denied]
    used = auth.used()
    assert used == {("discovery.k8s.io", "endpointslices", "list"), ("discovery.k8s.io", "endpointslices", "watch")}
    # The renderer also grants `get`, which the router never sends (it lists and watches by label selector).
    assert router_rules - used == {("discovery.k8s.io", "endpointslices", "get")}
    assert {r.namespace for r in auth.allowed} == {ns}
