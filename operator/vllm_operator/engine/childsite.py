"""The `sitecustomize` that every Python process of vLLM's runs at interpreter start, and the environment that gets it
there.

Two things must happen inside vLLM's own processes, which the wrapper cannot reach after exec: the AMX tile
permission (`amx.py` says why) and the working-set reading of the cgroup's memory
(`vllm_site/_vllm_operator_working_set.py` says why). vLLM starts
its engine core and workers with `spawn` (fork + exec), so a change in the wrapper's process does not survive; an
environment does. `vllm_site/` goes first on the child's PYTHONPATH, which vLLM's spawned processes inherit; its
`sitecustomize` does both and then runs any other `sitecustomize` on the path, so an image's own keeps working.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "vllm_site"
"""Holds the `sitecustomize.py` (stdlib only: it runs in vLLM's interpreter) and the working-set module it installs."""
AMX_TILE_ENV = "VLLM_OPERATOR_AMX_TILE"
"""Set to "1" when the host's CPU has AMX tiles: the `sitecustomize` then asks for the tile state."""


def child_env(env: Mapping[str, str], amx_tile: bool) -> dict[str, str]:
    """`env` for vLLM's process: `SITE_DIR` first on PYTHONPATH (kept once, the rest kept in order), and the AMX
    request switched on only on a host with AMX tiles (an inherited switch is dropped where there are none)."""
    out = dict(env)
    site = str(SITE_DIR)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    out["PYTHONPATH"] = os.pathsep.join([site, *rest])
    if amx_tile:
        out[AMX_TILE_ENV] = "1"
    else:
        out.pop(AMX_TILE_ENV, None)
    return out
