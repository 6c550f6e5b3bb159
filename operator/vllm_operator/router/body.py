"""Decoding a request body into the JSON object the router decides on, or the 400 that names what is wrong with it.

Why a module of its own: every way a client's bytes can fail to be a request is answered here, once, as an
OpenAI-style 400 — never as an exception that reaches the server's handler (a 500 and an ERROR line with a
traceback for a client's mistake, a cheap way to fill error logs and trip alerts). What a body can do to a decoder:

* not be JSON (syntax, invalid UTF-8, a BOM, trailing bytes, NaN/Infinity literals, an unpaired UTF-16 surrogate
  escape): msgspec's DecodeError, whose message says where.
* hold a number out of range (an integer of more than 4,300 digits, a float beyond 1.8e308): msgspec's
  ValidationError, a DecodeError too.
* nest deeper than the interpreter's recursion limit (~1,000 levels on CPython 3.11, a 2 KB body): msgspec raises
  RecursionError. A body that the decoder just got through can raise it again a few frames deeper (re-encoding it,
  `json.dumps` of its tools for counting), so the proxy answers RecursionError anywhere in its preparation of a
  request with the same 400 (`too_deep`). An explicit, lower depth limit was measured and not taken: walking the
  decoded body costs 130-300 µs for a 300-message conversation (the decode itself ~60 µs), on a path whose whole
  CPU cost is ~120 µs; vLLM's server answers a body its parser cannot follow with a 400 as well (FastAPI's "There
  was an error parsing the body"), so nothing nested that deep reaches an engine as a request.
* not be an object at the top level.

Values echoed back in an error are shortened (`decide.shown`): a 60 KB string or a 4,000-digit integer in a field
is not copied into the answer or the logs.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from vllm_operator.router.decide import REASON_INVALID, Refusal

_decode: Final = msgspec.json.Decoder().decode
"""msgspec: ~4 µs for a 2 KB chat body against ~23 µs with the json module (benchmarks/router), integers of any size
up to 4,300 digits kept exact (orjson would turn those beyond 64 bits into floats)."""
_LONE_HIGH_SURROGATE: Final = re.compile(
    rb"(?<!\\)(?:\\\\)*(\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")
"""A high-surrogate escape (after an even number of backslashes) that no low-surrogate escape follows."""


def bad(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, message, REASON_INVALID, param=param, code="invalid_value")


def too_deep() -> Refusal:
    """The answer to a body nested deeper than the interpreter can follow, wherever it is noticed: in the decoder,
    or in a step after it (re-encoding, `json.dumps` of tools) that runs a few stack frames deeper."""
    return bad("request body nests arrays and objects too deeply to decode (real requests nest a few dozen levels "
               "at most)")


def _not_json(raw: bytes, err: msgspec.DecodeError) -> Refusal:
    reason = str(err)
    if reason == "Input data was truncated":  # msgspec's word for an unpaired high surrogate, too
        lone = _LONE_HIGH_SURROGATE.search(raw)
        if lone is not None:
            reason = (f"JSON is malformed: {lone.group(1).decode()} at byte {lone.start(1)} is an unpaired UTF-16 "
                      "surrogate (not a character)")
    return bad(f"request body is not valid JSON: {reason}")


def decode_body(raw: bytes) -> dict[str, Any] | Refusal:
    """The request's JSON object, or the 400 saying why the bytes are not one."""
    try:
        body = _decode(raw)
    except msgspec.DecodeError as err:
        return _not_json(raw, err)
    except RecursionError:
        return too_deep()
    if not isinstance(body, dict):
        return bad(f"request body must be a JSON object, got {_json_type(body)}")
    return body


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"
