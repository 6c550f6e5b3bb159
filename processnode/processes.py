"""The process runtime of the process node: pods run as real local processes built from their pod spec.

Why: the end-to-end tier proves the whole loop with real parts — the operator's rendered pod spec must start real
vLLM servers and a real router, exactly as a kubelet would start the containers, so that what the planner wrote
(argv, env, probes, volumes) is what runs. There is no container runtime on these machines, so this node maps the
few things a container has onto the host:

* **Pod IP**: each pod gets a network namespace of its own (`network`: `processnode.network.PodNetwork`) with an
  address from the node's pod CIDR, and its container runs inside it and in a PID namespace of its own (the whole
  container dies with its main process). `--host=$(POD_IP)` binds the engine to its own address; the router (which
  would listen on `0.0.0.0`) is told the pod IP.
* **Command**: `command` + `args` with `$(VAR)` expanded from the container env as the kubelet does (`$$(VAR)` stays
  literal `$(VAR)`, unknown names stay as written); env values from literals, the downward API (`status.podIP`,
  `metadata.name`, `metadata.namespace`, `spec.nodeName`, `status.hostIP`), ConfigMap and Secret keys, plus
  `KUBERNETES_SERVICE_HOST/PORT` (`api_env`: the API server's real address; nothing here dials ClusterIPs).
  The image picks the local program through `IMAGE_TABLE` (below).
* **Volumes**: a PVC maps to a host directory given per claim (`pvcs={"models": dir}`), else to the hostPath/local
  directory of the PersistentVolume it is bound to; ConfigMap and Secret volumes become files written from the API
  objects; projected volumes (the ServiceAccount admission's) get a TokenRequest token bound to the pod, the CA
  ConfigMap and the namespace, and a program that takes `--kubeconfig` (the router) gets one holding that token, so
  it authenticates as its own ServiceAccount; emptyDirs become directories of the pod. Container paths under a mount
  path are rewritten to the host paths in the command, args and env, and in the text of projected ConfigMap files
  (the router's router.json names its tokenizer directory by container path).
* **terminationMessagePath**: a file of the container's own, whose content becomes `lastState.terminated.message`
  (with `FallbackToLogsOnError`, the log's tail when the file is empty and the exit code is not 0).
* **Restart policy Always with back-off**: an exited process is reported terminated (real exit code; 128+N for a
  signal) and restarted like the kubelet does it: the first exit restarts at once (the kubelet's back-off has no
  entry for the container yet), later ones wait in `CrashLoopBackOff` for 10 s, 20 s, 40 s … (capped at 300 s,
  forgotten after 10 min running); `restartCount` counts the restarts.
* **Probes**: startup, readiness and liveness `httpGet` probes are polled with the container's own timings against
  the pod IP; readiness gates the pod's Ready condition (so EndpointSlices follow it), a failed liveness or startup
  probe kills the container (SIGTERM, then SIGKILL after the grace period) and it restarts.
* **CPU binding**: engine containers get `limits.cpu` cores of their own, taken from the cores this process may run
  on, least-used first. The whole container runs on them (its CPU affinity, inherited by every process it starts,
  as the kubelet's static CPU manager gives a Guaranteed pod's integer-CPU container a cpuset), and
  `VLLM_CPU_OMP_THREADS_BIND` names them for vLLM's OpenMP threads. So an engine serving traffic keeps to its core
  while another engine starts on the other one: binding only the OpenMP threads let the busy engine's API server and
  engine-core loop take most of both cores (issue 19's slow restarts).
* **Stop**: SIGTERM to the container's main process (as the runtime signals PID 1), SIGKILL to its whole process
  group after the pod's grace period (capped by `max_grace_s`); stopped (SIGSTOPped) processes are killed too.
* **Images**: an image with no entry in `IMAGE_TABLE` is a pod failure (`ErrImageNeverPull` with a message naming
  the image and the table), never a hang.
IMAGE_TABLE (image repository -> local program; the tag is ignored):

* `ghcr.io/vllm-operator/engine-cpu` (and `.../engine`), command `vllm-operator engine [OPTS] -- vllm serve MODEL
  ARGS` -> the project venv's `vllm-operator engine --launcher=api-server --python=<.venv-vllm>/bin/python
  --termination-message-path=<file> --preflight=off [OPTS] -- vllm serve MODEL ARGS`; the wrapper then runs
  `python -m vllm.entrypoints.openai.api_server --model MODEL ARGS` (vllm-cpu's `vllm` console script does not start).
* `ghcr.io/vllm-operator/router`, command `vllm-operator router --config FILE` -> the project venv's
  `vllm-operator router --host=<pod IP> --kubeconfig=<its ServiceAccount's, else the runtime's> --config FILE`.
* `ghcr.io/vllm-operator/operator`, args `run ARGS` (the chart's Deployment sets only args: the image's entrypoint is
  `vllm-operator`) -> the project venv's `vllm-operator run ARGS` with `KUBECONFIG` holding its ServiceAccount's
  token (else the runtime's), so the chart's own operator pod reconciles under the chart's RBAC.
* `python` (Docker Hub's official image), command `python ARGS` -> the project venv's interpreter with ARGS (the
  node agent's own tests run small servers and probes with it).

The engine runs on `.venv-vllm` (real vLLM on CPU, from `scripts/vllm-cpu/requirements.lock`), the wrapper and the
router on the project's `.venv` (this interpreter's). Only tests and benchmarks use this module.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from processnode.network import Sandbox
from vllm_operator import constants
from vllm_operator.k8s import Resource

log = logging.getLogger(__name__)

CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
PVS = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)

REPO = Path(__file__).resolve().parents[1]
PROJECT_BIN = Path(sys.executable).parent
"""The project venv's bin directory (this interpreter's), where the `vllm-operator` console script lives."""
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 600.0
"""The kubelet's container restart back-off: 10 s doubling to 5 min, reset after 10 min of running."""
TERMINATION_MESSAGE_MAX_BYTES = 4096
FALLBACK_LOG_LINES = 80
"""FallbackToLogsOnError: the kubelet takes the last 80 lines (at most 2048 bytes) of the log."""
FALLBACK_LOG_BYTES = 2048

