"""Children by server-side apply on a real kube-apiserver: what only the real field manager can prove.

The reconcile routine runs here against the session's control plane as an admin client (the chart-RBAC run is
test_chart_on_apiserver's): every child is created by an apply PATCH and owned by the `vllm-operator` Apply manager;
a no-op resync writes nothing; a field the rendering drops (a toleration) disappears; another manager's annotation
and an autoscaler's replicas survive a reconcile; a field taken back from another manager is named in a Warning
event first. Requests and writes per VLLMDeployment are counted through a recording KubeApi (the figures of the
issue's "before/after"). The in-memory fake models none of this (it keeps no field ownership): this is where the
reconcile's use of server-side apply is proven.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.kube import unique
from tests.support.paths import CRD_FILE, EXAMPLES
from vllm_operator import constants, names
from vllm_operator.handlers.reconcile import ReconcileOutcome, reconcile
from vllm_operator.k8s import DEPLOYMENTS, EVENTS, VLLM_DEPLOYMENTS, ClientKubeApi, KubeApi

pytestmark = pytest.mark.integration

WRITES = {"create", "patch", "patch_status", "apply", "delete"}


class Recording:
    """A KubeApi that counts the calls it forwards (the API server's audit log would say the same, per verb)."""

    def __init__(self, inner: ClientKubeApi) -> None:
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, verb: str) -> Any:
        target = getattr(self.inner, verb)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[verb] += 1
            return await target(*args, **kwargs)

        return call

    @property
    def writes(self) -> int:
        """Writes, events left out (they describe writes rather than being ones)."""
        return sum(n for verb, n in self.calls.items() if verb in WRITES)


@pytest.fixture(scope="module")
def crd(kube: Cluster) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    kube.wait_established(constants.CRD_NAME)


@pytest.fixture
def namespace(kube: Cluster, crd: None) -> Iterator[str]:
    ns = unique("ssa")
    kube.kubectl("create", "namespace", ns)
    yield ns
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
async def api(kube: Cluster) -> AsyncIterator[ClientKubeApi]:
    client = await ClientKubeApi.from_environment(kubeconfig=str(kube.kubeconfig))
    try:
        yield client
    finally:
        await client.close()


def chat(namespace: str, **pools: Any) -> dict[str, Any]:
    obj = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
    obj["metadata"] = {"name": "chat", "namespace": namespace}
    for pool, fields in pools.items():
        obj["spec"]["pools"][pool].update(fields)
    return obj


async def create(api: KubeApi, obj: Mapping[str, Any]) -> dict[str, Any]:
    return await api.create(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj)


