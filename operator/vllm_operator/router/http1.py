"""A minimal HTTP/1.1 client for the router's hot path: one POST per request over pooled keep-alive connections.

Why not aiohttp's client: measured here it costs ~220 µs of CPU per request — more than the whole aiohttp *server*
side of the fake engine — and the router pays it on every request. This client does only what the router needs
towards vLLM (plain HTTP, a POST with a JSON body, Content-Length or chunked responses, keep-alive), in a few dozen
microseconds. The serving side is `server.py`, in the same style; aiohttp only does the health polls and the Kubernetes
watch.

Semantics the proxy relies on:
* `ConnectError` (refused, unreachable, reset before the request was written) = the request was not delivered.
* `Disconnected` = the connection ended before the response was complete. When that happens on a *reused*
  connection before any response byte, the server had closed it while idle (a keep-alive race), so the request is
  retried once on a fresh connection; that is the only retry here.
* `Response.close()` aborts the connection (the engine sees the client go away and stops generating) unless the body
  was read to the end, in which case the connection goes back to the pool.
* Connections idle for more than `keepalive_s` are dropped (below uvicorn's 5 s, vLLM's server).
* Backpressure: a response that buffers more than `HIGH_WATER` unread bytes pauses reading from the socket.
* Deadlines: `post(deadline=…)` and `Response.deadline` (event-loop time) bound the waits for the head and for body
  bytes; past it the wait raises TimeoutError. They are enforced by one sweep of the busy connections every
  `SWEEP_SECONDS` instead of an `asyncio.timeout` per wait: a timer per request and per streamed chunk (arm, cancel,
  re-arm) cost ~10 µs each here, more than the request's whole parsing (benchmarks/router). A deadline fires up to
  `SWEEP_SECONDS` late.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
import typing
from collections.abc import Mapping
from typing import Final

HIGH_WATER: Final = 256 * 1024
MAX_HEADER_BYTES: Final = 64 * 1024
SWEEP_SECONDS: Final = 0.05


class ConnectError(OSError):
    """The request could not be delivered (no connection, or it broke before the request was sent)."""


class ConnectTimeout(ConnectError):
    """No connection within the connect timeout."""


class Disconnected(ConnectionError):
    """The connection ended before the response was complete."""


class ProtocolError(Disconnected):
    """The upstream answered something that is not HTTP/1.1 as this client understands it."""


class _Conn(asyncio.Protocol):
    """One TCP connection; parses one response at a time."""

    __slots__ = ("_buf", "closed", "idle_since", "key", "pool", "response", "reused", "transport")

    def __init__(self, pool: Pool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self.response: Response | None = None
        self._buf = bytearray()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, hence no isinstance check).
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # unsolicited bytes on an idle connection: it cannot be reused
            self.abort()
            return
        response._feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is not None:
            response._lost()

    def pause_writing(self) -> None:  # request bodies are written at once; nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """Status, headers and the body as it arrives."""

    __slots__ = ("_buffered", "_chunk_left", "_chunk_state", "_chunked", "_chunks", "_conn", "_done", "_error",
                 "_got_bytes", "_have_head", "_head", "_head_waiter", "_keep_alive", "_length", "_paused", "_pending",
                 "_until_close", "_waiter", "deadline", "headers", "status")

    def __init__(self, conn: _Conn, deadline: float) -> None:
        self._conn = conn
        self.deadline = deadline
        """Event-loop time after which waiting for more of the response raises TimeoutError (may be moved)."""
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head = bytearray()
        self._have_head = False
        self._head_waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._done = False  # body complete
        self._error: Exception | None = None
        self._got_bytes = False
        self._paused = False
        # body framing
        self._length: int | None = None
        self._chunked = False
        self._until_close = False
        self._keep_alive = True
        self._pending = bytearray()  # chunked-decoding buffer
        self._chunk_left = 0
        self._chunk_state = 0  # 0: size line, 1: data, 2: CRLF after data, 3: trailers

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    # --------------------------------------------------------------------------------------- parsing (protocol)
    def _feed(self, data: bytes) -> None:
        self._got_bytes = True
        if not self._have_head:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEADER_BYTES:
                    self._fail(ProtocolError("response headers too large"))
                return
            try:
                self._parse_head(bytes(self._head[:end]))
            except (ValueError, IndexError) as err:
                self._fail(ProtocolError(f"malformed response head: {err}"))
                return
            data = bytes(self._head[end + 4 :])
            self._head = bytearray()
            self._have_head = True
            if not self._head_waiter.done():
                self._head_waiter.set_result(None)
            if self._length == 0 and not self._chunked and not self._until_close:
                self._finish()
                return
        if data:
            self._body(data)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, status, *_ = lines[0].split(b" ", 2)
        if not version.startswith(b"HTTP/1."):
            raise ValueError(f"not HTTP/1.x: {lines[0][:40]!r}")
        self.status = int(status)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower().decode("latin-1")
            text = value.strip().decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self.headers = headers
        connection = headers.get("connection", "").lower()
        self._keep_alive = version == b"HTTP/1.1" and "close" not in connection
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in headers:
            self._length = int(headers["content-length"])
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self._length = 0
        else:
            self._until_close = True
            self._keep_alive = False

    def _body(self, data: bytes) -> None:
        if self._chunked:
            self._dechunk(data)
            return
        if self._length is not None:
            take = data[: self._length]
            self._length -= len(take)
            self._push(take)
            if self._length == 0:
                self._finish()
            return
        self._push(data)  # until close

    def _dechunk(self, data: bytes) -> None:
        buf = self._pending
        buf += data
        out: list[bytes] = []
        pos = 0
        while True:
            if self._chunk_state == 0:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                try:
                    size = int(bytes(buf[pos:nl]).split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._fail(ProtocolError("bad chunk size"))
                    return
                pos = nl + 2
                if size == 0:
                    self._chunk_state = 3
                else:
                    self._chunk_left = size
                    self._chunk_state = 1
            elif self._chunk_state == 1:
                available = len(buf) - pos
                if available <= 0:
                    break
                take = min(available, self._chunk_left)
                out.append(bytes(buf[pos : pos + take]))
                pos += take
                self._chunk_left -= take
                if self._chunk_left == 0:
                    self._chunk_state = 2
            elif self._chunk_state == 2:
                if len(buf) - pos < 2:
                    break
                pos += 2
                self._chunk_state = 0
            else:  # trailers: lines until an empty one
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                line_empty = nl == pos
                pos = nl + 2
                if line_empty:
                    del buf[:pos]
                    if out:
                        self._push(b"".join(out))
                    self._finish()
                    return
        del buf[:pos]
        if out:
            self._push(b"".join(out))

    def _push(self, data: bytes) -> None:
        if not data:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: Exception) -> None:
        if self._error is None and not self._done:
            self._error = error
        if not self._head_waiter.done():
            self._head_waiter.set_exception(error)
            self._head_waiter.exception()  # mark retrieved: the caller may be gone
        self._wake()
        self._conn.abort()

    def _lost(self) -> None:
        if self._until_close and self._have_head:
            self._finish()
        elif not self._done:
            self._fail(Disconnected("the upstream closed the connection before the response was complete"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _expire(self, now: float) -> None:
        """Called by the pool's sweep: fail the wait in progress when the deadline has passed."""
        if now < self.deadline:
            return
        waiter = self._waiter if self._have_head else self._head_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError())
            waiter.exception()  # mark retrieved: the caller may be gone

    # --------------------------------------------------------------------------------------- reading (caller)
    async def _wait_head(self) -> None:
        await self._head_waiter

    async def readany(self) -> bytes:
        """The next body bytes; b"" at the end of the body. Raises Disconnected when the body broke off."""
        while not self._chunks:
            if self._done:
                self._release()
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self._conn.transport is not None and not self._conn.closed:
            self._paused = False
            self._conn.transport.resume_reading()
        if self._done:
            self._release()
        return data

    async def read(self) -> bytes:
        parts: list[bytes] = []
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            parts.append(data)

    def _release(self) -> None:
        conn = self._conn
        if conn.response is self:
            conn.response = None
            if self._keep_alive and not conn.closed:
                conn.pool._put(conn)
            else:
                conn.abort()

    def close(self) -> None:
        """Give the connection back when the body was read to the end, else abort it."""
        conn = self._conn
        if conn.response is self:
            if self._done and not self._chunks:
                self._release()
            else:
                conn.response = None
                conn.abort()


