"""Engine endpoints per pool: who is healthy, who gets the next request, and how the set is kept current.

Why least-outstanding-requests: engine requests vary from milliseconds to minutes, so round robin piles new work
onto an engine that is still busy with long generations; the number of requests the router has in flight to each
endpoint is known exactly and costs nothing to track. A pool whose strategy is `prefix` chooses with its
`PrefixBalancer` instead (prefix.py): the replica likely to hold the prompt's prefix, within load bounds over the
same in-flight counts and over its recent share of the pool's requests.

Health is both passive and active (docs/architecture.md, Endpoint discovery): a connect error or a 5xx answer ejects an
endpoint at once, and a poller GETs `/health` on every endpoint each `health.intervalSeconds` — a 200 re-admits an
ejected one, anything else ejects a healthy one. New endpoints start healthy: with discovery they come from
EndpointSlices, which list only pods that passed their readiness probe; static ones are polled right away.

Discovery (`SliceWatcher`) lists and watches the pool Service's EndpointSlices (`kubernetes.io/service-name=<svc>`)
with the operator's own asyncio client (`k8s.ClientKubeApi`, on kubernetes_asyncio, and `k8s.list_watch`: watches
resume from bookmarks, 410 lists again): in-cluster service account, else kubeconfig; the token is re-read when the
kubelet rotates it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

import aiohttp
import yarl

from vllm_operator.api.router_config import ServiceRef
from vllm_operator.k8s import ENDPOINT_SLICES, KubeApi, list_watch
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.prefix import PrefixBalancer
from vllm_operator.router.tokens import Prompt

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
CAUSE_CONNECT: Final = "connect"
CAUSE_5XX: Final = "status_5xx"
CAUSE_HEALTH: Final = "health_check"
THREAD_NAME_CHARS: Final = 4096
"""Prefix naming that must tokenize more than this many characters runs in a worker thread, as counting does from
the same length on (router/proxy.py: THREAD_COUNT_CHARS; at 32 KiB a new 30,000-character text held the loop for
tens of milliseconds, benchmarks/router/loop_stall.py)."""
_claims = itertools.count(1)


@dataclasses.dataclass(slots=True, eq=False)
class Endpoint:
    url: str
    pool: str
    healthy: bool = True
    outstanding: int = 0
    ejected_at: float | None = None
    ejection_cause: str | None = None
    claim: int = dataclasses.field(default_factory=lambda: next(_claims))
    """Who this endpoint is to the prefix index; renewed on re-admission, whose engine may have lost its cache."""
    host: str = dataclasses.field(init=False)
    port: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        parsed = yarl.URL(self.url)
        if parsed.scheme != "http" or not parsed.host:
            raise ValueError(f"engine endpoint {self.url!r} must be http://host:port")
        self.host = parsed.host
        self.port = parsed.port or 80


class Pool:
    """The endpoints of one pool and the choice between them."""

    def __init__(self, name: str, metrics: RouterMetrics, balancer: PrefixBalancer | None = None) -> None:
        self.name = name
        self.metrics = metrics
        self.endpoints: dict[str, Endpoint] = {}
        self.balancer = balancer
        self._turn = 0
        self.synced = False
        self._awake = asyncio.Event()
        """Set while the pool has a healthy endpoint: held requests wait on it."""

    def set_endpoints(self, urls: Iterable[str]) -> None:
        """Replace the set of endpoints, keeping the state (health, in-flight counts) of those that stay."""
        wanted = list(dict.fromkeys(urls))
        old = self.endpoints
        self.endpoints = {url: old.get(url) or Endpoint(url, self.name) for url in wanted}
        added = [u for u in wanted if u not in old]
        removed = [u for u in old if u not in self.endpoints]
        if added or removed:
            log.info("Updated pool %s endpoints: added %s, removed %s", self.name, added, removed)
        self.synced = True
        self.metrics.endpoints_discovered.labels(self.name).set(1)
        self._publish()

    def _publish(self) -> None:
        healthy = sum(1 for e in self.endpoints.values() if e.healthy)
        self.metrics.endpoints.labels(self.name, "healthy").set(healthy)
        self.metrics.endpoints.labels(self.name, "ejected").set(len(self.endpoints) - healthy)
        if healthy:
            self._awake.set()
        else:
            self._awake.clear()

    async def wait_healthy(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a healthy endpoint (a pool waking from zero); True when there is one."""
        if self.healthy_count:
            return True
        # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation (the client went away) that arrives
        # as the pool wakes, and the request would be sent on for nobody.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._awake.wait()
        return self.healthy_count > 0

    @property
    def healthy_count(self) -> int:
        return sum(1 for e in self.endpoints.values() if e.healthy)

    async def route_key(self, prompt: Prompt) -> list[int] | None:
        """What `pick` needs of the prompt: its prefix chain for a prefix pool, None otherwise. Naming that has to
        tokenize long new texts runs in a worker thread, so one long document does not stall the event loop."""
        balancer = self.balancer
        if balancer is None:
            return None
        missing = balancer.missing(prompt) if balancer.tokenizer is not None else {}
        if sum(map(len, missing.values())) > THREAD_NAME_CHARS:
            named = await asyncio.to_thread(balancer.name_texts, list(missing.values()))
            return balancer.chain(prompt, dict(zip(missing, named, strict=True)))
        return balancer.chain(prompt)

    def pick(self, exclude: Iterable[Endpoint] = (), key: list[int] | None = None) -> Endpoint | None:
        """The healthy endpoint for a request, or None: with a prefix `key` (from `route_key`) the balancer's
        choice, else the one with the fewest requests in flight (rotating among ties)."""
        best: Endpoint | None = None
        candidates = [e for e in self.endpoints.values() if e.healthy and e not in exclude]
        if not candidates:
            return None
        n = len(candidates)
        start = self._turn % n
        self._turn += 1
        if key is not None and self.balancer is not None:
            rotated = candidates[start:] + candidates[:start]
            chosen, outcome, credit = self.balancer.choose(rotated, key)
            assert isinstance(chosen, Endpoint)
            self.balancer.record(chosen.claim, key[:credit], {e.claim for e in self.endpoints.values()})
            self.metrics.child(self.metrics.prefix_choices, self.name, outcome).inc()
            self.metrics.child(self.metrics.prefix_index_blocks, self.name).set(self.balancer.index_size)
            return chosen
        for i in range(n):
            e = candidates[(start + i) % n]
            if best is None or e.outstanding < best.outstanding:
                best = e
        return best

    def eject(self, endpoint: Endpoint, cause: str) -> None:
        if not endpoint.healthy:
            return
        endpoint.healthy = False
        endpoint.ejected_at = time.monotonic()
        endpoint.ejection_cause = cause
        self.metrics.ejections.labels(self.name, cause).inc()
        log.warning("Ejected endpoint %s of pool %s (%s)", endpoint.url, self.name, cause)
        self._publish()

    def readmit(self, endpoint: Endpoint) -> None:
        if endpoint.healthy:
            return
        endpoint.healthy = True
        endpoint.ejected_at = None
        endpoint.ejection_cause = None
        endpoint.claim = next(_claims)
        self.metrics.readmissions.labels(self.name).inc()
        log.info("Re-admitted endpoint %s of pool %s after a healthy /health", endpoint.url, self.name)
        self._publish()


