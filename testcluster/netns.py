"""A network namespace with no route off the machine, for the control plane and everything it advertises.

Layout for slot S (0..15; one slot per running cluster, claimed atomically by `ip netns add`):

    host  vh-vllmopS 172.29.S.1/30  <-- veth -->  vn-vllmopS 172.29.S.2/30  namespace vllmop-S (+ lo)

The namespace has exactly two routes, both on-link (lo and the /30); there is no default route, so any other address
fails at once inside it. The API server advertises 172.29.S.2 (an ordinary, non-loopback address, as its endpoint
reconciler and EndpointSlices demand); processes on the host (pytest, the operator under test, kubectl, helm) reach it
through the host end of the veth, an address only this namespace's link has. Services get 172.30.(16·S).0/20 and kwok's
pods 172.31.(16·S).0/20; both ranges are blackholed on the host as a second wall, so a dial to a ClusterIP or a pod IP
from the host fails at once instead of leaving through the default gateway.

Fail closed: every step is checked; if one fails, what was made is torn down and `NetnsError` is raised before any
component starts. `prove_isolated` then shows that an outside address has no route inside the namespace and that the
host drops the service and pod ranges.

Ownership. The slot's name (`/run/netns/vllmop-S`) is only the atomic claim; right after it, the claimant binds the
same namespace to a second name of its own, `vllmop-S.<random>` (the pin), and every process it starts enters the
namespace through the pin (`nsenter --net=<pin>`), never by the slot's name. Teardown deletes the slot's name and its
blackhole routes only while that name is still the pinned namespace (same nsfs inode), then its own pin. Before
this, teardown deleted `vllmop-S` by name, and components entered it by name: a stale state's stop (`python -m
testcluster down` on a cluster that had died, a second stop of a stopped one) deleted the namespace another cluster
had claimed since, the next `create` claimed the free name, and the first cluster's next `ip netns exec vllmop-S`
(its next component, or a restarted one) landed in the newcomer's namespace: two API servers on 172.29.S.2:6443.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import ipaddress
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SLOTS = 16
PREFIX = "vllmop-"
# Addresses that must be unreachable from inside: public ones and the host's own networks.
PROBE_ADDRESSES = ("1.1.1.1", "8.8.8.8", "10.0.0.1", "192.168.0.1")


class NetnsError(RuntimeError):
    """The isolated network could not be set up (or proven isolated); nothing was started."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


def require_privileges() -> None:
    """Root and CAP_NET_ADMIN are needed to make namespaces, links and routes; say so plainly when missing."""
    if os.geteuid() != 0:
        raise NetnsError("the test cluster needs root (it creates a network namespace, a veth pair and blackhole "
                         f"routes); running as uid {os.geteuid()}")
    with open("/proc/self/status") as fh:
        caps = next((line.split()[1] for line in fh if line.startswith("CapEff:")), "0")
    cap_net_admin = 12
    if not int(caps, 16) >> cap_net_admin & 1:
        raise NetnsError("the test cluster needs CAP_NET_ADMIN (effective capabilities are "
                         f"{caps}); run it where root may create network namespaces")


