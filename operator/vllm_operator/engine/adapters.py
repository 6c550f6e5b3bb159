"""Loading and unloading LoRA adapters in the running vLLM, from the adapters file the operator renders.

Why in the wrapper: adding an adapter must not restart the engine, and the operator never calls engines over the
network. vLLM loads adapters at run time through `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (only
with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, which the plan sets); those endpoints are unauthenticated, so only this
process, inside the pod, calls them — on vLLM's own address from its `--host`/`--port` — and the router never
forwards them. The list comes from the adapters ConfigMap mounted as a directory; the kubelet swaps its files in
place when the ConfigMap changes (its `..data` symlink), and this loop reads the file every few seconds:

* an adapter in the file and not loaded is loaded (a Hub source is first downloaded into the pod's Hugging Face
  cache with `huggingface_hub.snapshot_download` at its revision, in a child process: the engine's environment
  may set `HF_HUB_OFFLINE` for a PVC-sourced model);
* a loaded adapter no longer in the file is unloaded; one whose source changed is unloaded, then loaded again;
* a failed load is kept with vLLM's message and retried after `RETRY_S`; what is loaded and what failed is on the
  wrapper's `/status` (`adapters`) and `/metrics` (`vllm_operator_engine_adapter_loaded{adapter}`, 1 loaded, 0
  failed or pending), which the PodMonitor scrapes.

Nothing is loaded before vLLM serves (the endpoints do not exist yet). A vLLM that restarts is a new wrapper
process too (the container restarts), which loads the whole list again.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_operator import constants

log = logging.getLogger("vllm_operator.engine")

INTERVAL_S = 2.0
"""How often the adapters file is read (the kubelet's own ConfigMap refresh takes up to a minute)."""
RETRY_S = 30.0
"""A failed load is tried again after this long (a Hub outage, a PVC path not written yet)."""
HTTP_TIMEOUT_S = 120.0
"""vLLM reads the adapter's weights inside the load call."""
DOWNLOAD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Adapter:
    """One entry of the adapters file: a local path, or a Hub repository at a revision."""

    name: str
    path: str | None = None
    hf_repo: str | None = None
    hf_revision: str | None = None


def parse(text: str) -> dict[str, Adapter]:
    """The adapters file (`{"adapters": [{"name", "path" | "hfRepo"[, "hfRevision"]}]}`) by name; ValueError when
    it is not that shape."""
    body = json.loads(text)
    items = body.get("adapters") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ValueError("expected {\"adapters\": [...]}")
    out: dict[str, Adapter] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ValueError(f"adapter entry without a name: {item!r}")
        adapter = Adapter(name=item["name"], path=item.get("path"), hf_repo=item.get("hfRepo"),
                          hf_revision=item.get("hfRevision"))
        if (adapter.path is None) == (adapter.hf_repo is None):
            raise ValueError(f"adapter {adapter.name}: give exactly one of path and hfRepo")
        out[adapter.name] = adapter
    return out


def engine_url(command: Sequence[str]) -> str:
    """vLLM's base URL from its launch arguments (`--host`, `--port`; vLLM's defaults all addresses and 8000)."""
    host, port = "", str(constants.ENGINE_PORT)
    args = list(command)
    for i, arg in enumerate(args):
        for flag in ("--host", "--port"):
            value = arg.split("=", 1)[1] if arg.startswith(flag + "=") else (
                args[i + 1] if arg == flag and i + 1 < len(args) else None)
            if value is not None:
                host, port = (value, port) if flag == "--host" else (host, value)
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def post(url: str, body: Mapping[str, Any], timeout: float = HTTP_TIMEOUT_S) -> tuple[int, str]:
    """POST JSON; (status, body text) for 2xx and error answers alike; (0, reason) when nothing answered."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode("utf-8", "replace")
    except (OSError, TimeoutError) as err:
        return 0, str(err)


def error_message(text: str) -> str:
    """vLLM's `{"error": {"message": ...}}`, or the text itself."""
    try:
        body = json.loads(text)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text.strip()


def hub_download(adapter: Adapter, python: str = sys.executable, env: Mapping[str, str] | None = None,
                 cache: str | None = None) -> str:
    """The local directory of a Hub adapter at its revision, downloaded into `cache` (HF_HUB_CACHE; default the
    environment's HF_HOME) when missing; RuntimeError with the child's last line on failure."""
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "print(snapshot_download(sys.argv[1], revision=sys.argv[2] or None))")
    child_env = {k: v for k, v in (env if env is not None else os.environ).items()
                 if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    if cache is not None:
        child_env["HF_HUB_CACHE"] = cache
    proc = subprocess.run([python, "-c", code, adapter.hf_repo or "", adapter.hf_revision or ""], env=child_env,
                          capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"download of {adapter.hf_repo}@{adapter.hf_revision or 'main'} failed: {last[:300]}")
    return proc.stdout.strip().splitlines()[-1]


@dataclass
class Syncer:
    """Brings vLLM's loaded adapters to the file's list; `step` is one pass, `run` loops until `stop` is set."""

    path: str
    url: str
    resolve_hub: Callable[[Adapter], str] = hub_download
    now: Callable[[], float] = time.time
    loaded: dict[str, Adapter] = field(default_factory=dict)
    failed: dict[str, tuple[str, float]] = field(default_factory=dict)
    """name -> (message, when)."""
    wanted: dict[str, Adapter] = field(default_factory=dict)
    file_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_text: str | None = None

    def read(self) -> dict[str, Adapter] | None:
        """The file's list, or None (and `file_error` set) when it cannot be read or parsed: keep what is loaded."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                text = fh.read()
            wanted = parse(text)
        except (OSError, ValueError) as err:
            if self.file_error != str(err):
                log.warning("Could not read the adapters file %s (kept the loaded adapters): %s", self.path, err)
            self.file_error = str(err)
            return None
        if text != self._last_text and self._last_text is not None:
            log.info("Adapters file %s changed: %s", self.path, ", ".join(sorted(wanted)) or "no adapters")
        self._last_text = text
        self.file_error = None
        return wanted

    def step(self) -> None:
        wanted = self.read()
        if wanted is None:
            return
        with self._lock:
            self.wanted = wanted
        for name in sorted(set(self.loaded) - set(wanted)):
            self._unload(name)
        for name, adapter in sorted(wanted.items()):
            if name in self.loaded and self.loaded[name] != adapter:
                self._unload(name)
            if name not in self.loaded:
                failed = self.failed.get(name)
                if failed is None or self.now() - failed[1] >= RETRY_S:
                    self._load(adapter)
        with self._lock:
            for name in set(self.failed) - set(wanted):
                del self.failed[name]

    def _load(self, adapter: Adapter) -> None:
        try:
            path = adapter.path if adapter.path is not None else self.resolve_hub(adapter)
        except (RuntimeError, OSError, subprocess.SubprocessError) as err:
            self._failed(adapter, str(err))
            return
        status, text = post(f"{self.url}/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": path})
        if status == 200 or (status == 400 and "has already been loaded" in text):
            with self._lock:
                self.loaded[adapter.name] = adapter
                self.failed.pop(adapter.name, None)
            log.info("Loaded LoRA adapter %s from %s", adapter.name, path)
            return
        self._failed(adapter, f"vLLM answered {status or 'nothing'}: {error_message(text)[:500]}")

    def _failed(self, adapter: Adapter, message: str) -> None:
        with self._lock:
            self.failed[adapter.name] = (message, self.now())
        log.error("Could not load LoRA adapter %s (retrying in %.0f s): %s", adapter.name, RETRY_S, message)

    def _unload(self, name: str) -> None:
        status, text = post(f"{self.url}/v1/unload_lora_adapter", {"lora_name": name})
        if status in {200, 404}:  # 404: vLLM does not have it (anymore): the goal is reached
            with self._lock:
                self.loaded.pop(name, None)
            log.info("Unloaded LoRA adapter %s", name)
            return
        log.error("Could not unload LoRA adapter %s (retrying): vLLM answered %s: %s", name, status or "nothing",
                  error_message(text)[:500])

    def snapshot(self) -> dict[str, Any]:
        """For /status: loaded and wanted names, failures with their messages, a file problem."""
        with self._lock:
            return {"file": self.path, "loaded": sorted(self.loaded), "wanted": sorted(self.wanted),
                    "failed": {n: m for n, (m, _) in sorted(self.failed.items())}, "fileError": self.file_error}

    def run(self, serving: Callable[[], bool], stop: threading.Event, interval_s: float = INTERVAL_S) -> None:
        while not stop.is_set():
            if serving():
                try:
                    self.step()
                except Exception:  # a bug here must not take the engine down; it is logged and retried
                    log.exception("Adapter sync pass failed")
            stop.wait(interval_s)
