"""The e2e tier's machine-level fixture: vLLM's own files held in the page cache for the whole tier
(`tests/support/vllm_cpu.pinned_in_page_cache` says why: these VMs page out what was idle for a minute, and a
restarted vLLM re-read torch from a disk the whole tier writes to; a restart once printed nothing for 7 minutes)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm_cpu import pinned_in_page_cache


@pytest.fixture(scope="session", autouse=True)
def vllm_files_in_page_cache() -> Iterator[None]:
    with pinned_in_page_cache():
        yield
