"""Engine start-up as phases, read off what vLLM prints: where a start is, and whether it still moves.

A slow start, a hung one and an OOM loop look the same from outside (a pod that is not Ready), and the kubelet's
startup probe on `/health` kills a slow start as readily as a hung one. vLLM says a lot about its start on its log,
so the wrapper reads it (`feed`) and keeps a `Tracker`: the phase the start is in, since when, what progress it last
made and when. A start is *stalled* when its phase has not advanced — no new phase, no progress line, no new bytes
downloaded — for that phase's limit (`DEFAULT_LIMITS_S`). This module is pure (no I/O, times are passed in) and
import-light: it runs inside the vLLM image. The phase names and limits live in the contract module
(`constants.StartupPhase`, `constants.STARTUP_PHASE_LIMITS_S`), which the health loop and the renderer read too.

The phases, in the order vLLM 0.32 goes through them (the lines that mark them are in `RULES`):

* `Launching` — the process started: imports (torch from a cold disk), platform and distributed set-up, config.
* `Downloading` — weights are fetched from the Hub. vLLM's own download shows no progress bar, so the wrapper
  measures the bytes arriving in the Hub cache (`observe_download`); a hub client that prints a progress bar
  (`12.3M/4.97G`) gives the total as well. The weights cache's fetch (`fetch.py`) knows more and says it: files
  done of total and an ETA.
* `LoadingWeights` — "Starting to load model", the checkpoint-shard progress bar, "Loading weights took".
* `Compiling` — torch.compile (Dynamo transform, graph compilation, compile-cache loads) and CUDA-graph capture.
  On GPUs the capture comes after the KV cache is sized, so this phase can follow `KVCacheAllocated`.
* `ProfilingMemory` — the profiling run that measures what memory is left ("Memory profiling takes",
  "Available KV cache memory").
* `KVCacheAllocated` — "GPU KV cache size: N tokens" (`CPU KV cache size` on CPU): the start's number, kept as
  `kv_cache_tokens`, with the maximum concurrency vLLM prints next.
* `Serving` — uvicorn's "Application startup complete": the API answers; the kubelet's probes take over.

Why per-phase limits rather than one budget: the phases differ by orders of magnitude and by what "progress" means.
A 140 GiB download may take an hour and still be fine as long as bytes arrive; a profiling run that has printed
nothing for fifteen minutes is hung. Defaults are generous (a stall costs minutes, a false kill costs the whole
start) and a wrapper flag overrides each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm_operator import constants

Phase = constants.StartupPhase
PHASES: tuple[Phase, ...] = constants.STARTUP_PHASES
"""Every phase, in their usual order (the metric lists each one, 1 for the current)."""
DEFAULT_LIMITS_S: Mapping[Phase, float] = constants.STARTUP_PHASE_LIMITS_S
"""Seconds a phase may go without advancing (`constants.STARTUP_PHASE_LIMITS_S` says why each)."""


@dataclass(frozen=True)
class Rule:
    phase: Phase
    regex: re.Pattern[str]


RULES: tuple[Rule, ...] = (
    Rule(Phase.SERVING, re.compile(r"Application startup complete")),
    Rule(Phase.KV_CACHE_ALLOCATED, re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size: [\d,]+ tokens|"
                                              r"Maximum concurrency for [\d,]+ tokens per request|"
                                              r"init engine \(profile, create kv cache")),
    Rule(Phase.COMPILING, re.compile(r"Dynamo bytecode transform time|Compiling a graph|torch\.compile takes|"
                                     r"Directly load (?:the compiled graph|AOT compilation)|Capturing CUDA graphs|"
                                     r"Graph capturing finished|Warming up model for the compilation|"
                                     r"Warming up done|Compile and warming up model|Compiling model again|"
                                     r"saved AOT compiled function")),
    Rule(Phase.PROFILING_MEMORY, re.compile(r"Memory profiling takes|Available KV cache memory|"
                                            r"GiB for KV cache on node|Profiling CUDA graph memory")),
    Rule(Phase.LOADING_WEIGHTS, re.compile(r"Starting to load model|Loading (?:safetensors|pt|bin) checkpoint|"
                                           r"Loading weights took|Model loading took|Initializing model took|"
                                           r"Time spent downloading weights")),
    Rule(Phase.DOWNLOADING, re.compile(r"Fetching \d+ files|"
                                       r"\.(?:safetensors|bin|pth?|gguf)\S*:\s*\d{1,3}%\|")),
)
"""First match wins, so a line naming two phases counts for the later one ("Loading weights took" after download)."""

KV_TOKENS = re.compile(r"KV cache size: (?P<tokens>[\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
PERCENT = re.compile(r"(?P<pct>\d{1,3})%")
FRACTION = re.compile(r"\|\s*(?P<done>\d+)/(?P<total>\d+)\b")
SIZE_PAIR = re.compile(r"(?P<done>[\d.]+)\s?(?P<du>[kKMGT]?)i?B?/(?P<total>[\d.]+)\s?(?P<tu>[kKMGT]?)i?B?\b")
_UNITS = {"": 1, "k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4}
"""tqdm's unit_scale prefixes (powers of 1000)."""


