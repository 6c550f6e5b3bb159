"""The router's HTTP/1.1 server: an asyncio.Protocol that parses requests, runs one handler task per request and
writes whole or streamed (chunked) responses.

Why not aiohttp's server: profiled under load, aiohttp's server layer (request parsing, request/response objects,
its handler machinery) plus the event-loop work it causes took ~60 % of the router's CPU for a 2 KB chat request
(benchmarks/router). The router needs a small part of HTTP/1.1 — a few fixed routes, JSON bodies, whole or SSE
answers — and this module does only that, in the style of `http1.py` (the upstream client).

Requests are framed by llhttp (`httptools`, the parser uvicorn and Node.js use) rather than by code of our own: a
parser's disagreements with the proxies in front of it are how requests get smuggled, and llhttp is the one the
most traffic has tested. tests/unit/router/test_framing_fuzz.py compares its decisions with h11's on generated
requests. What the server takes, and how it answers what it does not:
* llhttp refuses (400, connection closed): malformed request lines, methods it does not know, non-token field
  names, control characters in the target or in values, whitespace before the colon, folded lines (obs-fold),
  bare CR or LF, Content-Length that is not digits or appears twice, Content-Length together with
  Transfer-Encoding, a repeated Transfer-Encoding, chunked not the final coding, malformed chunk sizes (hex digits
  only, no overflow) and chunk data not followed by CRLF. It accepts runs of SP between the parts of the request
  line (RFC 9112 3 allows it; the framing is the same).
* On top of it, here: HTTP versions other than 1.0/1.1 → 505; CONNECT or an Upgrade → 400; a missing Host (HTTP/1.1)
  or two Host fields → 400; Transfer-Encoding in HTTP/1.0 → 400; a coding other than plain `chunked` → 501; a
  target that is neither a path nor absolute-form → 400. A head (request line + fields) over `MAX_HEAD_BYTES` →
  431 (414 when the target alone is that long); more than `MAX_HEADERS` fields → 431.
* Bodies: Content-Length or chunked (trailers are read, bounded and dropped). The body is collected up to the
  app's `max_body_bytes`; past it `Request.read()` raises `BodyError(413)` at once (the handler answers) and the
  rest is read and thrown away. A chunked body that breaks off is `BodyError(400)`. `Expect: 100-continue` is
  answered when the handler reads the body.
* Routing: path → method → handler; unknown path 404, known path with another method (HEAD included) 405 + Allow.
* Keep-alive (HTTP/1.1 by default, HTTP/1.0 with `Connection: keep-alive`) and pipelining: pipelined requests are
  framed as they arrive and handled one after another; while a handler runs, at most `PIPELINE_BUFFER` bytes of
  what follows are buffered before reading pauses. Idle connections close after `KEEPALIVE_SECONDS`.
* A client that disconnects (or half-closes) while its handler runs cancels the handler task, so the handler's
  upstream connection is closed and the engine aborts the request.
* Streamed responses (`StreamResponse`) are chunked; `write()` waits while the transport is over its high-water mark
  (backpressure from a slow reader reaches the handler, which stops reading its upstream).
* A response written before the request body was complete ends the connection: `Connection: close`, our side is
  half-closed and the rest of the body is read and dropped for up to `LINGER_SECONDS`, so the client reads the answer
  instead of a reset.
* Graceful shutdown: stop accepting, close idle connections, let running handlers finish within a bound (their
  responses carry `Connection: close`), then cancel what is left.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import time
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Final

import httptools

log = logging.getLogger(__name__)

MAX_HEAD_BYTES: Final = 32 * 1024
MAX_HEADERS: Final = 100
MAX_TRAILER_BYTES: Final = 16 * 1024
PIPELINE_BUFFER: Final = 256 * 1024
KEEPALIVE_SECONDS: Final = 75.0
"""Above the 60 s that proxies in front of the router (ingress-nginx, cloud load balancers) keep idle upstream
connections, so that it is them who close an idle connection, never the router under their feet."""
LINGER_SECONDS: Final = 2.0
SHUTDOWN_SECONDS: Final = 25.0
"""Below Kubernetes' default 30 s termination grace period."""

_REASONS: Final = {s.value: s.phrase for s in HTTPStatus}
_EAGER_TASK: Final[Callable[..., asyncio.Task[None]] | None] = getattr(asyncio, "eager_task_factory", None)
"""Python 3.12+ (the router image): a request's task runs at once, up to its first wait for the engine, instead of
one event-loop iteration later (a loop iteration and a callback fewer per request)."""


class BodyError(Exception):
    """The request body cannot be had: too large (413) or its chunked framing is broken (400)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str, code: str) -> bytes:
    """An OpenAI-style error body, for the answers the server gives without a handler."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


