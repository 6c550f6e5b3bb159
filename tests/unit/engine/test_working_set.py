"""engine/vllm_site/_vllm_operator_working_set.py: vLLM is shown the cgroup usage without the page cache no process
maps."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_operator.engine import childsite

V1_STAT = """cache 1879048192
rss 1073741824
mapped_file 104857600
total_cache 1879048192
total_rss 1073741824
total_inactive_file 1610612736
total_active_file 134217728
total_mapped_file 104857600
inactive_file 1
"""
V2_STAT = "anon 1073741824\nfile 1879048192\ninactive_file 1610612736\nactive_file 134217728\nfile_mapped 52428800\n"


@pytest.fixture
def ws() -> Iterator[types.ModuleType]:
    """The stdlib-only module as vLLM's interpreter imports it (from the site directory, not as a package)."""
    path = childsite.SITE_DIR / "_vllm_operator_working_set.py"
    spec = importlib.util.spec_from_file_location("_vllm_operator_working_set_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module


def test_unmapped_page_cache_reads_the_hierarchical_keys_on_v1_and_the_plain_ones_on_v2(ws: types.ModuleType) -> None:
    # active + inactive - mapped: 128 MiB + 1536 MiB - 100 MiB
    assert ws.unmapped_page_cache(V1_STAT, v2=False) == 134217728 + 1610612736 - 104857600  # total_*, not own
    assert ws.unmapped_page_cache(V2_STAT, v2=True) == 134217728 + 1610612736 - 52428800
    assert ws.unmapped_page_cache("rss 5\n", v2=False) is None
    assert ws.unmapped_page_cache(V1_STAT.replace("total_mapped_file", "x"), v2=False) is None
    assert ws.unmapped_page_cache("total_active_file 1\ntotal_inactive_file 1\ntotal_mapped_file 9\n", False) == 0


def test_usage_without_the_unmapped_page_cache(ws: types.ModuleType) -> None:
    usage = 3_350_000_000  # 0.88 GiB left of 4 GiB: the refusal measured on a cold node
    cache = 134217728 + 1610612736 - 104857600
    assert ws.working_set(usage, V1_STAT, v2=False) == usage - cache
    assert ws.working_set(100, V1_STAT, v2=False) == 0  # never negative
    assert ws.working_set(usage, None, v2=False) == usage  # memory.stat unreadable: vLLM's own number
    assert ws.working_set(usage, "rss 1\n", v2=False) == usage
    assert ws.working_set(None, V1_STAT, v2=False) is None  # no limit: vLLM reads no usage


def test_wrap_reads_the_stat_of_the_version_vllm_reads(ws: types.ModuleType) -> None:
    files = {ws.V1_STAT: V1_STAT, ws.V2_STAT: "active_file 0\ninactive_file 1000\nfile_mapped 0\n"}
    v1 = ws.wrap(lambda: 2_000_000_000, read=files.get, is_v2=lambda: False)
    v2 = ws.wrap(lambda: 2_000_000_000, read=files.get, is_v2=lambda: True)
    assert v1() == 2_000_000_000 - (134217728 + 1610612736 - 104857600)
    assert v2() == 2_000_000_000 - 1000


def test_patch_replaces_the_function_once_and_leaves_other_versions_alone(ws: types.ModuleType) -> None:
    module = types.ModuleType("cpu_resource_utils")

    def get_cgroup_memory_usage() -> int | None:
        return None

    module.get_cgroup_memory_usage = get_cgroup_memory_usage  # type: ignore[attr-defined]
    assert ws.patch(module) is True
    patched = module.get_cgroup_memory_usage  # type: ignore[attr-defined]
    assert patched.__wrapped__ is get_cgroup_memory_usage and "page cache" in patched.__doc__
    assert ws.patch(module) is False and module.get_cgroup_memory_usage is patched  # type: ignore[attr-defined]
    assert ws.patch(types.ModuleType("older_vllm")) is False


def test_the_hook_patches_the_module_when_it_is_imported(ws: types.ModuleType, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of TARGET's name on the path is patched as it is executed, so `from ... import` sees the wrap."""
    package = tmp_path / "vllm" / "utils"
    package.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cpu_resource_utils.py").write_text("def get_cgroup_memory_usage():\n    return 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("vllm", "vllm.utils", "vllm.utils.cpu_resource_utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    before = list(sys.meta_path)
    try:
        ws.install()
        ws.install()  # once
        assert len(sys.meta_path) == len(before) + 1
        from vllm.utils.cpu_resource_utils import get_cgroup_memory_usage  # type: ignore[import-not-found]
        assert hasattr(get_cgroup_memory_usage, "__wrapped__")
    finally:
        sys.meta_path[:] = before
        for name in ("vllm", "vllm.utils", "vllm.utils.cpu_resource_utils"):
            sys.modules.pop(name, None)


def test_off_switch(ws: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ws.DISABLE_ENV, "0")
    before = list(sys.meta_path)
    ws.install()
    assert sys.meta_path == before