async def edit(api: KubeApi, obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    return await api.patch(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj["metadata"]["name"], patch)


async def fresh(api: KubeApi, obj: Mapping[str, Any]) -> dict[str, Any]:
    got = await api.get(VLLM_DEPLOYMENTS, obj["metadata"]["namespace"], obj["metadata"]["name"])
    assert got is not None
    return got


async def deployment(api: KubeApi, ns: str, name: str) -> dict[str, Any]:
    got = await api.get(DEPLOYMENTS, ns, name)
    assert got is not None
    return got


def managers(obj: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(e["manager"], e["operation"], e.get("subresource", "")) for e in obj["metadata"].get("managedFields", [])}


async def test_children_are_applied_and_a_resync_writes_nothing(kube: Cluster, namespace: str,
                                                                api: ClientKubeApi) -> None:
    obj = await create(api, chat(namespace))
    first = Recording(api)
    outcome: ReconcileOutcome = await reconcile(first, obj)  # type: ignore[arg-type]
    assert outcome.spec_error is None and not outcome.updated and not outcome.deleted
    kinds = Counter(label.split()[0] for label in outcome.created)
    assert kinds == Counter({"Deployment": 3, "Service": 3, "PodDisruptionBudget": 3, "ConfigMap": 1,
                             "ServiceAccount": 1, "Role": 1, "RoleBinding": 1, "NetworkPolicy": 1}), kinds
    assert first.calls["apply"] == 14 and first.calls["create"] == 0 and first.calls["patch"] == 0, first.calls
    for name in (names.pool("chat", "short"), names.pool("chat", "long"), names.router("chat")):
        dep = await deployment(api, namespace, name)
        assert ("vllm-operator", "Apply", "") in managers(dep), managers(dep)
        assert ("vllm-operator", "Update", "") not in managers(dep), "no Update entry of the operator's own"
    # The controllers fill the children's status meanwhile (ReplicaSets, pods): until they are done a reconcile
    # may write the parent's status (pool counters), never a child; once they are, a resync writes nothing at all.
    for _ in range(20):
        again = Recording(api)
        resync = await reconcile(again, await fresh(api, obj))  # type: ignore[arg-type]
        assert not resync.changed and again.writes - again.calls["patch_status"] == 0, again.calls
        if again.writes == 0:
            break
        await asyncio.sleep(1)
    assert again.writes == 0, again.calls
    print(f"\nrequests per VLLMDeployment: first reconcile {dict(first.calls)} ({sum(first.calls.values())}), "
          f"resync {dict(again.calls)} ({sum(again.calls.values())}, {again.writes} writes)")


async def test_a_dropped_toleration_disappears(kube: Cluster, namespace: str, api: ClientKubeApi) -> None:
    toleration = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    obj = await create(api, chat(namespace, short={"tolerations": [toleration],
                                                    "nodeSelector": {"kubernetes.io/os": "linux"}}))
    await reconcile(api, obj)
    dep_name = names.pool("chat", "short")
    pod = (await deployment(api, namespace, dep_name))["spec"]["template"]["spec"]
    assert toleration in pod["tolerations"] and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    obj = await edit(api, obj, {"spec": {"pools": {"short": {"tolerations": None, "nodeSelector": None}}}})
    outcome = await reconcile(api, obj)
    assert f"Deployment {namespace}/{dep_name}" in outcome.updated
    pod = (await deployment(api, namespace, dep_name))["spec"]["template"]["spec"]
    # The GPU pool keeps the toleration the renderer adds for nvidia.com/gpu taints; the spec's is gone.
    assert toleration not in pod.get("tolerations", []) and "nodeSelector" not in pod, pod


async def test_other_managers_survive_and_a_taken_field_is_named_in_an_event(kube: Cluster, namespace: str,
                                                                               api: ClientKubeApi) -> None:
    obj = await create(api, chat(namespace, short={"externalAutoscaler": True}))
    await reconcile(api, obj)
    short, long_ = names.pool("chat", "short"), names.pool("chat", "long")
    assert (await deployment(api, namespace, short))["spec"]["replicas"] == 1, "never applied: the default"
    # An autoscaler's replicas (through the scale subresource, as the HPA writes them), someone's annotation, and a
    # hand edit of a field the operator renders (the long pool's engine image).
    kube.kubectl("scale", f"deployment/{short}", "--replicas=4", f"--namespace={namespace}")
    kube.kubectl("annotate", f"deployment/{short}", "team.example/owner=search", f"--namespace={namespace}")
    kube.kubectl("set", "image", f"deployment/{long_}", "engine=registry.example/hand-edited:1",
                 f"--namespace={namespace}")
    # A spec edit that re-renders both pools (tolerations are per pool).
    toleration = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    obj = await edit(api, obj, {"spec": {"pools": {"short": {"tolerations": [toleration]},
                                                   "long": {"tolerations": [toleration]}}}})
    outcome = await reconcile(api, obj)
    assert {f"Deployment {namespace}/{short}", f"Deployment {namespace}/{long_}"} <= set(outcome.updated)
    dep = await deployment(api, namespace, short)
    assert dep["spec"]["replicas"] == 4, "the autoscaler's replicas survived"
    assert dep["metadata"]["annotations"]["team.example/owner"] == "search"
    assert toleration in dep["spec"]["template"]["spec"]["tolerations"]
    engine = next(c for c in (await deployment(api, namespace, long_))["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "engine")
    assert engine["image"] != "registry.example/hand-edited:1", "the operator took its field back"
    events = [e for e in await api.list(EVENTS, namespace) if e["reason"] == "FieldsTakenOver"]
    assert len(events) == 1 and events[0]["type"] == "Warning", events
    message = events[0]["message"]
    assert f"Deployment {namespace}/{long_}" in message and "kubectl-set" in message and "image" in message, message
