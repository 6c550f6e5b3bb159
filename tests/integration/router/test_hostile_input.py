"""No request a client can send gets a 5xx or an ERROR line from the router while its engines are healthy.

A property test over whole requests, sent as raw bytes to a router on loopback with two healthy fake engines behind
it: any method, a set of paths in and around the API, any of the headers the router reads (Content-Type,
Authorization with API keys configured, the forwarded tracing headers) plus random ones, and bodies that are
random bytes, random JSON, or request-shaped JSON with random values in every field the router reads and then a
hostile edit of the bytes: nesting thousands of levels deep, integers of thousands of digits, NaN and Infinity
literals, unpaired UTF-16 surrogate escapes, invalid UTF-8 inside a string, a byte-order mark, a cut anywhere,
duplicate keys. A client's mistake is a 4xx with an OpenAI-shaped error (or the engine's own answer, forwarded);
the only 5xx the router may give is its own 503/504 about engines, which healthy engines never cause. Framing
(Content-Length against Transfer-Encoding, obs-fold and the other smuggling shapes) is the differential fuzz's
subject (tests/unit/router/test_framing_fuzz.py); here every request is framed correctly, by Content-Length or
chunked.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fakevllm.engine import run_in_thread
from tests.support.router import MODEL, router_config, router_in_thread, sample, word_counter
from vllm_operator.router.metrics import RouterMetrics

KEYS = {"free": "sk-free-key", "pro": "sk-pro-key"}
MAX_BODY = 65536
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
METHODS = ["POST"] * 8 + ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "FOO", "post"]
PATHS = [CHAT] * 6 + [COMPLETIONS] * 4 + [
    "/v1/models", "/health", "/livez", "/metrics", "/", "/v1/chat/completions/", "/v1/chat/completions?stream=1",
    "/V1/CHAT/COMPLETIONS", "/v1/embeddings", "/v1/../v1/completions", "/%00", "/v1/chat/completions#x", "*",
    "/v1/completions?" + "a" * 2000]
CONTENT_TYPES = ["application/json"] * 8 + [
    None, "", "application/json; charset=utf-8", "APPLICATION/JSON", "application/json;", "text/plain",
    "application/json, text/plain", "multipart/form-data; boundary=x", "application/x-ndjson", "\xe9/\xff",
    "application/json; charset=latin-1" + ";x" * 100]
AUTHORIZATION = [
    None, None, "Bearer sk-free-key", "Bearer sk-pro-key", "Bearer sk-free-key",  # the first five: valid
    "Bearer wrong", "Bearer", "Bearer ", "Basic c2stZnJlZQ==", "bearer  sk-free-key ", "Bearer " + "x" * 4000,
    "Bearer \xe9\xff\x80", "Bearer sk-free-key, Bearer sk-pro-key", "sk-free-key"]
TOKEN = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~"), min_size=1, max_size=20)
LATIN1 = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=60)

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


def _one_of_json(*likely: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(likely) | json_values


def _mostly(value: Any, *others: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`value` about two times in three, else one of `others`: valid requests must be common enough that the
    forwarding path (and the engines' answers to odd values) is exercised, not only the router's refusals."""
    return _weighted((2, st.just(value)), *((1, other) for other in others))