BASE_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "TZ")
"""Host variables a process needs to run at all; nothing else leaks in (a container starts from its image's env)."""
PROCESS_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, unknown refs stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, text)


def map_paths(text: str, mounts: Sequence[tuple[str, Path]]) -> str:
    """Rewrite container paths under a mount path (at the start of `text`, or after `=`, `:`, whitespace or a quote)
    to the host path of that mount, in one pass (a host path is never rewritten again); the longest mount wins."""
    if not mounts:
        return text
    hosts = {mount.rstrip("/") or "/": str(host) for mount, host in mounts}
    alternatives = "|".join(re.escape(m) for m in sorted(hosts, key=len, reverse=True))
    pattern = re.compile(r"(?:^|(?<=[=:\s\"']))(" + alternatives + r")(?=/|$|[\s\"',])")
    return pattern.sub(lambda m: hosts[m.group(1)], text)


def image_repository(image: str) -> str:
    """`registry/repo:tag@digest` -> `registry/repo`."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


@dataclass
class ContainerState:
    """What the node reports about a pod's (single main) container; the node agent turns it into pod status."""

    ready: bool = True
    running: bool = True
    restart_count: int = 0
    waiting_reason: str | None = None  # e.g. CrashLoopBackOff, ErrImageNeverPull
    last_terminated: dict[str, Any] | None = None  # {"reason": "Error", "exitCode": 88, "message": ...}
    waiting_message: str | None = None


class UnrunnableImage(ValueError):
    """A container's image has no local program here: the pod fails with ErrImageNeverPull, as a kubelet whose
    node lacks the image and may not pull it would report."""


class PodApi(Protocol):
    """What the node reads from the API server for a pod: ConfigMaps, Secrets, PVCs and PVs (None when absent),
    and ServiceAccount tokens bound to the pod (TokenRequest) for projected volumes."""

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None: ...

    async def token(self, namespace: str, service_account: str, pod: str, uid: str, expiration_s: int) -> str: ...