class Response:
    """A whole response."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"", headers: Mapping[str, str] | None = None,
                 content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers) if headers else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type


class Request:
    """One parsed request. `headers` has lower-case names (repeated fields joined with ", ")."""

    __slots__ = ("_body", "_conn", "_continue", "_done", "_error", "_limit", "_parts", "_received", "_streamed",
                 "_waiter", "chunked", "content_length", "headers", "keep_alive", "method", "path", "query",
                 "version")

    def __init__(self, conn: _Connection, method: str, path: str, query: str, version: str,
                 headers: dict[str, str], content_length: int | None, chunked: bool, keep_alive: bool,
                 limit: int) -> None:
        self._conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.version = version
        self.headers = headers
        self.content_length = content_length
        self.chunked = chunked
        self.keep_alive = keep_alive
        self._limit = limit
        self._parts: list[bytes] = []
        self._received = 0
        self._body: bytes | None = None
        self._done = not chunked and not content_length
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._continue = (version == "HTTP/1.1" and not self._done
                          and headers.get("expect", "").lower() == "100-continue")
        self._streamed = False

    @property
    def content_type(self) -> str:
        """The media type, lower case, without parameters; "" when there is no Content-Type."""
        value = self.headers.get("content-type")
        if value is None:
            return ""
        return value.split(";", 1)[0].strip().lower()

    async def read(self) -> bytes:
        """The whole body. BodyError when it is too large or malformed; ConnectionResetError when the client left."""
        while True:
            if self._error is not None:
                raise self._error
            if self._done:
                if self._body is None:
                    parts = self._parts
                    self._body = parts[0] if len(parts) == 1 else b"".join(parts)
                    self._parts = []
                return self._body
            if self._continue:
                self._continue = False
                self._conn._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    # ------------------------------------------------------------------------------- fed by the connection
    def _store(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > self._limit:
            if self._error is None:
                self._parts = []
                self._fail(BodyError(413, f"request body exceeds the limit of {self._limit} bytes"))
            return
        if self._error is None:
            self._parts.append(data)

    def _broken(self, why: str) -> None:
        self.keep_alive = False
        self._done = True
        self._fail(BodyError(400, f"malformed chunked request body: {why}"))

    def _finish(self) -> None:
        self._done = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class StreamResponse:
    """A response whose body is written piece by piece: `await prepare(request)`, `await write(data)`…,
    `await write_eof()`. Chunked transfer coding (close-delimited for an HTTP/1.0 client)."""

    __slots__ = ("_chunked", "_conn", "_ended", "headers", "status")

    def __init__(self, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers) if headers else {}
        self._conn: _Connection | None = None
        self._chunked = True
        self._ended = False

    async def prepare(self, request: Request) -> None:
        conn = request._conn
        if conn.closed:
            raise ConnectionResetError("the client has gone away")
        self._conn = conn
        self._chunked = request.version == "HTTP/1.1"
        if not self._chunked:
            request.keep_alive = False
        conn._start_stream(request, self)

    @property
    def must_wait(self) -> bool:
        """The next `write()` will wait for the client to read (the transport is over its high-water mark)."""
        return self._conn is not None and self._conn.write_paused

    async def write(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or self._ended:
            raise RuntimeError("write() before prepare() or after write_eof()")
        if conn.closed:
            raise ConnectionResetError("the client has gone away")
        if not data:
            return
        conn._write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if conn.write_paused:
            await conn._drain()

    async def write_eof(self) -> None:
        conn = self._conn
        if conn is None or self._ended:
            return
        self._ended = True
        if self._chunked and not conn.closed:
            conn._write(b"0\r\n\r\n")


Handler = Callable[[Request], Awaitable[Response | StreamResponse]]
Lifespan = Callable[[], contextlib.AbstractAsyncContextManager[None]]


class App:
    """Routes (exact paths) and the lifespans that run around serving (entered before the first connection is
    accepted, left after the last request has finished)."""

    def __init__(self, *, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.routes: dict[str, dict[str, Handler]] = {}
        self.lifespans: list[Lifespan] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        self.routes.setdefault(path, {})[method] = handler


_date_cache: list[typing.Any] = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True)
    return typing.cast(str, _date_cache[1])


def _head(status: int, headers: Mapping[str, str], framing: str, keep_alive: bool, version: str) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nDate: {_http_date()}\r\n{framing}"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"line break in response header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    if not keep_alive:
        lines.append("Connection: close\r\n")
    elif version == "HTTP/1.0":
        lines.append("Connection: keep-alive\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def _internal_error() -> Response:
    return Response(500, error_body(500, "internal error in the router", "internal_error"),
                    content_type="application/json")


def _head_too_large(fields: int) -> _Reject:
    if fields == 0:
        return _Reject(414, "request line too long", "uri_too_long")
    return _Reject(431, f"request head larger than {MAX_HEAD_BYTES} bytes", "headers_too_large")


class _Reject(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


class _Connection(asyncio.Protocol):
    """One client connection: parse (llhttp), dispatch, write; one request handled at a time.

    llhttp parses everything it is given, so pipelined requests are framed as they arrive and queued (heads, and
    bodies up to the app's limit) until the responses before them are written; reading pauses once more than
    `PIPELINE_BUFFER` bytes arrived while a handler ran. A request that cannot be framed is queued as a refusal in
    its turn, and nothing after it is parsed (its framing is unknown)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.app = server.app
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.closing = False  # finish the current request, then close (shutdown)
        self.write_paused = False
        self.last_active = 0.0
        self.request: Request | None = None  # the request being handled
        self.task: asyncio.Task[None] | None = None
        self._queue: collections.deque[Request | _Reject] = collections.deque()
        self._parser = httptools.HttpRequestParser(self)
        self._parsing: Request | None = None  # the request whose body is being parsed
        self._broken = False  # framing failed: nothing more is parsed
        self._in_head = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_size = 0  # request line + fields so far, as parsed
        self._head_raw = 0  # bytes received while in the head (bounds what llhttp buffers for one field)
        self._fields = 0
        self._trailer_size = 0
        self._pipelined = 0  # bytes received while a handler ran (for pausing)
        self._reading_paused = False
        self._discarding = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._linger: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, hence no isinstance check).
        self.transport = typing.cast(asyncio.Transport, transport)
        self.last_active = self.loop.time()
        self.server.connections.add(self)
        # Nagle off, explicitly: asyncio sets TCP_NODELAY only on sockets whose `proto` is IPPROTO_TCP, and accepted
        # sockets of a listener made with proto 0 have 0. Without it a small write that follows another one (the end
        # of a stream after its last event) waits for the client's delayed ACK: ~40 ms stalls (benchmarks/router).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self._discarding or self._broken:
            return
        if self.request is not None:
            self._pipelined += len(data)
        in_head = self._in_head
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._framing_failed(_Reject(400, "protocol upgrade and CONNECT are not supported"))
        except httptools.HttpParserError as err:
            cause = err.__context__
            self._framing_failed(cause if isinstance(cause, _Reject) else _Reject(400, str(err) or "malformed request"))
        else:
            if self._in_head:
                self._head_raw += len(data) if in_head else 0
                if self._head_raw > MAX_HEAD_BYTES:
                    self._framing_failed(_head_too_large(self._fields))
        if self.request is None:
            self._next()
        elif (self._pipelined > PIPELINE_BUFFER and not self._reading_paused and self.transport is not None
              and not self._discarding):
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a running handler is cancelled in connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._linger is not None:
            self._linger.cancel()
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        for request in (self.request, self._parsing):
            if request is not None and not request._done:
                request._fail(ConnectionResetError("the client has gone away"))
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client has gone away"))
            waiter.exception()  # retrieved: the writer may be gone

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------------------------- llhttp callbacks
    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._headers = {}
        self._head_size = 0
        self._head_raw = 0
        self._fields = 0
        self._trailer_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_HEAD_BYTES:
            raise _Reject(414, "request line too long", "uri_too_long")

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a trailer field of a chunked body: counted, then dropped
            self._trailer_size += len(name) + len(value) + 4
            if self._trailer_size > MAX_TRAILER_BYTES:
                raise _Reject(400, "chunked trailers too large")
            return
        self._fields += 1
        self._head_size += len(name) + len(value) + 4
        if self._fields > MAX_HEADERS:
            raise _Reject(431, f"more than {MAX_HEADERS} header fields", "headers_too_large")
        if self._head_size + len(self._url) > MAX_HEAD_BYTES:
            raise _head_too_large(self._fields)
        key = name.decode("ascii").lower()  # llhttp allows only token characters in names
        text = value.decode("latin-1").strip(" \t")
        headers = self._headers
        old = headers.get(key)
        if old is None:
            headers[key] = text
        elif key == "host":
            raise _Reject(400, "more than one Host field")
        else:  # Content-Length and Transfer-Encoding twice are refused by llhttp itself
            headers[key] = f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self._in_head = False
        request = self._head()
        self._queue.append(request)
        if not request._done:
            self._parsing = request

    def on_body(self, body: bytes) -> None:
        request = self._parsing
        if request is not None:
            request._store(body)

    def on_message_complete(self) -> None:
        request = self._parsing
        if request is not None:
            self._parsing = None
            request._finish()

    def _head(self) -> Request:
        """The checks llhttp leaves to its user, on a complete head; the Request."""
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Reject(505, f"HTTP version {version} is not supported", "version_not_supported")
        if parser.should_upgrade():  # CONNECT, or Upgrade with Connection: upgrade (checked before llhttp skips on)
            raise _Reject(400, "protocol upgrade and CONNECT are not supported")
        headers = self._headers
        if version == "1.1" and "host" not in headers:
            raise _Reject(400, "HTTP/1.1 request without Host")
        target = self._url
        if target[:1] != b"/":
            # absolute-form (sent to proxies; servers must accept it): keep the path
            scheme_end = target.find(b"://")
            if scheme_end < 0:
                raise _Reject(400, "request target must be a path")
            slash = target.find(b"/", scheme_end + 3)
            target = target[slash:] if slash >= 0 else b"/"
        length: int | None = None
        chunked = False
        coding = headers.get("transfer-encoding")
        if coding is not None:
            # llhttp has refused Content-Length with it, a repeated field, and a final coding other than chunked
            if version != "1.1":
                raise _Reject(400, "Transfer-Encoding in an HTTP/1.0 request")
            if coding.lower() != "chunked":
                raise _Reject(501, f"transfer coding {coding!r} is not supported (only chunked)", "not_implemented")
            chunked = True
        else:
            declared = headers.get("content-length")
            if declared is not None:  # digits only, one field: llhttp checked
                if len(declared) > 18:
                    raise _Reject(400, "malformed Content-Length")
                length = int(declared)
        connection = headers.get("connection")
        if version == "1.1":
            keep_alive = connection is None or "close" not in _tokens(connection)
        else:
            keep_alive = connection is not None and "keep-alive" in _tokens(connection)
        raw_path, _, raw_query = target.partition(b"?")
        return Request(self, parser.get_method().decode("ascii"), raw_path.decode("ascii"),
                       raw_query.decode("ascii"), "HTTP/1.1" if version == "1.1" else "HTTP/1.0", headers, length,
                       chunked, keep_alive, self.app.max_body_bytes)

    def _framing_failed(self, reject: _Reject) -> None:
        """Nothing after this point can be framed: a request whose body broke gets a BodyError (its handler
        answers), a broken head is refused in its turn; either way the connection ends after that answer."""
        self._broken = True
        self._in_head = False
        request = self._parsing
        if request is not None and not request._done:
            self._parsing = None
            request._broken(reject.message)
        else:
            self._queue.append(reject)

    # ------------------------------------------------------------------------------- dispatch
    def _next(self) -> None:
        """Dispatch the queued requests, until one needs a handler task or the queue runs dry."""
        queue = self._queue
        while self.request is None and queue and not self.closed and not self._discarding:
            request = queue.popleft()
            if isinstance(request, _Reject):
                self._refuse(request.status, request.message, request.code)
                return
            self.request = request
            methods = self.app.routes.get(request.path)
            if methods is None:
                self._answer(request, Response(404, error_body(404, f"no route for {request.path}", "not_found"),
                                               content_type="application/json"))
                continue
            handler = methods.get(request.method)
            if handler is None:
                self._answer(request, Response(405, error_body(405, f"method {request.method} is not allowed on "
                                                               f"{request.path}", "method_not_allowed"),
                                               {"Allow": ", ".join(methods)}, "application/json"))
                continue
            coro = self._run(request, handler)
            task = _EAGER_TASK(self.loop, coro) if _EAGER_TASK is not None else self.loop.create_task(coro)
            if not task.done():  # an eager task that finished at once has already gone on with the queue
                self.task = task
            return

    def _refuse(self, status: int, message: str, code: str) -> None:
        """A request that cannot be framed: answer and close (the framing of what follows is unknown)."""
        if self.transport is None or self.closed:
            return
        body = error_body(status, message, code)
        self._write(_head(status, {"Content-Type": "application/json"}, f"Content-Length: {len(body)}\r\n", False,
                          "HTTP/1.1") + body)
        self._queue.clear()
        self._end_connection(body_complete=False)

    async def _run(self, request: Request, handler: Handler) -> None:
        try:
            try:
                response = await handler(request)
            finally:
                self.task = None
        except asyncio.CancelledError:
            if not self.closed and self.transport is not None:
                self.transport.abort()  # cancelled by the shutdown: nothing more will be written
            return
        except Exception:
            log.exception("Handler for %s %s failed", request.method, request.path)
            if request._streamed or self.request is not request:
                if self.transport is not None:
                    self.transport.abort()  # the status line is gone: cut the response short
                return
            response = _internal_error()
        if isinstance(response, StreamResponse) and response._conn is not None:
            await response.write_eof()
            self._complete(request, request.keep_alive and response._chunked)
        else:
            if isinstance(response, StreamResponse):  # never prepared: nothing was written
                response = Response(response.status, b"", response.headers)
            try:
                self._answer(request, response)
            except ValueError:  # a header value with a line break: nothing was written
                log.exception("Response to %s %s cannot be sent", request.method, request.path)
                self._answer(request, _internal_error())
        if self.request is None and self._queue:
            self._next()

    # ------------------------------------------------------------------------------- writing
    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not self.closed and not transport.is_closing():
            transport.write(data)

    async def _drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("the client has gone away")
        waiter = self._drain_waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._drain_waiter = None

    def _keep(self, request: Request) -> bool:
        return request.keep_alive and request._done and request._error is None and not self.closing

    def _answer(self, request: Request, response: Response) -> None:
        keep = self._keep(request)
        body = response.body
        head = _head(response.status, response.headers, f"Content-Length: {len(body)}\r\n", keep, request.version)
        if request.method == "HEAD":
            self._write(head)
        elif len(body) < 16384:
            self._write(head + body)
        else:
            self._write(head)
            self._write(body)
        self._complete(request, keep)

    def _start_stream(self, request: Request, response: StreamResponse) -> None:
        keep = self._keep(request)
        request.keep_alive = keep
        request._streamed = True
        framing = "Transfer-Encoding: chunked\r\n" if response._chunked else ""
        self._write(_head(response.status, response.headers, framing, keep and response._chunked,
                          request.version))

    def _complete(self, request: Request, keep: bool) -> None:
        """The response to `request` is written: go on with the next request, or end the connection."""
        if self.request is request:
            self.request = None
        if not keep:
            self._end_connection(body_complete=request._done and request._error is None)
            return
        self.last_active = self.loop.time()
        self._pipelined = 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def _end_connection(self, body_complete: bool) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if body_complete or not transport.can_write_eof():
            transport.close()
            return
        # The client may still be sending: half-close, read and drop the rest for a while, then close.
        self._discarding = True
        self._queue.clear()
        transport.write_eof()
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        self._linger = self.loop.call_later(LINGER_SECONDS, transport.abort)

    def close_if_idle(self, now: float, idle_after: float) -> None:
        if self.request is None and not self.closed and now - self.last_active > idle_after \
                and self.transport is not None:
            self.transport.close()