def _weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each as often as its weight (`st.one_of` draws its branches evenly)."""
    pool = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(pool) - 1).flatmap(lambda i: pool[i])


roles = _one_of_json("user", "system", "assistant", "tool", "developer")
content_parts = st.lists(st.fixed_dictionaries({"type": _one_of_json("text", "image_url")},
                                               optional={"text": _one_of_json("hello world"),
                                                         "image_url": json_values}) | json_values, max_size=3)
message = st.fixed_dictionaries({"role": _mostly("user", roles)},
                                optional={"content": _mostly("hello world", _one_of_json(None), content_parts),
                                          "tool_calls": json_values, "name": json_values})
messages = _mostly([{"role": "user", "content": "hello world"}],
                   st.lists(_mostly({"role": "user", "content": "hi"}, message, json_values), max_size=4))
max_tokens = _mostly(8, _one_of_json(1, 10**6, 0, -1, 2**63, True), st.integers())
prompts = _mostly("hello", _one_of_json(["a", "b"], [1, 2], [[1]], []))
OPTIONAL = {"stream": _mostly(False, _one_of_json(True)), "max_tokens": max_tokens,
            "max_completion_tokens": max_tokens, "n": _mostly(1, json_values), "tools": json_values,
            "stream_options": _mostly({"include_usage": True}, _one_of_json({"include_usage": False})),
            "temperature": json_values, "ignore_eos": json_values}


def request_shaped(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """The body of a request to `path`: its required field, then any of the fields the router reads, each
    usually valid and otherwise any JSON."""
    field, value = ("messages", messages) if path == CHAT else ("prompt", prompts)
    shaped = st.fixed_dictionaries({"model": _mostly(MODEL, _one_of_json("other-model")),
                                    field: _weighted((3, value), (1, json_values))}, optional=OPTIONAL)
    return _weighted((3, shaped), (1, st.fixed_dictionaries({}, optional={"model": json_values, "messages": messages,
                                                                          "prompt": prompts})))


@st.composite
def hostile_edit(draw: st.DrawFn, raw: bytes) -> bytes:
    """One edit of serialized JSON that a careless or hostile client might make."""
    kind = draw(st.sampled_from(["none"] * 12 + ["nest"] * 3 + ["bigint", "literal", "surrogate", "utf8", "bom",
                                                                 "cut", "dupkey", "byte"]))
    at = draw(st.integers(0, len(raw)))
    if kind == "nest":  # wrap a value (after a ':' or '[') in thousands of arrays or objects
        depth = draw(st.sampled_from([64, 500, 990, 1000, 3000, 10000]))
        spots = [m.end() for m in re.finditer(rb"[:\[]", raw)] or [0]
        at = draw(st.sampled_from(spots))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"k":', b"}")]))
        value = draw(st.sampled_from([b"1", b'"x"', b"[]", b"{}"]))
        rest = raw[at:]
        end = re.match(rb'\s*("(?:[^"\\]|\\.)*"|-?[0-9.eE+-]+|true|false|null|\[\]|\{\})', rest)
        if end is None:
            return raw[:at] + opener * depth + value + closer * depth + rest
        return raw[:at] + opener * depth + rest[:end.end()] + closer * depth + rest[end.end():]
    if kind == "bigint":
        digits = draw(st.sampled_from([20, 40, 400, 4300, 4301, 10000]))
        return re.sub(rb"(?<![\w.])-?\d+(?![\w.])", b"-" * draw(st.booleans()) + b"9" * digits, raw, count=1) \
            if re.search(rb"\d", raw) else raw[:at] + b"9" * digits + raw[at:]
    if kind == "literal":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"undefined"]))
        return re.sub(rb":\s*[^,}\]]+", b":" + literal, raw, count=1)
    if kind == "surrogate":
        escape = draw(st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud800x", b"\\ud83d\\ude00", b"\\ud800\\ud800"]))
        return raw.replace(b'"', b'"' + escape, 1) if b'"' in raw else b'"' + escape + b'"'
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]))
        return raw.replace(b'"', b'"' + bad, 1)
    if kind == "bom":
        return b"\xef\xbb\xbf" + raw
    if kind == "cut":
        return raw[:at]
    if kind == "dupkey":
        return raw.replace(b"{", b'{"model": 1, "stream": "x", ', 1)
    if kind == "byte":
        return raw[:at] + draw(st.binary(min_size=1, max_size=3)) + raw[at:]
    return raw


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    source = draw(st.sampled_from(["shaped"] * 6 + ["json", "bytes"]))
    if source == "bytes":
        return draw(st.binary(max_size=300))
    value = draw(request_shaped(path) if source == "shaped" else json_values)
    raw = json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    return draw(hostile_edit(raw))


@dataclass
class Sent:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool

    def wire(self) -> bytes:
        head = [f"{self.method} {self.path} HTTP/1.1", "Host: router", "Connection: close"]
        head += [f"{name}: {value}" for name, value in self.headers]
        if self.chunked:
            head.append("Transfer-Encoding: chunked")
            size = max(1, len(self.body) // 3)
            pieces = [self.body[i:i + size] for i in range(0, len(self.body), size)]
            body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
        else:
            head.append(f"Content-Length: {len(self.body)}")
            body = self.body
        return "\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + body


@st.composite
def requests(draw: st.DrawFn) -> Sent:
    """Half of them an API call as a client would make it (POST, JSON, a valid key or none) with a generated
    body; the other half anything."""
    if draw(st.booleans()):
        headers = [("Content-Type", "application/json")]
        authorization = draw(st.sampled_from(AUTHORIZATION[:5]))
        if authorization is not None:
            headers.append(("Authorization", authorization))
        path = draw(st.sampled_from([CHAT, COMPLETIONS]))
        return Sent("POST", path, headers, draw(bodies(path)), draw(st.integers(0, 9)) == 0)
    headers = []
    content_type = draw(st.sampled_from(CONTENT_TYPES))
    if content_type is not None:
        headers.append(("Content-Type", content_type))
    authorization = draw(st.sampled_from(AUTHORIZATION))
    if authorization is not None:
        headers.append(("Authorization", authorization))
    for name in ("x-request-id", "traceparent", "tracestate"):
        if draw(st.booleans()):
            headers.append((name, draw(LATIN1)))
    headers += draw(st.lists(st.tuples(TOKEN, LATIN1), max_size=3))
    path = draw(st.sampled_from(PATHS))
    return Sent(draw(st.sampled_from(METHODS)), path, headers, draw(bodies(path)), draw(st.integers(0, 9)) == 0)


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Stack:
    port: int
    metrics: RouterMetrics
    errors: _Errors


ROUTERS = {
    "clamp-least-outstanding": {},
    "reject-prefix": {"overLimit": "reject", "pools.short.strategy": "prefix", "pools.long.strategy": "prefix"},
}


@pytest.fixture(scope="module", params=list(ROUTERS))
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two healthy fake engines and a router with API keys, on threads of their own, for the whole module: the
    property test sends hundreds of requests to one router, as clients would. Twice: clamping with the
    least-outstanding choice, and refusing over-limit requests with the prefix-cache-aware choice (which names
    every prompt's blocks)."""
    tmp = tmp_path_factory.mktemp("hostile")
    keys = tmp / "keys"
    keys.mkdir()
    for tier, key in KEYS.items():
        (keys / tier).write_text(key + "\n")
    errors = _Errors()
    root = logging.getLogger()
    root.addHandler(errors)
    try:
        with run_in_thread(model=MODEL, max_model_len=200, natural_tokens=5, record=False) as short, \
                run_in_thread(model=MODEL, max_model_len=1000, natural_tokens=5, record=False) as long, \
                router_in_thread(router_config([short.url], [long.url], apiKeysDir=str(keys), maxBodyBytes=MAX_BODY,
                                               **ROUTERS[request.param]), word_counter(Path(tmp) / "tok")) \
                as (url, metrics):
            yield Stack(int(url.rsplit(":", 1)[1]), metrics, errors)
    finally:
        root.removeHandler(errors)