class HealthChecker:
    """Polls GET /health on every endpoint of the given pools."""

    def __init__(self, pools: Iterable[Pool], session: aiohttp.ClientSession, *, interval: float,
                 timeout: float) -> None:
        self.pools = list(pools)
        self.session = session
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)

    async def check(self, pool: Pool, endpoint: Endpoint) -> None:
        try:
            async with self.session.get(endpoint.url + "/health", timeout=self.timeout) as response:
                await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            ok = False
        pool.metrics.health_checks.labels(pool.name, "ok" if ok else "failed").inc()
        if endpoint.url not in pool.endpoints:  # removed while we asked
            return
        if ok:
            pool.readmit(endpoint)
        else:
            pool.eject(endpoint, CAUSE_HEALTH)

    async def poll_once(self) -> None:
        checks = [self.check(p, e) for p in self.pools for e in list(p.endpoints.values())]
        if checks:
            await asyncio.gather(*checks)

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval)


# ----------------------------------------------------------------------------------------- EndpointSlice discovery


def slice_urls(slices: Iterable[Mapping[str, Any]], default_port: int) -> list[str]:
    """Base URLs of the ready endpoints in EndpointSlices (ready unset counts as ready, as the API defines)."""
    urls: list[str] = []
    for item in slices:
        if item.get("addressType", "IPv4") not in {"IPv4", "IPv6", "FQDN"}:
            continue
        port = default_port
        ports = item.get("ports") or []
        if ports:
            named = [p for p in ports if p.get("name") == "http"] or ports
            port = int(named[0].get("port") or default_port)
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready") is False or conditions.get("terminating") is True:
                continue
            for address in (endpoint.get("addresses") or [])[:1]:
                host = f"[{address}]" if ":" in address else address
                urls.append(f"http://{host}:{port}")
    return sorted(set(urls))


class SliceWatcher:
    """Keeps a Pool's endpoints equal to the ready endpoints of its Service's EndpointSlices (list, then watch)."""

    def __init__(self, pool: Pool, service: ServiceRef, kube: KubeApi, *, retry_seconds: float = 1.0) -> None:
        self.pool = pool
        self.service = service
        self.kube = kube
        self.retry_seconds = retry_seconds
        self.selector = f"{SERVICE_NAME_LABEL}={service.name}"

    async def run(self) -> None:
        while True:
            try:
                async for slices in list_watch(self.kube, ENDPOINT_SLICES, self.service.namespace,
                                               label_selector=self.selector):
                    self.pool.set_endpoints(slice_urls(slices.values(), self.service.port))
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("Lost the EndpointSlice watch for Service %s/%s (%s); listing again in %.1fs",
                            self.service.namespace, self.service.name, err, self.retry_seconds)
                await asyncio.sleep(self.retry_seconds)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
