"""Each pod's own network namespace, held by a sandbox process, wired into the cluster namespace's pod bridge.

Layout (inside the cluster's network namespace, where the node agent runs):

    bridge vopbr0  <cluster pod CIDR's first address>/<its prefix>   (shared by every node agent of the cluster)
      └── vp<node><run><n>  <-- veth -->  eth0 <pod IP>/<cluster prefix>   in the pod's namespace (+ lo)

Why a sandbox process: a network namespace lives as long as something holds it. The sandbox (`sleep infinity`
after `unshare --net`) is that holder, started with a parent-death signal, so when the agent (or the test process it
runs in) dies the sandbox dies and the kernel removes the namespace and its veth: nothing of a crashed run stays
configured. Names carry the node's tag and a run id; links of an earlier run of the same node are removed at start.

Fail closed: the pod's namespace has on-link routes for the cluster's pod range and host routes (through the bridge)
to the addresses the agent is told pods may reach (the API server's, Prometheus'); no default route. Before a pod's
containers start, `ip route get` to outside addresses must fail inside it, or the pod is not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import os
import re
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

BRIDGE = "vopbr0"
PROBE_ADDRESSES = ("1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.0.1")
"""Outside addresses that must have no route inside a pod's namespace (public ones, the host's usual networks)."""


class NetworkError(RuntimeError):
    """A pod's network could not be made (or proven closed); the pod's containers were not started."""


def _run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = _run("ip", *args)
    if check and proc.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


def node_tag(node: str) -> str:
    """Two hex digits naming a node in link names (IFNAMSIZ leaves 15 characters)."""
    return hashlib.sha256(node.encode()).hexdigest()[:2]


@dataclass
class Sandbox:
    """A pod's network namespace: the holder process, the pod IP and the bridge-side link."""

    key: str
    pid: int
    ip: str
    host_link: str
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)

    @property
    def netns_path(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def exec_prefix(self) -> list[str]:
        """Run a container's command in this pod's network namespace and in a PID namespace of its own.

        `setpriv --pdeathsig` kills the container when the agent's thread that started it goes away; the PID
        namespace (`unshare --pid --fork --kill-child`) takes every process of the container down with its main
        process, as a container runtime does, so nothing of a stopped container outlives it (vLLM's engine core
        included). The main process is the only child of `unshare`; `unshare` itself ignores SIGTERM.
        """
        return ["setpriv", "--pdeathsig", "KILL", "nsenter", f"--net={self.netns_path}", "--",
                "unshare", "--pid", "--fork", "--kill-child=SIGKILL", "--mount-proc", "--"]


def _unshared(sandbox: Sandbox, own: str) -> bool:
    """True once the sandbox is in a namespace other than `own` and has exec'd its holder (`sleep`)."""
    try:
        return os.readlink(sandbox.netns_path) != own and \
            Path(f"/proc/{sandbox.pid}/cmdline").read_bytes().startswith(b"sleep")
    except OSError:
        return False


class PodNetwork:
    """Pod namespaces for one node: addresses from the node's pod CIDR, on the cluster namespace's shared bridge."""

    def __init__(self, *, node: str, run_id: str, pod_cidr: str, cluster_pod_cidr: str,
                 reachable: Sequence[str] = ()) -> None:
        if not re.fullmatch(r"[0-9a-f]{4}", run_id):
            raise ValueError(f"run_id must be 4 hex digits, got {run_id!r}")
        self.node = node
        self.run_id = run_id
        self.tag = node_tag(node)
        self.pod_cidr = ipaddress.ip_network(pod_cidr)
        self.cluster = ipaddress.ip_network(cluster_pod_cidr)
        if not self.pod_cidr.subnet_of(self.cluster):  # type: ignore[arg-type]
            raise ValueError(f"node pod CIDR {pod_cidr} is not inside the cluster's {cluster_pod_cidr}")
        self.gateway = str(self.cluster[1])
        if ipaddress.ip_address(self.gateway) in self.pod_cidr:
            raise ValueError(f"node pod CIDR {pod_cidr} holds the bridge's address {self.gateway}")
        self.reachable = list(reachable)
        self._free = [str(a) for a in list(self.pod_cidr.hosts())[1:]]
        self._next_link = 0
        self.sandboxes: dict[str, Sandbox] = {}

    @property
    def link_prefix(self) -> str:
        return f"vp{self.tag}"

    def prepare(self) -> None:
        """The shared bridge (made by the first agent), and no links of this node's earlier runs."""
        if _ip("link", "show", BRIDGE, check=False).returncode != 0:
            _ip("link", "add", "name", BRIDGE, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.cluster.prefixlen}", "dev", BRIDGE)
        _ip("link", "set", BRIDGE, "up")
        ours = re.compile(rf"^{self.link_prefix}([0-9a-f]{{4}})\d+$")
        for line in _ip("-o", "link", "show").stdout.splitlines():
            name = line.split(":", 2)[1].strip().split("@", 1)[0]
            m = ours.match(name)
            if m and m.group(1) != self.run_id:
                _ip("link", "del", name, check=False)
                log.info("Removed link %s left by an earlier run of node %s", name, self.node)

    async def create(self, key: str) -> Sandbox:
        """Start a sandbox for pod `key`, wire its namespace and prove it has no route out."""
        if not self._free:
            raise NetworkError(f"node {self.node}: no free address left in {self.pod_cidr}")
        ip = self._free.pop(0)
        index, self._next_link = self._next_link, self._next_link + 1
        host_link, peer = f"{self.link_prefix}{self.run_id}{index}", f"vq{self.tag}{self.run_id}{index}"
        proc = await asyncio.create_subprocess_exec(
            "setpriv", "--pdeathsig", "KILL", "unshare", "--net", "--", "sleep", "infinity",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        sandbox = Sandbox(key=key, pid=proc.pid, ip=ip, host_link=host_link, proc=proc)
        self.sandboxes[key] = sandbox
        try:
            await self._wait_unshared(sandbox)
            await asyncio.to_thread(self._wire, sandbox, peer)
        except BaseException:
            await self.delete(key)
            raise
        log.info("Made the network of pod %s: %s on %s (sandbox pid %d)", key, ip, host_link, proc.pid)
        return sandbox

    async def _wait_unshared(self, sandbox: Sandbox) -> None:
        own = os.readlink("/proc/thread-self/ns/net")
        for _ in range(200):
            if sandbox.proc is not None and sandbox.proc.returncode is not None:
                err = (await sandbox.proc.stderr.read()).decode() if sandbox.proc.stderr else ""
                raise NetworkError(f"the sandbox of pod {sandbox.key} exited with {sandbox.proc.returncode}: "
                                   f"{err.strip()}")
            if _unshared(sandbox, own):
                return
            await asyncio.sleep(0.01)
        raise NetworkError(f"the sandbox of pod {sandbox.key} did not enter a network namespace of its own in 2 s")

    def _wire(self, sandbox: Sandbox, peer: str) -> None:
        _ip("link", "add", sandbox.host_link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", str(sandbox.pid))
        _ip("link", "set", sandbox.host_link, "master", BRIDGE)
        _ip("link", "set", sandbox.host_link, "up")
        inside = [
            "link set lo up",
            f"link set {peer} name eth0",
            f"addr add {sandbox.ip}/{self.cluster.prefixlen} dev eth0",
            "link set eth0 up",
            *(f"route add {address}/32 via {self.gateway} dev eth0" for address in self.reachable),
        ]
        proc = _run("nsenter", f"--net={sandbox.netns_path}", "--", "ip", "-batch", "-", stdin="\n".join(inside))
        if proc.returncode != 0:
            raise NetworkError(f"wiring the namespace of pod {sandbox.key} failed: {proc.stderr.strip()}")
        self.prove_closed(sandbox)

    def prove_closed(self, sandbox: Sandbox) -> None:
        """Raise unless no outside address routes from inside the pod's namespace and it has no default route."""
        enter = ["nsenter", f"--net={sandbox.netns_path}", "--", "ip"]
        for address in PROBE_ADDRESSES:
            proc = _run(*enter, "route", "get", address)
            if proc.returncode == 0:
                raise NetworkError(f"pod {sandbox.key}'s namespace routes {address} ({proc.stdout.strip()}): "
                                   "refusing to start a pod that could reach off the machine")
        routes = _run(*enter, "-o", "route", "show", "table", "all").stdout
        if any(line.split()[:1] == ["default"] for line in routes.splitlines()):
            raise NetworkError(f"pod {sandbox.key}'s namespace has a default route: {routes.strip()}")

    async def delete(self, key: str) -> None:
        """Kill the sandbox (the kernel removes the namespace and the veth pair with it) and free the address."""
        sandbox = self.sandboxes.pop(key, None)
        if sandbox is None:
            return
        if sandbox.proc is not None and sandbox.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                sandbox.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sandbox.proc.wait(), timeout=10)
        await asyncio.to_thread(_ip, "link", "del", sandbox.host_link, check=False)
        self._free.append(sandbox.ip)

    async def close(self) -> None:
        await asyncio.gather(*(self.delete(key) for key in list(self.sandboxes)))
