"""body.py: every way a body fails to be a request object is a 400 naming the reason, never an exception."""

from __future__ import annotations

import pytest

from vllm_operator.router.body import decode_body
from vllm_operator.router.decide import SHOWN_CHARS, Refusal, shown


@pytest.mark.parametrize(("raw", "message"), [
    (b"{", "not valid JSON: Input data was truncated"),
    (b'{"a": 1} x', "trailing characters (byte 10)"),
    (b'{"a": NaN}', "invalid character"),
    (b'{"a": "\xff"}', "Invalid UTF-8"),
    (b'{"a": ' + b"9" * 4301 + b"}", "Integer value out of range"),
    (b'{"a": -1e309}', "Number out of range"),
    (rb'{"a": "\ud83d"}', r"\ud83d at byte 7 is an unpaired UTF-16 surrogate"),
    (rb'{"a": "\\ud83d \udfff"}', "invalid utf-16 surrogate pair"),
    (b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests arrays and objects too deeply"),
    (b"[" * 100_000, "nests arrays and objects too deeply"),
    (b'"x"', "must be a JSON object, got a string"),
    (b"1.5", "must be a JSON object, got a number"),
    (b"true", "must be a JSON object, got a boolean"),
])
def test_refusals_name_the_reason(raw: bytes, message: str) -> None:
    refusal = decode_body(raw)
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.code) == (400, "invalid_value")
    assert message in refusal.message


def test_objects_decode_with_big_integers_exact() -> None:
    assert decode_body(b'{"n": ' + b"9" * 4300 + b', "s": "\\ud83d\\ude00"}') == {"n": int("9" * 4300), "s": "😀"}


@pytest.mark.parametrize("value", ["x" * 60_000, int("9" * 4300), [[[[[[[[[1]]]]]]]]], list(range(10_000)),
                                   {str(i): i for i in range(10_000)}])
def test_shown_echoes_are_short(value: object) -> None:
    text = shown(value)
    assert len(text) <= SHOWN_CHARS + 4 and "..." in text


def test_shown_keeps_short_values_whole() -> None:
    assert shown("short") == "'short'"
    assert shown([1, "a", None]) == "[1, 'a', None]"
