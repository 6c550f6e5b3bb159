"""A fake vLLM engine server: vLLM's HTTP surface without a model, driven by tests.

Why it exists: the router, the health loop, the router benchmark and the GPU load generator all need an upstream
that *speaks* vLLM (the OpenAI-compatible endpoints with vLLM's response shapes, `/health`, `/tokenize` and the
Prometheus `/metrics` with vLLM's metric names) but whose timing, lengths, failures and metric values a test can
set and change while it runs. A real vLLM on CPU is used where the engine itself is under test (the e2e tier); this
server is for everything that needs control rather than a model.

What it imitates (read off vLLM 0.32/0.33's source and logs):

* `POST /v1/chat/completions`, `POST /v1/completions`: non-streaming JSON and SSE streaming (`data: {...}\\n\\n`
  chunks, `data: [DONE]`), `usage`, `finish_reason` `stop` or `length`, `stream_options.include_usage` and vLLM's
  `stream_options.continuous_usage_stats` (usage in every chunk).
* max_tokens as vLLM resolves it: `max_completion_tokens` or `max_tokens` (chat), else the server cap
  (`max_tokens_cap`, like `--override-generation-config '{"max_new_tokens":N}'`) for chat and 16 for
  `/v1/completions`; then clamped to the cap and to `max_model_len - prompt`. Prompt `>= max_model_len` and
  `max_tokens > max_model_len` are 400s with vLLM's messages.
* How long a generation is: with `ignore_eos: true` exactly the effective max_tokens (finish_reason `length`);
  otherwise `natural_tokens` (finish_reason `stop`) unless that reaches max_tokens first (`length`).
* Prompt tokens are counted as whitespace-separated words: the prompt string (or strings; a list of token ids counts
  its length) for completions, the text of every message's content for chat (no chat-template overhead).
  `/tokenize` counts the same way, so a client calibrating against it sees one token per word.
* `GET /health` (200 empty, 503 while `engine_dead`), `GET /v1/models`, and `GET /metrics` in the plain Prometheus
  text format 0.0.4 (not OpenMetrics, so Prometheus keeps the `vllm:` names) with labels `model_name` and
  `engine="0"`: `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
  `vllm:cache_config_info`, `vllm:request_success_total{finished_reason=...}` (all five reasons from the start),
  `vllm:num_preemptions_total`, `vllm:prompt_tokens_total`, `vllm:generation_tokens_total` and a few more.
  A client that disconnects mid-stream is not counted under any finished_reason (as vLLM does).

How tests drive it: every knob is a field of :class:`Behaviour`, set at construction and changed at run time with
:meth:`FakeVllm.configure` or `POST /_control` (JSON of fields). Metric values are pinned with
:meth:`FakeVllm.set_metric` or `POST /_control/metrics`. Every request that reached a model endpoint is recorded
(:class:`RecordedRequest`: method, path, headers, parsed body, outcome, tokens) and readable with
:meth:`FakeVllm.requests` or `GET /_control/requests`.

Speed: the proxy benchmark uses this as its upstream, so the non-streaming path with no delays does no sleeping and
builds its response from pre-encoded pieces; the request log is a bounded deque and can be switched off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any, Final, Literal, TypeVar, get_args

from aiohttp import web

log = logging.getLogger(__name__)

FailMode = Literal["none", "status", "drop", "hang", "drop_mid_stream"]
FINISHED_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
COMPLETIONS_DEFAULT_MAX_TOKENS: Final = 16
MODEL_PATHS: Final = ("/v1/chat/completions", "/v1/completions")
_JSON: Final = "application/json"
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_POLL_S: Final = 0.01


@dataclasses.dataclass
class Behaviour:
    """Every knob of the fake engine. Change any of them while it runs; in-flight requests see the change."""

    model: str = "fake-model"
    """Served model name: requests naming another model get vLLM's 404."""
    max_model_len: int = 4096
    """Context length used for the length checks and the max_tokens clamp."""
    max_tokens_cap: int | None = None
    """Server-side max_new_tokens (vLLM's `--override-generation-config`): default for chat and hard cap."""
    natural_tokens: int = 16
    """Tokens a request generates before its "EOS" (finish_reason stop) unless max_tokens ends it first."""
    token_text: str = " tok"
    """Text of every generated token."""
    ttft_s: float = 0.0
    """Delay before the first token (streaming: after the response headers, as vLLM sends headers at once)."""
    chunk_delay_s: float = 0.0
    """Delay between consecutive tokens; a non-streaming answer takes ttft_s + (n-1) * chunk_delay_s."""
    headers_before_ttft: bool = True
    """Streaming sends its headers before the first-token delay (vLLM does); False holds them back as well."""
    max_num_seqs: int | None = None
    """Requests generating at once; the rest wait (counted in vllm:num_requests_waiting). None = unlimited."""
    fail_mode: FailMode = "none"
    """Failure injected into model requests: `status` answers fail_status with an OpenAI error body; `drop` closes
    the connection without answering; `hang` never answers (until the client goes away); `drop_mid_stream` sends
    headers and fail_after_chunks tokens, then closes the connection."""
    fail_status: int = 500
    """HTTP status for fail_mode `status`."""
    fail_count: int | None = None
    """How many more model requests fail; None = all of them. Counts down; at 0 fail_mode goes back to `none`."""
    fail_after_chunks: int = 1
    """Tokens sent before the connection is dropped in fail_mode `drop_mid_stream`."""
    engine_dead: bool = False
    """vLLM with a dead engine core (KEEP_ALIVE mode): /health 503, model requests 500 and in-flight ones cut off;
    /metrics and /v1/models still 200."""
    stall: bool = False
    """Stuck engine: requests are admitted and counted as running but no token is produced until this is cleared."""
    kv_cache_size_tokens: int = 65536
    """KV cache size; vllm:kv_cache_usage_perc is (prompt + generated tokens of running requests) / this."""
    block_size: int = 16
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    record: bool = True
    """Record requests (see FakeVllm.requests). Switch off for benchmarks."""
    log_limit: int = 10000
    """Most recent requests kept in the log."""

    def validate(self) -> None:
        """Raise ValueError naming the field when a value cannot work."""
        positive = ("max_model_len", "kv_cache_size_tokens", "block_size", "log_limit")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("natural_tokens", "fail_after_chunks"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("ttft_s", "chunk_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        for name in ("max_tokens_cap", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or null, got {value}")
        if self.fail_count is not None and self.fail_count < 0:
            raise ValueError(f"fail_count must be >= 0 or null, got {self.fail_count}")
        if self.fail_mode not in get_args(FailMode):
            raise ValueError(f"fail_mode must be one of {list(get_args(FailMode))}, got {self.fail_mode!r}")
        if not 100 <= self.fail_status <= 599:
            raise ValueError(f"fail_status must be an HTTP status 100-599, got {self.fail_status}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELD_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "model": (str,),
    "max_model_len": (int,),
    "max_tokens_cap": (int, type(None)),
    "natural_tokens": (int,),
    "token_text": (str,),
    "ttft_s": (int, float),
    "chunk_delay_s": (int, float),
    "headers_before_ttft": (bool,),
    "max_num_seqs": (int, type(None)),
    "fail_mode": (str,),
    "fail_status": (int,),
    "fail_count": (int, type(None)),
    "fail_after_chunks": (int,),
    "engine_dead": (bool,),
    "stall": (bool,),
    "kv_cache_size_tokens": (int,),
    "block_size": (int,),
    "cache_dtype": (str,),
    "gpu_memory_utilization": (int, float),
    "record": (bool,),
    "log_limit": (int,),
}
assert set(_FIELD_TYPES) == {f.name for f in dataclasses.fields(Behaviour)}


def apply_changes(current: Behaviour, changes: Mapping[str, Any]) -> Behaviour:
    """Return a validated copy of `current` with `changes`; ValueError names an unknown field or a wrong type."""
    for key, value in changes.items():
        types = _FIELD_TYPES.get(key)
        if types is None:
            raise ValueError(f"unknown behaviour field {key!r}; known: {sorted(_FIELD_TYPES)}")
        # bool is an int subclass: refuse True for an int field and 1 for a bool field.
        wrong_bool = isinstance(value, bool) and bool not in types
        if wrong_bool or not isinstance(value, types):
            names = "/".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"behaviour field {key!r} must be {names}, got {value!r}")
    updated = dataclasses.replace(current, **changes)
    updated.validate()
    return updated