class Pool:
    """Keep-alive connections per (host, port), and the sweep that enforces response deadlines."""

    def __init__(self, *, keepalive_s: float = 4.0) -> None:
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._sweep_handle: asyncio.TimerHandle | None = None

    def _sweep(self) -> None:
        busy = self._busy
        if not busy:
            self._sweep_handle = None
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in list(busy):
            response = conn.response
            if response is None or conn.closed:
                busy.discard(conn)
            else:
                response._expire(now)
        self._sweep_handle = loop.call_at(now + SWEEP_SECONDS, self._sweep)

    def _put(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        conn.reused = True
        self._idle.setdefault(conn.key, []).append(conn)

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.abort()
        return None

    async def _open(self, key: tuple[str, int], connect_timeout: float, deadline: float) -> _Conn:
        loop = asyncio.get_running_loop()
        connect_by = loop.time() + connect_timeout
        try:
            async with asyncio.timeout_at(min(connect_by, deadline)):
                _, conn = await loop.create_connection(lambda: _Conn(self, key), key[0], key[1])
        except TimeoutError as err:
            if deadline < connect_by:
                raise  # the request's own deadline came first
            raise ConnectTimeout(f"no connection to {key[0]}:{key[1]} within {connect_timeout:g} s") from err
        except OSError as err:
            raise ConnectError(f"could not connect to {key[0]}:{key[1]}: {err}") from err
        return conn

    async def post(self, host: str, port: int, path: str, body: bytes, headers: Mapping[str, str], *,
                   connect_timeout: float, deadline: float = math.inf) -> Response:
        """Send a POST and wait for the response head. ConnectTimeout when no connection came within
        `connect_timeout`; TimeoutError when the head has not come by `deadline` (event-loop time), which also
        stays the response's deadline for its body until the caller moves it."""
        key = (host, port)
        head = [f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in headers.items()]
        head.append("\r\n")
        request = "".join(head).encode("latin-1") + body
        for attempt in (0, 1):
            conn = self._take(key) if attempt == 0 else None
            if conn is None:
                conn = await self._open(key, connect_timeout, deadline)
            response = Response(conn, deadline)
            conn.response = response
            if deadline != math.inf:
                self._busy.add(conn)
                if self._sweep_handle is None:
                    self._sweep_handle = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)
            transport = conn.transport
            if transport is None or conn.closed:
                conn.response = None
                if conn.reused and attempt == 0:
                    continue
                raise ConnectError(f"connection to {host}:{port} closed before the request was sent")
            transport.write(request)
            try:
                await response._wait_head()
            except Disconnected:
                if conn.reused and not response._got_bytes and attempt == 0:
                    continue  # the server closed an idle keep-alive connection: once more, fresh
                raise
            except BaseException:
                response.close()
                raise
            return response
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._sweep_handle is not None:
            self._sweep_handle.cancel()
            self._sweep_handle = None
        self._busy.clear()
        for conns in self._idle.values():
            for conn in conns:
                conn.abort()
        self._idle.clear()
