"""The cgroup memory vLLM counts as used, as the kubelet counts it: usage minus the inactive file pages.

Stdlib only, and no import of vllm_operator: it runs inside vLLM's interpreter (engine/cgroup.py says why it exists
and how it gets there). `sitecustomize.py` beside it installs `install()`; the rest is pure and unit-tested.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

TARGET = "vllm.utils.cpu_resource_utils"
"""vLLM's module whose `get_cgroup_memory_usage()` every cgroup headroom check reads (vLLM 0.32/0.33)."""
FUNCTION = "get_cgroup_memory_usage"
V2_MAX = "/sys/fs/cgroup/memory.max"
V2_STAT = "/sys/fs/cgroup/memory.stat"
V1_STAT = "/sys/fs/cgroup/memory/memory.stat"
DISABLE_ENV = "VLLM_OPERATOR_CGROUP_WORKING_SET"
"""Set to 0 to leave vLLM's own reading alone."""


def inactive_file(stat_text: str, v2: bool) -> int | None:
    """Bytes of inactive file pages from a cgroup's memory.stat (v2 `inactive_file`; v1 `total_inactive_file`, which
    like `memory.usage_in_bytes` counts the whole subtree); None when the key is missing or unreadable."""
    key = "inactive_file" if v2 else "total_inactive_file"
    for line in stat_text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


def working_set(usage: int | None, stat_text: str | None, v2: bool) -> int | None:
    """`usage - inactive_file`, never below 0 (the kubelet's `container_memory_working_set_bytes`); `usage` as it was
    when memory.stat cannot be read."""
    if usage is None or stat_text is None:
        return usage
    inactive = inactive_file(stat_text, v2)
    return usage if inactive is None else max(0, usage - inactive)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _is_v2() -> bool:
    """vLLM's own test: cgroup v2 when memory.max can be read."""
    text = _read(V2_MAX)
    return text is not None and text.strip() != ""


def wrap(original: Callable[[], int | None], read: Callable[[str], str | None] = _read,
         is_v2: Callable[[], bool] = _is_v2) -> Callable[[], int | None]:
    def get_cgroup_memory_usage() -> int | None:
        usage = original()
        v2 = is_v2()
        return working_set(usage, read(V2_STAT if v2 else V1_STAT), v2)

    get_cgroup_memory_usage.__doc__ = (f"{original.__doc__ or ''}\n\nWrapped by the vllm-operator engine wrapper: the "
                                       "working set (usage minus inactive file pages), as the kubelet counts it.")
    get_cgroup_memory_usage.__wrapped__ = original  # type: ignore[attr-defined]
    return get_cgroup_memory_usage


def patch(module: ModuleType) -> bool:
    """Replace the module's usage reader; False (and nothing changed) when this vLLM has none."""
    original = getattr(module, FUNCTION, None)
    if not callable(original) or hasattr(original, "__wrapped__"):
        return False
    setattr(module, FUNCTION, wrap(original))
    return True


class _Finder(importlib.abc.MetaPathFinder):
    """Patches TARGET right after it is executed, before anything can import names from it."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader: Any = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Patch vLLM's usage reader when its module is imported (at once when it already is)."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return
    loaded = sys.modules.get(TARGET)
    if loaded is not None:
        patch(loaded)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
