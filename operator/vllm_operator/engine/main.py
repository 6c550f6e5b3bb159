"""`vllm-operator engine`: the engine pods' entrypoint — run vLLM as a child, make its start and failures visible.

vLLM has no OOM metric and its API server exits with code 0 when its engine core dies, so the kubelet and the
operator cannot tell a run-time CUDA OOM from a clean stop; and it answers HTTP only once it serves, so nobody can
tell a slow start from a hung one. This wrapper

* optionally preflights the GPU (free memory against the plan's budget, compute capability against an FP8 KV cache;
  `preflight.py`), failing fast with the numbers;
* starts the launch command as a child (`vllm serve MODEL ARGS…`, or rewritten for the CPU build's
  `python -m vllm.entrypoints.openai.api_server --model MODEL ARGS…` with `--launcher api-server`), passes its
  stdout and stderr through unchanged, and forwards SIGTERM/SIGINT for a graceful drain; on a CPU with AMX tiles
  its processes get the tile permission that vLLM's CPU attention assumes (`amx.py`), and every one of them counts
  the cgroup's memory in use, not the page cache it read, as used memory (vLLM refused a CPU pod's planned KV cache
  on a node with a cold page cache), both through the `sitecustomize` of `childsite.py`; a CPU engine without
  cores of its own (no static CPU manager) has its OpenMP threads left to the kernel's scheduler, as many as its CPU
  limit (`cpubind.py`: vLLM pins every engine of a node to the node's first cores);
* follows the start as phases (`phases.py`: launching, downloading, loading weights, compiling, profiling memory,
  KV cache allocated, serving) from the log — progress bars' `\r` updates included — and from the bytes arriving
  in the Hub cache (`downloads.py`), and serves them on its own port (`status.py`: `/startup` for the kubelet's
  startup probe, `/status`, `/metrics`);
* stops vLLM when a start-up phase goes its limit without advancing (exit code 83, StartupStalled);
* once vLLM serves, asks it for one token whenever it has been idle for a while (`idleprobe.py`) and exports
  whether it answered: vLLM's /health says 200 for an engine core that hangs without dying, and without traffic
  nothing else would notice;
* with `--adapters-file`, loads and unloads LoRA adapters in the serving vLLM as that file lists them
  (`adapters.py`: the adapters ConfigMap, followed without restarting vLLM);
* watches the log for "CUDA out of memory" / `OutOfMemoryError`, "EngineCore encountered a fatal error" (and the
  engine core dying), and the start-up "KV cache is needed, which is larger than the available KV cache memory";
* once the engine core has died, stops vLLM itself (`ENGINE_DEATH_GRACE_S` after the line, SIGTERM): vLLM's API
  server notices a dead engine only on its own watchdog's next round (every 5 s) and the kubelet restarts the
  container only after the wrapper exits, so every second it lingers is a second longer without the engine;
* exits with the distinct exit codes of the contract module (`constants.py`) and writes one JSON line to the
  termination message file (`--termination-message-path`, the container's terminationMessagePath) that
  `health.diagnose` reads back; it names the start-up phase the engine was in.

Usage: vllm-operator engine [--launcher serve|api-server|cli-main] [--python PY] [--termination-message-path P]
                            [--preflight auto|off|required] [--preflight-required-bytes N]
                            [--status-host H] [--status-port N] [--phase-limit PHASE=SECONDS ...]
                            [--adapters-file PATH] [--adapters-hub-cache DIR]
                            [--idle-probe-after S] [--idle-probe-timeout S] [--idle-probe-failures N]
                            [--idle-probe-tick S] [--hold-weights MARKER [--weights-leases DIR] [--pod-uid UID]]
                            -- vllm serve MODEL ARGS…
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from vllm_operator import constants
from vllm_operator.engine import (
    adapters,
    amx,
    childsite,
    cpubind,
    downloads,
    eviction,
    idleprobe,
    phases,
    preflight,
    status,
)

log = logging.getLogger("vllm_operator.engine")

LAUNCHERS = ("serve", "api-server", "cli-main")
READER_JOIN_S = 5.0
"""After the child exits, how long to wait for its log pipes to drain (engine-core grandchildren may hold them),
for both pipes together."""
ENGINE_DEATH_GRACE_S = 1.0
"""After the first engine-death line, how long vLLM gets to print the rest (a CUDA OOM's traceback follows the
fatal-error line) and to exit on its own before the wrapper stops it."""
WATCH_INTERVAL_S = 2.0
"""How often the watchdog measures the Hub cache and checks the phase limits."""
STALL_STOP_GRACE_S = 30.0
"""After a stall, how long vLLM gets to stop on SIGTERM before it is killed."""
LINE_SPLIT = re.compile(rb"[\r\n]")
MAX_PENDING_BYTES = 1 << 20


@dataclass(frozen=True)
class Pattern:
    reason: str
    regex: re.Pattern[str]


# Most specific first: a run-time CUDA OOM logs the OOM *and* the fatal-error line.
PATTERNS: tuple[Pattern, ...] = (
    Pattern(constants.REASON_KV_CACHE_TOO_SMALL,
            re.compile(r"KV cache is needed, which is larger than the available KV cache memory")),
    Pattern(constants.REASON_ENGINE_OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")),
    Pattern(constants.REASON_ENGINE_DEAD,
            re.compile(r"EngineCore encountered a fatal error|Engine core proc \S+ died unexpectedly|EngineDeadError|"
                       r"engine core exited unexpectedly")),
)
KV_NUMBERS = re.compile(r"max seq len \((?P<max_seq_len>\d+)\).*?\((?P<needed_gib>[\d.]+) GiB KV cache is needed.*?"
                        r"available KV cache memory \((?P<available_gib>[\d.]+) GiB\)"
                        r"(?:.*?estimated maximum model length is (?P<estimated_max_model_len>\d+))?")


EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[\w.]*(?:Error|Exception))\b: \S")
"""A Python exception's last line, also as vLLM's engine-core process prefixes it: `(EngineCore pid=N) RuntimeError:
For FP16/BF16 input, output must have the same dtype as inputs. For FP8 input, output must have dtype BF16`."""
GENERIC_EXCEPTION = re.compile(r"Engine core initialization failed|See root cause above|EngineDeadError|"
                               r"KeyboardInterrupt|SystemExit")
"""Exception lines that only point at another one (vLLM prints the root cause first) or that a stop causes."""


@dataclass
class Scanner:
    """Remembers the first log line that matched each failure pattern, and the last exception line that names a
    cause (`EXCEPTION_LINE`, not `GENERIC_EXCEPTION`) — the error a start that fails for another reason ends with.

    Once a stop was requested (SIGTERM forwarded), engine-death lines are part of a normal shutdown — vLLM's API
    server raises EngineDeadError when its engine core exits first — so only lines seen before the stop count.
    The first engine-death line outside a stop sets `died` and `wake` (the watchdog then stops vLLM).
    """

    seen: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: bool = False
    error_line: str | None = None
    died: bool = False
    wake: threading.Event = field(default_factory=threading.Event)

    def feed(self, line: str) -> None:
        if not self.stopping and EXCEPTION_LINE.search(line) and not GENERIC_EXCEPTION.search(line):
            with self.lock:
                self.error_line = line.strip()[:1024]
        for pattern in PATTERNS:
            if self.stopping and pattern.reason == constants.REASON_ENGINE_DEAD:
                continue
            if pattern.reason not in self.seen and pattern.regex.search(line):
                with self.lock:
                    self.seen.setdefault(pattern.reason, line.strip())
                if pattern.reason == constants.REASON_ENGINE_DEAD:
                    self.died = True
                    self.wake.set()


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    reason: str | None
    detail: str
    numbers: Mapping[str, float | int | str]


def outcome(child_code: int, seen: dict[str, str], stop_requested: bool, stalled: str | None = None,
            error_line: str | None = None, served: bool = False) -> Outcome:
    """The wrapper's exit code and reason from the child's code and what its log said (pure). `stalled` is the
    tracker's description when the wrapper stopped a stalled start: that stop is the cause, whatever vLLM printed
    while it went down. A non-zero exit before vLLM ever served (`served` False) with an exception line and none of
    the patterns is StartupFailed, its detail vLLM's error line."""
    if stalled is not None:
        return Outcome(constants.EXIT_STARTUP_STALLED, constants.REASON_STARTUP_STALLED, stalled, {})
    for pattern in PATTERNS:
        if pattern.reason in seen:
            line = seen[pattern.reason]
            numbers: dict[str, float | int] = {}
            if pattern.reason == constants.REASON_KV_CACHE_TOO_SMALL and (m := KV_NUMBERS.search(line)):
                numbers = {k: (float(v) if "." in v else int(v)) for k, v in m.groupdict().items() if v}
            return Outcome(constants.EXIT_CODES[pattern.reason], pattern.reason, line[:1024], numbers)
    if child_code == 0 and not stop_requested:
        return Outcome(constants.EXIT_UNEXPECTED, constants.REASON_UNEXPECTED_EXIT,
                       "vLLM exited with code 0 although no stop was requested", {})
    if child_code < 0:  # killed by a signal
        return Outcome(128 - child_code, None, f"vLLM was killed by signal {-child_code}", {})
    if child_code != 0 and not served and not stop_requested and error_line:
        return Outcome(constants.EXIT_STARTUP_FAILED, constants.REASON_STARTUP_FAILED, error_line[:1024], {})
    return Outcome(child_code, None, error_line[:1024] if error_line else "", {})


