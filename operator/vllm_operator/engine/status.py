"""The wrapper's own small endpoint: where the start is, as JSON, as Prometheus metrics, and for the startup probe.

vLLM answers HTTP only once it serves, so nothing about a start can be asked of vLLM itself; the wrapper, which
reads vLLM's log from the first line, can answer at once. It listens on its own port (`ENGINE_STATUS_PORT`, named
`status` in the pod) with

* `GET /startup` — the kubelet's startup probe: 200 once vLLM serves; 503 while it starts and when it stalled,
  with the `/status` JSON as the body (the kubelet records the first bytes of a failed probe in its event). A
  kubelet startup probe ends at its first success, after which liveness on vLLM's `/health` begins, so it must not
  succeed before vLLM answers; the stall limits are enforced by the wrapper itself (it stops vLLM and exits with
  `StartupStalled`), and the probe's failure budget is only a backstop for a wrapper that cannot answer at all.
* `GET /status` — the phase, since when, progress, limits, history and per-phase durations (always 200).
* `GET /metrics` — the same as gauges (`vllm_operator_engine_startup_*`, `vllm_operator_engine_process_start_*`),
  and, once vLLM serves, the idle engine's generation probe (`vllm_operator_engine_unresponsive`,
  `engine/idleprobe.py`), scraped by the PodMonitor next to vLLM's own metrics; the health loop reads them from
  Prometheus.

Stdlib `http.server` on a daemon thread: three read-only paths do not justify a framework inside the vLLM image.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vllm_operator import constants
from vllm_operator.engine import idleprobe
from vllm_operator.engine.phases import PHASES, Phase, Tracker

log = logging.getLogger("vllm_operator.engine")

METRIC_PHASE = constants.METRIC_STARTUP_PHASE
METRIC_PHASE_SINCE = constants.METRIC_STARTUP_PHASE_SINCE
METRIC_LAST_PROGRESS = constants.METRIC_STARTUP_LAST_PROGRESS
METRIC_STALLED = constants.METRIC_STARTUP_STALLED
METRIC_LIMIT = constants.METRIC_STARTUP_LIMIT
METRIC_DOWNLOAD = constants.METRIC_STARTUP_DOWNLOAD
METRIC_DOWNLOAD_TOTAL = constants.METRIC_STARTUP_DOWNLOAD_TOTAL
METRIC_DOWNLOAD_FILES = constants.METRIC_STARTUP_DOWNLOAD_FILES
METRIC_DOWNLOAD_TOTAL_FILES = constants.METRIC_STARTUP_DOWNLOAD_TOTAL_FILES
METRIC_DOWNLOAD_ETA = constants.METRIC_STARTUP_DOWNLOAD_ETA
METRIC_KV_TOKENS = constants.METRIC_STARTUP_KV_TOKENS
METRIC_DURATION = constants.METRIC_STARTUP_DURATION
METRIC_PROCESS_START = constants.METRIC_PROCESS_START
METRIC_ADAPTER_LOADED = constants.METRIC_ADAPTER_LOADED
METRIC_UNRESPONSIVE = constants.METRIC_ENGINE_UNRESPONSIVE
METRIC_PROBE_FAILURES = constants.METRIC_IDLE_PROBE_FAILURES
METRIC_PROBE_LAST_SUCCESS = constants.METRIC_IDLE_PROBE_LAST_SUCCESS
CONTENT_TYPE_METRICS = "text/plain; version=0.0.4; charset=utf-8"


class Monitor:
    """The tracker behind a lock: log-reader threads, the watchdog and HTTP handlers all touch it."""

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker
        self._lock = threading.Lock()
        self.adapters: Callable[[], dict[str, Any]] | None = None
        """The adapter syncer's snapshot (`engine/adapters.py`), when the engine serves LoRA adapters."""
        self.probe: idleprobe.Monitor | None = None
        """The idle engine's generation probe (`engine/idleprobe.py`), when it is on."""

    def feed(self, line: str, now: float | None = None) -> bool:
        with self._lock:
            before = self._tracker.phase
            advanced = self._tracker.feed(line, time.time() if now is None else now)
            after = self._tracker.phase
        if after is not before:
            log.info("Entered start-up phase %s (from %s)", after.value, before.value)
        return advanced

    def observe_download(self, bytes_done: int, now: float | None = None, total: int | None = None,
                         files: tuple[int, int] | None = None, eta_s: float | None = None) -> bool:
        with self._lock:
            before = self._tracker.phase
            grew = self._tracker.observe_download(bytes_done, time.time() if now is None else now, total,
                                                  files=files, eta_s=eta_s)
            after = self._tracker.phase
        if after is not before:
            log.info("Entered start-up phase %s (from %s): bytes are arriving in the Hub cache", after.value,
                     before.value)
        return grew

    def check(self, now: float | None = None) -> bool:
        with self._lock:
            return self._tracker.check(time.time() if now is None else now)

    def describe(self, now: float | None = None) -> str:
        with self._lock:
            return self._tracker.describe(time.time() if now is None else now)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        with self._lock:
            out = self._tracker.to_json(time.time() if now is None else now)
        if self.adapters is not None:
            out["adapters"] = self.adapters()
        if self.probe is not None:
            out["idleProbe"] = self.probe.snapshot()
        return out

    @property
    def phase(self) -> Phase:
        with self._lock:
            return self._tracker.phase

    @property
    def serving(self) -> bool:
        with self._lock:
            return self._tracker.serving


