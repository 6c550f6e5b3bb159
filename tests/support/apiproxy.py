"""A TLS-terminating proxy in front of the real kube-apiserver, for faults a healthy API server never makes on cue.

The operator under test gets a kubeconfig pointing here (its own CA, a serving certificate for the loopback
address; the ServiceAccount's bearer token is passed through untouched, so the API server still authenticates and
authorises the operator itself). Requests are relayed as they are; watch streams line by line, so a fault can be
put between two events:

- `hold(plural)`: open watches of that resource end (as a dropped connection would); new ones are answered 200 and
  then kept silent — a watch that is connected but hears nothing, while the test changes objects behind it;
- `expire(plural)`: every held watch of it gets the API server's `ERROR` event with code 410 (Gone: "too old
  resource version") and ends, and the hold is lifted: a client must list again to continue;
- `fail(plural, lists=, watches=, status=)`: the next lists and watches of that resource are answered `status`
  (a Status body, as the API server writes one) instead of being relayed;
- `go_away()` / `come_back()`: the API server is unreachable in between: open watches are cut (their connections
  dropped mid-stream) and every new connection is closed before an answer, as a crashed server's address does;
- `faults`: a hook `(ProxiedRequest) -> Fault | None` asked for every request that is not a watch: a `Fault` answers
  it with an API error status (409 Conflict, 500, 503, ... as a `Status` object like the API server's), holds it for
  `delay` seconds (past the client's timeout: a hung server), or drops the connection without an answer — before
  the request reaches the API server, or `after_commit` (the write happened, the client hears an error or nothing).

`requests` records (method, path, is_watch) for every request, so a test can show a relist came after the 410;
`injected` the (request, fault) pairs the hook chose. It listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from testcluster import pki
from testcluster.cluster import Cluster, write_kubeconfig

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length"}
GONE = json.dumps({"type": "ERROR", "object": {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "too old resource version (injected by the test proxy)", "reason": "Expired", "code": 410}}) + "\n"


REASONS = {409: ("Conflict", "the object has been modified; please apply your changes to the latest version and try "
                             "again (injected by the test proxy)"),
           429: ("TooManyRequests", "too many requests (injected by the test proxy)"),
           500: ("InternalError", "an error on the server (injected by the test proxy)"),
           503: ("ServiceUnavailable", "the server is currently unable to handle the request (injected by the test "
                                       "proxy)")}
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ProxiedRequest:
    """What a fault hook sees of a request: method, path (no query), query, the client's User-Agent."""

    method: str
    path: str
    query: dict[str, str]
    user_agent: str

    @property
    def plural(self) -> str:
        """The resource (subresources named as the API server's request info would not be: `deployments`,
        `status`): the path's resource segment after namespaces/<ns>/ or the group version."""
        parts = self.path.strip("/").split("/")
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        return rest[0] if rest else ""

    @property
    def subresource(self) -> str:
        parts = self.path.strip("/").split("/")
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        return rest[2] if len(rest) > 2 else ""

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


@dataclass(frozen=True)
class Fault:
    """What the proxy does to one request: wait `delay` seconds, then answer `status` or, with `drop`, close the
    connection without answering (neither: relay it). With `after_commit`, the request is relayed first (the write
    happens) and the delay and the answer come after, as when a response is lost on the way back. Without it, a
    client that gave up during the delay leaves the request unrelayed (a hung server)."""

    status: int | None = None
    delay: float = 0.0
    drop: bool = False
    after_commit: bool = False

    def describe(self) -> str:
        parts = [f"delay={self.delay:g}s"] if self.delay else []
        parts += [f"status={self.status}"] if self.status else []
        parts += ["drop"] if self.drop else []
        parts += ["after-commit"] if self.after_commit else []
        return ",".join(parts) or "relay"


FaultHook = Callable[[ProxiedRequest], "Fault | None"]


def status_body(code: int) -> bytes:
    reason, message = REASONS.get(code, ("InternalError" if code >= 500 else "BadRequest",
                                         f"injected by the test proxy ({code})"))
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


@dataclass
class _Watch:
    plural: str
    held: bool = False
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False
    cut: bool = False
    """End by dropping the connection (no final chunk), as when the server goes away."""


