"""The engine wrapper's adapter sync: the file's list against what it loaded, through vLLM's two runtime endpoints.

The endpoints are answered by a small local HTTP server that keeps vLLM's semantics for them (200 on a new name, 400
"has already been loaded", 404 on unloading an unknown name, 500 with vLLM's message for a rank above the engine's);
the e2e tier (tests/e2e/test_lora_vllm.py) runs the same code against real vLLM.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from vllm_operator.engine import adapters
from vllm_operator.engine.phases import Tracker
from vllm_operator.engine.status import Monitor, metrics_text


class Engine:
    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse: dict[str, str] = {}


@pytest.fixture
def engine() -> Iterator[tuple[Engine, str]]:
    state = Engine()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.calls.append((self.path, body))
            name = body["lora_name"]
            if self.path == "/v1/load_lora_adapter":
                if name in state.refuse:
                    self._send(500, {"error": {"message": state.refuse[name]}})
                elif name in state.loaded:
                    self._send(400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}})
                else:
                    state.loaded[name] = body["lora_path"]
                    self._send(200, None)
            elif name in state.loaded:
                del state.loaded[name]
                self._send(200, None)
            else:
                self._send(404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}})

        def _send(self, status: int, body: Any) -> None:
            data = b"Success" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def write(path: Path, *items: dict[str, Any]) -> None:
    path.write_text(json.dumps({"adapters": list(items)}))


def test_adds_removes_and_reloads_changed_sources(engine: tuple[Engine, str], tmp_path: Path) -> None:
    state, url = engine
    f = tmp_path / "short.json"
    write(f, {"name": "a", "path": "/adapters/m/a"}, {"name": "b", "path": "/adapters/m/b"})
    sync = adapters.Syncer(str(f), url)
    sync.step()
    assert state.loaded == {"a": "/adapters/m/a", "b": "/adapters/m/b"}
    sync.step()  # nothing changed: no calls
    assert len(state.calls) == 2
    write(f, {"name": "b", "path": "/adapters/m/b2"}, {"name": "c", "path": "/adapters/m/c"})
    sync.step()
    assert state.loaded == {"b": "/adapters/m/b2", "c": "/adapters/m/c"}
    assert [c[0].rsplit("/", 1)[1] for c in state.calls[2:]] == [
        "unload_lora_adapter", "unload_lora_adapter", "load_lora_adapter", "load_lora_adapter"]
    assert sync.snapshot()["loaded"] == ["b", "c"]


def test_a_failed_load_is_reported_and_retried_later(engine: tuple[Engine, str], tmp_path: Path) -> None:
    state, url = engine
    state.refuse["big"] = "LoRA rank 16 is greater than max_lora_rank 8."
    f = tmp_path / "long.json"
    write(f, {"name": "big", "path": "/x"})
    clock = [1000.0]
    sync = adapters.Syncer(str(f), url, now=lambda: clock[0])
    sync.step()
    snap = sync.snapshot()
    assert snap["loaded"] == [] and snap["wanted"] == ["big"]
    assert snap["failed"] == {"big": "vLLM answered 500: LoRA rank 16 is greater than max_lora_rank 8."}
    sync.step()
    assert len(state.calls) == 1, "retried before RETRY_S"
    del state.refuse["big"]
    clock[0] += adapters.RETRY_S
    sync.step()
    assert sync.snapshot()["loaded"] == ["big"] and sync.snapshot()["failed"] == {}


def test_an_unreadable_file_keeps_what_is_loaded(engine: tuple[Engine, str], tmp_path: Path) -> None:
    state, url = engine
    f = tmp_path / "short.json"
    write(f, {"name": "a", "path": "/a"})
    sync = adapters.Syncer(str(f), url)
    sync.step()
    f.write_text("{not json")
    sync.step()
    assert state.loaded == {"a": "/a"} and sync.snapshot()["fileError"]
    f.unlink()
    sync.step()
    assert state.loaded == {"a": "/a"}


def test_already_loaded_counts_as_loaded_and_unknown_unload_as_done(engine: tuple[Engine, str],
                                                                     tmp_path: Path) -> None:
    state, url = engine
    state.loaded["a"] = "/a"
    f = tmp_path / "short.json"
    write(f, {"name": "a", "path": "/a"})
    sync = adapters.Syncer(str(f), url)
    sync.step()
    assert sync.snapshot()["loaded"] == ["a"]
    del state.loaded["a"]
    write(f)
    sync.step()
    assert sync.snapshot()["loaded"] == []


def test_hub_adapters_are_resolved_to_a_local_path_first(engine: tuple[Engine, str], tmp_path: Path) -> None:
    state, url = engine
    f = tmp_path / "short.json"
    write(f, {"name": "h", "hfRepo": "org/adapter", "hfRevision": "abc"})
    seen: list[adapters.Adapter] = []

    def resolve(a: adapters.Adapter) -> str:
        seen.append(a)
        return "/hf/snapshots/abc"

    adapters.Syncer(str(f), url, resolve_hub=resolve).step()
    assert seen == [adapters.Adapter(name="h", hf_repo="org/adapter", hf_revision="abc")]
    assert state.loaded == {"h": "/hf/snapshots/abc"}


def test_parse_refuses_entries_without_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one of path and hfRepo"):
        adapters.parse(json.dumps({"adapters": [{"name": "a"}]}))
    with pytest.raises(ValueError, match="adapters"):
        adapters.parse("[]")


@pytest.mark.parametrize(("args", "url"), [
    (["vllm", "serve", "m", "--host=10.1.2.3", "--port=8000"], "http://10.1.2.3:8000"),
    (["python", "-m", "x", "--host", "10.1.2.3", "--port", "9000"], "http://10.1.2.3:9000"),
    (["vllm", "serve", "m"], "http://127.0.0.1:8000"),
    (["vllm", "serve", "m", "--host=0.0.0.0"], "http://127.0.0.1:8000"),
])
def test_engine_url_is_vllms_own_address(args: list[str], url: str) -> None:
    assert adapters.engine_url(args) == url


def test_status_and_metrics_show_loaded_and_pending(engine: tuple[Engine, str], tmp_path: Path) -> None:
    state, url = engine
    state.refuse["bad"] = "nope"
    f = tmp_path / "short.json"
    write(f, {"name": "good", "path": "/g"}, {"name": "bad", "path": "/b"})
    sync = adapters.Syncer(str(f), url)
    sync.step()
    monitor = Monitor(Tracker(started_at=0.0))
    monitor.adapters = sync.snapshot
    assert monitor.snapshot()["adapters"]["loaded"] == ["good"]
    text = metrics_text(monitor).decode()
    assert 'vllm_operator_engine_adapter_loaded{adapter="good"} 1.0' in text
    assert 'vllm_operator_engine_adapter_loaded{adapter="bad"} 0.0' in text


def test_hub_download_failure_names_the_repo_and_revision(tmp_path: Path) -> None:
    # the Hub endpoint is a closed local port: nothing leaves the machine, and HF_HUB_OFFLINE (set for PVC models)
    # is dropped for the download child, so it really tries
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1",
           "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2", "PATH": "/usr/bin:/bin"}
    with pytest.raises(RuntimeError, match=r"download of org/adapter@abc failed: "):
        adapters.hub_download(adapters.Adapter(name="h", hf_repo="org/adapter", hf_revision="abc"), env=env)
