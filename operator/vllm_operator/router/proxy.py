"""The forwarding path of `/v1/chat/completions` and `/v1/completions`.

Per request: auth → content type → size → JSON (body.py) → fields → prompt count → decision (decide.py) → body rewrite
(max_tokens, and `stream_options.include_usage` so that completion tokens can be counted) → least-loaded healthy
endpoint → forward → pass the answer back (SSE event by event, never buffered whole) while reading `finish_reason`
and `usage` out of it.

Timeouts (all answer 504 with an OpenAI-style body; once a stream has started, the 504 is sent as a final SSE
`data: {"error": ...}` event, since the status line is gone):
* connect: TCP connect to an engine; the endpoint is ejected and the request fails over to another one.
* first byte: streamed requests only — until the first body chunk (queueing + prefill). vLLM answers a non-streamed
  request only when generation has finished, so there only the total timeout applies.
* idle: longest gap between two streamed chunks.
* total: the whole request, from its arrival at the router.

Failover: a request goes to another endpoint when it could not be delivered (connect error or timeout, connection
dropped before any answer) or when the engine answered 5xx before anything reached the client; at most
MAX_ATTEMPTS endpoints are tried, so one request that makes engines fail cannot eject a whole pool for longer than
one health-check interval.

A client that goes away cancels the handler (server.py cancels the request's task), which closes the upstream
connection, and vLLM aborts a request whose connection closed — the engine stops generating. The router counts that
choice as finished_reason `abort` (vLLM itself does not count disconnects).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from vllm_operator import constants
from vllm_operator.api.router_config import RouterConfig
from vllm_operator.router import http1
from vllm_operator.router.access import AccessLog
from vllm_operator.router.auth import Auth
from vllm_operator.router.body import decode_body, too_deep
from vllm_operator.router.decide import (
    REASON_INVALID,
    SHOWN_CHARS,
    Decision,
    Limits,
    Refusal,
    Route,
    decide,
    requested_max_tokens,
    shown,
)
from vllm_operator.router.metrics import RouterMetrics
from vllm_operator.router.server import BodyError, Request, Response, StreamResponse
from vllm_operator.router.tokens import Count, Prompt, TokenCounter, extract_prompt
from vllm_operator.router.upstreams import CAUSE_5XX, CAUSE_CONNECT, Endpoint, Pool

log = logging.getLogger(__name__)

HEADER_PROMPT_TOKENS: Final = "x-vllm-operator-prompt-tokens"
HEADER_COUNT_METHOD: Final = "x-vllm-operator-prompt-tokens-method"
HEADER_POOL: Final = "x-vllm-operator-pool"
HEADER_MAX_TOKENS: Final = "x-vllm-operator-max-tokens"
MAX_ATTEMPTS: Final = 3
WAKE_RETRY_AFTER_S: Final = 30
"""Retry-After of a request whose pool did not wake within its budget: the pool may still be starting its engine."""
THREAD_COUNT_CHARS: Final = 4096
"""Prompts longer than this that need a count are tokenized in a worker thread (the tokenizer releases the GIL), so a
long prompt does not hold the event loop; a shorter one costs the loop a few milliseconds at most. It was 32 KiB:
a 30,000-character prompt then held the loop for 56-80 ms (benchmarks/router/loop_stall.py). Counting in slices
with an early stop was tried and dropped: the worker thread's GIL hand-offs between slices doubled the loop's p99
lateness against one whole count in the thread."""
_JSON: Final = "application/json"
_FINISH = re.compile(rb'"finish_reason":\s*"(\w+)"')
_USAGE = re.compile(rb'"usage":\s*\{')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d+)')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_DONE: Final = b"data: [DONE]"
_FORWARD_HEADERS: Final = ("x-request-id", "traceparent", "tracestate")
_encode: Final = msgspec.json.Encoder().encode
"""The body is decoded (body.py) and re-encoded with msgspec: the engine gets the canonical body the router decided
on, never duplicate keys or other parser differentials."""


_UPSTREAM_CUT: Final = Refusal(502, "The engine closed the connection before its answer was complete.",
                               "upstream_disconnected", code="upstream_disconnected", type="upstream_error")


def error_response(refusal: Refusal, headers: Mapping[str, str] | None = None) -> Response:
    return Response(refusal.status, json.dumps(refusal.body()).encode(), headers, content_type=_JSON)


def _bad(message: str, param: str | None = None, status: int = 400, code: str = "invalid_value") -> Refusal:
    return Refusal(status, message, REASON_INVALID, param=param, code=code)


class _Retry(Exception):
    """This endpoint could not take the request; try another one."""

    def __init__(self, kind: str, status: int | None = None, body: bytes = b"", content_type: str = _JSON) -> None:
        super().__init__(kind)
        self.kind = kind
        self.status = status
        self.body = body
        self.content_type = content_type


class _Timeout(Exception):
    def __init__(self, which: str, seconds: float) -> None:
        super().__init__(which)
        self.which = which
        self.seconds = seconds

    def refusal(self) -> Refusal:
        return Refusal(504, f"The engine did not answer within the router's {self.which} timeout of "
                       f"{self.seconds:g} s.", f"timeout_{self.which.replace('-', '_')}", code="upstream_timeout",
                       type="timeout_error")


def adapter_limits(limits: Limits, pools: Sequence[str]) -> Limits:
    """`limits` with the pools that do not serve an adapter disabled."""
    return dataclasses.replace(
        limits, short=dataclasses.replace(limits.short, enabled=limits.short.enabled and limits.short.name in pools),
        long=dataclasses.replace(limits.long, enabled=limits.long.enabled and limits.long.name in pools))


def model_not_found(model: object) -> Refusal:
    """OpenAI's answer for a model it does not serve (404, invalid_request_error, code model_not_found); the
    official clients raise NotFoundError for it."""
    name = model if isinstance(model, str) and len(model) <= SHOWN_CHARS else shown(model)
    return Refusal(404, f"The model `{name}` does not exist or you do not have access to it.", REASON_INVALID,
                   param="model", code="model_not_found")


class _Prepared:
    __slots__ = ("body", "chat", "client_usage", "count", "limits", "prompt", "route", "stream")

    def __init__(self, chat: bool, stream: bool, client_usage: bool, route: Route, count: Count, body: bytes,
                 prompt: Prompt, limits: Limits):
        self.limits = limits
        self.prompt = prompt
        self.chat = chat
        self.stream = stream
        self.client_usage = client_usage
        self.route = route
        self.count = count
        self.body = body


class _Note:
    """What the access log line says about a request, filled in as the request goes.

    `answered`: the whole answer was handed to the client (a stream's `data: [DONE]` written). A client that closes
    its connection right after `[DONE]` (the OpenAI clients do) cancels the handler while it still waits for the
    engine's end of stream; that request was served, not aborted, and is counted with its status, not as 499."""

    __slots__ = ("answered", "count", "requested", "tier", "upstream")

    def __init__(self) -> None:
        self.tier = "-"
        self.requested: int | None = None
        self.count: Count | None = None
        self.upstream = "-"
        self.answered = False


class _Outcome:
    """What was learnt from one answer, for the metrics."""

    __slots__ = ("completion_tokens", "finish", "prompt_tokens")

    def __init__(self) -> None:
        self.finish: list[bytes] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def scan(self, data: bytes) -> None:
        if b'"finish_reason"' in data:
            self.finish.extend(_FINISH.findall(data))
        if b'"usage"' in data and _USAGE.search(data):
            p, c = _PROMPT_TOKENS.search(data), _COMPLETION_TOKENS.search(data)
            if p:
                self.prompt_tokens = int(p.group(1))
            if c:
                self.completion_tokens = int(c.group(1))


class Router:
    """Handlers for the two model endpoints; owns nothing but references."""

    def __init__(self, config: RouterConfig, counter: TokenCounter, auth: Auth, pools: Mapping[str, Pool],
                 metrics: RouterMetrics, upstream: http1.Pool, access: AccessLog | None = None) -> None:
        self.config = config
        self.limits = Limits.from_config(config)
        self.model_limits = {config.model: self.limits, **{
            name: adapter_limits(self.limits, pools) for name, pools in (config.adapters or {}).items()}}
        """The limits per model name a request may send: the base model's, and each adapter's with the pools that
        do not serve it disabled (so length routing, caps and the fallback see only pools that can answer)."""
        self.counter = counter
        self.auth = auth
        self.pools = pools
        self.metrics = metrics
        self.upstream = upstream
        t = config.timeouts
        self.connect_s, self.first_byte_s, self.idle_s, self.total_s = (
            t.connect_seconds, t.first_byte_seconds, t.idle_seconds, t.total_seconds)
        self.retry_after = str(max(1, math.ceil(config.health.interval_seconds)))
        self.wake_seconds = {name: route.wake_seconds for name, route in
                             ((constants.POOL_SHORT, config.pools.short), (constants.POOL_LONG, config.pools.long))
                             if route.wake_seconds is not None}
        self.access = access if access is not None else AccessLog(config.access_log)

    async def chat(self, request: Request) -> Response | StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: Request) -> Response | StreamResponse:
        return await self._serve(request, chat=False)

    # ------------------------------------------------------------------------------------------------ prepare

    async def _prepare(self, request: Request, chat: bool,
                       note: _Note) -> _Prepared | Refusal | tuple[Refusal, Count]:
        tier = self.auth.tier_for(request.headers.get("authorization"))
        if isinstance(tier, Refusal):
            return tier
        note.tier = tier.name
        if request.content_type != _JSON:
            return _bad(f"Content-Type must be {_JSON}, got {shown(request.headers.get('content-type', 'none'))}",
                        status=415, code="unsupported_media_type")
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return _bad(f"request body of {length} bytes exceeds the limit of {limit} bytes", status=413,
                        code="request_too_large")
        try:
            raw = await request.read()
        except BodyError as err:
            if err.status == 413:
                return _bad(f"request body exceeds the limit of {limit} bytes", status=413, code="request_too_large")
            return _bad(err.message)
        body = decode_body(raw)
        if isinstance(body, Refusal):
            return body
        model = body.get("model")
        if model is None:
            return _bad("'model' is a required field", param="model")
        model_limits = self.model_limits.get(model) if isinstance(model, str) else None
        if model_limits is None:
            return model_not_found(model)
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            return _bad(f"'stream' must be a boolean, got {shown(stream)}", param="stream")
        prompt = extract_prompt(chat, body)
        if isinstance(prompt, Refusal):
            return prompt
        requested, refusal = requested_max_tokens(body)
        if refusal is not None:
            return refusal
        note.requested = requested
        limits, param = model_limits, "messages" if chat else "prompt"

        def decide_at(n: int) -> Decision:
            return decide(n, requested, tier, limits, prompt_param=param)

        if self.counter.has_tokenizer and sum(map(len, prompt.texts)) > THREAD_COUNT_CHARS:
            decision, count = await asyncio.to_thread(self.counter.settle, prompt, decide_at)
        else:
            decision, count = self.counter.settle(prompt, decide_at)
        self.metrics.child(self.metrics.token_counts, count.method).inc()
        note.count = count
        if isinstance(decision, Refusal):
            return decision, count
        keys = [k for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None] or ["max_tokens"]
        for key in keys:
            body[key] = decision.max_tokens
        client_usage = False
        if stream:
            options = body.get("stream_options")
            client_usage = isinstance(options, dict) and options.get("include_usage") is True
            if not client_usage:
                body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        out = _encode(body)
        return _Prepared(chat, bool(stream), client_usage, decision, count, out, prompt, limits)

    def _choose_pool(self, route: Route, limits: Limits) -> str:
        """The decided pool, or the long one when the short pool has nobody healthy and the long pool can take it
        (and serves the requested model)."""
        name = route.pool
        if name == constants.POOL_SHORT and self.pools[name].healthy_count == 0:
            long = limits.long
            if long.enabled and self.pools[long.name].healthy_count > 0 and route.max_tokens <= long.max_tokens:
                self.metrics.pool_fallbacks.inc()
                return long.name
        return name

    # ------------------------------------------------------------------------------------------------ serve

    async def _serve(self, request: Request, chat: bool) -> Response | StreamResponse:
        start = time.perf_counter()
        endpoint = "chat" if chat else "completions"
        note = _Note()
        try:
            prepared = await self._prepare(request, chat, note)
        except RecursionError:  # a body the decoder just got through, one frame deeper (body.py)
            prepared = too_deep()
        if not isinstance(prepared, _Prepared):
            refusal, counted = prepared if isinstance(prepared, tuple) else (prepared, None)
            self.metrics.child(self.metrics.refusals, refusal.reason).inc()
            self.metrics.child(self.metrics.requests, "none", endpoint, str(refusal.status)).inc()
            if self.access.enabled:
                self._log_access(request, refusal.status, "none", None, note, start)
            if counted is None:
                return error_response(refusal)
            return error_response(refusal, {HEADER_PROMPT_TOKENS: str(counted.tokens),
                                            HEADER_COUNT_METHOD: counted.method})
        route = prepared.route
        pool_name = self._choose_pool(route, prepared.limits)
        for cap in route.clamps:
            self.metrics.child(self.metrics.clamps, pool_name, cap).inc()
        headers = {
            HEADER_POOL: pool_name,
            HEADER_PROMPT_TOKENS: str(prepared.count.tokens),
            HEADER_COUNT_METHOD: prepared.count.method,
            HEADER_MAX_TOKENS: str(route.max_tokens),
        }
        upstream_headers = {"Content-Type": _JSON}
        for name in _FORWARD_HEADERS:
            value = request.headers.get(name)
            if value is not None:
                upstream_headers[name] = value
        self.metrics.overhead.observe(time.perf_counter() - start)
        woken = await self._wake(pool_name)
        if woken is not None:
            self.metrics.child(self.metrics.requests, pool_name, endpoint, str(woken.status)).inc()
            if self.access.enabled:
                self._log_access(request, woken.status, pool_name, route.max_tokens, note, start)
            return error_response(woken, {**headers, "Retry-After": str(WAKE_RETRY_AFTER_S)})
        in_flight = self.metrics.child(self.metrics.in_flight, pool_name)
        in_flight.inc()
        status = 0
        try:
            response = await self._forward(request, prepared, self.pools[pool_name], headers, upstream_headers,
                                           start, note)
            status = response.status
            return response
        except asyncio.CancelledError:
            if note.answered:
                status = 200
            else:
                status = 499
                self.metrics.child(self.metrics.client_disconnects, pool_name).inc()
            raise
        finally:
            in_flight.dec()
            self.metrics.child(self.metrics.requests, pool_name, endpoint, str(status)).inc()
            self.metrics.child(self.metrics.duration, pool_name).observe(time.perf_counter() - start)
            if self.access.enabled:
                self._log_access(request, status, pool_name, route.max_tokens, note, start)

    async def _wake(self, pool_name: str) -> Refusal | None:
        """Hold a request for a pool at zero replicas until it has a healthy endpoint (None), at most the pool's
        wake budget; past it the refusal to answer (503). Held requests are exported per pool: KEDA's activation
        trigger on them is what wakes the pool (docs/architecture.md, Autoscaling)."""
        pool = self.pools[pool_name]
        budget = self.wake_seconds.get(pool_name)
        if budget is None or pool.healthy_count:
            return None
        held = self.metrics.child(self.metrics.held, pool_name)
        held.inc()
        waited = time.monotonic()
        try:
            if await pool.wait_healthy(budget):
                log.info("Released a request held %.1f s for pool %s, which woke", time.monotonic() - waited,
                         pool_name)
                return None
        finally:
            held.dec()
        return Refusal(503, f"The {pool_name} pool is waking from zero replicas and had no healthy endpoint within "
                       f"{budget:.0f} s; retry later.", "pool_waking", code="pool_waking", type="service_unavailable")

    def _log_access(self, request: Request, status: int, pool: str, sent: int | None, note: _Note,
                    start: float) -> None:
        """`POST /v1/chat/completions 200 pool=short tier=free prompt_tokens=412 count=bound requested_max_tokens=-
        max_tokens=256 upstream=http://10.0.0.7:8000 latency_ms=31.4`: max_tokens as the client sent it and as the
        engine got it; 499 = the client left; `-` = none (not sent, not counted, no pool, no upstream tried)."""
        count = note.count
        requested = note.requested
        self.access.write(
            f"{request.method} {request.path} {status} pool={pool} tier={note.tier} "
            f"prompt_tokens={'-' if count is None else count.tokens} count={'-' if count is None else count.method} "
            f"requested_max_tokens={'-' if requested is None else requested} max_tokens={'-' if sent is None else sent}"
            f" upstream={note.upstream} latency_ms={(time.perf_counter() - start) * 1000:.1f}")

    async def _forward(self, request: Request, prepared: _Prepared, pool: Pool, headers: dict[str, str],
                       upstream_headers: dict[str, str], start: float, note: _Note) -> Response | StreamResponse:
        tried: list[Endpoint] = []
        last: _Retry | None = None
        deadline = asyncio.get_running_loop().time() + self.total_s - (time.perf_counter() - start)
        key = await pool.route_key(prepared.prompt)
        while len(tried) < MAX_ATTEMPTS:
            endpoint = pool.pick(tried, key)
            if endpoint is None:
                break
            if tried:
                self.metrics.child(self.metrics.failovers, pool.name).inc()
            tried.append(endpoint)
            note.upstream = endpoint.url
            endpoint.outstanding += 1
            try:
                return await self._attempt(request, prepared, pool, endpoint, headers, upstream_headers, start,
                                           deadline, note)
            except _Retry as retry:
                last = retry
                self.metrics.child(self.metrics.upstream_errors, pool.name, retry.kind).inc()
                pool.eject(endpoint, CAUSE_5XX if retry.status else CAUSE_CONNECT)
            except _Timeout as timeout:
                kind = f"timeout_{timeout.which.replace('-', '_')}"
                self.metrics.child(self.metrics.upstream_errors, pool.name, kind).inc()
                if timeout.which == "connect":
                    pool.eject(endpoint, CAUSE_CONNECT)
                    last = _Retry("timeout_connect")
                    continue
                return error_response(timeout.refusal(), headers)
            finally:
                endpoint.outstanding -= 1
        if last is not None and last.status is not None:  # every try answered 5xx: pass the engine's answer on
            return Response(last.status, last.body, headers, content_type=last.content_type)
        if last is not None and last.kind == "timeout_connect":
            return error_response(_Timeout("connect", self.connect_s).refusal(), headers)
        refusal = Refusal(503, f"No healthy endpoint in the {pool.name} pool"
                          + (f" ({len(tried)} tried)" if tried else "") + "; retry later.",
                          "no_healthy_endpoint", code="no_healthy_endpoint", type="service_unavailable")
        return error_response(refusal, {**headers, "Retry-After": self.retry_after})

    async def _attempt(self, request: Request, prepared: _Prepared, pool: Pool, endpoint: Endpoint,
                       headers: dict[str, str], upstream_headers: dict[str, str], start: float,
                       deadline: float, note: _Note) -> Response | StreamResponse:
        loop = asyncio.get_running_loop()
        first_byte_deadline = min(deadline, loop.time() + self.first_byte_s) if prepared.stream else deadline
        try:
            upstream = await self.upstream.post(endpoint.host, endpoint.port, request.path, prepared.body,
                                                upstream_headers, connect_timeout=self.connect_s,
                                                deadline=first_byte_deadline)
        except http1.ConnectTimeout as err:
            raise _Timeout("connect", self.connect_s) from err
        except TimeoutError as err:
            which = "first-byte" if first_byte_deadline < deadline else "total"
            raise _Timeout(which, self.first_byte_s if which == "first-byte" else self.total_s) from err
        except (http1.ConnectError, http1.Disconnected) as err:
            log.info("Could not deliver a request to %s (%s)", endpoint.url, err)
            raise _Retry("connect" if isinstance(err, http1.ConnectError) else "disconnected") from err
        try:
            upstream.deadline = deadline
            if upstream.status >= 500:
                try:
                    body = await upstream.read()
                except (TimeoutError, http1.Disconnected):
                    body = b""
                raise _Retry("status_5xx", upstream.status, body, upstream.content_type or _JSON)
            if prepared.stream and upstream.status == 200 and upstream.content_type == "text/event-stream":
                return await self._relay_stream(request, prepared, pool, upstream, headers, start,
                                                first_byte_deadline, deadline, note)
            return await self._relay_whole(prepared, pool, upstream, headers, start, deadline)
        finally:
            upstream.close()

    async def _relay_whole(self, prepared: _Prepared, pool: Pool, upstream: http1.Response,
                           headers: dict[str, str], start: float, deadline: float) -> Response | StreamResponse:
        try:
            body = await upstream.read()  # bounded by upstream.deadline = the total deadline
        except TimeoutError as err:
            raise _Timeout("total", self.total_s) from err
        except http1.Disconnected:
            self.metrics.child(self.metrics.upstream_errors, pool.name, "disconnected").inc()
            self.metrics.child(self.metrics.finished, pool.name, "error").inc()
            return error_response(_UPSTREAM_CUT, headers)
        self.metrics.child(self.metrics.ttft, pool.name).observe(time.perf_counter() - start)
        if upstream.status == 200:
            outcome = _Outcome()
            outcome.scan(body)
            self._account(pool.name, prepared, outcome, None)
        return Response(upstream.status, body, headers, content_type=upstream.headers.get("content-type", _JSON))

    async def _relay_stream(self, request: Request, prepared: _Prepared, pool: Pool,
                            upstream: http1.Response, headers: dict[str, str], start: float,
                            first_byte_deadline: float, deadline: float, note: _Note) -> Response | StreamResponse:
        """Relay SSE events as they complete. The client's response starts with the engine's first body chunk, so
        a first-byte timeout (or an engine that drops before answering) is still a proper 504/502 status."""
        loop = asyncio.get_running_loop()
        upstream.deadline = first_byte_deadline
        try:
            data = await upstream.readany()
        except TimeoutError as err:
            which = "total" if first_byte_deadline >= deadline else "first-byte"
            raise _Timeout(which, self.total_s if which == "total" else self.first_byte_s) from err
        except http1.Disconnected as err:
            raise _Retry("disconnected") from err
        self.metrics.child(self.metrics.ttft, pool.name).observe(time.perf_counter() - start)
        response = StreamResponse(200, {
            **headers, "Content-Type": upstream.headers.get("content-type", "text/event-stream"),
            "Cache-Control": "no-cache"})
        await response.prepare(request)
        outcome = _Outcome()
        pending = b""
        ended_by: str | None = None
        accounted = False  # counted when [DONE] passes, before the client can read it and look at the metrics
        idle_s = self.idle_s
        try:
            # The idle and total deadlines bound each wait for the engine (upstream.deadline, moved after every
            # chunk: no timer per chunk) and, only when the client makes us wait, each write.
            while data:
                pending += data
                cut = pending.rfind(b"\n\n")
                if cut >= 0:
                    events, pending = pending[: cut + 2], pending[cut + 2 :]
                    outcome.scan(events)
                    if not prepared.client_usage and b'"usage"' in events:
                        events = _drop_usage_events(events)
                    if _DONE in events and not accounted:
                        self._account(pool.name, prepared, outcome, None)
                        accounted = True
                    if events:
                        if response.must_wait:
                            async with asyncio.timeout_at(min(deadline, loop.time() + idle_s)):
                                await response.write(events)
                        else:
                            await response.write(events)
                        if _DONE in events:
                            note.answered = True
                upstream.deadline = min(deadline, loop.time() + idle_s)
                data = await upstream.readany()
        except TimeoutError:
            which = "total" if loop.time() >= deadline - 0.001 else "idle"
            seconds = self.total_s if which == "total" else self.idle_s
            self.metrics.child(self.metrics.upstream_errors, pool.name, f"timeout_{which}").inc()
            ended_by = "error"
            await _write_quietly(response, b"data: " + json.dumps(_Timeout(which, seconds).refusal().body()).encode()
                                 + b"\n\n")
        except http1.Disconnected:
            self.metrics.child(self.metrics.upstream_errors, pool.name, "disconnected").inc()
            ended_by = "error"
            await _write_quietly(response, b"data: " + json.dumps(_UPSTREAM_CUT.body()).encode() + b"\n\n")
        except (ConnectionError, RuntimeError):  # the client went away while we wrote
            if not note.answered:
                self.metrics.child(self.metrics.client_disconnects, pool.name).inc()
                ended_by = "abort"
        except asyncio.CancelledError:  # the client went away (server.py cancels the handler)
            if not accounted:
                self._account(pool.name, prepared, outcome, None if note.answered else "abort")
            raise
        if pending and ended_by is None:
            outcome.scan(pending)
            if _DONE in pending and not accounted:
                self._account(pool.name, prepared, outcome, None)
                accounted = True
            await _write_quietly(response, pending)
            if _DONE in pending:
                note.answered = True
        if not accounted:
            self._account(pool.name, prepared, outcome, ended_by)
        await _write_eof_quietly(response)
        return response

    def _account(self, pool: str, prepared: _Prepared, outcome: _Outcome, ended_by: str | None) -> None:
        m = self.metrics
        reasons = outcome.finish or ([ended_by.encode()] if ended_by else [])
        for reason in reasons:
            m.child(m.finished, pool, reason.decode()).inc()
        prompt = outcome.prompt_tokens if outcome.prompt_tokens is not None else prepared.count.tokens
        m.child(m.prompt_tokens, pool).inc(prompt)
        if outcome.completion_tokens is not None:
            m.child(m.completion_tokens, pool).inc(outcome.completion_tokens)


def _drop_usage_events(events: bytes) -> bytes:
    """Remove the usage-only event the router asked for and the client did not (its `choices` are empty)."""
    kept = []
    for event in events.split(b"\n\n"):
        if event and _USAGE.search(event) and re.search(rb'"choices":\s*\[\s*\]', event):
            continue
        kept.append(event)
    return b"\n\n".join(kept)


async def _write_quietly(response: StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write(data)


async def _write_eof_quietly(response: StreamResponse) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