@dataclasses.dataclass
class RecordedRequest:
    """One request that reached a model endpoint (or /tokenize), as the engine saw it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    """Parsed JSON body, or None when the body was not JSON (then `raw` has it)."""
    raw: bytes
    received_at: float
    """time.time() at arrival."""
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    """The effective max_tokens the engine used (after defaults, caps and the context clamp)."""
    completion_tokens: int = 0
    """Tokens generated so far (final once `outcome` is set)."""
    outcome: str = "pending"
    """pending | stop | length | disconnected | failed:<mode> | engine_dead | rejected:<status>"""

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": dict(self.headers),
            "body": self.body,
            "raw": None if self.body is not None else self.raw.decode("utf-8", "replace"),
            "received_at": self.received_at,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "completion_tokens": self.completion_tokens,
            "outcome": self.outcome,
        }


class RequestError(Exception):
    """An OpenAI-style error answer (status, message, type, param)."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}
        return web.Response(status=self.status, body=json.dumps(body).encode(), content_type=_JSON)


def count_words(text: str) -> int:
    """The fake's tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def count_prompt_tokens(path: str, body: Mapping[str, Any]) -> int:
    """Prompt tokens of a request body by the fake's rule (see the module docstring)."""
    if path == "/v1/chat/completions" or "messages" in body:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        total = 0
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                raise RequestError(400, f"messages[{i}] must be an object", param="messages")
            content = message.get("content")
            if isinstance(content, str):
                total += count_words(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        total += count_words(part["text"])
            elif content is not None:
                raise RequestError(400, f"messages[{i}].content must be a string or a list of parts", param="messages")
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_words(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return count_words(prompt[0])
        if len(prompt) == 1 and isinstance(prompt[0], list):
            return len(prompt[0])
        raise RequestError(400, "the fake serves one prompt per request (a string, [string] or token ids)", "prompt")
    raise RequestError(400, "'prompt' must be a string or a list of token ids", param="prompt")


def _int_field(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{name} must be an integer, got {value!r}", param=name)
    if value < 1:
        raise RequestError(400, f"{name} must be at least 1, got {value}", param=name)
    return value


def resolve_max_tokens(path: str, body: Mapping[str, Any], prompt_tokens: int, b: Behaviour) -> int:
    """The max_tokens vLLM would use for this request, or the 400 it would answer."""
    if prompt_tokens >= b.max_model_len:
        raise RequestError(
            400,
            f"This model's maximum context length is {b.max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. "
            "Please reduce the length of the input.",
            param="messages" if path == "/v1/chat/completions" else "prompt",
        )
    if path == "/v1/chat/completions":
        asked = _int_field(body, "max_completion_tokens") or _int_field(body, "max_tokens")
        default = b.max_tokens_cap
    else:
        asked = _int_field(body, "max_tokens")
        default = COMPLETIONS_DEFAULT_MAX_TOKENS
    if asked is not None and asked > b.max_model_len:
        raise RequestError(
            400,
            f"max_tokens={asked} cannot be greater than max_model_len={b.max_model_len}. "
            "Please request fewer output tokens.",
            param="max_tokens",
        )
    room = b.max_model_len - prompt_tokens
    want = asked if asked is not None else (default if default is not None else room)
    if b.max_tokens_cap is not None:
        want = min(want, b.max_tokens_cap)
    return min(want, room)


def _sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _token_chunk(
    head: Mapping[str, Any], chat: bool, text: str, finish: str | None, usage: Mapping[str, int] | None = None
) -> bytes:
    """One streamed token as vLLM frames it (chat: a `delta`; completions: `text`); with vLLM's
    `stream_options.continuous_usage_stats` every chunk also carries the usage so far."""
    piece: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
    choice = {"index": 0, **piece, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    event: dict[str, Any] = {**head, "choices": [choice]}
    if usage is not None:
        event["usage"] = dict(usage)
    return _sse(event)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class _Metrics:
    """The engine's counters and gauges; `overrides` pin a rendered value (gauges) or extra series."""

    def __init__(self) -> None:
        self.finished: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.admission_rejections = 0
        self.running = 0
        self.waiting = 0
        self.kv_tokens_in_use = 0
        self.overrides: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}


_COUNTER_ATTRS: Final = {
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:admission_rejections_total": "admission_rejections",
}
_GAUGES: Final = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_HELP: Final = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means awake.",
    "vllm:cache_config_info": "Information of the LLMEngine CacheConfig",
    "vllm:request_success_total": "Count of successfully processed requests.",
    "vllm:prompt_tokens_total": "Number of prefill tokens processed.",
    "vllm:generation_tokens_total": "Number of generation tokens processed.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:admission_rejections_total": "Requests rejected by admission control.",
}


def _fmt(value: float) -> str:
    return repr(float(value))


def _labels(pairs: Mapping[str, str] | tuple[tuple[str, str], ...]) -> str:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    inner = ",".join(f'{k}="{v}"' for k, v in items)
    return "{" + inner + "}"


@dataclasses.dataclass(frozen=True)
class _Job:
    """A model request that passed validation, on its way through the generation loop."""

    chat: bool
    body: Mapping[str, Any]
    stream: bool
    prompt_tokens: int
    n_tokens: int
    reason: str
    failure: FailMode
    record: RecordedRequest | None


class FakeVllm:
    """The fake engine. `async with FakeVllm(Behaviour(...)) as fake:` serves on 127.0.0.1 (a free port unless
    given); `fake.url` is its base URL. Knobs: :meth:`configure`; metrics: :meth:`set_metric`; log: :meth:`requests`.

    Methods are not thread-safe: from another thread (a sync test using the `openai` client) use :func:`run_in_thread`,
    whose handle marshals every call onto the server's loop.
    """

    def __init__(self, behaviour: Behaviour | None = None, *, host: str = "127.0.0.1", port: int = 0, **knobs: Any):
        base = behaviour or Behaviour()
        base.validate()
        self.behaviour = apply_changes(base, knobs) if knobs else base
        self._initial = self.behaviour
        self.host = host
        self.port = port
        self.metrics = _Metrics()
        self._log: deque[RecordedRequest] = deque(maxlen=self.behaviour.log_limit)
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()
        self._slot_free: asyncio.Condition | None = None
        self._runner: web.AppRunner | None = None
        self._text_cache: dict[tuple[str, int], str] = {}
        self.app = self._build_app()

    # ---------------------------------------------------------------- control (Python)
    def configure(self, **changes: Any) -> Behaviour:
        """Change knobs at run time (validated; ValueError names the field). Returns the new behaviour."""
        self.behaviour = apply_changes(self.behaviour, changes)
        if self._log.maxlen != self.behaviour.log_limit:
            self._log = deque(self._log, maxlen=self.behaviour.log_limit)
        if self._slot_free is not None and "max_num_seqs" in changes:
            asyncio.get_running_loop().create_task(self._notify_slots())
        log.info("Configured fake vLLM on %s: %s", self.url, changes)
        return self.behaviour

    def set_metric(self, name: str, value: float | None, labels: Mapping[str, str] | None = None) -> None:
        """Set a metric. Counters (`vllm:*_total`, request_success_total needs labels={"finished_reason": r}) are
        set and keep counting from there. Gauges running/waiting/kv_cache_usage_perc are pinned to `value` until
        set to None. Any other name adds (or with None removes) a gauge series with these labels."""
        m = self.metrics
        if name == "vllm:request_success_total":
            reason = (labels or {}).get("finished_reason")
            if reason not in m.finished:
                raise ValueError(f"vllm:request_success_total needs labels finished_reason in {FINISHED_REASONS}")
            m.finished[reason] = int(value or 0)
        elif name in _COUNTER_ATTRS:
            setattr(m, _COUNTER_ATTRS[name], int(value or 0))
        else:
            key = (name, tuple(sorted((labels or {}).items())))
            if value is None:
                m.overrides.pop(key, None)
            else:
                m.overrides[key] = float(value)

    def requests(self, path: str | None = None) -> list[RecordedRequest]:
        """Recorded requests, oldest first (optionally only those to `path`)."""
        return [r for r in self._log if path is None or r.path == path]

    def clear_requests(self) -> None:
        self._log.clear()

    def reset(self) -> None:
        """Back to the constructed behaviour, zero metrics, empty log."""
        self.behaviour = self._initial
        self.metrics = _Metrics()
        self._log = deque(maxlen=self.behaviour.log_limit)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> FakeVllm:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()
        log.info("Started fake vLLM serving %s on %s", self.behaviour.model, self.url)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info("Stopped fake vLLM on %s", self.url)

    async def __aenter__(self) -> FakeVllm:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---------------------------------------------------------------- app
    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._handle_generate)
        app.router.add_post("/v1/completions", self._handle_generate)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_get("/health", self._handle_health)
        app.router.add_get("/metrics", self._handle_metrics)
        app.router.add_post("/tokenize", self._handle_tokenize)
        app.router.add_get("/_control", self._handle_control_get)
        app.router.add_post("/_control", self._handle_control_post)
        app.router.add_post("/_control/metrics", self._handle_control_metrics)
        app.router.add_get("/_control/requests", self._handle_control_requests)
        app.router.add_delete("/_control/requests", self._handle_control_requests_clear)
        app.router.add_post("/_control/reset", self._handle_control_reset)
        return app

    async def _handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.behaviour.engine_dead else 200)

    async def _handle_models(self, request: web.Request) -> web.Response:
        b = self.behaviour
        created = int(time.time())
        card = {
            "id": b.model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": b.model,
            "parent": None,
            "max_model_len": b.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{self._id_prefix}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return web.json_response({"object": "list", "data": [card]})

    async def _handle_tokenize(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = self._parse(raw)
        record = self._record(request, raw, body)
        try:
            if not isinstance(body, dict):
                raise RequestError(400, "request body must be a JSON object")
            count = count_prompt_tokens("/tokenize", body)
        except RequestError as err:
            if record is not None:
                record.outcome = f"rejected:{err.status}"
            return err.response()
        if record is not None:
            record.prompt_tokens = count
            record.outcome = "tokenized"
        payload = {"count": count, "max_model_len": self.behaviour.max_model_len, "tokens": list(range(count))}
        payload["token_strs"] = None
        return web.json_response(payload)

    def _metric_lines(self) -> list[str]:
        b, m = self.behaviour, self.metrics
        base = (("engine", "0"), ("model_name", b.model))
        lab = _labels(base)
        ov = m.overrides

        def gauge_value(name: str, computed: float) -> float:
            return ov.get((name, ()), computed)

        computed = {
            "vllm:num_requests_running": float(m.running),
            "vllm:num_requests_waiting": float(m.waiting),
            "vllm:kv_cache_usage_perc": min(1.0, m.kv_tokens_in_use / b.kv_cache_size_tokens),
        }
        out: list[str] = []

        def head(name: str, kind: str) -> None:
            out.append(f"# HELP {name} {_HELP.get(name, name)}")
            out.append(f"# TYPE {name} {kind}")

        for name in _GAUGES:
            head(name, "gauge")
            out.append(f"{name}{lab} {_fmt(gauge_value(name, computed[name]))}")
        head("vllm:engine_sleep_state", "gauge")
        for state, flag in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            out.append(f"vllm:engine_sleep_state{_labels((*base, ('sleep_state', state)))} {_fmt(flag)}")
        num_blocks = b.kv_cache_size_tokens // b.block_size
        info = {
            "block_size": str(b.block_size),
            "cache_dtype": b.cache_dtype,
            "enable_prefix_caching": "True",
            "gpu_memory_utilization": str(b.gpu_memory_utilization),
            "kv_cache_size_tokens": str(num_blocks * b.block_size),
            "kv_cache_max_concurrency": f"{num_blocks * b.block_size / b.max_model_len:.2f}",
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(num_blocks),
            "engine": "0",
        }
        head("vllm:cache_config_info", "gauge")
        out.append(f"vllm:cache_config_info{_labels(info)} 1.0")
        head("vllm:request_success_total", "counter")
        for reason in FINISHED_REASONS:
            reason_labels = _labels((*base, ("finished_reason", reason)))
            out.append(f"vllm:request_success_total{reason_labels} {_fmt(m.finished[reason])}")
        for name, attr in _COUNTER_ATTRS.items():
            head(name, "counter")
            out.append(f"{name}{lab} {_fmt(getattr(m, attr))}")
        extra: dict[str, list[str]] = {}
        for (name, labels), value in sorted(ov.items()):
            if name in _GAUGES and not labels:
                continue
            extra.setdefault(name, []).append(f"{name}{_labels(labels) if labels else ''} {_fmt(value)}")
        for name, lines in extra.items():
            head(name, "gauge")
            out.extend(lines)
        return out

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        text = "\n".join(self._metric_lines()) + "\n"
        return web.Response(body=text.encode(), headers={"Content-Type": _METRICS_CONTENT_TYPE})

    # ---------------------------------------------------------------- control (HTTP)
    async def _json_object(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as err:
            raise RequestError(400, f"control body is not JSON: {err}") from err
        if not isinstance(body, dict):
            raise RequestError(400, "control body must be a JSON object")
        return body

    def _state(self) -> dict[str, Any]:
        m = self.metrics
        return {
            "behaviour": self.behaviour.to_json(),
            "running": m.running,
            "waiting": m.waiting,
            "finished": dict(m.finished),
            "prompt_tokens_total": m.prompt_tokens,
            "generation_tokens_total": m.generation_tokens,
            "recorded": len(self._log),
        }

    async def _handle_control_get(self, request: web.Request) -> web.Response:
        return web.json_response(self._state())

    async def _handle_control_post(self, request: web.Request) -> web.Response:
        try:
            self.configure(**await self._json_object(request))
        except RequestError as err:
            return err.response()
        except ValueError as err:
            return RequestError(400, str(err)).response()
        return web.json_response(self._state())

    async def _handle_control_metrics(self, request: web.Request) -> web.Response:
        """Body: {"name": ..., "value": number|null, "labels": {...}} or {"set": [such objects]}."""
        try:
            body = await self._json_object(request)
            items = body.get("set", [body])
            if not isinstance(items, list):
                raise RequestError(400, "'set' must be a list of {name, value, labels}")
            for item in items:
                name, value, labels = item.get("name"), item.get("value"), item.get("labels")
                if not isinstance(name, str) or not name:
                    raise RequestError(400, f"metric 'name' must be a non-empty string, got {name!r}")
                if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                    raise RequestError(400, f"metric {name} 'value' must be a number or null, got {value!r}")
                if labels is not None and not (
                    isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
                ):
                    raise RequestError(400, f"metric {name} 'labels' must be an object of strings")
                self.set_metric(name, value, labels)
        except RequestError as err:
            return err.response()
        except ValueError as err:
            return RequestError(400, str(err)).response()
        return web.Response(body=("\n".join(self._metric_lines()) + "\n").encode(), content_type="text/plain")

    async def _handle_control_requests(self, request: web.Request) -> web.Response:
        path = request.query.get("path")
        return web.json_response([r.to_json() for r in self.requests(path)])

    async def _handle_control_requests_clear(self, request: web.Request) -> web.Response:
        self.clear_requests()
        return web.Response(status=204)

    async def _handle_control_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self._state())

    # ---------------------------------------------------------------- generation
    @staticmethod
    def _parse(raw: bytes) -> Any:
        """The body, or None (answered 400). vLLM's FastAPI answers 400 for every body its parser fails on, nesting
        too deep for json.loads (RecursionError) included: only a JSONDecodeError is a 422 there, which vLLM turns
        into a 400 as well."""
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return None

    def _record(self, request: web.Request, raw: bytes, body: Any) -> RecordedRequest | None:
        if not self.behaviour.record:
            return None
        rec = RecordedRequest(request.method, request.path, request.headers, body, raw, time.time())
        self._log.append(rec)
        return rec

    def _take_failure(self) -> FailMode:
        b = self.behaviour
        if b.fail_mode == "none":
            return "none"
        if b.fail_count is not None:
            remaining = b.fail_count - 1
            if remaining <= 0:
                self.behaviour = dataclasses.replace(b, fail_mode="none", fail_count=None)
            else:
                self.behaviour = dataclasses.replace(b, fail_count=remaining)
        return b.fail_mode

    def _text(self, n: int) -> str:
        key = (self.behaviour.token_text, n)
        text = self._text_cache.get(key)
        if text is None:
            text = self.behaviour.token_text * n
            if len(self._text_cache) > 256:
                self._text_cache.clear()
            self._text_cache[key] = text
        return text

    async def _handle_generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = self._parse(raw)
        path = request.path
        record = self._record(request, raw, body)
        b = self.behaviour
        try:
            if b.engine_dead:
                raise RequestError(
                    500, "EngineCore encountered an issue. See stack trace for the root cause.", "InternalServerError"
                )
            if not isinstance(body, dict):
                raise RequestError(400, "request body must be a JSON object (JSON decode error)")
            model = body.get("model")
            if model is not None and model != b.model:
                raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
            n = body.get("n", 1)
            if n not in (None, 1):
                raise RequestError(400, f"n={n!r}: the fake serves one choice per request", param="n")
            prompt_tokens = count_prompt_tokens(path, body)
            max_tokens = resolve_max_tokens(path, body, prompt_tokens, b)
        except RequestError as err:
            if record is not None:
                record.outcome = "engine_dead" if b.engine_dead else f"rejected:{err.status}"
            return err.response()
        if body.get("ignore_eos"):
            n_tokens, reason = max_tokens, "length"
        elif b.natural_tokens < max_tokens:
            n_tokens, reason = b.natural_tokens, "stop"
        else:
            n_tokens, reason = max_tokens, "length"
        if record is not None:
            record.prompt_tokens = prompt_tokens
            record.max_tokens = max_tokens

        failure = self._take_failure()
        if failure == "status":
            if record is not None:
                record.outcome = "failed:status"
            msg = f"injected failure (HTTP {b.fail_status})"
            return RequestError(b.fail_status, msg, "InternalServerError").response()
        if failure == "drop":
            if record is not None:
                record.outcome = "failed:drop"
            return self._drop(request)
        if failure == "hang":
            if record is not None:
                record.outcome = "failed:hang"
            # aiohttp does not cancel handlers when the peer leaves; poll the transport instead of an Event.
            while not self._gone(request):  # noqa: ASYNC110
                await asyncio.sleep(_POLL_S)
            return web.Response(status=499)

        stream = bool(body.get("stream"))
        chat = path == "/v1/chat/completions"
        if failure == "drop_mid_stream":
            n_tokens = min(n_tokens, b.fail_after_chunks)
        if (
            not stream
            and failure == "none"
            and not b.stall
            and b.ttft_s == 0
            and b.chunk_delay_s == 0
            and b.max_num_seqs is None
        ):
            return self._instant(chat, prompt_tokens, n_tokens, reason, record)
        job = _Job(chat, body, stream, prompt_tokens, n_tokens, reason, failure, record)
        return await self._generate(request, job)

    def _instant(
        self, chat: bool, prompt_tokens: int, n_tokens: int, reason: str, record: RecordedRequest | None
    ) -> web.Response:
        """The hot path: no delays, no failures, non-streaming."""
        m = self.metrics
        m.prompt_tokens += prompt_tokens
        m.generation_tokens += n_tokens
        m.finished[reason] += 1
        if record is not None:
            record.completion_tokens = n_tokens
            record.outcome = reason
        return web.Response(body=self._full_body(chat, prompt_tokens, n_tokens, reason), content_type=_JSON)

    def _full_body(self, chat: bool, prompt_tokens: int, n_tokens: int, reason: str) -> bytes:
        b = self.behaviour
        ident = next(self._ids)
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + n_tokens,
            "completion_tokens": n_tokens,
            "prompt_tokens_details": None,
        }
        text = self._text(n_tokens)
        if chat:
            payload: dict[str, Any] = {
                "id": f"chatcmpl-{self._id_prefix}{ident:x}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": b.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "prompt_logprobs": None,
                "kv_transfer_params": None,
            }
        else:
            payload = {
                "id": f"cmpl-{self._id_prefix}{ident:x}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": b.model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": reason,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": None,
            }
        return json.dumps(payload, separators=(",", ":")).encode()

    @staticmethod
    def _gone(request: web.Request) -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        transport = request.transport
        if transport is not None:
            transport.abort()
        return web.Response(status=499)

    async def _notify_slots(self) -> None:
        if self._slot_free is not None:
            async with self._slot_free:
                self._slot_free.notify_all()

    async def _admit(self, request: web.Request) -> bool:
        """Wait for a sequence slot when max_num_seqs is set. False when the client left while waiting."""
        m = self.metrics
        if self.behaviour.max_num_seqs is None:
            return True
        if self._slot_free is None:
            self._slot_free = asyncio.Condition()
        m.waiting += 1
        try:
            async with self._slot_free:
                while True:
                    limit = self.behaviour.max_num_seqs
                    if limit is None or m.running < limit:
                        return True
                    if self._gone(request):
                        return False
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._slot_free.wait(), 0.05)
        finally:
            m.waiting -= 1

    async def _sleep(self, seconds: float, request: web.Request) -> bool:
        """Sleep (also through stall mode); False when the client went away or the engine died meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            if self._gone(request) or self.behaviour.engine_dead:
                return False
            left = deadline - time.monotonic()
            if left <= 0 and not self.behaviour.stall:
                return True
            await asyncio.sleep(min(_POLL_S, left) if left > 0 else _POLL_S)

    async def _generate(self, request: web.Request, job: _Job) -> web.StreamResponse:
        chat, body, stream, prompt_tokens = job.chat, job.body, job.stream, job.prompt_tokens
        n_tokens, reason, failure, record = job.n_tokens, job.reason, job.failure, job.record
        b = self.behaviour
        m = self.metrics
        response: web.StreamResponse | None = None
        if stream and b.headers_before_ttft:
            response = web.StreamResponse(headers=_SSE_HEADERS)
            await response.prepare(request)
        if not await self._admit(request):
            if record is not None:
                record.outcome = "disconnected"
            return response or web.Response(status=499)
        m.running += 1
        m.prompt_tokens += prompt_tokens
        m.kv_tokens_in_use += prompt_tokens
        produced = 0
        outcome = "pending"
        ident = next(self._ids)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._id_prefix}{ident:x}"
        head = {"id": rid, "object": obj, "created": created, "model": b.model}
        mid: bytes | None = None
        options = body.get("stream_options")
        options = options if isinstance(options, dict) else {}
        continuous = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
        try:
            for i in range(n_tokens):
                delay = self.behaviour.ttft_s if i == 0 else self.behaviour.chunk_delay_s
                if not await self._sleep(delay, request):
                    outcome = "engine_dead" if self.behaviour.engine_dead else "disconnected"
                    break
                produced += 1
                m.generation_tokens += 1
                m.kv_tokens_in_use += 1
                if record is not None:
                    record.completion_tokens = produced
                if not stream:
                    continue
                if response is None:
                    response = web.StreamResponse(headers=_SSE_HEADERS)
                    await response.prepare(request)
                last = produced == n_tokens and failure != "drop_mid_stream"
                chunks = []
                if chat and i == 0:
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
                    first: dict[str, Any] = {**head, "choices": [{**role, "finish_reason": None, "stop_reason": None}]}
                    if continuous:
                        first["usage"] = _usage(prompt_tokens, 0)
                    chunks.append(_sse(first))
                if continuous:
                    usage = _usage(prompt_tokens, produced)
                    chunks.append(_token_chunk(head, chat, b.token_text, reason if last else None, usage))
                elif last:
                    chunks.append(_token_chunk(head, chat, b.token_text, reason))
                else:
                    # Every token but the last is the same event: encode it once per request.
                    if mid is None:
                        mid = _token_chunk(head, chat, b.token_text, None)
                    chunks.append(mid)
                try:
                    await response.write(b"".join(chunks))
                except ConnectionError:
                    outcome = "disconnected"
                    break
            else:
                if failure == "drop_mid_stream":
                    outcome = "failed:drop_mid_stream"
                    if response is None:
                        response = web.StreamResponse(headers=_SSE_HEADERS if stream else {"Content-Type": _JSON})
                        if not stream:
                            response.content_length = 4096
                        await response.prepare(request)
                    transport = request.transport
                    if transport is not None:
                        transport.abort()
                else:
                    outcome = reason
        finally:
            m.running -= 1
            m.kv_tokens_in_use -= prompt_tokens + produced
            if self._slot_free is not None:
                await self._notify_slots()
        if record is not None:
            record.outcome = outcome
        if outcome == reason:
            m.finished[reason] += 1
        if outcome == "engine_dead":
            if response is None:
                return RequestError(500, "EngineCore encountered an issue.", "InternalServerError").response()
            transport = request.transport
            if transport is not None:
                transport.abort()
            return response
        if outcome != reason:
            return response or web.Response(status=499)
        if not stream:
            return web.Response(body=self._full_body(chat, prompt_tokens, produced, reason), content_type=_JSON)
        assert response is not None or n_tokens == 0
        if response is None:
            response = web.StreamResponse(headers=_SSE_HEADERS)
            await response.prepare(request)
        tail = []
        if n_tokens == 0:
            empty: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason, "stop_reason": None}
            empty.update({"delta": {"role": "assistant", "content": ""}} if chat else {"text": ""})
            tail.append(_sse({**head, "choices": [empty]}))
        if options.get("include_usage"):
            tail.append(_sse({**head, "choices": [], "usage": _usage(prompt_tokens, produced)}))
        tail.append(b"data: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await response.write(b"".join(tail))
            await response.write_eof()
        return response


# -------------------------------------------------------------------- running it from sync code

T = TypeVar("T")


class ThreadedFakeVllm:
    """A FakeVllm serving from its own thread and event loop, for sync tests (the sync `openai` client).

    Every method runs on the server's loop and waits for it, so it is safe to call from the test's thread.
    """

    def __init__(self, fake: FakeVllm, loop: asyncio.AbstractEventLoop):
        self.fake = fake
        self._loop = loop

    def _call(self, fn: Callable[[], T]) -> T:
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as err:  # handed to the caller's thread
                future.set_exception(err)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=10)

    @property
    def url(self) -> str:
        return self.fake.url

    def configure(self, **changes: Any) -> Behaviour:
        return self._call(lambda: self.fake.configure(**changes))

    def set_metric(self, name: str, value: float | None, labels: Mapping[str, str] | None = None) -> None:
        self._call(lambda: self.fake.set_metric(name, value, labels))

    def requests(self, path: str | None = None) -> list[RecordedRequest]:
        return self._call(lambda: self.fake.requests(path))

    def clear_requests(self) -> None:
        self._call(self.fake.clear_requests)

    def reset(self) -> None:
        self._call(self.fake.reset)

    def metrics_text(self) -> str:
        return self._call(lambda: "\n".join(self.fake._metric_lines()) + "\n")


@contextlib.contextmanager
def run_in_thread(
    behaviour: Behaviour | None = None, *, host: str = "127.0.0.1", port: int = 0, **knobs: Any
) -> Iterator[ThreadedFakeVllm]:
    """`with run_in_thread(natural_tokens=5) as fake:` serves until the block ends."""
    loop = asyncio.new_event_loop()
    started: Future[FakeVllm] = Future()
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            fake = FakeVllm(behaviour, host=host, port=port, **knobs)
            await fake.start()
        except BaseException as err:
            started.set_exception(err)
            return
        started.set_result(fake)
        try:
            await stop.wait()
        finally:
            await fake.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="fake-vllm", daemon=True)
    thread.start()
    try:
        fake = started.result(timeout=10)
        yield ThreadedFakeVllm(fake, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)
        loop.close()


@contextlib.asynccontextmanager
async def serving(behaviour: Behaviour | None = None, **knobs: Any) -> AsyncIterator[FakeVllm]:
    """`async with serving(ttft_s=0.05) as fake:` — the same as `async with FakeVllm(...)`, as a function."""
    async with FakeVllm(behaviour, **knobs) as fake:
        yield fake


# -------------------------------------------------------------------- start-up


STARTUP_PHASES: Final = ("Launching", "Downloading", "LoadingWeights", "Compiling", "ProfilingMemory",
                         "KVCacheAllocated", "Serving")
"""The phases the engine wrapper follows (`vllm_operator.engine.phases.Phase` values), in the order printed."""


def startup_lines(phase: str, *, model: str, kv_tokens: int, max_model_len: int, step: int, steps: int) -> list[str]:
    """What vLLM 0.32 prints in one start-up phase (the lines of a real CPU start of the tiny test model, plus the
    shard and graph-capture progress bars of its GPU code path), for progress step `step` of `steps`. Log lines go
    to stdout (vLLM's logger), progress bars to stderr with `\\r`, as tqdm draws them."""
    core = "(EngineCore pid=2) INFO 12-01 22:30:0{s} [{f}] {m}"
    worker = "(Worker pid=3) INFO 12-01 22:30:0{s} [{f}] {m}"
    api = "(APIServer pid=1) INFO 12-01 22:30:0{s} [{f}] {m}"
    pct = (100 * step) // max(1, steps)
    if phase == "Launching":
        return [api.format(s=0, f="api_utils.py:286", m=f"non-default args: {{'model': '{model}'}}"),
                api.format(s=0, f="model.py:733", m="Resolved architecture: LlamaForCausalLM"),
                core.format(s=1, f="core.py:133", m="Initializing a V1 LLM engine (v0.32.0) with config: ...")]
    if phase == "LoadingWeights":
        bar = f"\rLoading safetensors checkpoint shards: {pct:3d}% Completed | {step}/{steps} [00:0{step % 10}<00:00]"
        return ([worker.format(s=2, f="cpu_model_runner.py:68", m=f"Starting to load model {model}...")]
                if step == 0 else [bar] if step < steps
                else [bar, worker.format(s=3, f="base_loader.py:82", m="Initializing model took 0.656656 seconds")])
    if phase == "Compiling":
        return ([worker.format(s=4, f="cpu_model_runner.py:87", m="Warming up model for the compilation...")]
                if step == 0 else [f"\rCapturing CUDA graphs (decode, FULL): {pct:3d}%| | {step}/{steps} [00:01<00:00]"]
                if step < steps else [worker.format(s=5, f="cpu_model_runner.py:91", m="Warming up done.")])
    if phase == "ProfilingMemory":
        return [worker.format(s=5, f="cpu_worker.py:260", m="Explicitly set (0.06/23.54) GiB for KV cache on node 0.")]
    if phase == "KVCacheAllocated":
        return [core.format(s=6, f="kv_cache_utils.py:2327", m=f"CPU KV cache size: {kv_tokens:,} tokens, Maximum "
                            f"concurrency for {max_model_len:,} tokens per request: {kv_tokens / max_model_len:.2f}x"),
                core.format(s=6, f="core.py:402", m="init engine (profile, create kv cache, warmup model) took 0.30 s"),
                api.format(s=7, f="entry.py:140", m="Starting vLLM server on http://127.0.0.1:8000")]
    if phase == "Serving":
        return ["INFO:     Application startup complete."]
    return []


def run_startup(*, step_s: float, stall_in: str | None, steps: int, model: str, kv_tokens: int, max_model_len: int,
                download_repo: str | None = None, download_bytes: int = 0) -> bool:
    """Print vLLM's start-up, `step_s` between lines; False when it stalled in `stall_in` (prints nothing more).

    `download_repo` with `download_bytes` makes the Downloading phase real on disk: the bytes are written in `steps`
    pieces into `$HF_HOME/hub/models--ORG--NAME/blobs/<name>.incomplete`, where the hub client puts a download."""
    for phase in STARTUP_PHASES:
        if phase == stall_in:
            print(f"(fake vLLM) stalling in {phase}", file=sys.stderr, flush=True)
            return False
        if phase == "Downloading":
            if download_repo and download_bytes > 0:
                _download(download_repo, download_bytes, steps, step_s)
            continue
        if phase == "Serving":
            return True
        bar = False
        for step in range(steps + 1 if phase in ("LoadingWeights", "Compiling") else 1):
            for line in startup_lines(phase, model=model, kv_tokens=kv_tokens, max_model_len=max_model_len,
                                      step=step, steps=steps):
                if line.startswith("\r"):
                    sys.stderr.write(line)
                    sys.stderr.flush()
                    bar = True
                    continue
                if bar:  # tqdm ends its line when the bar closes
                    sys.stderr.write("\n")
                    sys.stderr.flush()
                    bar = False
                print(line, flush=True)
            time.sleep(step_s)
    return True


def _download(repo: str, total: int, steps: int, step_s: float) -> None:
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(os.environ.get("HF_HOME") or ".", "hub")
    blobs = os.path.join(hub, "models--" + repo.replace("/", "--"), "blobs")
    os.makedirs(blobs, exist_ok=True)
    part = os.path.join(blobs, "0123456789abcdef.incomplete")
    pieces = max(1, steps)
    with open(part, "ab") as fh:
        for i in range(pieces):
            fh.write(b"\0" * (total // pieces + (total % pieces if i == pieces - 1 else 0)))
            fh.flush()
            time.sleep(step_s)
    os.replace(part, part.removesuffix(".incomplete"))


# -------------------------------------------------------------------- standalone


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fakevllm",
        description="A fake vLLM server (OpenAI API, /health, /metrics) for tests and benchmarks.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    p.add_argument("--model", default="fake-model", help="served model name")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-tokens-cap", type=int, default=None, help="server-side max_new_tokens (default and cap)")
    p.add_argument("--tokens", type=int, default=16, help="natural output length (finish_reason stop)")
    p.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    p.add_argument("--chunk-delay-ms", type=float, default=0.0, help="delay between tokens")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--kv-cache-tokens", type=int, default=65536)
    p.add_argument("--no-record", action="store_true", help="do not keep a request log (benchmarks)")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--startup-step-s", type=float, default=None,
                   help="print vLLM's start-up lines first, this many seconds apart (default: serve at once)")
    p.add_argument("--startup-steps", type=int, default=3, help="progress-bar steps in loading and compiling")
    p.add_argument("--stall-in", choices=STARTUP_PHASES[1:], default=None,
                   help="stop the start-up in this phase and never serve")
    p.add_argument("--download-repo", default=None, help="Hub id whose download the start-up writes into $HF_HOME")
    p.add_argument("--download-bytes", type=int, default=0, help="bytes that download writes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        behaviour = Behaviour(
            model=args.model,
            max_model_len=args.max_model_len,
            max_tokens_cap=args.max_tokens_cap,
            natural_tokens=args.tokens,
            ttft_s=args.ttft_ms / 1000,
            chunk_delay_s=args.chunk_delay_ms / 1000,
            max_num_seqs=args.max_num_seqs,
            kv_cache_size_tokens=args.kv_cache_tokens,
            record=not args.no_record,
        )
        behaviour.validate()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    if args.startup_step_s is not None and not run_startup(
            step_s=args.startup_step_s, stall_in=args.stall_in, steps=args.startup_steps, model=args.model,
            kv_tokens=args.kv_cache_tokens, max_model_len=args.max_model_len, download_repo=args.download_repo,
            download_bytes=args.download_bytes):
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)

    async def serve() -> None:
        async with FakeVllm(behaviour, host=args.host, port=args.port) as fake:
            if args.startup_step_s is not None:
                print(startup_lines("Serving", model="", kv_tokens=0, max_model_len=1, step=0, steps=0)[0],
                      flush=True)
            print(f"fake vLLM serving {behaviour.model} on {fake.url}", flush=True)
            await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
