"""Engine argument form and the version tables."""

from __future__ import annotations

import pytest

from tests.unit.planning.helpers import make_plan
from vllm_operator.api.errors import SpecError
from vllm_operator.planning import engine_args


@pytest.mark.parametrize(("token", "name"), [
    ("--max-model-len=1", "max-model-len"), ("--max_model_len", "max-model-len"),
    ("--Max_Model_Len=2", "max-model-len"),
    ("-tp", "tensor-parallel-size"), ("--no-enable-chunked-prefill", "enable-chunked-prefill"),
    ("--no-enable-prefix-caching", "no-enable-prefix-caching"), ("value", None), ("-", None),
], ids=str)
def test_normalize_flag(token: str, name: str | None) -> None:
    assert engine_args.normalize_flag(token) == name


def test_extra_args_appended_after_sorted_managed_args() -> None:
    p = make_plan(pools={"short": {"extraArgs": ["--enable-prefix-caching", "--swap-space-gb", "4",
                                                 "--attention-backend", "TRITON_ATTN"]}})
    args = p.pools["short"].engine_args
    assert args[-5:] == ["--enable-prefix-caching", "--swap-space-gb", "4", "--attention-backend", "TRITON_ATTN"]
    assert args[:-5] == sorted(args[:-5])


def test_generation_override_is_compact_unquoted_json() -> None:
    assert engine_args.generation_override(512) == '{"max_new_tokens":512}'


@pytest.mark.parametrize(("value", "text"), [(0.9, "0.9"), (0.85, "0.85"), (1.0, "1.0"), (0.4567, "0.4567")],
                         ids=["0.9", "0.85", "1", "4-digits"])
def test_format_float(value: float, text: str) -> None:
    assert engine_args.format_float(value) == text


@pytest.mark.parametrize(("version", "table", "warns"), [
    ("0.26", "0.26", False), ("0.26.0", "0.26", False), ("0.32.0", "0.32", False), ("0.33.1", "0.33", False),
    ("0.30.0", "0.26", True), ("1.0", "0.33", True),
], ids=str)
def test_version_tables(version: str, table: str, warns: bool) -> None:
    got, warnings = engine_args.engine_version(version, "f")
    assert got.version == table and bool(warnings) == warns


@pytest.mark.parametrize("version", ["0.25.9", "zero", "1"], ids=["too-old", "garbage", "no-minor"])
def test_bad_versions_refused(version: str) -> None:
    with pytest.raises(SpecError) as info:
        engine_args.engine_version(version, "spec.engine.gpu.version")
    assert info.value.field == "spec.engine.gpu.version"


def test_every_table_has_every_flag_the_planner_emits() -> None:
    for version in engine_args.ENGINE_VERSIONS.values():
        for example in (make_plan(engine_version=version.version), make_plan(
                engine_version=version.version, accelerator={"count": 2}, model={"quantization": "awq"})):
            for pool in example.pools.values():
                flags = {a.split("=", 1)[0].removeprefix("--") for a in pool.engine_args}
                assert flags <= version.flags
