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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "vllm_site"
"""Holds the `sitecustomize.py` that installs the working-set reading (stdlib only: it runs in vLLM's interpreter)."""


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for vLLM's process: `SITE_DIR` first on PYTHONPATH (kept once, the rest kept in order)."""
    out = dict(env)
    site = str(SITE_DIR)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    out["PYTHONPATH"] = os.pathsep.join([site, *rest])
    return out
