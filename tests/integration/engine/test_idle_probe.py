"""The wrapper's idle-engine probe over the fake vLLM (`vllm-operator engine -- python -m fakevllm`).

The fake's `fail_mode: hang` is the zombie: `/health` and `/metrics` answer 200, model requests never do, and the
engine's own numbers do not move. The wrapper must flag it on its `/metrics` (`vllm_operator_engine_unresponsive 1`)
after the configured failures, clear it once the engine answers again, and never probe while a request runs — also
one that runs long without a token (a long prefill: the fake's `ttft_s`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.integration.engine.test_startup_phases import Wrapped, follow, wrapped
from vllm_operator import constants
from vllm_operator.engine import idleprobe

pytestmark = pytest.mark.integration

PROBE = ["--idle-probe-after=1", "--idle-probe-timeout=1", "--idle-probe-failures=2", "--idle-probe-tick=0.2"]


def engine(w: Wrapped, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{w.engine_port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def probes(w: Wrapped) -> list[dict[str, Any]]:
    """The probe requests the fake received (the ones asking for token id 0 only)."""
    return [r for r in engine(w, "/_control/requests?path=/v1/completions")
            if (r.get("body") or {}).get("allowed_token_ids") == [0]]


def metric(w: Wrapped, name: str) -> float | None:
    for line in w.get("/metrics")[1].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait(what: str, predicate: Any, timeout: float = 30.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout}s")


def test_a_hung_idle_engine_is_flagged_and_cleared_when_it_answers_again(tmp_path: Path) -> None:
    with wrapped(tmp_path, ["--startup-step-s=0.05", "--startup-steps=1"], PROBE) as w:
        _, last = follow(w)
        assert last is not None and last["phase"] == "Serving", w.log.read_text()[-3000:]
        wait("a first probe answered", lambda: (w.status() or {}).get("idleProbe", {}).get("lastSuccessAt"))
        sent = probes(w)
        assert sent and sent[0]["body"]["max_tokens"] == 1 and sent[0]["body"]["stop_token_ids"] == [0]
        assert metric(w, constants.METRIC_ENGINE_UNRESPONSIVE) == 0.0

        engine(w, "/_control", {"fail_mode": "hang"})
        hung = time.monotonic()
        wait("flagged unresponsive", lambda: metric(w, constants.METRIC_ENGINE_UNRESPONSIVE) == 1.0)
        took = time.monotonic() - hung
        assert w.health() == 200, "the zombie still answers /health: only the probe can tell"
        status = w.status()
        assert status is not None and status["idleProbe"]["failures"] >= 2 and status["idleProbe"]["unresponsive"]
        assert metric(w, constants.METRIC_IDLE_PROBE_FAILURES) is not None
        assert "The engine is unresponsive" in w.log.read_text()
        # idle 1 s (or at once) + 2 failures of 1 s each, plus ticks: seconds, not minutes
        assert took < 15, took

        engine(w, "/_control", {"fail_mode": "none"})
        wait("cleared after the engine answered", lambda: metric(w, constants.METRIC_ENGINE_UNRESPONSIVE) == 0.0)
        assert w.proc.poll() is None, "the wrapper only reports; the health loop replaces the pod"


def test_a_request_running_long_is_never_probed_or_flagged(tmp_path: Path) -> None:
    """A request that takes 6 s to its first token (a long prefill) and then streams slowly: the engine is busy the
    whole time, so no probe goes out (a probe must not compete with real work) and nothing is flagged."""
    with wrapped(tmp_path, ["--startup-step-s=0.05", "--startup-steps=1"], PROBE) as w:
        _, last = follow(w)
        assert last is not None and last["phase"] == "Serving", w.log.read_text()[-3000:]
        wait("a first probe answered", lambda: (w.status() or {}).get("idleProbe", {}).get("lastSuccessAt"))
        engine(w, "/_control", {"ttft_s": 6.0, "chunk_delay_s": 0.5})
        done: list[Any] = []
        body = {"model": "fake-model", "prompt": "a long document", "max_tokens": 6, "ignore_eos": True}
        worker = threading.Thread(target=lambda: done.append(engine(w, "/v1/completions", body, timeout=60)))
        started = time.time()
        worker.start()
        while worker.is_alive():
            assert metric(w, constants.METRIC_ENGINE_UNRESPONSIVE) == 0.0
            time.sleep(0.2)
        ended = time.time()
        assert done and done[0]["usage"]["completion_tokens"] == 6
        during = [r for r in probes(w) if started + 0.5 < r["received_at"] < ended - 0.5]
        assert during == [], f"probed while a request ran: {during}"
        status = w.status()
        assert status is not None and status["idleProbe"]["failures"] == 0


class _Engine(BaseHTTPRequestHandler):
    """vLLM's three endpoints the prober uses; it refuses `allowed_token_ids` (as a build with a sampler that does
    not support it would) and answers a plain one-token request."""

    bodies: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        if self.path == "/metrics":
            text = ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                    f"vllm:generation_tokens_total {len(self.bodies)}\n")
            self._send(200, text.encode())
        else:
            self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        self._send(400 if "allowed_token_ids" in body else 200, b"{}")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_engine_refusing_the_token_constraint_gets_plain_probes() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monitor = idleprobe.Monitor(idleprobe.ProbeSettings(idle_after_s=0.3, timeout_s=2, failures=2))
    stop = threading.Event()
    runner = threading.Thread(target=idleprobe.run, args=(monitor, f"http://127.0.0.1:{server.server_address[1]}",
                                                          lambda: True, stop, 0.1), daemon=True)
    runner.start()
    try:
        wait("two probes answered", lambda: monitor.snapshot()["probes"] >= 2)
    finally:
        stop.set()
        runner.join(5)
        server.shutdown()
    snap = monitor.snapshot()
    assert snap["enabled"] and snap["unsupported"] is None and not snap["unresponsive"]
    assert "allowed_token_ids" in _Engine.bodies[0] and "allowed_token_ids" not in _Engine.bodies[-1]
    assert [b for b in _Engine.bodies if "allowed_token_ids" in b] == _Engine.bodies[:1], "asked once, then plain"