def _check(stack: Stack, sent: Sent) -> None:
    seen = len(stack.errors.records)
    answer = _exchange(stack.port, sent.wire())
    status_line = answer.split(b"\r\n", 1)[0]
    assert re.fullmatch(rb"HTTP/1\.1 \d{3} [\w -]+", status_line), answer[:200]
    status = int(status_line.split()[1])
    event(f"{sent.path if sent.path in (CHAT, COMPLETIONS) else 'other'} {status}")  # --hypothesis-show-statistics
    # logger and thread named: a record from a thread another module left running would read differently
    errors = [f"[{r.name} on {r.threadName}] {r.getMessage()}" + (f" {r.exc_info[1]!r}" if r.exc_info else "")
              for r in stack.errors.records[seen:]]
    assert status < 500, answer[:600]
    assert errors == [], answer[:600]
    if status >= 400 and sent.method != "HEAD":
        body = answer.split(b"\r\n\r\n", 1)[1]
        if not sent.chunked or b"Transfer-Encoding: chunked" not in answer:
            error = json.loads(body)["error"]
            assert set(error) >= {"message", "type", "param", "code"}, error
            assert len(error["message"]) < 600, error["message"]


@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sent=requests())
def test_no_request_gets_a_5xx_or_an_error_line(stack: Stack, sent: Sent) -> None:
    _check(stack, sent)


def test_the_engines_stayed_healthy(stack: Stack) -> None:
    """After the property test (same module, same router): no engine was ejected, none answered 5xx, and the
    router sent both of them requests (the bodies reached the engines, not only the router's refusals)."""
    m = stack.metrics
    for pool in ("short", "long"):
        assert sample(m, "vllm_operator_router_endpoints", pool=pool, state="healthy") == 1
        assert sample(m, "vllm_operator_router_endpoints", pool=pool, state="ejected") == 0
        for cause in ("status_5xx", "connect"):
            assert sample(m, "vllm_operator_router_ejections_total", pool=pool, cause=cause) == 0
        assert sample(m, "vllm_operator_router_upstream_errors_total", pool=pool, kind="status_5xx") == 0
    for endpoint in ("chat", "completions"):
        assert sample(m, "vllm_operator_router_requests_total", pool="short", endpoint=endpoint, status="200") > 0
