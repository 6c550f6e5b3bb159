"""Endpoint discovery through EndpointSlices on the real control plane (docs/architecture.md, Endpoint discovery):
the router lists and watches the pool Services' slices, which the real endpointslice controller publishes for the
Services' pods, follows additions, readiness changes and deletions, only routes to ready endpoints, and recovers
from API errors, an expired watch (410) and the API server going away and coming back.

The pods are kwok pods on a node of this module's own: kwok gives each an IP from the cluster's pod range, and
that IP is made an address of the cluster network namespace's loopback, where the pod's engine (a fake vLLM)
listens on the Service's port. This test's thread runs inside that namespace while a test runs (pod addresses exist
only there: the host blackholes them), so the router, its engines and the API server all meet there. The router
authenticates with a token of a ServiceAccount bound to the Role the operator renders for routers; faults are made
by tests/support/apiproxy.py in front of the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from fakevllm.engine import FakeVllm
from testcluster.cluster import Cluster, write_kubeconfig
from testcluster.netns import entered
from tests.support.apiproxy import ApiProxy
from tests.support.kube import add_gpu_nodes, apply, unique
from tests.support.kubelet import ContainerReport, report
from tests.support.paths import EXAMPLES
from tests.support.router import MODEL, router_config, running_router, sample, words
from tests.support.waiting import eventually
from vllm_operator.api.resource import parse_spec
from vllm_operator.k8s import ENDPOINT_SLICES, PODS, ClientKubeApi, KubeError, Resource
from vllm_operator.planning import RemediationState, plan
from vllm_operator.rendering.router import role
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.tokens import TokenCounter

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
PORT = 8000
ROUTER_SA = "router"
SERVICES = Resource("", "v1", "services", "Service")
SLICES_SYNC_S = 30.0
"""Allowance for a pod change to reach the router: kwok's status write, the endpointslice controller's update and
the router's watch, on a loaded 2-core machine (about a second when quiet)."""


@dataclass
class Setup:
    kube: Cluster
    namespace: str
    label: dict[str, str]
    token: str
    """A TokenRequest token of the router's ServiceAccount (the Role the operator renders for routers)."""


@pytest.fixture(scope="module")
def setup(kube: Cluster) -> Iterator[Setup]:
    ns = unique("discovery")
    label = {"vllm-operator.dev/test-node": ns}
    kube.kubectl("create", "namespace", ns)
    nodes = add_gpu_nodes(kube, ns, 1, label=label, gpus=0)
    (chat,) = [d for d in yaml.safe_load_all((EXAMPLES / "chat.yaml").read_text()) if d]
    rules = role(plan(parse_spec(chat["spec"]), None, RemediationState(pools={}), name="chat", namespace=ns))["rules"]
    apply(kube, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ROUTER_SA}},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": ROUTER_SA},
           "rules": rules},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": ROUTER_SA},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER_SA},
           "subjects": [{"kind": "ServiceAccount", "name": ROUTER_SA, "namespace": ns}]}, namespace=ns)
    token = kube.kubectl("create", "token", ROUTER_SA, "-n", ns, "--duration=1h").stdout.strip()
    yield Setup(kube, ns, label, token)
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    kube.kubectl("delete", "node", *nodes, "--wait=false", check=False)


@pytest.fixture
def inside(setup: Setup) -> Iterator[None]:
    """This thread (the test's event loop) in the cluster's network namespace for the test."""
    with entered(setup.kube.netns.pin_name):
        yield


@pytest.fixture
async def long_engine(inside: None) -> AsyncIterator[FakeVllm]:
    """The long pool's engine at a static URL, on the namespace's loopback (where the router is)."""
    async with FakeVllm(model=MODEL, max_model_len=1000, natural_tokens=5) as fake:
        yield fake


