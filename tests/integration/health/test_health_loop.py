"""The whole health loop in the operator: kopf timer -> snapshot -> diagnose -> decide -> act, on the real control
plane (testcluster: kube-apiserver, the deployment and ReplicaSet controllers, the scheduler, kwok nodes), with engine
pod states written as a kubelet writes them (tests/support/kubelet.py) and engine metrics from fake vLLM engines
scraped by a real Prometheus.

Checked: repeated EngineOOM moves the pool one rung down and the new rung reaches the rendered Deployment's args,
with status history and events; a Stalled engine's pod is deleted (once, within budget); while Prometheus is down
nothing is deleted and MetricsAvailable=False says why, and the deletion happens once it is back.
Fault-to-action times are logged (and appended to $HEALTH_TIMINGS when set).

The operator runs in a thread of this process (the health interval is shortened to 1 s, which the command line does
not offer) logged in with the chart's ServiceAccount token, so every call it makes is authorised by the chart's RBAC.
The chart is installed once per module, watching one namespace; each test makes a VLLMDeployment of its own name
there, on this module's kwok nodes. Pods are kwok pods, so their engines are fake vLLMs this test starts on loopback,
and Prometheus scrapes them through file_sd targets carrying the label contract's labels (namespace, pod,
vllmdeployment, pool) with the real pods' names — what the rendered PodMonitor's relabelings give real pods, as in
tests/integration/kube/test_autoscaling.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from fakevllm.engine import FakeVllm
from testcluster import binaries
from testcluster.cluster import Cluster
from tests.support import inprocess
from tests.support.health_harness import Engine, client_loop, engines, record_timing
from tests.support.kube import add_gpu_nodes, namespaced_release, unique, wait_for
from tests.support.kubelet import ContainerReport, report
from tests.support.net import free_port
from tests.support.paths import EXAMPLES
from tests.support.prometheus import Prometheus, running_prometheus
from tests.support.waiting import eventually
from vllm_operator import constants, names
from vllm_operator.handlers.reconcile import reconcile
from vllm_operator.health import loop
from vllm_operator.k8s import DEPLOYMENTS, EVENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi

pytestmark = pytest.mark.integration

CHAT = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
REMEDIATION = {"restartBudget": 3, "thresholds": {"oomCount": 2, "oomWindowSeconds": 600, "stallSeconds": 3,
                                                  "windowSeconds": 6}}


def record(kind: str, seconds: float) -> None:
    record_timing(kind, seconds, tier="operator on the real control plane", health_interval_s=1,
                  scrape_interval_s=1, stall_s=3, window_s=6)


@dataclass
class Setup:
    kube: Cluster
    namespace: str
    label: dict[str, str]
    operator_kubeconfig: Path
    """A TokenRequest token of the chart's ServiceAccount."""
    user: str
    """That ServiceAccount's user name in the audit log."""