def termination_message(result: Outcome, child_code: int, startup: Mapping[str, object] | None = None) -> str:
    """One JSON line, at most 4096 bytes (the kubelet's limit). `startup` adds where the start was (phase, since,
    progress): an OOM while profiling memory is a different problem from one after hours of serving."""
    body: dict[str, object] = {"reason": result.reason, "exitCode": result.exit_code, "childExitCode": child_code,
                               "detail": result.detail, **result.numbers}
    if startup is not None:
        body.update({"phase": startup.get("phase"), "phaseSince": startup.get("since"),
                     "progress": startup.get("progress") or None, "limitSeconds": startup.get("limitSeconds")})
        body = {k: v for k, v in body.items() if v is not None or k == "reason"}
    text = json.dumps(body, separators=(",", ":"))
    while len(text.encode()) > constants.TERMINATION_MESSAGE_MAX_BYTES and len(str(body["detail"])) > 16:
        body["detail"] = str(body["detail"])[: len(str(body["detail"])) // 2]
        text = json.dumps(body, separators=(",", ":"))
    return text


def write_termination_message(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    except OSError as err:
        log.warning("Could not write the termination message to %s: %s", path, err)


def launch_command(command: Sequence[str], launcher: str, python: str) -> list[str]:
    """`vllm serve MODEL ARGS…` as the chosen launcher runs it; any other command runs as given."""
    cmd = list(command)
    if len(cmd) >= 2 and os.path.basename(cmd[0]) == "vllm" and cmd[1] == "serve" and launcher != "serve":
        if len(cmd) < 3 or cmd[2].startswith("-"):
            raise ValueError(f"launcher {launcher} needs `vllm serve MODEL ...` with the model third, got {cmd[:3]}")
        model, rest = cmd[2], cmd[3:]
        if launcher == "api-server":
            return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *rest]
        return [python, "-m", "vllm.entrypoints.cli.main", "serve", model, *rest]
    return cmd


def model_of(command: Sequence[str]) -> str | None:
    """The model a launch command serves: `vllm serve MODEL`, or the value of `--model`."""
    cmd = list(command)
    if len(cmd) >= 3 and os.path.basename(cmd[0]) == "vllm" and cmd[1] == "serve" and not cmd[2].startswith("-"):
        return cmd[2]
    for i, arg in enumerate(cmd):
        if arg == "--model" and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith("--model="):
            return arg.split("=", 1)[1]
    return None


def _pump(stream: IO[bytes], sink: IO[bytes], scanner: Scanner, monitor: status.Monitor | None) -> None:
    """Pass the child's output through unchanged and read it as lines split at `\n` *and* `\r`: progress bars
    (tqdm) redraw with `\r` and end their line only when done, and their updates are the progress we look for.
    A segment that has not ended yet (the bar being drawn) goes to the phase tracker at once; the failure scanner
    reads only whole lines, so a failure text split across two reads is never missed."""
    pending = b""
    read = getattr(stream, "read1", stream.read)
    while chunk := read(65536):
        try:
            sink.write(chunk)
            sink.flush()
        except (OSError, ValueError):
            pass
        *lines, rest = LINE_SPLIT.split(pending + chunk)
        if len(rest) > MAX_PENDING_BYTES:
            lines, rest = [*lines, rest], b""
        for raw in lines:
            if raw:
                _feed(raw, scanner, monitor)
        if rest and rest != pending and monitor is not None:
            monitor.feed(rest.decode("utf-8", "replace"))
        pending = rest
    if pending:
        _feed(pending, scanner, monitor)
    stream.close()


def _feed(raw: bytes, scanner: Scanner, monitor: status.Monitor | None) -> None:
    line = raw.decode("utf-8", "replace")
    scanner.feed(line)
    if monitor is not None:
        monitor.feed(line)


@dataclass(frozen=True)
class StartupOptions:
    """How the wrapper follows the start (see `phases.py` and `status.py`)."""

    status_host: str = ""
    status_port: int | None = constants.ENGINE_STATUS_PORT
    """None: no endpoint (the phases are still followed and logged)."""
    limits: Mapping[phases.Phase, float] = field(default_factory=lambda: dict(phases.DEFAULT_LIMITS_S))
    model: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """vLLM's environment (and where its Hub cache is looked for)."""
    watch_interval_s: float = WATCH_INTERVAL_S
    stop_grace_s: float = STALL_STOP_GRACE_S
    death_grace_s: float = ENGINE_DEATH_GRACE_S
    adapters_file: str | None = None
    """The pool's adapters file (`engine/adapters.py`); None: no LoRA adapters to follow."""
    adapters_hub_cache: str | None = None
    """Where Hub-sourced adapters are downloaded (None: the environment's HF_HOME)."""
    engine_url: str = f"http://127.0.0.1:{constants.ENGINE_PORT}"
    adapters_interval_s: float = adapters.INTERVAL_S
    idle_probe: idleprobe.ProbeSettings = field(default_factory=idleprobe.ProbeSettings)
    """The idle engine's generation probe (`engine/idleprobe.py`); `idle_after_s` 0 turns it off."""
    idle_probe_tick_s: float = idleprobe.TICK_S


def _watch(child: subprocess.Popen[bytes], monitor: status.Monitor, options: StartupOptions, stop: threading.Event,
           stalled: list[str], scanner: Scanner) -> None:
    """Measure the Hub cache and check the phase limits until the child exits; stop a stalled start, and vLLM
    once its engine core has died (woken by `scanner.wake`, also set when the child has exited)."""
    blobs = downloads.repo_blobs(options.model or "", options.env)
    while child.poll() is None:
        if scanner.died:
            if not stop.is_set():
                _end_dead_engine(child, options, stop, scanner)
            return
        if blobs is not None and not monitor.serving:
            monitor.observe_download(downloads.bytes_in(blobs))
        if not stop.is_set() and not monitor.serving and monitor.check():
            stalled.append(monitor.describe())
            stop.set()
            scanner.stopping = True
            log.error("Stopped vLLM (pid %d): its start stalled, %s", child.pid, stalled[0])
            _terminate(child, options.stop_grace_s)
            return
        scanner.wake.wait(options.watch_interval_s)


def _end_dead_engine(child: subprocess.Popen[bytes], options: StartupOptions, stop: threading.Event,
                     scanner: Scanner) -> None:
    """vLLM's engine core died: let vLLM finish its lines and exit by itself for `death_grace_s`, then stop it
    (SIGTERM, SIGKILL after `stop_grace_s`). Not a stop request for the outcome: the death line already decided
    the reason, and later lines still count (an OOM's traceback)."""
    try:
        child.wait(options.death_grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    stop.set()
    log.warning("Stopped vLLM (pid %d): its engine core died (%s), and vLLM's own watchdog would notice only on "
                "its next round", child.pid, scanner.seen.get(constants.REASON_ENGINE_DEAD, "")[:200])
    _terminate(child, options.stop_grace_s)


def _terminate(child: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, and SIGKILL if vLLM has not exited `grace_s` later."""
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        log.error("vLLM (pid %d) did not stop within %.0fs of SIGTERM; killed it", child.pid, grace_s)
        with contextlib.suppress(ProcessLookupError):
            child.kill()


def run(command: Sequence[str], *, termination_path: str, startup: StartupOptions | None = None) -> int:
    """Run the child to the end; returns the wrapper's exit code (see module docstring)."""
    options = startup or StartupOptions()
    scanner = Scanner()
    stop = threading.Event()
    monitor = status.Monitor(phases.Tracker(started_at=time.time(), limits=options.limits))
    syncer = None
    if options.adapters_file:
        cache = options.adapters_hub_cache

        def resolve(adapter: adapters.Adapter) -> str:
            return adapters.hub_download(adapter, cache=cache)

        syncer = adapters.Syncer(options.adapters_file, options.engine_url, resolve_hub=resolve)
    if syncer is not None:
        monitor.adapters = syncer.snapshot
        threading.Thread(target=syncer.run, args=(lambda: monitor.serving, stop, options.adapters_interval_s),
                         name="engine-adapters", daemon=True).start()
    if options.idle_probe.enabled:
        monitor.probe = idleprobe.Monitor(options.idle_probe)
        threading.Thread(target=idleprobe.run, args=(monitor.probe, options.engine_url, lambda: monitor.serving,
                                                     stop, options.idle_probe_tick_s),
                         name="engine-idle-probe", daemon=True).start()
    server = None
    if options.status_port is not None:
        try:
            server = status.serve(monitor, options.status_host, options.status_port)
        except OSError as err:
            result = Outcome(constants.EXIT_LAUNCH_FAILED, constants.REASON_LAUNCH_FAILED,
                             f"could not listen on {options.status_host or '0.0.0.0'}:{options.status_port} for "
                             f"the start-up status (the startup probe asks there): {err}", {})
            write_termination_message(termination_path, termination_message(result, -1))
            log.error("Could not serve the start-up status: %s", err)
            return result.exit_code
    try:
        return _run_child(command, termination_path, options, scanner, stop, monitor)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def _run_child(command: Sequence[str], termination_path: str, options: StartupOptions, scanner: Scanner,
               stop: threading.Event, monitor: status.Monitor) -> int:
    try:
        child = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=options.env)
    except OSError as err:
        result = Outcome(constants.EXIT_LAUNCH_FAILED, constants.REASON_LAUNCH_FAILED,
                         f"could not start {command[0]!r}: {err}", {})
        write_termination_message(termination_path, termination_message(result, -1))
        log.error("Could not start the engine: %s", err)
        return result.exit_code

    def forward(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        scanner.stopping = True
        log.info("Forwarded signal %d to vLLM (pid %d)", signum, child.pid)
        if child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    assert child.stdout is not None and child.stderr is not None
    stalled: list[str] = []
    readers = [threading.Thread(target=_pump, args=(child.stdout, sys.stdout.buffer, scanner, monitor), daemon=True),
               threading.Thread(target=_pump, args=(child.stderr, sys.stderr.buffer, scanner, monitor), daemon=True)]
    watchdog = threading.Thread(target=_watch, args=(child, monitor, options, stop, stalled, scanner), daemon=True,
                                name="engine-watchdog")
    for thread in [*readers, watchdog]:
        thread.start()
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    scanner.wake.set()  # the watchdog returns at once instead of after its interval
    drained = time.monotonic() + READER_JOIN_S
    for thread in [*readers, watchdog]:
        thread.join(max(0.0, drained - time.monotonic()))
    result = outcome(code, dict(scanner.seen), stop.is_set(), stalled[0] if stalled else None,
                     scanner.error_line, served=monitor.serving)
    if result.reason is not None or result.exit_code != 0:
        write_termination_message(termination_path, termination_message(result, code, monitor.snapshot()))
    if result.reason is not None:
        log.error("vLLM ended with %s (child exit code %d, wrapper exit code %d): %s", result.reason, code,
                  result.exit_code, result.detail[:300])
    return result.exit_code


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-operator engine",
                                description="Run vLLM under the engine wrapper (engine pods' command).")
    p.add_argument("--launcher", choices=LAUNCHERS, default=os.environ.get("VLLM_OPERATOR_LAUNCHER", "serve"),
                   help="how `vllm serve MODEL ARGS` is started: serve (as given), api-server (python -m "
                        "vllm.entrypoints.openai.api_server --model MODEL), cli-main (python -m "
                        "vllm.entrypoints.cli.main serve MODEL); env VLLM_OPERATOR_LAUNCHER")
    p.add_argument("--python", default=os.environ.get("VLLM_OPERATOR_PYTHON", sys.executable),
                   help="interpreter for the api-server and cli-main launchers (env VLLM_OPERATOR_PYTHON)")
    p.add_argument("--termination-message-path", default="/dev/termination-log",
                   help="file the one-line JSON failure reason is written to (the container's terminationMessagePath)")
    p.add_argument("--preflight", choices=("auto", "off", "required"), default="auto",
                   help="GPU preflight: auto (when a GPU can be read), off, required (fail without GPU facts)")
    p.add_argument("--preflight-required-bytes", type=int, default=None,
                   help="free memory each GPU must have (the plan's budget); default gpu-memory-utilization x total")
    p.add_argument("--status-host", default=os.environ.get("POD_IP", ""),
                   help="address of the start-up status endpoint (default: env POD_IP, else all addresses)")
    p.add_argument("--status-port", type=int, default=constants.ENGINE_STATUS_PORT,
                   help=f"port of the start-up status endpoint (/startup, /status, /metrics; default "
                        f"{constants.ENGINE_STATUS_PORT}; 0 turns it off)")
    p.add_argument("--phase-limit", action="append", default=[], metavar="PHASE=SECONDS",
                   help="seconds a start-up phase may go without advancing before vLLM is stopped (repeatable; "
                        "defaults: " + ", ".join(f"{k.value}={v:.0f}" for k, v in phases.DEFAULT_LIMITS_S.items())
                        + ")")
    p.add_argument("--watch-interval", type=float, default=WATCH_INTERVAL_S, metavar="SECONDS",
                   help=f"how often the Hub cache is measured and the limits checked (default {WATCH_INTERVAL_S:.0f})")
    p.add_argument("--adapters-file", default=None, metavar="PATH",
                   help="LoRA adapters file to follow (the adapters ConfigMap's <pool>.json): adapters are loaded "
                        "and unloaded in the running vLLM through its runtime endpoints as the file changes")
    p.add_argument("--adapters-hub-cache", default=None, metavar="DIR",
                   help="directory Hub-sourced adapters are downloaded into (default: HF_HOME's hub cache)")
    probe = idleprobe.ProbeSettings()
    p.add_argument("--idle-probe-after", type=float, metavar="SECONDS",
                   default=os.environ.get("VLLM_OPERATOR_IDLE_PROBE_AFTER", str(probe.idle_after_s)),
                   help="ask the engine for one token after this long without work, to find an engine that "
                        "answers /health but generates nothing (engine/idleprobe.py); 0 turns it off (default "
                        f"{probe.idle_after_s:g}; env VLLM_OPERATOR_IDLE_PROBE_AFTER)")
    p.add_argument("--idle-probe-timeout", type=float, metavar="SECONDS",
                   default=os.environ.get("VLLM_OPERATOR_IDLE_PROBE_TIMEOUT", str(probe.timeout_s)),
                   help=f"how long one probe may take (default {probe.timeout_s:g}; env "
                        "VLLM_OPERATOR_IDLE_PROBE_TIMEOUT)")
    p.add_argument("--idle-probe-failures", type=int, metavar="N",
                   default=os.environ.get("VLLM_OPERATOR_IDLE_PROBE_FAILURES", str(probe.failures)),
                   help=f"failed probes in a row that flag the engine unresponsive (default {probe.failures}; env "
                        "VLLM_OPERATOR_IDLE_PROBE_FAILURES)")
    p.add_argument("--idle-probe-tick", type=float, default=idleprobe.TICK_S, metavar="SECONDS",
                   help=f"how often vLLM's /metrics is read to tell an idle engine (default {idleprobe.TICK_S:g})")
    p.add_argument("--hold-weights", default=None, metavar="MARKER",
                   help="the weights cache entry's .complete marker: held under a shared lock while the wrapper "
                        "runs, so the cache does not evict a model in use (engine/eviction.py)")
    p.add_argument("--weights-leases", default=None, metavar="DIR",
                   help="the weights cache's lease directory, mounted read-write: with --hold-weights, this pod's "
                        "lease of the entry is renewed at every start and every "
                        f"{eviction.LEASE_RENEW_S:.0f} s, so an engine the kubelet keeps restarting keeps its entry")
    p.add_argument("--pod-uid", default=os.environ.get("POD_UID"),
                   help="this pod's UID, the lease's name (default: env POD_UID)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command, e.g. vllm serve MODEL ARGS")
    return p


def _preflight(mode: str, command: Sequence[str], required: int | None) -> list[str]:
    if mode == "off":
        return []
    found = preflight.read_gpus()
    if found is None or not found[0]:
        if mode == "required":
            return ["preflight required but no GPU could be read (no NVML, no nvidia-smi, or no device visible)"]
        log.info("Skipped the GPU preflight: no GPU visible")
        return []
    gpus, how = found
    request = preflight.parse_request(command)
    problems = preflight.check(gpus, request, required_bytes=required)
    if not problems:
        log.info("Preflight passed via %s: %s", how, "; ".join(
            f"GPU {g.index} {g.name} {g.free_bytes / preflight.GIB:.1f}/{g.total_bytes / preflight.GIB:.1f} GiB free"
            f" cc {g.compute_capability}" for g in gpus[:request.tensor_parallel_size]))
    return problems


def hold_weights(marker: Path, leases: str | None, pod_uid: str | None) -> Outcome | None:
    """Hold the weights cache entry for this process's life (eviction.hold) and renew this pod's lease of it now
    and while the wrapper runs (eviction.keep_renewing); the outcome to exit with when the entry is gone."""
    try:
        eviction.hold(marker)
    except OSError as err:
        detail = (f"the cached model's marker {marker} cannot be read ({err.strerror}): the weights cache entry is "
                  "gone; restarts cannot fetch it again (fetch-weights runs when a pod is created), a replacement "
                  "pod does")
        return Outcome(constants.EXIT_WEIGHTS_GONE, constants.REASON_WEIGHTS_GONE, detail, {})
    log.info("Holding the weights cache entry %s while the engine runs", marker)
    if leases and pod_uid:
        lease = eviction.pod_lease(Path(leases), marker, pod_uid)
        eviction.keep_renewing(lease, threading.Event())
        log.info("Renewing the weights cache lease %s every %.0f s", lease, eviction.LEASE_RENEW_S)
    elif leases:
        log.warning("No pod UID (--pod-uid, env POD_UID): the weights cache lease is not renewed")
    return None


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="vllm-operator engine: %(levelname)s %(message)s")
    args = build_parser().parse_args(list(argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("vllm-operator engine: give the command after --, e.g. -- vllm serve MODEL ARGS", file=sys.stderr)
        return 2
    if args.hold_weights:  # first: a restart renews the lease even when a later check fails
        refused = hold_weights(Path(args.hold_weights), args.weights_leases, args.pod_uid)
        if refused is not None:
            write_termination_message(args.termination_message_path, termination_message(refused, -1))
            log.error("%s", refused.detail)
            return refused.exit_code
    try:
        cmd = launch_command(command, args.launcher, args.python)
        limits = phases.parse_limits(args.phase_limit)
        probe = idleprobe.ProbeSettings(idle_after_s=args.idle_probe_after, timeout_s=args.idle_probe_timeout,
                                        failures=args.idle_probe_failures)
        probe.validate()
        problems = _preflight(args.preflight, command, args.preflight_required_bytes)
    except ValueError as err:
        print(f"vllm-operator engine: {err}", file=sys.stderr)
        return 2
    if problems:
        detail = "; ".join(problems)
        result = Outcome(constants.EXIT_PREFLIGHT_FAILED, constants.REASON_PREFLIGHT_FAILED, detail, {})
        write_termination_message(args.termination_message_path, termination_message(result, -1))
        log.error("Preflight failed: %s", detail)
        return result.exit_code
    log.info("Starting %s", " ".join(cmd))
    amx_tile = amx.host_has_amx_tile()
    if amx_tile:
        log.info("This CPU has AMX tiles: vLLM's processes ask for the tile state at start (%s on PYTHONPATH; "
                 "vllm_operator/engine/amx.py says why)", childsite.SITE_DIR)
    env, bound = cpubind.child_env(childsite.child_env(os.environ, amx_tile))
    if bound is not None:
        log.info("This CPU engine %s (%s)", bound.reason,
                 ", ".join(f"{k}={v}" for k, v in bound.env.items()))
    startup = StartupOptions(env=env,
                             status_host=args.status_host, status_port=args.status_port or None, limits=limits,
                             model=model_of(command), watch_interval_s=max(0.1, args.watch_interval),
                             adapters_file=args.adapters_file, adapters_hub_cache=args.adapters_hub_cache,
                             engine_url=adapters.engine_url(command), idle_probe=probe,
                             idle_probe_tick_s=max(0.1, args.idle_probe_tick))
    return run(cmd, termination_path=args.termination_message_path, startup=startup)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
