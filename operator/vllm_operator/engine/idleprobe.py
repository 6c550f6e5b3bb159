"""A one-token generation probe of an idle engine: a zombie vLLM is found without user traffic.

vLLM's `/health` asks its API server whether the engine has *reported* an error (`AsyncLLM.check_health` reads a
flag); an engine core that hangs without dying — a stuck collective, a wedged driver call, a process stopped by a
signal — leaves `/health` at 200 while no request is ever answered. The health loop's stall rule sees such an engine
only once requests run and no token comes (it needs traffic); an engine that hangs while its pool is idle stays
Ready, the router keeps sending it the next user's requests, and those are the first to find out.

So the wrapper, which already follows vLLM from its first log line, asks the engine for one token when it has been
idle for `idle_after_s`:

* **Idle means no work in vLLM's own numbers** (`vllm:num_requests_running` and `_waiting` at 0, and
  `vllm:generation_tokens_total` not grown since the last look), read off vLLM's `/metrics` every few seconds. A
  request that runs long — a 32K-token prefill on CPU, a long generation — keeps the engine busy and is never
  competed with: no probe runs while anything runs or waits, and growing token counts are proof of life by
  themselves (the stall rule judges a busy engine).
* **The probe is one token that ends as `stop`:** `/v1/completions` with `max_tokens: 1`, the only allowed token
  id 0 (`allowed_token_ids`, every vocabulary has it) also a stop token (`stop_token_ids`). So it finishes with
  `finished_reason="stop"`, not `length`, and does not feed the RunawayGeneration share; it costs one prefill of a
  one-word prompt and one decode step.
* **A probe fails** when no answer comes within `timeout_s`, or vLLM answers 5xx. It counts only when the engine
  did not generate anything meanwhile (a real request that arrived during the probe and produced tokens proves the
  engine alive, whatever happened to the probe). After `failures` failures in a row the engine is *unresponsive*:
  the wrapper exports `vllm_operator_engine_unresponsive 1`, which the health loop reads (`api.signals`,
  EngineUnresponsive) and acts on — it deletes the pod within the pool's restart budget — and which the alert
  rules threshold. Probing goes on meanwhile: one success (a stopped process continued) clears it.
* A probe answered 4xx is asked again without the token constraint (an engine that refuses `allowed_token_ids`
  then gets plain one-token probes, which finish as `length`); answered 4xx again, this engine cannot be probed
  this way (a pooling model has no completions): the prober says so once and stops; nothing is flagged.

Defaults (`ProbeSettings`): idle 60 s, timeout 30 s, 2 failures, so a zombie is flagged within about two minutes of
its last work (plus the health loop's interval). On a GPU a one-token probe is a few milliseconds once a minute of
idleness; on a CPU engine it is one forward pass of a short prompt (well under the timeout for the models a CPU
pool serves). Wrapper flags (`--idle-probe-after`, `--idle-probe-timeout`, `--idle-probe-failures`, and their
`VLLM_OPERATOR_IDLE_PROBE_*` environment variables, which a pool's `env` sets) change them; `--idle-probe-after 0`
turns the probe off.

The state machine (`IdleProber`) is pure — times are passed in — so every rule is a row in a unit test; `run` is the
thread that feeds it from HTTP.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("vllm_operator.engine")

TICK_S = 5.0
"""How often vLLM's /metrics is read (the probe's own clock)."""
METRICS_TIMEOUT_S = 5.0
PROBE_TOKEN_ID = 0
"""The one token the probe may generate, and a stop token: the probe ends as `stop` after one token."""
PROBE_PROMPT = "ping"

_SERIES = re.compile(r"^vllm[:_](?P<name>num_requests_running|num_requests_waiting|generation_tokens_total)"
                     r"(?:\{[^}]*\})?\s+(?P<value>\S+)", re.MULTILINE)


@dataclass(frozen=True)
class ProbeSettings:
    idle_after_s: float = 60.0
    """Seconds without work before the first probe (0: no probing)."""
    timeout_s: float = 30.0
    """How long one probe may take before it counts as failed."""
    failures: int = 2
    """Failed probes in a row that make the engine unresponsive."""

    @property
    def enabled(self) -> bool:
        return self.idle_after_s > 0

    def validate(self) -> None:
        """ValueError naming the setting when a value cannot work."""
        if self.idle_after_s < 0:
            raise ValueError(f"--idle-probe-after must be >= 0 seconds (0 turns the probe off), got "
                             f"{self.idle_after_s:g}")
        if self.timeout_s <= 0:
            raise ValueError(f"--idle-probe-timeout must be > 0 seconds, got {self.timeout_s:g}")
        if self.failures < 1:
            raise ValueError(f"--idle-probe-failures must be >= 1, got {self.failures}")


@dataclass(frozen=True)
class EngineLoad:
    """vLLM's own numbers, summed over its series."""

    running: float
    waiting: float
    generated: float
    """generation_tokens_total."""

    @property
    def busy(self) -> bool:
        return self.running > 0 or self.waiting > 0