@pytest.fixture(scope="module")
def setup(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with namespaced_release(kube, "health", tmp_path_factory.mktemp("health")) as release:
        for crd, kind in ((constants.CRD_NAME, "vllmd"), (constants.CLASS_CRD_NAME, "vllmwc")):
            kube.wait_established(crd)
            wait_for(f"{kind} to be listable",
                     lambda k=kind: kube.kubectl("get", k, "-A", check=False).returncode == 0, timeout=30)
        ns = release.watched
        label = {"vllm-operator.dev/test-node": ns}
        nodes = add_gpu_nodes(kube, ns, 2, label=label, gpus=8)
        try:
            yield Setup(kube, ns, label, release.kubeconfig, release.user)
        finally:
            kube.kubectl("delete", "node", *nodes, "--wait=false", check=False)
    forbidden = [(e["verb"], e["requestURI"]) for e in kube.audit_events()
                 if e.get("user", {}).get("username") == release.user
                 and e.get("responseStatus", {}).get("code") == 403]
    assert not forbidden, f"the health loop made calls the chart's RBAC does not grant: {forbidden}"


@pytest.fixture
async def admin(setup: Setup) -> AsyncIterator[ClientKubeApi]:
    """The test's own client (admin): what it reads, and the kubelet's status writes."""
    api = await ClientKubeApi.from_environment(kubeconfig=str(setup.kube.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture
def name() -> str:
    """This test's VLLMDeployment (its pods, Deployments and Prometheus labels are named after it)."""
    return unique("chat")


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    with running_prometheus(executable=str(binaries.prometheus())) as p:
        yield p


@contextlib.asynccontextmanager
async def running_operator(setup: Setup, **config: Any) -> AsyncIterator[None]:
    """The operator with its health loop (checks every second) until the block exits, as the chart's
    ServiceAccount."""
    async with inprocess.running_operator(setup.operator_kubeconfig, setup.kube.kubeconfig,
                                          namespaces=(setup.namespace,), health_enabled=True,
                                          health_interval_override=1.0, **config):
        yield


@pytest.fixture(autouse=True)
async def cleanup(setup: Setup, admin: ClientKubeApi, name: str) -> AsyncIterator[None]:
    """The test's VLLMDeployment goes afterwards (its children by garbage collection), so its pods leave the
    module's nodes to the next test."""
    yield
    with contextlib.suppress(Exception):
        await admin.delete(VLLM_DEPLOYMENTS, setup.namespace, name)


def chat(setup: Setup, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = copy.deepcopy(CHAT)
    obj["metadata"] = {"name": name, "namespace": setup.namespace}
    obj["spec"]["pools"] = {pool: {**obj["spec"]["pools"][pool], "nodeSelector": dict(setup.label)}
                            for pool in ("short", "long")}
    obj["spec"]["remediation"] = copy.deepcopy(REMEDIATION)
    return obj


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return dict(next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == type_), {}))


async def pool_pods(kube: ClientKubeApi, ns: str, name: str, pool: str) -> list[dict[str, Any]]:
    pods = await kube.list(PODS, ns, f"{constants.LABEL_DEPLOYMENT}={name},{constants.LABEL_POOL}={pool}")
    return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


async def started_pool_pods(kube: ClientKubeApi, ns: str, name: str, pool: str) -> list[dict[str, Any]] | None:
    """The pool's pods once kwok has started them all: a state written before its first report would be
    overwritten by it."""
    pods = await pool_pods(kube, ns, name, pool)
    started = all(p.get("status", {}).get("containerStatuses") for p in pods)
    return pods if pods and started else None


async def ready_obj(kube: ClientKubeApi, ns: str, name: str) -> dict[str, Any] | None:
    obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    return obj if cond(obj, constants.COND_READY).get("status") == "True" else None


def engine_args(dep: dict[str, Any] | None) -> list[str]:
    return list((dep or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
                .get("args", []))


def oom(restarts: int) -> ContainerReport:
    message = json.dumps({"reason": constants.REASON_ENGINE_OOM, "exitCode": constants.EXIT_ENGINE_OOM,
                          "detail": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"})
    return ContainerReport(ready=False, restart_count=restarts,
                           last_terminated={"exitCode": constants.EXIT_ENGINE_OOM, "reason": "Error",
                                            "message": message})


async def reasons(kube: ClientKubeApi, ns: str, name: str) -> list[str]:
    """Reasons of the events about this test's VLLMDeployment (the namespace also holds the scheduler's and the
    controllers' events, and those of the module's other tests)."""
    return [e.get("reason", "") for e in await kube.list(EVENTS, ns)
            if e.get("involvedObject", {}).get("kind") == constants.KIND
            and e.get("involvedObject", {}).get("name") == name]


async def deletion_graces(kube: ClientKubeApi, ns: str, pod: str, version: str, out: list[int]) -> None:
    """Append the deletionGracePeriodSeconds the API server gave `pod` when it was deleted (from a watch from
    `version`, since kwok removes a deleted pod a moment later)."""
    async for event in kube.watch(PODS, ns, resource_version=version):
        meta = event.object.get("metadata", {})
        if meta.get("name") == pod and meta.get("deletionGracePeriodSeconds") is not None:
            out.append(int(meta["deletionGracePeriodSeconds"]))
            return


async def gone(kube: ClientKubeApi, ns: str, pod: str) -> bool:
    """The pod was deleted: it is gone, or going (its deletionTimestamp is set; kwok removes it a moment later)."""
    found = await kube.get(PODS, ns, pod)
    return found is None or bool(found["metadata"].get("deletionTimestamp"))


async def test_repeated_engine_oom_steps_the_pool_down_into_the_deployment(setup: Setup, admin: ClientKubeApi,
                                                                           name: str) -> None:
    ns = setup.namespace
    async with running_operator(setup):
        await admin.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))
        await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        dep_name = names.pool(name, "short")
        before = engine_args(await admin.get(DEPLOYMENTS, ns, dep_name))
        util_before = next(a for a in before if a.startswith("--gpu-memory-utilization="))
        pods = await eventually(lambda: started_pool_pods(admin, ns, name, "short"), timeout=30)
        pod = pods[0]["metadata"]["name"]

        await report(admin, ns, pod, oom(1))

        async def counted() -> bool:
            obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
            short = (obj or {}).get("status", {}).get("pools", {}).get("short", {})
            return len(short.get("restartBudget", {}).get("oomEvents", [])) == 1

        await eventually(counted, timeout=30)
        injected = time.monotonic()
        await report(admin, ns, pod, oom(2))

        async def stepped() -> list[str] | None:
            args = engine_args(await admin.get(DEPLOYMENTS, ns, dep_name))
            return args if util_before not in args else None

        after = await eventually(stepped, timeout=30)
        record("EngineOOM x2 -> step-down in Deployment args", time.monotonic() - injected)
        util_after = next(a for a in after if a.startswith("--gpu-memory-utilization="))
        assert float(util_after.split("=")[1]) == pytest.approx(float(util_before.split("=")[1]) - 0.05)
        obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        assert obj is not None
        step = obj["status"]["pools"]["short"]["stepDown"]
        assert step["level"] == 1 and "gpu-memory-utilization" in step["history"][-1]["rung"]
        assert "EngineOOM x2" in step["history"][-1]["reason"]
        assert obj["status"]["stepDownLevel"] == 1
        assert obj["status"]["pools"]["long"]["stepDown"].get("level", 0) == 0
        assert cond(obj, constants.COND_METRICS_AVAILABLE)["reason"] == "PrometheusNotConfigured"
        events = await reasons(admin, ns, name)
        assert "ObservedEngineOOM" in events and "SteppedDown" in events
        assert await pool_pods(admin, ns, name, "short"), "pods were rolled, not deleted"


async def test_stalled_engine_deleted_and_nothing_while_prometheus_is_down(setup: Setup, admin: ClientKubeApi,
                                                                          name: str, prom: Prometheus) -> None:
    ns = setup.namespace
    async with running_operator(setup, prometheus_url=prom.url):
        await admin.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))
        await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        specs = [(p["metadata"]["name"], pool) for pool in ("short", "long")
                 for p in await pool_pods(admin, ns, name, pool)]
        async with engines(specs, prom, namespace=ns, deployment=name) as fleet:

            async def scraped() -> bool:
                obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
                pools = (obj or {}).get("status", {}).get("pools", {})
                return (cond(obj, constants.COND_METRICS_AVAILABLE).get("status") == "True"
                        and all(pools.get(p, {}).get("diagnosis") == "Healthy" for p in ("short", "long")))

            await eventually(scraped, timeout=40, interval=0.5)
            obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
            assert obj is not None and obj["status"]["pools"]["short"]["observedKVTokens"] == 32768

            stalled = fleet[0]
            graces: list[int] = []
            _, version = await admin.list_versioned(PODS, ns)
            watching = asyncio.create_task(deletion_graces(admin, ns, stalled.pod, version, graces))
            stalled.fake.configure(stall=True)
            injected = time.monotonic()
            await eventually(lambda: gone(admin, ns, stalled.pod), timeout=40, interval=0.25)
            record("Stalled -> pod deleted", time.monotonic() - injected)
            await asyncio.wait_for(watching, timeout=10)
            # a stalled engine cannot drain: deleted with a short grace, not the pod's own 30 s
            assert graces == [constants.STALLED_POD_GRACE_S], graces
            obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
            assert obj is not None and obj["status"]["pools"]["short"]["restartBudget"]["used"] == 1
            assert "RestartedStalledPod" in await reasons(admin, ns, name)

            # Prometheus goes away; then the long pool's engine stalls. Nothing may be deleted meanwhile.
            prom.stop()
            victim = next(e for e in fleet if e.pool == "long")
            victim.fake.configure(stall=True)

            async def blind() -> bool:
                return cond(await admin.get(VLLM_DEPLOYMENTS, ns, name),
                            constants.COND_METRICS_AVAILABLE).get("reason") == "PrometheusUnreachable"

            await eventually(blind, timeout=30, interval=0.5)
            await asyncio.sleep(10)  # three stall windows with a check every second: long enough to have acted
            assert not await gone(admin, ns, victim.pod), "a pod was deleted while Prometheus was down"
            obj = await admin.get(VLLM_DEPLOYMENTS, ns, name)
            assert obj is not None and obj["status"]["pools"]["long"]["restartBudget"].get("used", 0) == 0

            prom.start()
            back = time.monotonic()
            await eventually(lambda: gone(admin, ns, victim.pod), timeout=40, interval=0.25)
            record("Prometheus back -> stalled pod deleted", time.monotonic() - back)


def kv_too_small(detail: str | None) -> ContainerReport:
    message = {"reason": constants.REASON_KV_CACHE_TOO_SMALL, "exitCode": constants.EXIT_KV_CACHE_TOO_SMALL,
               **({"detail": detail} if detail else {})}
    return ContainerReport(ready=False, restart_count=1, waiting_reason="CrashLoopBackOff",
                           last_terminated={"exitCode": constants.EXIT_KV_CACHE_TOO_SMALL, "reason": "Error",
                                            "message": json.dumps(message)})


async def test_kv_cache_too_small_takes_the_kv_path_into_the_deployment(setup: Setup, admin: ClientKubeApi,
                                                                        name: str) -> None:
    ns = setup.namespace
    obj = chat(setup, name)
    obj["spec"]["remediation"]["allowLowerMaxModelLen"] = True
    async with running_operator(setup):
        await admin.create(VLLM_DEPLOYMENTS, ns, obj)
        await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        dep_name = names.pool(name, "long")
        before = engine_args(await admin.get(DEPLOYMENTS, ns, dep_name))
        pods = await eventually(lambda: started_pool_pods(admin, ns, name, "long"), timeout=30)
        injected = time.monotonic()
        await report(admin, ns, pods[0]["metadata"]["name"], kv_too_small(
            "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory (2.10 GiB)"))

        async def changed() -> list[str] | None:
            args = engine_args(await admin.get(DEPLOYMENTS, ns, dep_name))
            return args if args != before else None

        after = await eventually(changed, timeout=30)
        record("KVCacheTooSmall -> KV rung in Deployment args", time.monotonic() - injected)
        moved = sorted(set(after) ^ set(before))
        assert moved and all(a.startswith(("--kv-cache-dtype=", "--max-model-len=")) for a in moved), moved
        current = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        assert current is not None
        step = current["status"]["pools"]["long"]["stepDown"]
        assert step["kvLevel"] == 1 and step.get("level", 0) == 0
        assert step["history"][-1]["reason"] == "KVCacheTooSmall at start-up"
        assert "SteppedKVPath" in await reasons(admin, ns, name)


async def test_storm_every_pod_stalls_budget_caps_deletions(setup: Setup, admin: ClientKubeApi, name: str,
                                                            prom: Prometheus) -> None:
    """Every engine stalls, replacements too: one pod per pool at a time, never more than the budget."""
    ns = setup.namespace
    budget = 2
    obj = chat(setup, name)
    obj["spec"]["remediation"]["restartBudget"] = budget
    fleet: dict[str, Engine] = {}
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def follow_pods() -> None:
        """Give every engine pod, old or new, a stalled fake engine under traffic, registered with Prometheus."""
        while True:
            pods = {p["metadata"]["name"]: p["metadata"]["labels"][constants.LABEL_POOL]
                    for pool in ("short", "long") for p in await pool_pods(admin, ns, name, pool)}
            for pod, pool in pods.items():
                if pod not in fleet:
                    fake = await FakeVllm(stall=True, kv_cache_size_tokens=32768).start()
                    engine = Engine(pod=pod, pool=pool, fake=fake)
                    engine.tasks = [asyncio.create_task(client_loop(session, engine)) for _ in range(2)]
                    fleet[pod] = engine
            prom.set_targets([fleet[n].target(ns, name) for n in pods])
            await asyncio.sleep(0.3)

    async with running_operator(setup, prometheus_url=prom.url):
        await admin.create(VLLM_DEPLOYMENTS, ns, obj)
        await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        started = time.monotonic()
        follower = asyncio.create_task(follow_pods())
        try:
            async def exhausted() -> dict[str, Any] | None:
                current = await admin.get(VLLM_DEPLOYMENTS, ns, name)
                pools = (current or {}).get("status", {}).get("pools", {})
                used = [pools.get(p, {}).get("restartBudget", {}).get("used", 0) for p in ("short", "long")]
                return current if used == [budget, budget] else None

            await eventually(exhausted, timeout=90, interval=0.5)
            record(f"storm: budget {budget}/pool spent", time.monotonic() - started)
            await asyncio.sleep(10)  # ten more checks with every pod stalled: nothing more may go
            current = await admin.get(VLLM_DEPLOYMENTS, ns, name)
            assert current is not None
            for pool in ("short", "long"):
                assert current["status"]["pools"][pool]["restartBudget"]["used"] == budget
            assert len(fleet) == 3 + 2 * budget, f"pods seen: {sorted(fleet)}"
            remediating = cond(current, constants.COND_REMEDIATING)
            assert remediating["status"] == "False" and remediating["reason"] == "BudgetExhausted"
            assert (await reasons(admin, ns, name)).count("RestartedStalledPod") == 2 * budget
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            for engine in fleet.values():
                for task in engine.tasks:
                    task.cancel()
                await asyncio.gather(*engine.tasks, return_exceptions=True)
                await engine.fake.stop()
            await session.close()


async def test_a_decision_on_a_stale_status_is_made_again_on_the_fresh_one(setup: Setup, admin: ClientKubeApi,
                                                                             name: str) -> None:
    """The controller writes the status between the loop's read and its write: the loop's write gets 409, and the
    one status writer reads the object again and the loop decides again on it, so the controller's update is kept
    and the rung moves once (not on the stale decision, not twice). No operator runs: the test calls the reconcile
    and the loop's two halves itself, as admin."""
    ns, kube = setup.namespace, admin
    await kube.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))
    created = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    assert created is not None
    await reconcile(kube, created)
    pods = await eventually(lambda: started_pool_pods(kube, ns, name, "long"), timeout=30)
    dep_name = names.pool(name, "long")
    before = engine_args(await kube.get(DEPLOYMENTS, ns, dep_name))
    await report(kube, ns, pods[0]["metadata"]["name"], kv_too_small(None))
    rechecked: list[str] = []

    async def recheck(current: Any) -> Any:
        rechecked.append(current["metadata"]["resourceVersion"])
        return await loop.check(kube, None, current)

    async def kv_seen() -> Any:
        obj = await kube.get(VLLM_DEPLOYMENTS, ns, name)
        result = await loop.check(kube, None, obj or {})
        return (obj, result) if result is not None and result.rung_changes else None

    obj, result = await eventually(kv_seen, timeout=20)
    raced = await kube.patch_status(VLLM_DEPLOYMENTS, ns, name, {"status": {"ready": "controller-was-here"}})
    await loop.execute(kube, obj, result, reconcile=reconcile, recheck=recheck)
    assert rechecked == [raced["metadata"]["resourceVersion"]], "decided again once, on the object as raced"
    after = await kube.get(VLLM_DEPLOYMENTS, ns, name)
    assert after is not None
    assert after["status"]["pools"]["long"]["stepDown"]["kvLevel"] == 1
    assert engine_args(await kube.get(DEPLOYMENTS, ns, dep_name)) != before
    assert "SteppedKVPath" in await reasons(kube, ns, name)


