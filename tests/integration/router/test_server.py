"""The router's HTTP/1.1 server (router/server.py) over real sockets: framing, keep-alive and pipelining, what it
refuses (400/404/405/413/414/431/501/505), chunked request bodies, 100-continue, handler cancellation on
disconnect, backpressure on streamed answers and graceful shutdown. The router endpoints themselves are covered by
the other tests in this directory (aiohttp and the official openai client as clients)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.support.waiting import eventually
from vllm_operator.router.server import (
    MAX_HEAD_BYTES,
    App,
    BodyError,
    Request,
    Response,
    StreamResponse,
    serve,
)

LIMIT = 1024


class Probe:
    """An app with a few handlers that record what they saw."""

    def __init__(self) -> None:
        self.app = App(max_body_bytes=LIMIT)
        self.cancelled = asyncio.Event()
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.streams: list[StreamResponse] = []
        self.stream_written = 0
        self.app.add("POST", "/echo", self.echo)
        self.app.add("GET", "/hello", self.hello)
        self.app.add("GET", "/wait", self.wait)
        self.app.add("GET", "/stream", self.stream)
        self.app.add("POST", "/early", self.early)
        self.app.add("GET", "/nodelay", self.nodelay)
        self.app.add("GET", "/fail", self.fail)
        self.app.add("GET", "/bad-header", self.bad_header)

    async def echo(self, request: Request) -> Response:
        try:
            body = await request.read()
        except BodyError as err:
            return Response(err.status, err.message.encode())
        return Response(200, body, {"X-Length": str(len(body))})

    async def hello(self, request: Request) -> Response:
        return Response(200, b"hello " + request.query.encode(), content_type="text/plain")

    async def wait(self, request: Request) -> Response:
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(200, b"released")

    async def stream(self, request: Request) -> StreamResponse:
        response = StreamResponse(200, {"Content-Type": "text/event-stream"})
        self.streams.append(response)
        await response.prepare(request)
        chunk = b"x" * 32768
        for _ in range(int(request.query or "4")):
            await response.write(chunk)
            self.stream_written += len(chunk)
        await response.write_eof()
        return response

    async def nodelay(self, request: Request) -> Response:
        transport = request._conn.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        return Response(200, str(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)).encode())

    async def fail(self, request: Request) -> Response:
        raise RuntimeError("a bug in a handler")

    async def bad_header(self, request: Request) -> Response:
        return Response(200, b"x", {"X-Injected": "a\r\nSet-Cookie: evil=1"})

    async def early(self, request: Request) -> Response:
        """Answers without reading the body (like the router's 413 on a declared Content-Length)."""
        return Response(413, b"too large")


@contextlib.asynccontextmanager
async def probe_server(shutdown_timeout: float = 5.0) -> AsyncIterator[tuple[Probe, str, int]]:
    probe = Probe()
    async with serve(probe.app, shutdown_timeout=shutdown_timeout) as url:
        host, port = url.removeprefix("http://").split(":")
        yield probe, host, int(port)


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


async def read_reply(reader: asyncio.StreamReader, head_request: bool = False) -> Reply:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if head_request:
        return Reply(status, headers, b"")
    if headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return Reply(status, headers, b"".join(parts))
            parts.append(data[:-2])
    return Reply(status, headers, await reader.readexactly(int(headers.get("content-length", "0"))))


async def exchange(port: int, raw: bytes, replies: int = 1) -> tuple[list[Reply], bytes]:
    """Send `raw`, read `replies` answers, then whatever follows until the server closes (b"" if it keeps the
    connection open: then the client closes)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        out = [await read_reply(reader, raw.startswith(b"HEAD")) for _ in range(replies)]
        closed_by_server = out[-1].headers.get("connection") == "close"
        rest = await reader.read() if closed_by_server else b""
        return out, rest
    finally:
        writer.close()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def test_keep_alive_serves_sequential_requests_on_one_connection() -> None:
    async with probe_server() as (_, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for i in range(3):
            writer.write(post("/echo", f"body {i}".encode()))
            reply = await read_reply(reader)
            assert (reply.status, reply.body) == (200, f"body {i}".encode())
            assert "connection" not in reply.headers
            assert "date" in reply.headers
        writer.close()


async def test_nagle_is_off_on_accepted_connections() -> None:
    """Otherwise the last small write of a stream waits for the client's delayed ACK (~40 ms)."""
    async with probe_server() as (_, _host, port):
        (reply,), _ = await exchange(port, b"GET /nodelay HTTP/1.1\r\nHost: t\r\n\r\n")
    assert reply.body == b"1"


async def test_idle_keep_alive_connections_are_closed_after_the_keep_alive_time() -> None:
    probe = Probe()
    async with serve(probe.app, keepalive_s=0.3) as url:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
        writer.write(b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await read_reply(reader)).status == 200
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the server, not by the client
        writer.close()


async def test_pipelined_requests_are_answered_in_order() -> None:
    raw = (post("/echo", b"one") + b"GET /hello?two HTTP/1.1\r\nHost: t\r\n\r\n" + post("/echo", b"three")
           + b"GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n" + post("/echo", b"five"))
    async with probe_server() as (_, _host, port):
        replies, _ = await exchange(port, raw, replies=5)
    assert [(r.status, r.body) for r in replies[:3]] == [(200, b"one"), (200, b"hello two"), (200, b"three")]
    assert replies[3].status == 404
    assert (replies[4].status, replies[4].body) == (200, b"five")


async def test_body_split_at_every_byte_and_absolute_form_target() -> None:
    raw = b"POST http://router.example/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
    async with probe_server() as (_, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for i in range(len(raw)):
            writer.write(raw[i : i + 1])
            await writer.drain()
        reply = await read_reply(reader)
        writer.close()
    assert (reply.status, reply.body) == (200, b"hello")


async def test_http10_closes_unless_keep_alive_is_asked_for() -> None:
    async with probe_server() as (_, _host, port):
        replies, rest = await exchange(port, b"GET /hello HTTP/1.0\r\n\r\n")
        assert replies[0].status == 200 and replies[0].headers["connection"] == "close" and rest == b""
        replies, _ = await exchange(port, b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
                                          b"GET /hello?again HTTP/1.0\r\n\r\n", replies=2)
        assert replies[0].headers["connection"] == "keep-alive"
        assert replies[1].body == b"hello again"


MALFORMED = [
    pytest.param(b"GARBAGE\r\n\r\n", 400, id="request-line"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost : t\r\n\r\n", 400, id="space-before-colon"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: t\r\nX-A: 1\r\n  folded\r\n\r\n", 400, id="obs-fold"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: t\nX-A: 1\r\n\r\n", 400, id="bare-lf"),
    pytest.param(b"GET /hel\x01lo HTTP/1.1\r\nHost: t\r\n\r\n", 400, id="control-in-target"),
    pytest.param(b"G(ET /hello HTTP/1.1\r\nHost: t\r\n\r\n", 400, id="method-not-token"),
    pytest.param(b"GET /hello HTTP/1.1\r\n\r\n", 400, id="no-host"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, id="two-hosts"),
    pytest.param(b"GET hello HTTP/1.1\r\nHost: t\r\n\r\n", 400, id="target-not-a-path"),
    pytest.param(post("/echo", b"abc", "Content-Length: 4\r\n"), 400, id="conflicting-content-length"),
    pytest.param(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\nabc", 400, id="signed-length"),
    pytest.param(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n0\r\n\r\n", 400, id="length-and-chunked"),
    pytest.param(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400,
                 id="chunked-not-final"),
    pytest.param(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501,
                 id="unsupported-coding"),
    pytest.param(b"GET /hello HTTP/2.0\r\nHost: t\r\n\r\n", 505, id="http2-text"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: t\r\n" + b"X-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", 431,
                 id="headers-too-large"),
    pytest.param(b"GET /hello HTTP/1.1\r\nHost: t\r\n" + b"X-A: 1\r\n" * 101 + b"\r\n", 431,
                 id="too-many-headers"),
    pytest.param(b"GET /" + b"a" * (MAX_HEAD_BYTES + 10), 414, id="request-line-too-long"),
]


@pytest.mark.parametrize(("raw", "status"), MALFORMED)
async def test_malformed_requests_are_refused_and_the_connection_closes(raw: bytes, status: int) -> None:
    async with probe_server() as (_, _host, port):
        replies, rest = await exchange(port, raw)
        assert replies[0].status == status
        assert replies[0].headers["connection"] == "close"
        assert rest == b""
        error = json.loads(replies[0].body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        replies, _ = await exchange(port, b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")  # the server still serves
        assert replies[0].status == 200


async def test_unknown_path_404_and_other_methods_405_with_allow() -> None:
    async with probe_server() as (_, _host, port):
        (reply,), _ = await exchange(port, b"GET /v1/embeddings HTTP/1.1\r\nHost: t\r\n\r\n")
        assert reply.status == 404
        (reply,), _ = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n")
        assert reply.status == 405 and reply.headers["allow"] == "POST"
        (reply,), _ = await exchange(port, b"HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\n"
                                           b"Host: t\r\n\r\n")
        assert reply.status == 405 and int(reply.headers["content-length"]) > 0  # a HEAD answer has no body…
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"HEAD /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
        first, second = await read_reply(reader, head_request=True), await read_reply(reader)
        writer.close()
        assert first.status == 405 and second.status == 200  # …so the next answer starts right after its head


async def test_failing_handler_or_unsendable_header_is_500_and_the_connection_goes_on() -> None:
    raw = (b"GET /fail HTTP/1.1\r\nHost: t\r\n\r\nGET /bad-header HTTP/1.1\r\nHost: t\r\n\r\n"
           b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
    async with probe_server() as (_, _host, port):
        replies, _ = await exchange(port, raw, replies=3)
    assert [r.status for r in replies] == [500, 500, 200]
    assert "set-cookie" not in replies[1].headers
    assert json.loads(replies[0].body)["error"]["code"] == "internal_error"


async def test_chunked_request_body_with_extensions_and_trailers() -> None:
    raw = (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: yes\r\n\r\n"
           b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n")
    async with probe_server() as (_, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for i in range(0, len(raw), 3):
            writer.write(raw[i : i + 3])
            await writer.drain()
        first, second = await read_reply(reader), await read_reply(reader)
        writer.close()
    assert (first.status, first.body) == (200, b"hello world")
    assert (second.status, second.body) == (200, b"hello ")


@pytest.mark.parametrize("chunks", [b"0x5\r\nhello\r\n0\r\n\r\n", b"5\r\nhelloXX0\r\n\r\n", b"-5\r\nhello\r\n",
                                    b"5 5\r\nhello\r\n"], ids=["hex-prefix", "no-crlf-after-data", "negative",
                                                                "two-numbers"])
async def test_malformed_chunked_body_is_400_and_closes(chunks: bytes) -> None:
    raw = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks
    async with probe_server() as (_, _host, port):
        (reply,), _ = await exchange(port, raw)
    assert reply.status == 400 and b"malformed chunked request body" in reply.body
    assert reply.headers["connection"] == "close"


async def test_body_over_the_limit_is_413_and_the_client_reads_it_while_still_sending() -> None:
    async with probe_server() as (_, host, port):
        # chunked: the limit is found while reading; the client keeps sending 200 KiB more after the answer
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):
            writer.write(b"800\r\n" + b"x" * 2048 + b"\r\n")
        reply = await read_reply(reader)
        assert reply.status == 413 and reply.headers["connection"] == "close"
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        assert await reader.read() == b""  # closed cleanly after the answer, not reset before it
        writer.close()
        # declared Content-Length, answered before the body is read
        (reply,), rest = await exchange(port, b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n"
                                              + b"x" * 5000)
        assert reply.status == 413 and reply.headers["connection"] == "close" and rest == b""


async def test_expect_100_continue_is_answered_when_the_body_is_read() -> None:
    async with probe_server() as (_, host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = await reader.readuntil(b"\r\n\r\n")
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        reply = await read_reply(reader)
        writer.close()
    assert (reply.status, reply.body) == (200, b"hello")


@pytest.mark.parametrize("how", ["close", "half-close"])
async def test_client_disconnect_cancels_the_handler(how: str) -> None:
    async with probe_server() as (probe, host, port):
        _reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        await probe.entered.wait()
        if how == "close":
            writer.close()
        else:
            writer.write_eof()
        await asyncio.wait_for(probe.cancelled.wait(), 10)
        writer.close()


async def test_streamed_answer_waits_for_a_slow_reader() -> None:
    total_chunks = 1024  # 32 MiB in 32 KiB chunks
    async with probe_server() as (probe, host, port):
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        writer.write(f"GET /stream?{total_chunks} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        # the client reads nothing: the server's transport fills up and the handler's write() waits
        await eventually(lambda: asyncio.sleep(0, bool(probe.streams) and probe.streams[0]._conn is not None
                                                  and probe.streams[0]._conn.write_paused))
        blocked_at = probe.stream_written
        assert blocked_at < 24 * 1024 * 1024, "socket buffers are a few MiB; the handler must not run ahead"
        reply = await read_reply(reader)
        writer.close()
    assert len(reply.body) == total_chunks * 32768
    assert probe.stream_written == total_chunks * 32768


async def test_graceful_shutdown_finishes_running_requests_and_refuses_new_ones() -> None:
    probe = Probe()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def run() -> None:
        async with serve(probe.app, shutdown_timeout=30) as url:
            ready.set_result(int(url.rsplit(":", 1)[1]))
            await stop.wait()

    server = asyncio.create_task(run())
    port = await ready
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    await probe.entered.wait()
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    stop.set()
    assert await idle_reader.read() == b"", "idle keep-alive connections are closed at once"

    async def refused() -> bool:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return True
        w.close()
        return False

    await eventually(refused)
    assert not server.done()
    probe.release.set()
    reply = await read_reply(reader)
    assert (reply.status, reply.body) == (200, b"released")
    assert reply.headers["connection"] == "close"
    await asyncio.wait_for(server, 10)
    writer.close()
    idle_writer.close()


async def test_shutdown_cancels_requests_that_outlive_the_bound() -> None:
    probe = Probe()
    async with serve(probe.app, shutdown_timeout=0.2) as url:
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
        await probe.entered.wait()
    assert probe.cancelled.is_set()
    assert await reader.read() == b""
    writer.close()


async def test_aiohttp_client_sees_a_normal_server() -> None:
    """A mainstream client: keep-alive reuse, chunked upload, streamed download."""

    async def upload() -> AsyncIterator[bytes]:
        for part in (b"abc", b"def"):
            yield part

    async with probe_server() as (_, host, port), aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"http://{host}:{port}/echo", data=b"x" * 100) as response:
                assert response.status == 200 and await response.read() == b"x" * 100
        async with http.post(f"http://{host}:{port}/echo", data=upload()) as response:
            assert await response.read() == b"abcdef"
        async with http.get(f"http://{host}:{port}/stream?3") as response:
            assert len(await response.read()) == 3 * 32768