def parse_load(text: str) -> EngineLoad | None:
    """The three series from vLLM's /metrics text (either spelling of the names); None when any is missing."""
    sums: dict[str, float] = {}
    for m in _SERIES.finditer(text):
        try:
            sums[m["name"]] = sums.get(m["name"], 0.0) + float(m["value"])
        except ValueError:
            continue
    if len(sums) < 3:
        return None
    return EngineLoad(running=sums["num_requests_running"], waiting=sums["num_requests_waiting"],
                      generated=sums["generation_tokens_total"])


OK = "ok"
FAILED = "failed"
UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class ProbeResult:
    outcome: str
    """OK, FAILED or UNSUPPORTED."""
    detail: str
    seconds: float


@dataclass
class IdleProber:
    """When to probe and what the probes add up to. Every method takes `now` (epoch seconds)."""

    settings: ProbeSettings
    serving_since: float | None = None
    last_alive_at: float | None = None
    """When the engine last showed it works: began serving, generated tokens, or answered a probe."""
    last_generated: float | None = None
    busy: bool = False
    failures: int = 0
    """Failed probes in a row."""
    probes: int = 0
    last_probe_at: float | None = None
    last_success_at: float | None = None
    last_detail: str = ""
    unsupported: str | None = None
    """Why probing stopped for good (a 4xx answer); None while it goes on."""

    def start_serving(self, now: float) -> None:
        if self.serving_since is None:
            self.serving_since = now
            self.last_alive_at = now

    def observe(self, load: EngineLoad | None, now: float) -> None:
        """A look at vLLM's numbers (None: /metrics did not answer, which tells nothing here — a hung API server is
        the liveness probe's)."""
        if load is None:
            return
        if self.last_generated is not None and load.generated > self.last_generated:
            self.last_alive_at = now
            self._clear("generated tokens")
        self.last_generated = load.generated
        self.busy = load.busy

    def due(self, now: float) -> bool:
        """Whether a probe should run now: serving, probing on, nothing running or waiting, and idle long enough
        since the last sign of life; after a failed probe at once, until the failures in a row flag the engine;
        then every `idle_after_s` (a success clears the flag, and a hung engine is not sent a stream of probes)."""
        if (not self.settings.enabled or self.unsupported is not None or self.serving_since is None
                or self.busy or self.last_alive_at is None):
            return False
        if self.unresponsive:
            return self.last_probe_at is None or now - self.last_probe_at >= self.settings.idle_after_s
        return self.failures > 0 or now - self.last_alive_at >= self.settings.idle_after_s

    def record(self, result: ProbeResult, generated_meanwhile: bool, now: float) -> None:
        """A probe's result; `generated_meanwhile`: the engine's token count grew while it ran (alive, whatever
        the probe's own fate)."""
        self.probes += 1
        self.last_probe_at = now
        self.last_detail = result.detail
        if result.outcome == UNSUPPORTED:
            self.unsupported = result.detail
            return
        if result.outcome == OK or generated_meanwhile:
            self.last_success_at = now if result.outcome == OK else self.last_success_at
            self.last_alive_at = now
            self._clear("answered a probe" if result.outcome == OK else "generated tokens during a probe")
            return
        self.failures += 1

    def _clear(self, why: str) -> None:
        if self.failures:
            log.info("The engine %s again after %d failed idle probe(s)", why, self.failures)
        self.failures = 0

    @property
    def unresponsive(self) -> bool:
        return self.failures >= self.settings.failures

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.settings.enabled and self.unsupported is None, "idleAfterSeconds":
                self.settings.idle_after_s, "timeoutSeconds": self.settings.timeout_s,
                "failuresToFlag": self.settings.failures, "failures": self.failures, "probes": self.probes,
                "unresponsive": self.unresponsive, "lastProbeAt": self.last_probe_at,
                "lastSuccessAt": self.last_success_at, "lastAliveAt": self.last_alive_at,
                "detail": self.last_detail, "unsupported": self.unsupported}