def _identity(path: str) -> int | None:
    """The namespace a `/run/netns` file is bound to (its nsfs inode), or None when the file is missing or is not a
    bound namespace (a claim whose mount has not happened yet, or was undone, is an empty file on tmpfs)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino if st.st_dev == os.stat("/proc/self/ns/net").st_dev else None


@dataclass(frozen=True)
class Netns:
    """One claimed slot: names and addresses, and the pin (`pin_name`) that makes it this claimant's."""

    slot: int
    pin_name: str = ""

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.slot}"

    @property
    def host_link(self) -> str:
        return f"vh-vllmop{self.slot}"

    @property
    def ns_link(self) -> str:
        return f"vn-vllmop{self.slot}"

    @property
    def host_address(self) -> str:
        return f"172.29.{self.slot}.1"

    @property
    def address(self) -> str:
        """The namespace's own address: the API server advertises it, kwok's nodes report it."""
        return f"172.29.{self.slot}.2"

    @property
    def service_cidr(self) -> str:
        return f"172.30.{16 * self.slot}.0/20"

    @property
    def pod_cidr(self) -> str:
        return f"172.31.{16 * self.slot}.0/20"

    @property
    def first_service_ip(self) -> str:
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def path(self) -> str:
        """The pin: this claimant's own name for the namespace, which nobody else deletes or re-creates."""
        if not self.pin_name:
            raise NetnsError(f"slot {self.slot} has no pin (a state written before pins existed): its namespace "
                             f"cannot be told from one another cluster claimed since")
        return f"/run/netns/{self.pin_name}"

    def owned(self) -> bool:
        """True while the slot's name still names the namespace this claimant pinned."""
        if not self.pin_name:
            return False
        mine = _identity(self.path)
        return mine is not None and _identity(f"/run/netns/{self.name}") == mine

    def exec_prefix(self) -> list[str]:
        """Prefix a command with this to run it inside the namespace, entered through the pin (nsenter execs the
        command: same PID). Not `ip netns exec`, which enters by the slot's name and remounts /sys (a kubelet then
        finds no cgroup mounts)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.exec_prefix(), *cmd], capture_output=True, text=True, check=False)

    def teardown(self) -> None:
        """Remove the namespace (its veth pair goes with it) and the blackhole routes, if the slot is still ours;
        then the pin. Idempotent, and harmless on a stale state: a slot someone else claimed since is not touched."""
        if self.owned():
            for cidr in (self.service_cidr, self.pod_cidr):
                _ip("route", "del", "blackhole", cidr, check=False)
        self.release()

    def release(self) -> None:
        """Give the slot back: its name if it is still ours, then the pin; routes are left alone."""
        if self.owned():
            _ip("netns", "del", self.name, check=False)
        if self.pin_name:
            _ip("netns", "del", self.pin_name, check=False)

    def prove_isolated(self) -> None:
        """Raise unless no outside address routes from inside and the host drops the service and pod ranges."""
        refuse_routes_out(self.exec_prefix(), f"namespace {self.name}")
        for cidr in (self.service_cidr, self.pod_cidr):
            if not _ip("route", "show", "type", "blackhole", "exact", cidr, check=False).stdout.strip():
                raise NetnsError(f"host has no blackhole route for {cidr}")
            sample = str(ipaddress.ip_network(cidr)[5])
            proc = _ip("route", "get", sample, check=False)  # a blackholed address has no route: EINVAL
            if proc.returncode == 0 and not proc.stdout.startswith("blackhole"):
                raise NetnsError(f"host routes {sample} ({cidr}) somewhere: {proc.stdout.strip()}; expected a "
                                 "blackhole")
        proc = subprocess.run(["ip", "route", "get", self.address], capture_output=True, text=True, check=False)
        if proc.returncode != 0 or f"dev {self.host_link}" not in proc.stdout:
            raise NetnsError(f"host does not reach {self.address} through {self.host_link}: "
                             f"{(proc.stdout or proc.stderr).strip()}")


def refuse_routes_out(prefix: list[str], label: str) -> None:
    """Raise `NetnsError` if, inside the namespace that `prefix` enters, a public address, a private one or the
    host's own gateway has a route, or any routing table has a default route."""
    gateway = _ip("route", "show", "default", check=False).stdout.split()
    probes = list(PROBE_ADDRESSES)
    if "via" in gateway:
        probes.append(gateway[gateway.index("via") + 1])
    for address in probes:
        proc = subprocess.run([*prefix, "ip", "route", "get", address], capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            raise NetnsError(f"{label} has a route to {address} ({proc.stdout.strip()}): refusing to start "
                             "anything that could reach off the machine")
    routes = subprocess.run([*prefix, "ip", "-o", "route", "show", "table", "all"], capture_output=True, text=True,
                            check=False).stdout
    if " default " in f" {routes} " or routes.startswith("default"):
        raise NetnsError(f"{label} has a default route: {routes.strip()}")


def _check_ranges_free(ns: Netns) -> None:
    """Refuse a slot whose ranges the host already routes (other than our own blackholes)."""
    table = _ip("-o", "route", "show").stdout.splitlines()
    ours = {ns.service_cidr, ns.pod_cidr}
    wanted = [ipaddress.ip_network(c) for c in (f"172.29.{ns.slot}.0/30", ns.service_cidr, ns.pod_cidr)]
    for line in table:
        fields = line.split()
        if not fields or fields[0] == "default":
            continue
        if fields[0] == "blackhole" and fields[1] in ours:
            continue
        dest = fields[1] if fields[0] in {"blackhole", "unreachable", "prohibit"} else fields[0]
        try:
            net = ipaddress.ip_network(dest, strict=False)
        except ValueError:
            continue
        if any(net.overlaps(w) for w in wanted):
            raise NetnsError(f"host already routes {dest} ({line.strip()}), which overlaps slot {ns.slot}")


def _pin(slot: int) -> Netns | None:
    """Bind the namespace just claimed as `vllmop-<slot>` to a name of this claimant's own as well (a bind mount of
    the nsfs file, as `ip netns` makes its names); None when the claim is no longer a namespace to pin."""
    claimed = f"/run/netns/{PREFIX}{slot}"
    ns = Netns(slot, pin_name=f"{PREFIX}{slot}.{secrets.token_hex(4)}")
    if _identity(claimed) is None:
        return None
    pin = Path(ns.path)
    try:
        pin.touch(exist_ok=False)
    except OSError as err:
        raise NetnsError(f"could not create the pin {pin}: {err}") from err
    mount = subprocess.run(["mount", "--bind", claimed, str(pin)], capture_output=True, text=True, check=False)
    if mount.returncode != 0 or _identity(str(pin)) != _identity(claimed):
        pin.unlink(missing_ok=True)
        raise NetnsError(f"could not pin {claimed} at {pin}: {mount.stderr.strip()}")
    return ns


def create() -> Netns:
    """Claim a free slot and build its isolated network; on any failure tear down and raise `NetnsError`."""
    require_privileges()
    last_error = ""
    for slot in range(SLOTS):
        claim = _ip("netns", "add", f"{PREFIX}{slot}", check=False)
        if claim.returncode != 0:
            last_error = claim.stderr.strip()
            continue
        try:
            ns = _pin(slot)
        except NetnsError:
            _ip("netns", "del", f"{PREFIX}{slot}", check=False)  # the claim this call just made
            raise
        if ns is None:
            last_error = f"slot {slot}'s namespace went away right after it was claimed"
            continue
        try:
            _check_ranges_free(ns)
        except NetnsError as err:
            # the slot's previous owner removed its namespace but its veth is still going away: try the next slot,
            # touching nothing of theirs (only the namespace this call just added is removed)
            ns.release()
            last_error = str(err)
            continue
        try:
            _ip("-n", ns.name, "link", "set", "lo", "up")
            _ip("link", "add", ns.host_link, "type", "veth", "peer", "name", ns.ns_link, "netns", ns.name)
            _ip("addr", "add", f"{ns.host_address}/30", "dev", ns.host_link)
            _ip("link", "set", ns.host_link, "up")
            _ip("-n", ns.name, "addr", "add", f"{ns.address}/30", "dev", ns.ns_link)
            _ip("-n", ns.name, "link", "set", ns.ns_link, "up")
            for cidr in (ns.service_cidr, ns.pod_cidr):
                _ip("route", "replace", "blackhole", cidr)
            ns.prove_isolated()
        except BaseException:
            ns.teardown()
            raise
        return ns
    raise NetnsError(f"no free network-namespace slot among {PREFIX}0..{SLOTS - 1} (last: {last_error})")


CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """This thread in `/run/netns/<name>` (a cluster's pin) until the block exits; threads and processes it starts
    meanwhile stay in there. Why: pod addresses exist only inside the cluster's network namespace (the host
    blackholes them), so a test that talks to pods (the e2e tier's clients, Prometheus) runs there. `setns(2)` moves
    the calling thread only; leaving restores the thread's own namespace."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
