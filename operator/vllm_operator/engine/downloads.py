"""How many bytes of a Hub download have arrived, measured in the Hugging Face cache on disk.

vLLM fetches weights with `huggingface_hub.snapshot_download` and turns its progress bars off, so its log says
nothing between "Using model weights format" and "Time spent downloading weights". The bytes are visible on disk
all the same: the hub client writes each file into `<cache>/models--ORG--NAME/blobs/`, as `<hash>.incomplete`
while it arrives. Summing that folder's sizes every few seconds tells a download that moves from one that hangs,
which is what the Downloading phase's limit is about. A local model directory (a PVC) has no download.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def hub_cache(env: Mapping[str, str]) -> Path:
    """The hub cache the child will use: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    return Path(env.get("HOME") or "~").expanduser() / ".cache" / "huggingface" / "hub"


def repo_blobs(model: str, env: Mapping[str, str]) -> Path | None:
    """The blobs folder a Hub model id downloads into; None when `model` is a local directory or no Hub id."""
    if not model or Path(model).exists() or model.startswith(("/", ".")) or model.count("/") != 1:
        return None
    return hub_cache(env) / ("models--" + model.replace("/", "--")) / "blobs"


def bytes_in(folder: Path) -> int:
    """Total size of the files directly in `folder` (0 when it does not exist yet)."""
    total = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # renamed from .incomplete between listing and stat
    return total
