"""pytest fixtures for the real-vLLM tiers: the tiny model directory (made once per session).

Registered in tests/conftest.py. The engines themselves are started per module by the tests that need them
(`tests.support.vllm_cpu.start_vllm` in a module-scoped fixture): each costs ~20 s of a 2-core machine and ~1 GB.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import vllm_cpu

TINY_MODEL_NAME = "tiny-llama"
"""Directory name of the tiny model, as examples/cpu-dev.yaml's PVC path has it."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_model.py --shape tiny, written once per session into a temporary directory."""
    return vllm_cpu.make_model("tiny", tmp_path_factory.mktemp("models") / TINY_MODEL_NAME)