class _Collector(Collector):
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        s = self.monitor.snapshot()
        phase = GaugeMetricFamily(METRIC_PHASE, "1 for the start-up phase the engine is in, 0 for the others.",
                                  labels=["phase"])
        for p in PHASES:
            phase.add_metric([p.value], 1.0 if s["phase"] == p.value else 0.0)
        yield phase
        yield GaugeMetricFamily(METRIC_PHASE_SINCE, "When the engine entered its current start-up phase (epoch s).",
                                value=float(s["since"]))
        yield GaugeMetricFamily(METRIC_LAST_PROGRESS, "When the start last advanced (epoch s).",
                                value=float(s["lastProgressAt"]))
        yield GaugeMetricFamily(METRIC_STALLED, "1 once the current phase went its limit without advancing.",
                                value=1.0 if s["stalled"] else 0.0)
        yield GaugeMetricFamily(METRIC_PROCESS_START, "When the wrapper launched this vLLM process (epoch s).",
                                value=float(s["startedAt"]))
        for name, key, help_ in ((METRIC_LIMIT, "limitSeconds", "Seconds the current phase may go without advancing."),
                                 (METRIC_DOWNLOAD, "downloadBytes", "Bytes of the Hub download on disk so far."),
                                 (METRIC_DOWNLOAD_TOTAL, "downloadTotalBytes",
                                  "Bytes the Hub download will have, where the hub client reported it."),
                                 (METRIC_DOWNLOAD_FILES, "downloadFiles",
                                  "Files of the download finished and verified, where the fetch counts them."),
                                 (METRIC_DOWNLOAD_TOTAL_FILES, "downloadTotalFiles",
                                  "Files the download will have, where the fetch counts them."),
                                 (METRIC_DOWNLOAD_ETA, "downloadEtaSeconds",
                                  "Seconds the download still needs at its average rate so far."),
                                 (METRIC_KV_TOKENS, "kvCacheTokens", "KV cache size in tokens, as vLLM printed it.")):
            if s[key] is not None:
                yield GaugeMetricFamily(name, help_, value=float(s[key]))
        durations = GaugeMetricFamily(METRIC_DURATION, "Seconds the start spent in each phase so far.",
                                      labels=["phase"])
        for name, seconds in s["durations"].items():
            durations.add_metric([name], float(seconds))
        yield durations
        if "adapters" in s:
            loaded = GaugeMetricFamily(METRIC_ADAPTER_LOADED, "1 for a LoRA adapter loaded in vLLM, 0 for one the "
                                       "adapters file lists that is not (pending or failed).", labels=["adapter"])
            for name in sorted(set(s["adapters"]["wanted"]) | set(s["adapters"]["loaded"])):
                loaded.add_metric([name], 1.0 if name in s["adapters"]["loaded"] else 0.0)
            yield loaded
        if "idleProbe" in s:
            probe = s["idleProbe"]
            yield GaugeMetricFamily(METRIC_UNRESPONSIVE, "1 once one-token probes of the idle engine failed "
                                    "failuresToFlag times in a row while vLLM's /health answered; 0 otherwise.",
                                    value=1.0 if probe["unresponsive"] else 0.0)
            yield GaugeMetricFamily(METRIC_PROBE_FAILURES, "Failed one-token probes of the idle engine in a row.",
                                    value=float(probe["failures"]))
            if probe["lastSuccessAt"] is not None:
                yield GaugeMetricFamily(METRIC_PROBE_LAST_SUCCESS, "When a probe of the idle engine last got its "
                                        "token (epoch s).", value=float(probe["lastSuccessAt"]))


def metrics_text(monitor: Monitor) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(monitor))
    return generate_latest(registry)


def _handler(monitor: Monitor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "vllm-operator-engine"

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(HTTPStatus.OK, metrics_text(monitor), CONTENT_TYPE_METRICS)
                return
            if path in ("/status", "/startup"):
                snap = monitor.snapshot()
                body = json.dumps(snap, separators=(",", ":")).encode()
                ok = path == "/status" or snap["phase"] == Phase.SERVING.value
                self._send(HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE, body, "application/json")
                return
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown vLLM's own log

    return Handler


def serve(monitor: Monitor, host: str, port: int) -> ThreadingHTTPServer:
    """Start the endpoint on a daemon thread; the caller shuts it down. OSError when the port is taken."""
    server = ThreadingHTTPServer((host, port), _handler(monitor))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="engine-status", daemon=True).start()
    log.info("Serving start-up status on http://%s:%d (/startup, /status, /metrics)", host or "0.0.0.0",
             server.server_address[1])
    return server