@dataclass
class Fleet:
    """This test's Services (short, long, and an unrelated one) and their pods, each with its engine."""

    setup: Setup
    admin: ClientKubeApi
    short: str = field(default_factory=lambda: unique("demo-short"))
    long: str = field(default_factory=lambda: unique("demo-long"))
    other: str = field(default_factory=lambda: unique("something-else"))
    engines: dict[str, FakeVllm] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return self.setup.namespace

    async def create_services(self) -> None:
        for name in (self.short, self.long, self.other):
            await self.admin.create(SERVICES, self.namespace, {
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                "spec": {"selector": {"app": name},
                         "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}})

    async def add(self, pod: str, service: str, max_model_len: int = 200) -> FakeVllm:
        """A Running pod of `service` on this module's node, and its engine listening on the pod's IP."""
        await self.admin.create(PODS, self.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {"app": service}},
            "spec": {"nodeSelector": dict(self.setup.label), "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "engine", "image": "fakevllm",
                                     "ports": [{"name": "http", "containerPort": PORT}]}]}})

        async def addressed() -> str | None:
            found = await self.admin.get(PODS, self.namespace, pod)
            return ((found or {}).get("status") or {}).get("podIP")

        ip = await eventually(addressed, timeout=SLICES_SYNC_S, interval=0.2)
        self._ip("add", ip)
        self.addresses[pod] = ip
        fake = await FakeVllm(model=MODEL, max_model_len=max_model_len, natural_tokens=5, host=ip,
                              port=PORT).start()
        self.engines[pod] = fake
        return fake

    async def delete(self, pod: str) -> None:
        """Delete the pod (kwok removes it; the endpointslice controller drops its endpoint) and stop its engine."""
        with contextlib.suppress(KubeError):  # a test may have deleted it itself
            await self.admin.delete(PODS, self.namespace, pod)
        await eventually(lambda: self._gone(pod), timeout=SLICES_SYNC_S, interval=0.2)
        await self.engines.pop(pod).stop()
        self._ip("del", self.addresses.pop(pod))

    async def _gone(self, pod: str) -> bool:
        return await self.admin.get(PODS, self.namespace, pod) is None

    def _ip(self, verb: str, ip: str) -> None:
        subprocess.run(["ip", "-n", self.setup.kube.netns.pin_name, "addr", verb, f"{ip}/32", "dev", "lo"],
                       check=verb == "add", capture_output=True, text=True)

    async def ready_endpoints(self, service: str) -> int:
        slices = await self.admin.list(ENDPOINT_SLICES, self.namespace, f"kubernetes.io/service-name={service}")
        return sum(1 for s in slices for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready") is not False)

    async def close(self) -> None:
        for pod in list(self.engines):
            with contextlib.suppress(Exception):
                await self.delete(pod)
        for name in (self.short, self.long, self.other):
            with contextlib.suppress(Exception):
                await self.admin.delete(SERVICES, self.namespace, name)


@pytest.fixture
async def fleet(setup: Setup, inside: None) -> AsyncIterator[Fleet]:
    admin = await ClientKubeApi.from_environment(kubeconfig=str(setup.kube.kubeconfig))
    made = Fleet(setup, admin)
    try:
        await made.create_services()
        yield made
    finally:
        await made.close()
        await admin.close()


@pytest.fixture
def router_kubeconfig(setup: Setup, tmp_path: Path) -> str:
    path = tmp_path / "router.kubeconfig"
    write_kubeconfig(path, setup.kube.server, setup.kube.ca_file, user=ROUTER_SA, token=setup.token,
                     namespace=setup.namespace)
    return str(path)


def services(fleet: Fleet, *pools: str) -> dict[str, Any]:
    return {f"pools.{pool}.service": {"namespace": fleet.namespace, "name": getattr(fleet, pool), "port": PORT}
            for pool in pools}


def healthy(metrics: RouterMetrics, pool: str, count: int) -> Any:
    async def check() -> bool:
        return sample(metrics, "vllm_operator_router_endpoints", pool=pool, state="healthy") == count
    return check


async def ask(http: aiohttp.ClientSession, url: str, n_words: int) -> tuple[int, str]:
    async with http.post(url + CHAT, json={"model": MODEL, "messages": [
            {"role": "user", "content": words(n_words) if n_words > 1 else "hi"}]}) as response:
        await response.read()
        return response.status, response.headers.get("x-vllm-operator-pool", "")


async def test_router_follows_endpoint_slices(fleet: Fleet, router_kubeconfig: str, counter: TokenCounter,
                                              http: aiohttp.ClientSession) -> None:
    config = router_config(**services(fleet, "short", "long"))
    async with running_router(config, counter, kubeconfig=router_kubeconfig) as (url, metrics):
        async with http.get(url + "/health") as response:
            assert response.status == 503, "no pods yet: nothing to route to"
        short_a = await fleet.add("short-a", fleet.short)
        long_a = await fleet.add("long-a", fleet.long, max_model_len=1000)
        other = await fleet.add("unrelated", fleet.other)  # a pod of another Service must be ignored
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)
        await eventually(healthy(metrics, "long", 1), timeout=SLICES_SYNC_S)
        async with http.get(url + "/health") as response:
            assert response.status == 200

        for n_words in (5, 80):
            assert (await ask(http, url, n_words))[0] == 200
        assert len(short_a.requests()) == 1 and len(long_a.requests()) == 1

        # A second ready endpoint joins; one whose pod is not ready is not used.
        short_b = await fleet.add("short-b", fleet.short)
        await eventually(healthy(metrics, "short", 2), timeout=SLICES_SYNC_S)
        await report(fleet.admin, fleet.namespace, "short-a", ContainerReport(ready=False))
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)
        short_a.clear_requests()
        for _ in range(3):
            assert (await ask(http, url, 1))[0] == 200
        assert short_a.requests() == [] and len(short_b.requests()) == 3
        assert other.requests() == []

        # All short pods gone: short requests fall back to the long pool.
        for pod in ("short-a", "short-b"):
            await fleet.delete(pod)

        async def none_left() -> bool:
            return (sample(metrics, "vllm_operator_router_endpoints", pool="short", state="healthy") == 0
                    and sample(metrics, "vllm_operator_router_endpoints", pool="short", state="ejected") == 0)

        await eventually(none_left, timeout=SLICES_SYNC_S)
        assert await ask(http, url, 1) == (200, "long")
    assert sample(metrics, "vllm_operator_router_discovery_synced", pool="short") == 1


