"""The GPU benchmark's VLLMDeployments: valid specs, and each variant differs from the baseline in one knob only.

The layouts are compared at equal hardware, so a variant that drifted in a second field would measure two things.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.loadgen import GPU_BENCH
from vllm_operator.api.resource import parse_resource

DEPLOYMENTS = GPU_BENCH / "deployments"


def spec(name: str) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((DEPLOYMENTS / f"{name}.yaml").read_text())
    parse_resource(obj)  # raises SpecError when invalid
    return obj


def flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    return out


def test_baseline_is_an_h200_with_engine_0_26() -> None:
    parsed = parse_resource(spec("bf16"))
    assert parsed.spec.accelerator.type.value == "nvidia-h200-141gb"
    assert parsed.spec.engine is not None and parsed.spec.engine.gpu is not None
    assert parsed.spec.engine.gpu.version == "0.26.0"


@pytest.mark.parametrize(
    ("variant", "field", "value"),
    [
        pytest.param("tuned", "spec.pools.long.maxNumBatchedTokens", 2048, id="tuned-chunked-prefill"),
        pytest.param("fp8", "spec.pools.long.kvCacheDtype", "fp8", id="fp8-kv"),
    ],
)
def test_variant_changes_one_knob(variant: str, field: str, value: Any) -> None:
    base, other = flat(spec("bf16")), flat(spec(variant))
    changed = {k for k in base.keys() | other.keys() if base.get(k) != other.get(k)}
    assert changed == {field}
    assert other[field] == value
