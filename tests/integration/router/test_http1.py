"""The router's upstream HTTP/1.1 client against scripted raw TCP servers: framing (Content-Length, chunked split at
every byte, read-until-close), keep-alive reuse, the stale keep-alive retry, aborts that reach the server, backpressure
and malformed answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from vllm_operator.router import http1

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, int, list[int]]]:
    """A TCP server running `handler` per connection; yields host, port and a list of connection counts."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield "127.0.0.1", port, connections
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


async def post(pool: http1.Pool, host: str, port: int, body: bytes = b"{}") -> http1.Response:
    return await pool.post(host, port, "/v1/completions", body, {"Content-Type": "application/json"},
                           connect_timeout=2)


async def test_content_length_and_keep_alive_reuse() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(ok(b'{"n": %d}' % len(seen)))
            await writer.drain()

    async with raw_server(handler) as (host, port, connections):
        pool = http1.Pool()
        for i in (1, 2, 3):
            response = await post(pool, host, port, b'{"x": 1}')
            assert response.status == 200
            assert response.content_type == "application/json"
            assert await response.read() == b'{"n": %d}' % i
            response.close()
        pool.close()
    assert len(connections) == 1, "one keep-alive connection for three requests"
    assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Length: 8\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"x": 1}')


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"b\r\ndata: one\n\n\r\n"
           b"B;ext=1\r\ndata: two\n\n\r\n"
           b"0\r\nX-Trailer: t\r\n\r\n")


@pytest.mark.parametrize("step", [1, 3, 7, len(CHUNKED)], ids=["byte-by-byte", "3-bytes", "7-bytes", "at-once"])
async def test_chunked_body_split_anywhere(step: int) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(0, len(CHUNKED), step):
            writer.write(CHUNKED[i: i + step])
            await writer.drain()
            await asyncio.sleep(0)
        await read_request(reader)  # keep-alive: a second request on the same connection
        writer.write(ok(b"second"))
        await writer.drain()

    async with raw_server(handler) as (host, port, connections):
        pool = http1.Pool()
        response = await post(pool, host, port)
        assert response.content_type == "text/event-stream"
        assert await response.read() == b"data: one\n\ndata: two\n\n"
        response.close()
        second = await post(pool, host, port)
        assert await second.read() == b"second"
        pool.close()
    assert len(connections) == 1


async def test_body_until_close_and_connection_close_header() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async with raw_server(handler) as (host, port, connections):
        pool = http1.Pool()
        for _ in range(2):
            response = await post(pool, host, port)
            assert await response.read() == b"all of it"
            response.close()
        pool.close()
    assert len(connections) == 2, "a closed connection is not reused"


async def test_stale_keep_alive_connection_is_retried_fresh() -> None:
    """The server closes each connection right after answering (as an idle timeout would): the next request on the
    pooled connection fails before any byte, and the client retries once on a new connection."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"fine"))  # says keep-alive, then closes anyway
        await writer.drain()

    async with raw_server(handler) as (host, port, connections):
        pool = http1.Pool()
        for _ in range(3):
            response = await post(pool, host, port)
            assert await response.read() == b"fine"
            response.close()
            await asyncio.sleep(0.05)  # let the FIN arrive (or not: both paths must work)
        pool.close()
    assert len(connections) == 3


async def test_close_before_the_end_aborts_the_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()  # returns b"" when the client aborted
        closed.set()

    async with raw_server(handler) as (host, port, _):
        pool = http1.Pool()
        response = await post(pool, host, port)
        assert await response.readany() == b"first"
        response.close()
        await asyncio.wait_for(closed.wait(), 5)
        pool.close()


async def test_connection_lost_mid_body_is_disconnected() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.transport.abort()

    async with raw_server(handler) as (host, port, _):
        pool = http1.Pool()
        response = await post(pool, host, port)
        with pytest.raises(http1.Disconnected):
            await response.read()
        pool.close()


@pytest.mark.parametrize("answer", [b"garbage\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"],
                         ids=["not-http", "bad-status", "bad-chunk-size"])
async def test_malformed_answers_are_protocol_errors(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async with raw_server(handler) as (host, port, _):
        pool = http1.Pool()
        with pytest.raises(http1.ProtocolError):
            response = await post(pool, host, port)
            await response.read()
        pool.close()


async def test_refused_and_timed_out_connects() -> None:
    pool = http1.Pool()
    async with raw_server(lambda r, w: asyncio.sleep(0)) as (host, port, _):
        pass  # now closed: nothing listens on port
    with pytest.raises(http1.ConnectError):
        await post(pool, host, port)
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    try:
        with pytest.raises(http1.ConnectTimeout):
            await pool.post("127.0.0.1", listener.getsockname()[1], "/", b"", {}, connect_timeout=0.3)
    finally:
        filler.close()
        listener.close()


async def test_backpressure_pauses_reading() -> None:
    """A large body that nobody reads stays mostly in the socket buffers, not in the client's memory."""
    size = 8 * 1024 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with raw_server(handler) as (host, port, _):
        pool = http1.Pool()
        response = await post(pool, host, port)
        await asyncio.sleep(0.5)
        assert response._buffered <= http1.HIGH_WATER + 1024 * 1024
        assert len(await response.read()) == size
        pool.close()