async def test_slices_existing_before_start_are_listed(fleet: Fleet, router_kubeconfig: str,
                                                       counter: TokenCounter, long_engine: FakeVllm) -> None:
    """Pods (and so slices) that exist before the router starts are picked up by the initial list."""
    await fleet.add("pre-short", fleet.short)
    await eventually(lambda: fleet.ready_endpoints(fleet.short), timeout=SLICES_SYNC_S)
    config = router_config([], [long_engine.url], **services(fleet, "short"))
    async with running_router(config, counter, kubeconfig=router_kubeconfig) as (_, metrics):
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)


@pytest.fixture
def proxy(setup: Setup, inside: None, tmp_path: Path) -> Iterator[ApiProxy]:
    """The fault proxy, started inside the namespace (its 127.0.0.1 is the namespace's, where the router is)."""
    with ApiProxy(setup.kube, tmp_path / "proxy") as running:
        yield running


async def test_discovery_recovers_from_api_errors(fleet: Fleet, proxy: ApiProxy, counter: TokenCounter,
                                                  long_engine: FakeVllm, tmp_path: Path) -> None:
    """The first two lists and the first watch answer 500: the router retries, relists, and still follows."""
    await fleet.add("s1", fleet.short)
    await eventually(lambda: fleet.ready_endpoints(fleet.short), timeout=SLICES_SYNC_S)
    proxy.fail("endpointslices", lists=2, watches=1)
    kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", fleet.setup.token, fleet.namespace)
    config = router_config([], [long_engine.url], **services(fleet, "short"))
    async with running_router(config, counter, kubeconfig=str(kubeconfig)) as (_, metrics):
        await eventually(healthy(metrics, "short", 1), timeout=20)
        # The watch failed once too; after the relist the router still follows changes.
        await eventually(lambda: asyncio.sleep(0, proxy.failures_left("endpointslices") == {"list": 0, "watch": 0}),
                         timeout=20)
        await fleet.delete("s1")
        await eventually(healthy(metrics, "short", 0), timeout=SLICES_SYNC_S)
    assert [(verb, status) for verb, _, status in proxy.failed] == [("list", 500), ("list", 500), ("watch", 500)]


async def test_an_expired_watch_is_resumed_by_a_relist(fleet: Fleet, proxy: ApiProxy, counter: TokenCounter,
                                                       long_engine: FakeVllm, tmp_path: Path) -> None:
    """The watch goes quiet (connected, hearing nothing) while a pod joins, then ends with 410 Gone: the router
    lists again and finds the pod it never heard of."""
    await fleet.add("first", fleet.short)
    kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", fleet.setup.token, fleet.namespace)
    config = router_config([], [long_engine.url], **services(fleet, "short"))
    async with running_router(config, counter, kubeconfig=str(kubeconfig)) as (_, metrics):
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)
        proxy.hold("endpointslices")
        await eventually(lambda: asyncio.sleep(0, proxy.held_watches("endpointslices") == 1), timeout=20)
        await fleet.add("second", fleet.short)
        await eventually(lambda: _at_least(fleet.ready_endpoints(fleet.short), 2), timeout=SLICES_SYNC_S)
        await asyncio.sleep(2)  # the slice changed two seconds ago; a held watch cannot have told the router
        assert sample(metrics, "vllm_operator_router_endpoints", pool="short", state="healthy") == 1
        index = len(proxy.requests)
        proxy.expire("endpointslices")
        await eventually(healthy(metrics, "short", 2), timeout=20)
        assert proxy.gone_sent == 1
        assert list(proxy.lists_after(index, "endpointslices")), "the router found the pod by listing again"


