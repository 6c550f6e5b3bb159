"""Clusters started side by side never share a network namespace or an address, and a stale state's stop leaves a
slot that another cluster has claimed since alone.

Seen before the pins (testcluster/netns.py, "Ownership"): `python -m testcluster up` while the integration tier
started its fault cluster, both in `vllmop-1` at 172.29.1.2, both API servers binding 6443 there. The slot's name was
deleted by whoever held a state naming it, and every component entered the namespace by that name, so a component
started after the name changed hands joined the newcomer's namespace.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testcluster import cluster, netns
from testcluster.cluster import Cluster
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration


def _netns_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def _readyz(kube: Cluster) -> int:
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    pki = kube.directory / "pki"
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return cluster._get(f"{kube.server}/readyz", context)[0]


def _listed() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()


def test_cli_up_and_a_cluster_started_at_the_same_time_get_their_own_namespaces(tmp_path: Path) -> None:
    """The reported race, both ways at once: the CLI's `up` in a process of its own and `cluster.start` here."""
    started: dict[str, Cluster | BaseException] = {}

    def here() -> None:
        try:
            started["here"] = cluster.start(tmp_path / "here", kwok=False)
        except BaseException as err:
            started["here"] = err

    thread = threading.Thread(target=here)
    cli = subprocess.Popen([sys.executable, "-m", "testcluster", "up", "--no-kwok", "--dir", str(tmp_path / "cli")],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    thread.start()
    out, _ = cli.communicate(timeout=300)
    thread.join(300)
    try:
        assert cli.returncode == 0, out
        mine = started["here"]
        assert isinstance(mine, Cluster), mine
        other = cluster.load(tmp_path / "cli")
        assert other.netns.slot != mine.netns.slot and other.netns.address != mine.netns.address
        for kube in (mine, other):
            assert _readyz(kube) == 200
            inode = os.stat(kube.netns.path).st_ino
            # every component of a cluster is in the namespace its pin names, and no other cluster's is
            assert {name: _netns_of(pid) for name, pid in kube.state.pids.items()} == {
                name: inode for name in kube.state.pids}, kube.state.pids
        assert os.stat(mine.netns.path).st_ino != os.stat(other.netns.path).st_ino
    finally:
        subprocess.run([sys.executable, "-m", "testcluster", "down", "--dir", str(tmp_path / "cli")], cwd=ROOT,
                       check=False, capture_output=True)
        if isinstance(started.get("here"), Cluster):
            started["here"].stop()  # type: ignore[union-attr]


def test_a_stale_stop_leaves_the_slot_to_the_cluster_that_claimed_it_since(tmp_path: Path) -> None:
    first = cluster.start(tmp_path / "first", kwok=False)
    stale = dataclasses.replace(first.state, pids={}, binaries={}, argv={})
    first.stop()
    second = cluster.start(tmp_path / "second", kwok=False)
    try:
        # the state of a cluster that held this slot before (a dead cluster's state.json, `down` run on it later);
        # and one written before pins existed, which names only the slot
        for old in (dataclasses.replace(stale, slot=second.netns.slot),
                    dataclasses.replace(stale, slot=second.netns.slot, pin="")):
            cluster.stop(old)
            first.stop()  # a second stop of a stopped cluster is the same thing
            assert second.netns.name in _listed() and second.netns.owned()
            assert _readyz(second) == 200
            for cidr in (second.netns.service_cidr, second.netns.pod_cidr):
                shown = subprocess.run(["ip", "route", "show", "type", "blackhole", "exact", cidr],
                                       capture_output=True, text=True, check=True).stdout
                assert cidr in shown, f"a stale stop removed {cidr}'s blackhole, the host's second wall"
        # a component started again after all that enters this cluster's namespace, not whatever has the name
        second.stop_component("kube-apiserver")
        second.start_component("kube-apiserver")
        assert _netns_of(second.state.pids["kube-apiserver"]) == os.stat(second.netns.path).st_ino
    finally:
        second.stop()
    assert second.netns.name not in _listed() and second.netns.pin_name not in _listed()


def test_a_stale_stop_between_a_claim_and_its_first_component_changes_nothing(tmp_path: Path) -> None:
    """The reported collision, exactly: a cluster has claimed its slot and not started anything yet (its namespace
    holds no process, so deleting its name destroyed it), a stale stop for that slot runs, another cluster starts.
    On the code before pins the newcomer got the same slot and address, and the first cluster's next component ran
    in the newcomer's namespace (reproduced: both `net:[4026532175]`)."""
    claimed = netns.create()
    try:
        netns.Netns(claimed.slot).teardown()  # a state from before pins
        netns.Netns(claimed.slot, pin_name=f"{claimed.name}.0000dead").teardown()  # a dead cluster's pinned state
        newcomer = cluster.start(tmp_path / "newcomer", kwok=False)
        try:
            assert newcomer.netns.slot != claimed.slot and newcomer.netns.address != claimed.address
            entered = subprocess.run([*claimed.exec_prefix(), "readlink", "/proc/self/ns/net"], capture_output=True,
                                     text=True, check=True).stdout.strip()
            assert entered == f"net:[{os.stat(claimed.path).st_ino}]"
            assert entered != os.readlink(f"/proc/{newcomer.state.pids['kube-apiserver']}/ns/net")
        finally:
            newcomer.stop()
    finally:
        claimed.teardown()
    assert claimed.name not in _listed() and claimed.pin_name not in _listed()