async def test_disabling_a_pool_removes_its_status_also_after_health_checks(setup: Setup, admin: ClientKubeApi,
                                                                            name: str) -> None:
    """Every status writer (reconcile, refresh, the health loop) writes a diff with nulls against the object read:
    with the long pool disabled, `status.pools.long` and `status.plan.long` go and stay gone while the health loop
    checks every second (a whole-status merge patch cannot delete a key; 2d3eb9d kept both)."""
    ns = setup.namespace
    async with running_operator(setup):
        await admin.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))
        obj = await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        assert "long" in obj["status"]["pools"] and "long" in obj["status"]["plan"]
        await admin.patch(VLLM_DEPLOYMENTS, ns, name, {"spec": {"pools": {"long": {"enabled": False}}}})

        async def without_long() -> dict[str, Any] | None:
            got = await ready_obj(admin, ns, name)
            return got if got is not None and got["status"].get("observedGeneration") == 2 else None

        got = await eventually(without_long, timeout=60)
        assert "long" not in got["status"]["pools"] and "long" not in got["status"]["plan"], got["status"]
        await asyncio.sleep(4)  # four health checks at the 1 s interval
        got = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        assert got is not None and cond(got, constants.COND_DEGRADED).get("status") == "False", got["status"]
        assert "long" not in got["status"]["pools"] and "long" not in got["status"]["plan"], got["status"]
        assert got["status"]["longReplicas"] == "-"