def _size(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def classify(line: str) -> Phase | None:
    """The phase a log line marks, or None for a line that says nothing about the start."""
    for rule in RULES:
        if rule.regex.search(line):
            return rule.phase
    return None


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def human_seconds(s: float) -> str:
    """`45s`, `5m10s`, `2h05m`: an ETA a person reads at a glance."""
    s = max(0, round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class Tracker:
    """Where one start is. Every method takes `now` (epoch seconds), so tests drive the clock."""

    started_at: float
    """When the wrapper launched vLLM (the process start the health loop counts from)."""
    limits: Mapping[Phase, float] = field(default_factory=lambda: dict(DEFAULT_LIMITS_S))
    phase: Phase = Phase.LAUNCHING
    phase_since: float = 0.0
    last_progress_at: float = 0.0
    progress: str = ""
    """What the start last reported, short: `2.1 GiB of 15.0 GiB`, `shards 3/8`, `65,536 tokens`."""
    download_bytes: int | None = None
    download_total_bytes: int | None = None
    download_files: int | None = None
    """Files finished of `download_total_files` (only a fetch that counts them reports these)."""
    download_total_files: int | None = None
    download_eta_s: float | None = None
    """Seconds the download still needs, as its last observation estimated (None: not known yet)."""
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    history: list[tuple[Phase, float]] = field(default_factory=list)
    """(phase, entered at) in the order the start went through them (a phase re-entered appears again)."""
    stalled_at: float | None = None

    def __post_init__(self) -> None:
        self.phase_since = self.phase_since or self.started_at
        self.last_progress_at = self.last_progress_at or self.started_at
        if not self.history:
            self.history.append((self.phase, self.phase_since))

    def _enter(self, phase: Phase, now: float) -> None:
        if phase is not self.phase:
            self.phase = phase
            self.phase_since = now
            self.history.append((phase, now))
            self.progress = ""
        self.last_progress_at = now

    def feed(self, line: str, now: float) -> bool:
        """Read one log line (a progress bar's `\\r` segments are lines too); True when the start advanced."""
        if self.phase is Phase.SERVING or self.stalled_at is not None:
            return False
        phase = classify(line)
        if phase is None:
            if self.phase is Phase.LAUNCHING and line.strip():
                self.last_progress_at = now  # imports and config print as they go: any output is progress here
                return True
            return False
        self._enter(phase, now)
        if phase is Phase.DOWNLOADING and (m := SIZE_PAIR.search(line)) is not None:
            done, total = _size(m["done"], m["du"]), _size(m["total"], m["tu"])
            self.download_total_bytes = max(total, self.download_total_bytes or 0)
            self.download_bytes = max(done, self.download_bytes or 0)
            self.progress = f"{human_bytes(self.download_bytes)} of {human_bytes(self.download_total_bytes)}"
            return True
        kv, concurrency = KV_TOKENS.search(line), CONCURRENCY.search(line)
        if kv is not None or concurrency is not None:
            if kv is not None:
                self.kv_cache_tokens = int(kv["tokens"].replace(",", ""))
            if concurrency is not None:
                self.max_concurrency = float(concurrency["x"])
            parts = [f"{self.kv_cache_tokens:,} tokens"] if self.kv_cache_tokens is not None else []
            if concurrency is not None:
                parts.append(f"{self.max_concurrency:.2f}x concurrency at {concurrency['len']} tokens")
            self.progress = ", ".join(parts)
        elif (m := FRACTION.search(line)) is not None:
            label = "shards" if phase is Phase.LOADING_WEIGHTS else "steps"
            self.progress = f"{label} {m['done']}/{m['total']}"
        elif (m := PERCENT.search(line)) is not None:
            self.progress = f"{m['pct']}%"
        return True

    def observe_download(self, bytes_done: int, now: float, total: int | None = None,
                         files: tuple[int, int] | None = None, eta_s: float | None = None) -> bool:
        """Bytes in the download so far (measured in the Hub cache, or read off a progress bar); True when they
        grew. Growth moves a start that is launching or loading into Downloading: vLLM downloads while loading.
        `files` (done, total) and `eta_s` come from a fetch that counts them; they update the progress text but
        are not progress themselves (only new bytes are)."""
        if total is not None:
            self.download_total_bytes = total
        if files is not None:
            self.download_files, self.download_total_files = files
        self.download_eta_s = eta_s
        grew = self.download_bytes is not None and bytes_done > self.download_bytes
        first = self.download_bytes is None
        self.download_bytes = bytes_done if first else max(bytes_done, self.download_bytes or 0)
        if self.phase is Phase.SERVING or self.stalled_at is not None:
            return False
        if grew and self.phase in (Phase.LAUNCHING, Phase.LOADING_WEIGHTS):
            self._enter(Phase.DOWNLOADING, now)
        if self.phase is Phase.DOWNLOADING and (grew or files is not None or first):
            if grew:
                self.last_progress_at = now
            self.progress = self.download_progress()
        return grew

    def download_progress(self) -> str:
        """`3.1 GiB of 15.0 GiB, 2 of 4 files, ETA 5m10s` — what of it is known."""
        done = human_bytes(self.download_bytes or 0)
        total = self.download_total_bytes
        parts = [f"{done} of {human_bytes(total)}" if total else f"{done} downloaded"]
        if self.download_total_files:
            parts.append(f"{self.download_files or 0} of {self.download_total_files} files")
        if self.download_eta_s is not None:
            parts.append(f"ETA {human_seconds(self.download_eta_s)}")
        return ", ".join(parts)

    def limit(self) -> float | None:
        """The current phase's limit in seconds (None: no limit, i.e. Serving)."""
        return self.limits.get(self.phase)

    def idle_s(self, now: float) -> float:
        return max(0.0, now - self.last_progress_at)

    def check(self, now: float) -> bool:
        """True (and remembered) once the current phase has gone its limit without advancing."""
        limit = self.limit()
        if self.stalled_at is None and limit is not None and self.idle_s(now) > limit:
            self.stalled_at = now
        return self.stalled_at is not None

    @property
    def serving(self) -> bool:
        return self.phase is Phase.SERVING

    def durations(self, now: float) -> dict[Phase, float]:
        """Seconds spent in each phase so far (a re-entered phase adds up; the current one counts to `now`)."""
        out: dict[Phase, float] = {}
        for (phase, at), nxt in zip(self.history, [*self.history[1:], None], strict=True):
            end = nxt[1] if nxt is not None else (now if phase is not Phase.SERVING else at)
            out[phase] = out.get(phase, 0.0) + max(0.0, end - at)
        return out

    def describe(self, now: float) -> str:
        """One line for logs and the stall's termination message."""
        limit = self.limit()
        state = (f"stalled: no progress for {self.idle_s(now):.0f}s (limit {limit:.0f}s)" if self.stalled_at
                 else f"last progress {self.idle_s(now):.0f}s ago" + (f" (limit {limit:.0f}s)" if limit else ""))
        detail = f", {self.progress}" if self.progress else ""
        return f"phase {self.phase.value} for {now - self.phase_since:.0f}s{detail}; {state}"

    def to_json(self, now: float) -> dict[str, object]:
        """What the wrapper's /status serves (and the termination message of a stalled start carries)."""
        limit = self.limit()
        return {
            "phase": self.phase.value,
            "since": self.phase_since,
            "startedAt": self.started_at,
            "lastProgressAt": self.last_progress_at,
            "progress": self.progress,
            "limitSeconds": limit,
            "stalled": self.stalled_at is not None,
            "downloadBytes": self.download_bytes,
            "downloadTotalBytes": self.download_total_bytes,
            "downloadFiles": self.download_files,
            "downloadTotalFiles": self.download_total_files,
            "downloadEtaSeconds": self.download_eta_s,
            "kvCacheTokens": self.kv_cache_tokens,
            "maxConcurrency": self.max_concurrency,
            "history": [{"phase": p.value, "at": at} for p, at in self.history],
            "durations": {p.value: round(s, 3) for p, s in self.durations(now).items()},
        }


def parse_limits(items: list[str]) -> dict[Phase, float]:
    """`PHASE=SECONDS` items (phase names as in `Phase`, case-insensitive) over the defaults; ValueError names the
    bad item and the phases that exist."""
    limits = dict(DEFAULT_LIMITS_S)
    by_name = {p.value.lower(): p for p in PHASES if p is not Phase.SERVING}
    for item in items:
        name, sep, value = item.partition("=")
        phase = by_name.get(name.strip().lower())
        if not sep or phase is None:
            raise ValueError(f"--phase-limit {item!r}: want PHASE=SECONDS with PHASE one of "
                             f"{', '.join(p.value for p in by_name.values())}")
        try:
            seconds = float(value)
        except ValueError as err:
            raise ValueError(f"--phase-limit {item!r}: {value!r} is not a number of seconds") from err
        if seconds <= 0:
            raise ValueError(f"--phase-limit {item!r}: the limit must be positive")
        limits[phase] = seconds
    return limits