class Monitor:
    """The prober behind a lock: the probe thread writes it, the status endpoint reads it."""

    def __init__(self, settings: ProbeSettings) -> None:
        self.settings = settings
        self._prober = IdleProber(settings)
        self._lock = threading.Lock()

    def start_serving(self, now: float) -> None:
        with self._lock:
            self._prober.start_serving(now)

    def observe(self, load: EngineLoad | None, now: float) -> None:
        with self._lock:
            self._prober.observe(load, now)

    def due(self, now: float) -> bool:
        with self._lock:
            return self._prober.due(now)

    def record(self, result: ProbeResult, generated_meanwhile: bool, now: float) -> None:
        with self._lock:
            self._prober.record(result, generated_meanwhile, now)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._prober.to_json()

    @property
    def failures(self) -> int:
        with self._lock:
            return self._prober.failures

    @property
    def unresponsive(self) -> bool:
        with self._lock:
            return self._prober.unresponsive


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def read_load(engine_url: str) -> EngineLoad | None:
    try:
        return parse_load(_get(f"{engine_url}/metrics", METRICS_TIMEOUT_S).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def served_model(engine_url: str, timeout: float) -> str | None:
    """The first model id vLLM serves (`--served-model-name`, else the model path)."""
    try:
        data = json.loads(_get(f"{engine_url}/v1/models", timeout))
        return str(data["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def probe_body(model: str, plain: bool = False) -> dict[str, Any]:
    """One token, which is also a stop token: finishes as `stop` (module docstring). `plain`: without the token
    constraint, for an engine that refuses `allowed_token_ids` (it then finishes as `length`)."""
    body: dict[str, Any] = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    if not plain:
        body.update(allowed_token_ids=[PROBE_TOKEN_ID], stop_token_ids=[PROBE_TOKEN_ID])
    return body


def probe(engine_url: str, model: str, timeout_s: float, plain: bool = False) -> ProbeResult:
    """One generation request with a deadline; never raises."""
    started = time.monotonic()
    request = urllib.request.Request(f"{engine_url}/v1/completions",
                                     data=json.dumps(probe_body(model, plain)).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            resp.read()
        return ProbeResult(OK, f"one token in {time.monotonic() - started:.2f}s", time.monotonic() - started)
    except urllib.error.HTTPError as err:
        took = time.monotonic() - started
        text = err.read()[:200].decode("utf-8", "replace")
        if 400 <= err.code < 500:
            return ProbeResult(UNSUPPORTED, f"vLLM answered the probe {err.code}: {text}", took)
        return ProbeResult(FAILED, f"vLLM answered the probe {err.code} after {took:.1f}s: {text}", took)
    except (OSError, ValueError) as err:  # timeout, connection reset
        took = time.monotonic() - started
        return ProbeResult(FAILED, f"no answer to a one-token request within {took:.1f}s "
                                   f"(timeout {timeout_s:g}s): {type(err).__name__}", took)


def run(monitor: Monitor, engine_url: str, serving: Callable[[], bool], stop: threading.Event,
        tick_s: float = TICK_S) -> None:
    """The probe thread: look at vLLM's numbers every `tick_s`, probe when due, until `stop`."""
    settings = monitor.settings
    if not settings.enabled:
        return
    model: str | None = None
    plain = False
    while not stop.wait(tick_s):
        if not serving():
            continue
        now = time.time()
        monitor.start_serving(now)
        load = read_load(engine_url)
        monitor.observe(load, now)
        if not monitor.due(now):
            continue
        model = model or served_model(engine_url, settings.timeout_s)
        if model is None:
            continue  # the API server does not answer: the kubelet's liveness probe is for that
        result = probe(engine_url, model, settings.timeout_s, plain)
        if result.outcome == UNSUPPORTED and not plain:  # e.g. sampling constraints refused: ask without them
            log.info("vLLM refused the constrained probe (%s); probing with a plain one-token request",
                     result.detail)
            plain = True
            result = probe(engine_url, model, settings.timeout_s, plain)
        after = read_load(engine_url)
        own = 1 if result.outcome == OK else 0  # the probe's own token
        grew = after is not None and load is not None and after.generated > load.generated + own
        was = monitor.unresponsive
        monitor.record(result, grew, time.time())
        if result.outcome == UNSUPPORTED:
            log.warning("Stopped probing the idle engine: %s", result.detail)
        elif result.outcome == FAILED and not grew:
            log.warning("Idle probe %d failed: %s", monitor.failures, result.detail)
            if monitor.unresponsive and not was:
                log.error("The engine is unresponsive: %d one-token probes in a row got no answer while "
                          "vLLM's /health still answers (%s)", monitor.failures, result.detail)