class PodNetworks(Protocol):
    """Where pods get their own network namespace and IP (`processnode.network.PodNetwork`)."""

    async def create(self, key: str) -> Sandbox: ...

    async def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Launch:
    """What the image table produces for one container."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchContext:
    pod_ip: str
    termination_file: Path
    kubeconfig: Path | None
    vllm_python: Path


def _engine(command: list[str], ctx: LaunchContext) -> Launch:
    if command[:2] != ["vllm-operator", "engine"]:
        raise ValueError(f"engine image: expected command `vllm-operator engine ...`, got {command[:2]}")
    argv = [str(PROJECT_BIN / "vllm-operator"), "engine", "--launcher=api-server", f"--python={ctx.vllm_python}",
            f"--termination-message-path={ctx.termination_file}", "--preflight=off", *command[2:]]
    return Launch(argv, {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TRANSFORMERS_OFFLINE": "1"})


def _router(command: list[str], ctx: LaunchContext) -> Launch:
    if command[:2] != ["vllm-operator", "router"]:
        raise ValueError(f"router image: expected command `vllm-operator router ...`, got {command[:2]}")
    extra = [f"--host={ctx.pod_ip}"]
    if ctx.kubeconfig is not None:
        extra.append(f"--kubeconfig={ctx.kubeconfig}")
    return Launch([str(PROJECT_BIN / "vllm-operator"), "router", *extra, *command[2:]])


def _operator(command: list[str], ctx: LaunchContext) -> Launch:
    args = command[1:] if command[:1] == ["vllm-operator"] else command  # the image's entrypoint is vllm-operator
    if args[:1] != ["run"]:
        raise ValueError(f"operator image: expected args `run ...` (entrypoint vllm-operator), got {command[:2]}")
    env = {} if ctx.kubeconfig is None else {"KUBECONFIG": str(ctx.kubeconfig)}
    return Launch([str(PROJECT_BIN / "vllm-operator"), *args], env)


def _python(command: list[str], _ctx: LaunchContext) -> Launch:
    if not command or command[0] not in ("python", "python3"):
        raise ValueError(f"python image: expected command `python ...`, got {command[:1]}")
    return Launch([sys.executable, *command[1:]])


IMAGE_TABLE: dict[str, Callable[[list[str], LaunchContext], Launch]] = {
    "ghcr.io/vllm-operator/engine-cpu": _engine,
    "ghcr.io/vllm-operator/engine": _engine,
    "ghcr.io/vllm-operator/router": _router,
    "ghcr.io/vllm-operator/operator": _operator,
    "python": _python,
    "docker.io/library/python": _python,
}
"""Image repository -> how its container command runs here (see the module docstring's table)."""


def quantity_cores(value: Any) -> int:
    """`limits.cpu` as whole cores (at least 1): "1" -> 1, "1500m" -> 2, 2 -> 2."""
    text = str(value)
    cores = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return max(1, int(-(-cores // 1)))


@dataclass
class Probe:
    path: str
    port: int
    initial_delay_s: float
    period_s: float
    timeout_s: float
    failure_threshold: int
    success_threshold: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, container: Mapping[str, Any]) -> Probe | None:
        if not spec or "httpGet" not in spec:
            return None
        get = spec["httpGet"]
        port: Any = get.get("port")
        if isinstance(port, str) and not port.isdigit():
            named = [p for p in container.get("ports", []) or [] if p.get("name") == port]
            if not named:
                raise ValueError(f"probe port {port!r} names no port of container {container.get('name')!r}")
            port = named[0]["containerPort"]
        return cls(path=get.get("path", "/"), port=int(port), initial_delay_s=float(spec.get("initialDelaySeconds", 0)),
                   period_s=float(spec.get("periodSeconds", 10)), timeout_s=float(spec.get("timeoutSeconds", 1)),
                   failure_threshold=int(spec.get("failureThreshold", 3)),
                   success_threshold=int(spec.get("successThreshold", 1)))


@dataclass
class Container:
    """One supervised container (the pod's first) and what was reported about it."""

    namespace: str
    pod: str
    ip: str
    root: Path
    report: Callable[[ContainerState], None]
    spec: dict[str, Any]
    pod_spec: dict[str, Any]
    labels: dict[str, str]
    cores: list[int] = field(default_factory=list)
    uid: str = ""
    sandbox: Sandbox | None = None
    """The pod's own network namespace."""
    env: dict[str, str] = field(default_factory=dict)
    """The container env as resolved at preparation (literals, downward API, ConfigMap/Secret keys)."""
    proc: asyncio.subprocess.Process | None = None
    argv: list[str] = field(default_factory=list)
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    stopping: bool = False
    task: asyncio.Task[None] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every start and exit, with monotonic times (tests and benchmarks read fault -> restart timings here)."""

    @property
    def log_path(self) -> Path:
        return self.root / "container.log"

    @property
    def termination_file(self) -> Path:
        return self.root / "termination-log"

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class ProcessRuntime:
    """A `PodRuntime` that runs each pod's container as a local process tree (see the module docstring)."""

    def __init__(self, work_dir: Path, *, network: PodNetworks, pvcs: Mapping[str, Path] | None = None,
                 cpus: Sequence[int] | None = None, vllm_python: Path = VLLM_PYTHON,
                 max_grace_s: float = 10.0, backoff_initial_s: float = BACKOFF_INITIAL_S,
                 backoff_max_s: float = BACKOFF_MAX_S, host_ip: str = "127.0.0.1",
                 api_env: Mapping[str, str] | None = None) -> None:
        self.work_dir = work_dir
        self.network = network
        self.host_ip = host_ip
        self.api_env = dict(api_env or {})
        """KUBERNETES_SERVICE_HOST/PORT: the API server's real address (nothing here dials ClusterIPs)."""
        self.pvcs = dict(pvcs or {})
        self.cpus = list(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))
        self.vllm_python = vllm_python
        self.max_grace_s = max_grace_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.api: PodApi | None = None
        self.kubeconfig: Path | None = None
        self.containers: dict[tuple[str, str], Container] = {}
        self.errors: list[BaseException] = []

    def connect(self, api: PodApi, kubeconfig: Path) -> None:
        """Where ConfigMaps, Secrets and volumes are read from and what the router's discovery uses."""
        self.api = api
        self.kubeconfig = kubeconfig

    # -- PodRuntime -------------------------------------------------------------------------------------------------

    async def start(self, pod: dict[str, Any], report: Callable[[ContainerState], None]) -> str:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        containers = pod["spec"].get("containers", [])
        if len(containers) != 1:
            raise ValueError(f"pod {namespace}/{name}: the process runtime runs single-container pods, got "
                             f"{len(containers)} containers")
        sandbox = await self.network.create(f"{namespace}/{name}")
        ip = sandbox.ip
        root = self.work_dir / namespace / name
        root.mkdir(parents=True, exist_ok=True)
        container = Container(namespace=namespace, pod=name, ip=ip, root=root, report=report, spec=containers[0],
                              pod_spec=pod["spec"], labels=dict(meta.get("labels", {}) or {}), sandbox=sandbox,
                              uid=str(meta.get("uid", "")))
        self.containers[(namespace, name)] = container
        report(ContainerState(ready=False, running=False))
        container.task = asyncio.create_task(self._supervise(container), name=f"pod-{namespace}-{name}")
        return ip

    async def stop(self, namespace: str, name: str) -> None:
        container = self.containers.pop((namespace, name), None)
        if container is None:
            return
        container.stopping = True
        grace = min(float(container.pod_spec.get("terminationGracePeriodSeconds", 30)), self.max_grace_s)
        await self._kill(container, grace)
        if container.task is not None:
            container.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await container.task
        await self.network.delete(f"{namespace}/{name}")
        log.info("Stopped pod %s/%s", namespace, name)

    async def close(self) -> None:
        """Stop every pod (the cluster is going away), all at once."""
        await asyncio.gather(*(self.stop(namespace, name) for namespace, name in list(self.containers)))

    # -- lookups for tests ------------------------------------------------------------------------------------------

    def container(self, namespace: str, name: str) -> Container:
        return self.containers[(namespace, name)]

    # -- supervision ------------------------------------------------------------------------------------------------

    async def _supervise(self, c: Container) -> None:
        backoff = 0.0  # the kubelet restarts a container's first exit at once, then backs off from 10 s
        try:
            launch = await self._prepare(c)
            while not c.stopping:
                started = time.monotonic()
                with contextlib.suppress(FileNotFoundError):
                    c.termination_file.unlink()
                c.termination_file.touch()
                await self._spawn(c, launch)
                c.history.append({"event": "started", "t": started, "pid": c.proc.pid if c.proc else None})
                c.report(ContainerState(ready=False, running=True, restart_count=c.restart_count,
                                        last_terminated=c.last_terminated))
                prober = asyncio.create_task(self._probe(c))
                assert c.proc is not None
                code = await c.proc.wait()
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober
                await self._kill(c, 0)  # whatever the main process left behind in its group
                if c.stopping:
                    return
                ran = time.monotonic() - started
                c.last_terminated = self._terminated(c, code)
                c.history.append({"event": "exited", "t": time.monotonic(), "exitCode": c.last_terminated["exitCode"]})
                c.restart_count += 1
                if ran > BACKOFF_RESET_S:
                    backoff = 0.0
                log.info("Container of pod %s/%s exited with %s; restarting in %.0f s", c.namespace, c.pod,
                         c.last_terminated["exitCode"], backoff)
                if backoff > 0:
                    c.report(ContainerState(ready=False, running=False, restart_count=c.restart_count,
                                            waiting_reason="CrashLoopBackOff", last_terminated=c.last_terminated))
                    await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_s) if backoff > 0 else self.backoff_initial_s
        except asyncio.CancelledError:
            raise
        except UnrunnableImage as err:
            log.info("Pod %s/%s cannot run: %s", c.namespace, c.pod, err)
            c.report(ContainerState(ready=False, running=False, waiting_reason="ErrImageNeverPull",
                                    waiting_message=str(err)))
        except Exception as err:
            log.exception("Runtime failed on pod %s/%s", c.namespace, c.pod)
            self.errors.append(err)
            c.report(ContainerState(ready=False, running=False, waiting_reason="CreateContainerError",
                                    waiting_message=f"{type(err).__name__}: {err}"))

    def _terminated(self, c: Container, code: int) -> dict[str, Any]:
        exit_code = 128 - code if code < 0 else code
        try:
            message = c.termination_file.read_bytes()[:TERMINATION_MESSAGE_MAX_BYTES].decode("utf-8", "replace")
        except OSError:
            message = ""
        if not message.strip() and exit_code != 0 and \
                c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = c.log_tail(64_000).splitlines()[-FALLBACK_LOG_LINES:]
            message = "\n".join(lines)[-FALLBACK_LOG_BYTES:]
        reason = "OOMKilled" if code == -signal.SIGKILL and self._oom_killed(c) else (
            "Completed" if exit_code == 0 else "Error")
        entry: dict[str, Any] = {"exitCode": exit_code, "reason": reason}
        if code < 0:
            entry["signal"] = -code
        if message.strip():
            entry["message"] = message.rstrip("\n")
        return entry

    @staticmethod
    def _oom_killed(_c: Container) -> bool:
        """No memory cgroup per pod here: a SIGKILL is never attributed to the OOM killer."""
        return False

    async def _spawn(self, c: Container, launch: Launch) -> None:
        env = {k: v for k, v in os.environ.items() if k in BASE_ENV_KEEP}
        env.update(PROCESS_ENV)
        env.update(launch.env)
        env.update(self._env_for(c))
        c.argv = launch.argv
        prefix = c.sandbox.exec_prefix() if c.sandbox is not None else []
        if c.cores:  # the container's cpuset: set before anything of it runs, inherited by all it starts
            prefix = ["taskset", "--cpu-list", ",".join(map(str, c.cores)), *prefix]
        with c.log_path.open("ab") as log_file:
            log_file.write(f"--- start {time.strftime('%H:%M:%S')} restart {c.restart_count}: "
                           f"{' '.join(launch.argv)}\n".encode())
            log_file.flush()
            c.proc = await asyncio.create_subprocess_exec(
                *prefix, *launch.argv, stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                stderr=asyncio.subprocess.STDOUT, env=env, cwd=str(c.root), start_new_session=True)
        log.info("Started pod %s/%s at %s (pid %d): %s", c.namespace, c.pod, c.ip, c.proc.pid,
                 " ".join(launch.argv))

    def _env_for(self, c: Container) -> dict[str, str]:
        """Container env (resolved in `_prepare`), plus the engine's core binding."""
        env = dict(c.env)
        if c.cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, c.cores))
        return env

    async def _kill(self, c: Container, grace: float) -> None:
        proc = c.proc
        if proc is None:
            return
        pids = descendants(proc.pid)
        if proc.returncode is None:
            # in a pod namespace the container's main process is the only child of `unshare` (which ignores
            # SIGTERM): it is what a runtime signals as PID 1 — and, as PID 1 of its PID namespace, it gets SIGTERM
            # only if it handles it (else the grace period runs out and SIGKILL ends it, as in a container)
            main = [pid for pid in pids if _ppid(pid) == proc.pid] if c.sandbox is not None else [proc.pid]
            for pid in main:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=grace)
        for pid in [*pids, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if c.sandbox is not None and proc.returncode is None:
            # `unshare` reaps the container's main process and exits with it; killed first it would leave a zombie
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=10)

    # -- probes -----------------------------------------------------------------------------------------------------

    async def _probe(self, c: Container) -> None:
        startup = Probe.from_spec(c.spec.get("startupProbe"), c.spec)
        readiness = Probe.from_spec(c.spec.get("readinessProbe"), c.spec)
        liveness = Probe.from_spec(c.spec.get("livenessProbe"), c.spec)
        async with aiohttp.ClientSession() as session:
            if startup is not None and not await self._until(session, c, startup, want=True):
                c.history.append({"event": "startup-probe-failed", "t": time.monotonic()})
                log.info("Startup probe of pod %s/%s failed %d times; killing the container", c.namespace, c.pod,
                         startup.failure_threshold)
                await self._kill(c, min(self.max_grace_s, 30.0))
                return
            tasks = []
            if liveness is not None:
                tasks.append(asyncio.create_task(self._liveness(session, c, liveness)))
            try:
                if readiness is not None:
                    await self._readiness(session, c, readiness)
                c.report(ContainerState(ready=True, restart_count=c.restart_count, last_terminated=c.last_terminated))
                c.history.append({"event": "ready", "t": time.monotonic()})
                await asyncio.Event().wait()
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _check(self, session: aiohttp.ClientSession, c: Container, probe: Probe) -> bool:
        url = f"http://{c.ip}:{probe.port}{probe.path}"
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=probe.timeout_s)) as resp:
                await resp.read()
                return 200 <= resp.status < 400
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def _until(self, session: aiohttp.ClientSession, c: Container, probe: Probe, *, want: bool) -> bool:
        """Startup probe: True once it succeeds; False after failureThreshold failures."""
        await asyncio.sleep(probe.initial_delay_s)
        failures = 0
        while True:
            if await self._check(session, c, probe) == want:
                return True
            failures += 1
            if failures >= probe.failure_threshold:
                return False
            await asyncio.sleep(probe.period_s)

    async def _readiness(self, session: aiohttp.ClientSession, c: Container, probe: Probe) -> None:
        await asyncio.sleep(probe.initial_delay_s)
        ready = False
        successes = failures = 0
        while True:
            ok = await self._check(session, c, probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if not ready and successes >= probe.success_threshold:
                ready = True
            elif ready and failures >= probe.failure_threshold:
                ready = False
            else:
                await asyncio.sleep(probe.period_s)
                continue
            c.history.append({"event": "ready" if ready else "unready", "t": time.monotonic()})
            log.info("Pod %s/%s became %s", c.namespace, c.pod, "ready" if ready else "not ready")
            c.report(ContainerState(ready=ready, restart_count=c.restart_count, last_terminated=c.last_terminated))
            await asyncio.sleep(probe.period_s)

    async def _liveness(self, session: aiohttp.ClientSession, c: Container, probe: Probe) -> None:
        await asyncio.sleep(probe.initial_delay_s)
        failures = 0
        while True:
            await asyncio.sleep(probe.period_s)
            failures = 0 if await self._check(session, c, probe) else failures + 1
            if failures >= probe.failure_threshold:
                c.history.append({"event": "liveness-failed", "t": time.monotonic()})
                log.info("Liveness probe of pod %s/%s failed %d times; killing the container", c.namespace, c.pod,
                         failures)
                await self._kill(c, min(float(c.pod_spec.get("terminationGracePeriodSeconds", 30)),
                                        self.max_grace_s))
                return

    # -- preparing a pod --------------------------------------------------------------------------------------------

    async def _prepare(self, c: Container) -> Launch:
        """Volumes, env and argv of the container; waits (ContainerCreating) for ConfigMaps/Secrets that are missing."""
        while True:
            try:
                return await self._prepare_once(c)
            except LookupError as err:
                log.info("Pod %s/%s waits for %s", c.namespace, c.pod, err)
                await asyncio.sleep(1.0)

    async def _read(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        if self.api is None:
            raise RuntimeError("ProcessRuntime.connect(api, kubeconfig) was not called")
        obj = await self.api.get(res, namespace, name)
        if obj is None:
            raise LookupError(f"{res.kind} {namespace}/{name}")
        return obj

    async def _prepare_once(self, c: Container) -> Launch:
        volumes = {v["name"]: v for v in c.pod_spec.get("volumes", []) or []}
        mounts: list[tuple[str, Path]] = []
        for mount in c.spec.get("volumeMounts", []) or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ValueError(f"pod {c.namespace}/{c.pod}: volumeMount {mount['name']!r} names no volume")
            host = await self._volume(c, volume)
            if mount.get("subPath"):
                host = host / mount["subPath"]
            mounts.append((mount["mountPath"], host))
        projected = [host for _, host in mounts if host.is_relative_to(c.root / "volumes")]
        for path in (p for host in projected for p in host.rglob("*") if p.is_file()):
            # projected text may name other mounts of the pod by container path (router.json's tokenizer path)
            with contextlib.suppress(UnicodeDecodeError):
                text = path.read_text()
                mapped = map_paths(text, mounts)
                if mapped != text:
                    path.write_text(mapped)
        env = {k: map_paths(v, mounts) for k, v in (await self._resolve_env(c)).items()}
        c.env = env
        command = [map_paths(expand(x, env), mounts) for x in [*c.spec.get("command", []), *c.spec.get("args", [])]]
        image = image_repository(c.spec.get("image", ""))
        make = IMAGE_TABLE.get(image)
        if make is None:
            raise UnrunnableImage(f"pod {c.namespace}/{c.pod}: image {c.spec.get('image')!r} is not in the process "
                             f"runtime's IMAGE_TABLE ({', '.join(sorted(IMAGE_TABLE))})")
        if c.labels.get(constants.LABEL_COMPONENT) == constants.COMPONENT_ENGINE:
            c.cores = self._assign_cores(c)
        return make(command, LaunchContext(pod_ip=c.ip, termination_file=c.termination_file,
                                           kubeconfig=self._kubeconfig_for(c, mounts),
                                           vllm_python=self.vllm_python))

    def _kubeconfig_for(self, c: Container, mounts: Sequence[tuple[str, Path]]) -> Path | None:
        """A pod with a ServiceAccount token mounted authenticates as that account: its programs that take a
        kubeconfig (the router, the operator) get one holding the mounted token and CA, pointed at the API
        server's address. Without one, the runtime's own kubeconfig."""
        mounted = dict(mounts).get(SERVICE_ACCOUNT_DIR)
        host, port = self.api_env.get("KUBERNETES_SERVICE_HOST"), self.api_env.get("KUBERNETES_SERVICE_PORT")
        if mounted is None or not (mounted / "token").exists() or not host or not port:
            return self.kubeconfig
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "pod", "cluster": {"server": f"https://{host}:{port}",
                                                     "certificate-authority": str(mounted / "ca.crt")}}],
            "users": [{"name": "pod", "user": {"token": (mounted / "token").read_text().strip()}}],
            "contexts": [{"name": "pod", "context": {"cluster": "pod", "user": "pod", "namespace": c.namespace}}],
        }
        path = c.root / "serviceaccount.kubeconfig"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def _assign_cores(self, c: Container) -> list[int]:
        limits = (c.spec.get("resources", {}) or {}).get("limits", {}) or {}
        want = min(quantity_cores(limits.get("cpu", 1)), len(self.cpus))
        used: dict[int, int] = {cpu: 0 for cpu in self.cpus}
        for other in self.containers.values():
            if other is not c:
                for cpu in other.cores:
                    used[cpu] = used.get(cpu, 0) + 1
        return sorted(sorted(self.cpus, key=lambda cpu: (used[cpu], cpu))[:want])

    async def _volume(self, c: Container, volume: Mapping[str, Any]) -> Path:
        name = volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = str(volume["persistentVolumeClaim"]["claimName"])
            if claim in self.pvcs:
                return self.pvcs[claim]
            return await self._claimed_directory(c, claim)
        host: Path = c.root / "volumes" / str(name)
        await asyncio.to_thread(host.mkdir, parents=True, exist_ok=True)
        if "configMap" in volume:
            obj = await self._read(CONFIG_MAPS, c.namespace, volume["configMap"]["name"])
            self._project(host, {k: v.encode() for k, v in (obj.get("data") or {}).items()}, volume["configMap"])
        elif "secret" in volume:
            obj = await self._read(SECRETS, c.namespace, volume["secret"]["secretName"])
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            data.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
            self._project(host, data, volume["secret"])
        elif "projected" in volume:
            await self._projected(c, host, volume["projected"])
        elif "emptyDir" not in volume:
            raise ValueError(f"pod {c.namespace}/{c.pod}: volume {name!r} has a kind the process runtime does not "
                             f"map ({sorted(k for k in volume if k != 'name')})")
        return host

    async def _projected(self, c: Container, host: Path, projected: Mapping[str, Any]) -> None:
        """A projected volume (what the ServiceAccount admission plugin mounts): a TokenRequest token bound to
        the pod, ConfigMap keys (the cluster's CA) and the downward API's namespace."""
        if self.api is None:
            raise RuntimeError("ProcessRuntime.connect(api, kubeconfig) was not called")
        for source in projected.get("sources", []) or []:
            if "serviceAccountToken" in source:
                spec = source["serviceAccountToken"]
                account = str(c.pod_spec.get("serviceAccountName") or "default")
                token = await self.api.token(c.namespace, account, c.pod, c.uid,
                                             int(spec.get("expirationSeconds", 3607)))
                self._project(host, {"token": token.encode()}, {"items": [{"key": "token", "path": spec["path"]}]})
            elif "configMap" in source:
                obj = await self._read(CONFIG_MAPS, c.namespace, source["configMap"]["name"])
                self._project(host, {k: v.encode() for k, v in (obj.get("data") or {}).items()}, source["configMap"])
            elif "downwardAPI" in source:
                fields = {"metadata.namespace": c.namespace, "metadata.name": c.pod}
                for item in source["downwardAPI"].get("items", []) or []:
                    path = (item.get("fieldRef") or {}).get("fieldPath")
                    if path not in fields:
                        raise ValueError(f"pod {c.namespace}/{c.pod}: projected downwardAPI {path!r} is not supported")
                    self._project(host, {path: fields[path].encode()}, {"items": [{"key": path, "path": item["path"]}]})
            else:
                raise ValueError(f"pod {c.namespace}/{c.pod}: projected source {sorted(source)} is not supported")

    @staticmethod
    def _project(host: Path, data: Mapping[str, bytes], source: Mapping[str, Any]) -> None:
        items = source.get("items")
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, rel in pairs:
            if key not in data:
                raise LookupError(f"key {key!r} in {source}")
            path = host / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[key])

    async def _claimed_directory(self, c: Container, claim: str) -> Path:
        """The host directory of the PersistentVolume bound to `claim` (hostPath or local); waits while unbound."""
        pvc = await self._read(PVCS, c.namespace, claim)
        volume_name = (pvc.get("spec") or {}).get("volumeName")
        if not volume_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise LookupError(f"PVC {c.namespace}/{claim} to be bound")
        pv = await self._read(PVS, None, volume_name)
        spec = pv.get("spec") or {}
        source = spec.get("hostPath") or spec.get("local")
        if not source:
            raise ValueError(f"pod {c.namespace}/{c.pod}: PV {volume_name} (of PVC {claim}) is neither hostPath nor "
                             "local; the process node maps only host directories")
        return Path(source["path"])

    async def _resolve_env(self, c: Container) -> dict[str, str]:
        env: dict[str, str] = dict(self.api_env)
        fields = {"status.podIP": c.ip, "metadata.name": c.pod, "metadata.namespace": c.namespace,
                  "spec.nodeName": str(c.pod_spec.get("nodeName", "")), "status.hostIP": self.host_ip}
        for item in c.spec.get("env", []) or []:
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
                continue
            source = item.get("valueFrom", {}) or {}
            if "fieldRef" in source:
                path = source["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise ValueError(f"pod {c.namespace}/{c.pod}: env {name} fieldRef {path!r} is not supported")
                env[name] = fields[path]
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                obj = await self._read(SECRETS, c.namespace, ref["name"])
                env[name] = base64.b64decode((obj.get("data") or {})[ref["key"]]).decode()
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                obj = await self._read(CONFIG_MAPS, c.namespace, ref["name"])
                env[name] = (obj.get("data") or {})[ref["key"]]
            else:
                raise ValueError(f"pod {c.namespace}/{c.pod}: env {name} has an unsupported source {sorted(source)}")
        return env


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


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def process_argv(pid: int) -> list[str]:
    """The argv of a running process (/proc/PID/cmdline)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]