async def _at_least(count: Any, wanted: int) -> bool:
    return bool(await count >= wanted)


async def test_the_api_server_going_away_and_coming_back(fleet: Fleet, proxy: ApiProxy, counter: TokenCounter,
                                                          long_engine: FakeVllm, http: aiohttp.ClientSession,
                                                          tmp_path: Path) -> None:
    """While the API server is unreachable the router keeps routing to the endpoints it knows; once it is back,
    the router catches up with what changed meanwhile (one pod gone, another joined)."""
    before = await fleet.add("before", fleet.short)
    kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", fleet.setup.token, fleet.namespace)
    config = router_config([], [long_engine.url], **services(fleet, "short"))
    async with running_router(config, counter, kubeconfig=str(kubeconfig)) as (url, metrics):
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)
        proxy.go_away()
        after = await fleet.add("after", fleet.short)
        await fleet.admin.delete(PODS, fleet.namespace, "before")  # its engine keeps running: only the slice says
        await eventually(lambda: only(fleet, fleet.short, after.host), timeout=SLICES_SYNC_S)
        await eventually(lambda: asyncio.sleep(0, proxy.dropped >= 2), timeout=20)  # the router kept trying
        assert sample(metrics, "vllm_operator_router_endpoints", pool="short", state="healthy") == 1
        assert await ask(http, url, 1) == (200, "short")
        assert len(before.requests()) == 1, "the endpoint the router knows still serves while the API server is away"
        proxy.come_back()

        async def caught_up() -> bool:
            after.clear_requests()
            return await ask(http, url, 1) == (200, "short") and len(after.requests()) == 1

        await eventually(caught_up, timeout=20, interval=0.5)
        before.clear_requests()
        for _ in range(3):
            assert await ask(http, url, 1) == (200, "short")
        assert before.requests() == [] and len(after.requests()) == 4


async def only(fleet: Fleet, service: str, address: str) -> bool:
    """The Service's slices hold exactly one endpoint, ready, at `address`."""
    slices = await fleet.admin.list(ENDPOINT_SLICES, fleet.namespace, f"kubernetes.io/service-name={service}")
    endpoints = [e for s in slices for e in s.get("endpoints") or []]
    return len(endpoints) == 1 and endpoints[0]["addresses"] == [address] and \
        (endpoints[0].get("conditions") or {}).get("ready") is not False


async def test_large_slices_are_read_from_the_watch(fleet: Fleet, router_kubeconfig: str, counter: TokenCounter,
                                                    long_engine: FakeVllm) -> None:
    """A watch event is one JSON line; a full slice (1000 endpoints, ~250 KB) must not break the stream. The
    endpointslice controller cuts slices at 100 endpoints, so this one is written by the test as another endpoint
    controller would (its own managed-by label; the API server validates it like any slice)."""
    engine_pod = await fleet.add("big-0", fleet.other)  # an engine at a pod address; its own Service is not watched
    config = router_config([], [long_engine.url], **services(fleet, "short"))
    async with running_router(config, counter, kubeconfig=router_kubeconfig) as (_, metrics):
        await eventually(lambda: asyncio.sleep(0, sample(metrics, "vllm_operator_router_discovery_synced",
                                                         pool="short") == 1), timeout=SLICES_SYNC_S)
        big: dict[str, Any] = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": f"{fleet.short}-big",
                            "labels": {"kubernetes.io/service-name": fleet.short,
                                       "endpointslice.kubernetes.io/managed-by": "tests.vllm-operator.dev"}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": PORT, "protocol": "TCP"}],
               "endpoints": [{"addresses": [engine_pod.host], "conditions": {"ready": True}}]}
        big["endpoints"] += [
            {"addresses": [f"10.{i // 250}.{i % 250}.1"], "conditions": {"ready": False},
             "targetRef": {"kind": "Pod", "namespace": fleet.namespace, "name": f"demo-short-{'x' * 120}-{i}"}}
            for i in range(999)]
        await fleet.admin.create(ENDPOINT_SLICES, fleet.namespace, copy.deepcopy(big))
        await eventually(healthy(metrics, "short", 1), timeout=SLICES_SYNC_S)
        await fleet.admin.delete(ENDPOINT_SLICES, fleet.namespace, f"{fleet.short}-big")