async def test_quiet_checks_write_nothing(setup: Setup, admin: ClientKubeApi, name: str) -> None:
    """Once the health loop has said its piece, checks on an unchanged, healthy deployment make zero writes."""
    ns = setup.namespace
    async with running_operator(setup):
        await admin.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))

        async def settled() -> dict[str, Any] | None:
            obj = await ready_obj(admin, ns, name)
            return obj if cond(obj, constants.COND_METRICS_AVAILABLE).get("reason") == "PrometheusNotConfigured" \
                and cond(obj, constants.COND_DEGRADED).get("status") == "False" else None

        await eventually(settled, timeout=60)
        await asyncio.sleep(2)  # let the last in-flight check land
        before = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        events_before = len(await reasons(admin, ns, name))
        await asyncio.sleep(5)  # five checks
        after = await admin.get(VLLM_DEPLOYMENTS, ns, name)
        assert before is not None and after is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert len(await reasons(admin, ns, name)) == events_before


def operator_requests(setup: Setup, since: float) -> list[tuple[str, str]]:
    """(verb, resource) of the operator's requests received at or after `since` (epoch seconds), from the audit log:
    one per request (a watch is logged when its response starts, and again when it ends)."""
    out, seen = [], set()
    for e in setup.kube.audit_events():
        if e.get("user", {}).get("username") != setup.user or e.get("auditID") in seen:
            continue
        seen.add(e.get("auditID"))
        received = dt.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        if received >= since:
            out.append((e.get("verb", ""), e.get("objectRef", {}).get("resource", "")))
    return out


