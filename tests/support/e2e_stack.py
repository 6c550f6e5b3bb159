"""The whole system on one machine for the end-to-end tier: simulated cluster + process-backed node + real vLLM
engines + real router + real Prometheus + the operator with its health loop, from `examples/cpu-dev.yaml`.

Why a thread: the cluster's controllers, the process runtime's probes and the operator must keep running while a
test blocks (the official `openai` client is synchronous, fault timings are measured with sleeps), so the cluster
lives in its own event loop on a background thread and tests reach it through `Stack.run(coro)`. Everything is
started once per test module (two engines cost ~1 min and ~5 GiB of a 2-core machine).

Pods run under `processnode.processes.ProcessRuntime`: the PVC `models` is the directory holding the tiny model made by
`scripts/make_model.py --shape tiny`, and the ConfigMap `tiny-llama-tokenizer` (named by cpu-dev.yaml) is created
from that model's tokenizer files, as an admin would with `kubectl create configmap --from-file`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import openai
import yaml

from processnode.processes import CONFIG_MAPS, Container, ProcessRuntime, descendants
from tests.support.operator import running_operator
from tests.support.paths import EXAMPLES
from tests.support.prometheus import Prometheus, running_prometheus
from vllm_operator import constants, names
from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_spec
from vllm_operator.k8s import EVENTS, PODS, VLLM_DEPLOYMENTS, ClientKubeApi, Resource
from vllm_operator.planning import RemediationState, plan
from vllm_operator.sim.cluster import SimCluster, cpu_node

T = TypeVar("T")
ENGINE_CORE_TITLE = b"VLLM::EngineCore"
"""The process title vLLM gives its engine-core child (/proc/PID/cmdline starts with it)."""
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
EXAMPLE = yaml.safe_load((EXAMPLES / "cpu-dev.yaml").read_text())
NS, NAME = EXAMPLE["metadata"]["namespace"], EXAMPLE["metadata"]["name"]
TOKENIZER_CONFIGMAP = EXAMPLE["spec"]["model"]["tokenizer"]["configMap"]["name"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ACCESS_LINE = re.compile(r'"GET /(health|metrics|status|startup) HTTP/1\.1" 200')
"""Probe and scrape lines of a pod's access log, left out of a failure's log tails."""
READY_TIMEOUT_S = 420.0
"""Two engines starting together on a busy 2-core machine: 50-100 s measured, up to ~4 min seen under load."""


def cond(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return dict(next((c for c in (obj or {}).get("status", {}).get("conditions", []) or []
                      if c.get("type") == type_), {}))


class Stack:
    """A running system; all API reads/writes go through `run` (the cluster's loop)."""

    def __init__(self, root: Path, model_dir: Path, prom: Prometheus, example: dict[str, Any] | None = None) -> None:
        self.example = example if example is not None else EXAMPLE
        self.root = root
        self.model_dir = model_dir
        self.prom = prom
        self.runtime = ProcessRuntime(root / "pods", pvcs={"models": model_dir.parent},
                                      targets_file=prom.targets_file)
        self.loop = asyncio.new_event_loop()
        self.cluster: SimCluster | None = None
        self.kube: ClientKubeApi | None = None
        self._thread = threading.Thread(target=self._main, name="e2e-cluster", daemon=True)
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._ready.result(timeout=120)

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=120)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with SimCluster(nodes=[cpu_node("cpu-0", cpu="2", memory="24Gi")],
                                  runtimes={"cpu-0": self.runtime}) as cluster:
                self.cluster = cluster
                assert cluster.client is not None
                self.runtime.connect(_SimPodApi(cluster.client), cluster.kubeconfig)
                await cluster.client.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": NS}})
                await cluster.client.create(CONFIG_MAPS, NS, {
                    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": TOKENIZER_CONFIGMAP, "namespace": NS},
                    "data": {f: (self.model_dir / f).read_text() for f in TOKENIZER_FILES}})
                try:
                    async with running_operator(cluster, health_enabled=True, prometheus_url=self.prom.url) as kube:
                        self.kube = kube
                        await kube.create(VLLM_DEPLOYMENTS, NS, copy.deepcopy(self.example))
                        self._ready.set_result(None)
                        await self._stop.wait()
                finally:
                    await self.runtime.close()
        except BaseException as err:
            if not self._ready.done():
                self._ready.set_exception(err)
            raise

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

    def pods(self, pool: str | None = None, component: str = constants.COMPONENT_ENGINE) -> list[dict[str, Any]]:
        selector = f"{constants.LABEL_DEPLOYMENT}={NAME},{constants.LABEL_COMPONENT}={component}"
        if pool is not None:
            selector += f",{constants.LABEL_POOL}={pool}"
        pods = self.call(lambda k: k.list(PODS, NS, selector))
        return sorted((p for p in pods if not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: p["metadata"]["name"])

    def events(self) -> list[dict[str, Any]]:
        return self.call(lambda k: k.list(EVENTS, NS))

    def container(self, pod: str) -> Container:
        return self.runtime.container(NS, pod)

    def engine(self, pool: str) -> Container:
        """The (single) engine pod's container of a pool."""
        pods = self.pods(pool)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return self.container(pods[0]["metadata"]["name"])

    def router_url(self) -> str:
        pods = self.pods(component=constants.COMPONENT_ROUTER)
        assert len(pods) == 1
        return f"http://{pods[0]['status']['podIP']}:{constants.ROUTER_PORT}"

    def ready(self) -> bool:
        """VLLMDeployment Ready, every engine and router pod Ready, the router serving."""
        if cond(self.obj(), constants.COND_READY).get("status") != "True":
            return False
        pods = self.pods("short") + self.pods("long") + self.pods(component=constants.COMPONENT_ROUTER)
        if len(pods) != 3 or not all(cond(p, "Ready").get("status") == "True" for p in pods):
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
        self.wait(self.ready, timeout, interval=1.0, what="both pools and the router Ready")

    def diagnostics(self) -> str:
        """What a failed wait shows: the VLLMDeployment's status and recent events (the operator's decisions), then
        each pod's log tail without the probe and scrape access lines that would fill it."""
        parts = []
        with contextlib.suppress(Exception):
            status = self.obj().get("status", {})
            parts.append(f"\n--- {NAME} status.conditions: {status.get('conditions')}\n"
                         f"--- {NAME} status.pools: {status.get('pools')}")
        with contextlib.suppress(Exception):
            events = sorted(self.events(), key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
            parts.append("\n--- events (newest 15):\n" + "\n".join(
                f"{e.get('lastTimestamp') or e.get('eventTime')} {e.get('reason')}: {e.get('message')}"
                for e in events[-15:]))
        for c in list(self.runtime.containers.values()):
            lines = [ln for ln in c.log_tail(20000).splitlines() if not ACCESS_LINE.search(ln)]
            parts.append(f"\n--- {c.pod} ({c.ip}, restarts {c.restart_count}, last {c.last_terminated}) log tail:\n"
                         + "\n".join(lines[-25:]))
        return "".join(parts)


class _SimPodApi:
    """The process runtime's reads on the emulator (its pods carry no projected ServiceAccount tokens)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = await self.client.get(res, namespace, name)
        return found

    async def token(self, namespace: str, service_account: str, pod: str, uid: str, expiration_s: int) -> str:
        raise LookupError(f"the emulator issues no token for {namespace}/{service_account} (pod {pod})")


def http_status(url: str, timeout: float = 3.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, TimeoutError):
        return None


@contextlib.contextmanager
def running_stack(root: Path, model_dir: Path, example: dict[str, Any] | None = None) -> Iterator[Stack]:
    """Prometheus + the stack, cpu-dev.yaml (or `example`, a variant of it) applied and Ready (or a failure with
    every pod's log tail)."""
    with running_prometheus() as prom:
        stack = Stack(root, model_dir, prom, example)
        stack.start()
        try:
            stack.wait_ready()
            yield stack
        finally:
            stack.stop()
            assert stack.runtime.errors == [], f"the process runtime failed: {stack.runtime.errors!r}"


def pool_service(pool: str) -> str:
    return names.pool(NAME, pool)


def the_plan() -> Plan:
    """What the operator plans for cpu-dev.yaml with no remediation applied."""
    return plan(parse_spec(EXAMPLE["spec"]), None, RemediationState(pools={}), name=NAME, namespace=NS)


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


def model_name() -> str:
    return str(the_plan().router.model)


def engine_core_pid(stack: Stack, pool: str) -> int:
    container = stack.engine(pool)
    assert container.proc is not None
    for pid in descendants(container.proc.pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(ENGINE_CORE_TITLE):
                return pid
        except OSError:
            continue
    raise LookupError(f"no {ENGINE_CORE_TITLE.decode()} below the wrapper of {container.pod}")


@dataclass(frozen=True)
class Answer:
    """One request of `Traffic`: when it was sent and answered (monotonic), its status (0: no answer) and pool."""

    sent: float
    answered: float
    status: int
    pool: str


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