def _tokens(value: str) -> list[str]:
    return [t.strip() for t in value.lower().split(",")]


class Server:
    """The listening socket and its connections."""

    def __init__(self, app: App, *, keepalive_s: float = KEEPALIVE_SECONDS) -> None:
        self.app = app
        self.keepalive_s = keepalive_s
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self._listener: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, sock: socket.socket) -> None:
        self._listener = await self.loop.create_server(lambda: _Connection(self), sock=sock, backlog=1024)
        self._sweeper = self.loop.create_task(self._sweep(), name="http-keepalive")

    async def _sweep(self) -> None:
        interval = min(5.0, self.keepalive_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = self.loop.time()
            for conn in list(self.connections):
                conn.close_if_idle(now, self.keepalive_s)

    async def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Stop accepting; let running requests finish within `timeout`; then cancel them and close everything."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._listener is not None:
            self._listener.close()
        for conn in list(self.connections):
            conn.closing = True
            if conn.request is None and conn.transport is not None:
                conn.transport.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
        await asyncio.sleep(0)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._listener is not None:
            await self._listener.wait_closed()


@contextlib.asynccontextmanager
async def serve(app: App, host: str = "127.0.0.1", port: int = 0, *, shutdown_timeout: float = SHUTDOWN_SECONDS,
                keepalive_s: float = KEEPALIVE_SECONDS) -> AsyncIterator[str]:
    """Enter the app's lifespans, serve until the block ends, shut down gracefully; yields the base URL (port 0
    picks a free one)."""
    async with contextlib.AsyncExitStack() as stack:
        for lifespan in app.lifespans:
            await stack.enter_async_context(lifespan())
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.setblocking(False)
            server = Server(app, keepalive_s=keepalive_s)
            await server.start(sock)
        except BaseException:
            sock.close()
            raise
        bound = sock.getsockname()[1]
        try:
            yield f"http://[{host}]:{bound}" if family == socket.AF_INET6 else f"http://{host}:{bound}"
        finally:
            await server.shutdown(shutdown_timeout)
