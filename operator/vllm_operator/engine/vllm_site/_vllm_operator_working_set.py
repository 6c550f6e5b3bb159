"""vLLM counts the page cache a container read as memory it may not use; the wrapper makes it count what is in use.

Measured on a CPU pool (examples/cpu-dev.yaml: 4 GiB limit, 1.19 GiB planned KV cache, cgroup v1): started on a node
whose page cache did not hold the image's files, vLLM refused its own planned KV cache — "Available memory on node 0
(0.88/4.0 GiB) on kv cache allocation is less than requested memory for kv". The kernel charges a cgroup the file
pages its processes read first (torch, vLLM, the model), and vLLM's CPU worker (`vllm/utils/cpu_resource_utils.py`,
0.32/0.33: `get_memory_node_info`) takes `limit - memory.usage_in_bytes` (v2: `memory.max - memory.current`) as the
memory left, page cache included. That is vLLM's mistake, not the pod's: clean page cache is reclaimed by the kernel
before the cgroup's limit is hit (an allocation under the limit evicts it; it never OOM-kills for it), and vLLM's
own host-wide figure in the same function counts file pages as available (MemFree + Active(file) + Inactive(file) +
SReclaimable). It bites exactly on a fresh node or after a node's page cache was dropped, and on cgroup v2 as well.

Three ways were weighed:

* **Plan a bigger memory limit** with room for the charged page cache: the room would be the size of everything
  read at start-up (a ~1–2 GB torch + vLLM install, plus the weights for a model read from disk), reserved on the
  node for good though the kernel hands it back on demand — scheduling capacity lost to a misreading, and still a
  guess (a larger model reads more).
* **Drop the page cache** from inside the container before the KV allocation: needs writes to the cgroup's control
  files or /proc/sys/vm, which an engine container (all capabilities dropped, non-root) does not have.
* **Correct the reading** (chosen): every process vLLM starts gets `vllm_site/` first on its PYTHONPATH; its
  `sitecustomize` wraps `get_cgroup_memory_usage()` so that it returns the usage without the page cache that no
  process maps: usage − (active + inactive file pages − mapped file pages), from memory.stat (`total_*` on v1,
  the plain keys on v2). What stays counted is what cannot be handed back on demand: anonymous memory, shared memory
  (/dev/shm, which counts against the limit and is not reclaimable), kernel memory, and the file pages processes
  map (torch's code, mmapped weights). Nothing else of vLLM changes: its headroom checks keep working, against the
  number that means what they assume.

  Why not the kubelet's working set (usage − inactive file pages), the first candidate: measured on the engine-cpu
  image under a 4 GiB limit with a cold page cache, three processes importing torch and vLLM (the API server, the
  engine core and the worker do) left 896 MiB of page cache charged, 348 MiB of it *active* — files read by more
  than one process are promoted on their second read — though nothing maps them. The working set keeps those
  counted; the refusal it had to cure was short by 0.31 GiB (0.88 GiB left, 1.19 GiB planned).

Harmless where it does not matter: without a cgroup memory limit vLLM never reads the usage; on a GPU pod it reads it
only to estimate host RAM for weight loading (`model_loader/weight_utils.py`), where this is the better
estimate too; a vLLM without the function (another version) is left alone, as is one where memory.stat cannot be
read. `VLLM_OPERATOR_CGROUP_WORKING_SET=0` turns it off. The patch is installed through an import hook, so it is in
place before any vLLM module imports the function's name.

This module: the cgroup memory vLLM counts as used, without the page cache no process maps (which the kernel
reclaims). Stdlib only, and no import of vllm_operator: it runs inside vLLM's interpreter, where `sitecustomize.py`
beside it (put first on vLLM's PYTHONPATH by engine/childsite.py) installs `install()`; the rest is pure and
unit-tested.
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


def stat_value(stat_text: str, key: str) -> int | None:
    """One counter of a cgroup's memory.stat; None when the key is missing or unreadable."""
    for line in stat_text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None


KEYS = {False: ("total_active_file", "total_inactive_file", "total_mapped_file"),
        True: ("active_file", "inactive_file", "file_mapped")}
"""(active file, inactive file, mapped file) in memory.stat: v1's `total_*` count the whole subtree, as
`memory.usage_in_bytes` does; v2's are the cgroup's own, as `memory.current` is."""


def unmapped_page_cache(stat_text: str, v2: bool) -> int | None:
    """File pages on the cgroup's LRU lists that no process maps: page cache the kernel reclaims before the limit
    is hit. None when memory.stat lacks a counter."""
    values = [stat_value(stat_text, key) for key in KEYS[v2]]
    if any(v is None for v in values):
        return None
    active, inactive, mapped = (int(v or 0) for v in values)
    return max(0, active + inactive - mapped)


def working_set(usage: int | None, stat_text: str | None, v2: bool) -> int | None:
    """`usage` without the unmapped page cache, never below 0; `usage` as it was when memory.stat cannot be read."""
    if usage is None or stat_text is None:
        return usage
    cache = unmapped_page_cache(stat_text, v2)
    return usage if cache is None else max(0, usage - cache)


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
                                       "usage without the unmapped page cache, which the kernel reclaims.")
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
