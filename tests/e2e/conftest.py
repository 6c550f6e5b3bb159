"""The e2e tier's shared fixtures.

* `venv_vllm_pinned`: the project venv's vLLM files held in the page cache for a module that runs vLLM from
  `.venv-vllm` (plain engines, the wrapper tests: `pytestmark` names it). `tests/support/vllm_cpu.pinned_in_page_cache`
  says why: these VMs page out what was idle for a minute, and a restarted vLLM re-read torch from a disk the whole
  tier writes to; a restart once printed nothing for 7 minutes. The stacks on real nodes pin the engine image's own
  copy, which their containers read, instead (tests/support/e2e_stack.py).
* `cpu_dev`: `examples/cpu-dev.yaml` on the real control plane and real nodes (tests/support/e2e_stack.py), started
  once for the session and shared by the modules that need exactly that system (test_operator_vllm, test_router_vllm,
  test_self_healing_vllm, whose faults run last by name): each start is two cold vLLM engines, about a minute of the
  tier. Modules with a variant of the example (LoRA, autoscaling) or a node of their own (node failure) start
  their own.
* `healthy`: that system Ready, and the test inside its network namespace (`Stack.inside`: the session's later
  tests use the host's loopback); a fault test before may have left it healing. Tests ask for this, not `cpu_dev`.
* `plain_engine`: one plain vLLM (tests/support/plain_engine.py) for the substrate and health-signal modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.e2e_stack import Stack, running_stack
from tests.support.plain_engine import SharedEngine
from tests.support.vllm_cpu import pinned_in_page_cache


@pytest.fixture(scope="module")
def venv_vllm_pinned() -> Iterator[None]:
    with pinned_in_page_cache():
        yield


@pytest.fixture(scope="session")
def cpu_dev(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("cpu-dev"), tiny_model_dir, inside=False) as s:
        yield s


@pytest.fixture
def healthy(cpu_dev: Stack) -> Iterator[Stack]:
    """The system Ready (a previous fault test may have left it healing), the test thread in its network namespace
    for the test (and the threads it starts, which inherit it)."""
    with cpu_dev.inside():
        cpu_dev.wait_ready()
        yield cpu_dev


@pytest.fixture(scope="session")
def plain_engine(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[SharedEngine]:
    shared = SharedEngine(tiny_model_dir, tmp_path_factory.mktemp("plain-engine"))
    try:
        yield shared
    finally:
        shared.close()