async def operator_checks(port: int) -> float:
    """The operator's vllm_operator_health_checks_total, from its /metrics."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vllm_operator_health_checks_total"))


async def test_quiet_checks_send_no_request(setup: Setup, admin: ClientKubeApi, name: str) -> None:
    """A settled deployment's checks send nothing: the object comes from kopf's watch (its status write would be
    conditional on that version), its engine pods, pool Deployments and PDBs from the operator's watches, which were
    opened with the chart's RBAC. Up to 2d3eb9d each check GET its VLLMDeployment (~17 requests/s at 500 on the
    30 s interval); before the watch cache it also listed all three (~50 LISTs/s)."""
    ns = setup.namespace
    port = free_port()
    async with running_operator(setup, http_port=port, http_host="127.0.0.1"):
        await admin.create(VLLM_DEPLOYMENTS, ns, chat(setup, name))
        await eventually(lambda: ready_obj(admin, ns, name), timeout=60)
        await asyncio.sleep(2)  # the last in-flight reconcile and check land
        since, before = time.time(), await operator_checks(port)
        await asyncio.sleep(5)  # five checks at the 1 s interval
        checks = await operator_checks(port) - before
        seen = [r for r in operator_requests(setup, since) if r[0] != "watch"]
    assert checks >= 3, f"the health loop checked {checks} times in 5 s at a 1 s interval"
    assert not seen, f"settled checks sent {seen}"
    watches = {r for verb, r in operator_requests(setup, 0) if verb == "watch"}
    assert {"pods", "deployments", "poddisruptionbudgets"} <= watches, watches