def _plural(path: str) -> str:
    """The resource of a collection path: /apis/g/v/namespaces/ns/PLURAL or /api/v1/PLURAL."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def _drop(request: web.Request) -> None:
    """Close the client's connection at once, with no end to the chunked body: the stream breaks off."""
    if request.transport is not None:
        request.transport.abort()


class ApiProxy:
    """Start with `with ApiProxy(kube, workdir) as proxy:`; `proxy.kubeconfig(...)` for the client under test."""

    def __init__(self, kube: Cluster, workdir: Path, faults: FaultHook | None = None) -> None:
        self.kube = kube
        self.faults = faults
        self.injected: list[tuple[ProxiedRequest, Fault]] = []
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        authority = pki.Authority(workdir, "proxy-ca")
        self.ca = authority.pair.cert
        self._serving = authority.issue("proxy", "apiproxy", server=True, ips=("127.0.0.1",))
        self.port = 0
        self.requests: list[tuple[str, str, bool]] = []
        self.gone_sent = 0
        self.failed: list[tuple[str, str, int]] = []
        """(verb, path, status) of every request answered by `fail` instead of the API server."""
        self._fail: dict[tuple[str, str], tuple[int, int]] = {}  # (plural, "list"|"watch") -> (left, status)
        self._away = False
        self.dropped = 0
        """Connections dropped unanswered while the API server was away."""
        self._held: set[str] = set()
        self._watches: list[_Watch] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="apiproxy", daemon=True)
        self._error: BaseException | None = None

    # --- control, from the test's thread -------------------------------------------------------------------

    def __enter__(self) -> ApiProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the API proxy did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(30)

    def kubeconfig(self, path: Path, token: str, namespace: str) -> Path:
        write_kubeconfig(path, f"https://127.0.0.1:{self.port}", self.ca, user="proxied", token=token,
                         namespace=namespace)
        return path

    def hold(self, plural: str) -> None:
        self._call(self._hold, plural)

    def expire(self, plural: str) -> None:
        self._call(self._expire, plural)

    def fail(self, plural: str, *, lists: int = 0, watches: int = 0, status: int = 500) -> None:
        self._call(self._set_fail, plural, lists, watches, status)

    def failures_left(self, plural: str) -> dict[str, int]:
        return {verb: self._fail.get((plural, verb), (0, 0))[0] for verb in ("list", "watch")}

    def go_away(self) -> None:
        self._call(self._go_away)

    def come_back(self) -> None:
        self._call(self._come_back)

    def held_watches(self, plural: str) -> int:
        return sum(1 for w in list(self._watches) if w.plural == plural and w.held and not w.stop.is_set())

    def _call(self, fn: object, *args: object) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(fn(*args), self._loop).result(10)  # type: ignore[operator]

    async def _hold(self, plural: str) -> None:
        self._held.add(plural)
        for watch in self._watches:
            if watch.plural == plural:
                watch.stop.set()

    async def _set_fail(self, plural: str, lists: int, watches: int, status: int) -> None:
        self._fail[(plural, "list")] = (lists, status)
        self._fail[(plural, "watch")] = (watches, status)

    async def _go_away(self) -> None:
        self._away = True
        for watch in self._watches:
            watch.cut = True
            watch.stop.set()

    async def _come_back(self) -> None:
        self._away = False

    async def _expire(self, plural: str) -> None:
        self._held.discard(plural)
        for watch in self._watches:
            if watch.plural == plural:
                watch.gone = True
                watch.stop.set()

    # --- the proxy, on its own loop --------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as err:  # reported by __enter__
            self._error = err
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        upstream = ssl.create_default_context(cafile=str(self.kube.ca_file))
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(str(self._serving.cert), str(self._serving.key))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream), timeout=timeout,
                                         auto_decompress=False) as session:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            async def handle(request: web.Request) -> web.StreamResponse:
                return await self._handle(session, request)

            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
            await web.SockSite(runner, sock, ssl_context=serving).start()
            self._ready.set()
            await self._stopping.wait()
            for watch in self._watches:
                watch.stop.set()
            await runner.cleanup()

    async def _handle(self, session: aiohttp.ClientSession, request: web.Request) -> web.StreamResponse:
        if self._away:
            self.dropped += 1
            _drop(request)  # the connection drops before any answer; aiohttp discards this one
            return web.Response(status=503)
        is_watch = request.query.get("watch") in {"true", "1"}
        self.requests.append((request.method, request.path, is_watch))
        plural = _plural(request.path)
        left, status = self._fail.get((plural, "watch" if is_watch else "list"), (0, 0))
        if left > 0 and request.method == "GET":
            self._fail[(plural, "watch" if is_watch else "list")] = (left - 1, status)
            self.failed.append(("watch" if is_watch else "list", request.path, status))
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                      "message": "injected by the test proxy", "reason": "InternalError",
                                      "code": status}, status=status)
        if is_watch and plural in self._held:
            return await self._held_watch(request, plural)
        fault = None
        if not is_watch and self.faults is not None:
            proxied = ProxiedRequest(request.method, request.path, dict(request.query),
                                     request.headers.get("User-Agent", ""))
            fault = self.faults(proxied)
            if fault is not None:
                self.injected.append((proxied, fault))
        if fault is not None and not fault.after_commit:
            await asyncio.sleep(fault.delay)
            if fault.drop or request.transport is None or request.transport.is_closing():
                _drop(request)  # dropped, or the client gave up while the server hung
                return web.Response(status=503)  # never reaches the client: its connection is gone
            if fault.status:
                return web.Response(status=fault.status, body=status_body(fault.status),
                                    content_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        # Bodies pass through as they are (gzip included: the proxy does not decompress); watch streams are read
        # line by line, so they are asked for uncompressed.
        headers["Accept-Encoding"] = "identity" if is_watch else request.headers.get("Accept-Encoding", "identity")
        body = await request.read()
        url = f"{self.kube.server}{request.path_qs}"
        try:
            upstream = await session.request(request.method, url, headers=headers, data=body or None)
        except aiohttp.ClientError as err:
            return web.Response(status=503, text=f"apiproxy: upstream unreachable: {err}")
        async with upstream:
            if fault is not None and fault.after_commit:
                await upstream.read()  # the write is done; the answer is what goes missing
                await asyncio.sleep(fault.delay)
                if fault.drop or request.transport is None or request.transport.is_closing():
                    _drop(request)
                    return web.Response(status=503)
                if fault.status:
                    return web.Response(status=fault.status, body=status_body(fault.status),
                                        content_type="application/json")
                return web.Response(status=upstream.status, body=await upstream.read(), headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            try:
                await response.prepare(request)
                if is_watch and upstream.status == 200:
                    if await self._relay_watch(upstream, response, plural):
                        _drop(request)
                        return response
                else:
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                await response.write_eof()
            except ConnectionResetError:
                pass  # the client went away (an operator stopping, a watch it closed)
            return response

    async def _relay_watch(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse, plural: str
                           ) -> bool:
        """Relay the watch until it ends or is stopped; True when it was cut (the connection is to be dropped)."""
        watch = _Watch(plural)
        self._watches.append(watch)
        # A hold or an outage that began while this watch was on its way to the API server applies to it too.
        if self._away:
            watch.cut = True
            watch.stop.set()
        elif plural in self._held:
            watch.stop.set()
        stop = asyncio.ensure_future(watch.stop.wait())
        try:
            while True:
                line = asyncio.ensure_future(upstream.content.readline())
                done, _ = await asyncio.wait({line, stop}, return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    line.cancel()
                    break
                data = line.result()
                if not data:
                    break
                await response.write(data)
            if watch.gone:
                self.gone_sent += 1
                await response.write(GONE.encode())
        except (ConnectionResetError, aiohttp.ClientError):
            pass
        finally:
            stop.cancel()
            self._watches.remove(watch)
        return watch.cut

    async def _held_watch(self, request: web.Request, plural: str) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        watch = _Watch(plural, held=True)
        self._watches.append(watch)
        try:
            await watch.stop.wait()
            if watch.cut:
                _drop(request)
                return response
            if watch.gone:
                self.gone_sent += 1
                await response.write(GONE.encode())
            await response.write_eof()
        except ConnectionResetError:
            pass
        finally:
            self._watches.remove(watch)
        return response

    def lists_after(self, index: int, plural: str) -> Iterator[str]:
        """Paths of non-watch GETs of `plural` collections among requests[index:] (a relist)."""
        for method, path, is_watch in self.requests[index:]:
            if method == "GET" and not is_watch and _plural(path) == plural:
                yield path
