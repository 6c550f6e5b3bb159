"""The test cluster's network cannot reach off the machine and its setup fails closed (real namespaces and routes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testcluster import netns
from testcluster.netns import NetnsError

pytestmark = pytest.mark.integration


def test_namespace_has_no_route_out_and_host_blackholes_its_ranges() -> None:
    ns = netns.create()
    try:
        for address in ("1.1.1.1", "10.1.2.3", "192.0.2.1"):
            proc = ns.run("ip", "route", "get", address)
            assert proc.returncode != 0 and "unreachable" in proc.stderr, (address, proc)
        assert ns.run("ip", "route", "get", ns.host_address).returncode == 0  # the one on-link peer: the host
        for cidr in (ns.service_cidr, ns.pod_cidr):
            shown = subprocess.run(["ip", "route", "show", "type", "blackhole", "exact", cidr],
                                   capture_output=True, text=True, check=True).stdout
            assert cidr in shown
    finally:
        ns.teardown()
    assert ns.name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    leftover = subprocess.run(["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True,
                              check=True).stdout
    assert ns.pod_cidr not in leftover and ns.service_cidr not in leftover


def test_a_route_out_is_caught_before_anything_starts() -> None:
    ns = netns.create()
    try:
        subprocess.run(["ip", "-n", ns.name, "route", "add", "default", "via", ns.host_address], check=True)
        with pytest.raises(NetnsError, match="has a route to"):
            ns.prove_isolated()
    finally:
        ns.teardown()


def test_without_root_the_error_says_what_is_needed() -> None:
    code = "from testcluster import netns\ntry:\n netns.create()\nexcept netns.NetnsError as e:\n print(e)"
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, check=False, cwd=netns.__file__.rsplit("/", 2)[0])
    assert "needs root" in proc.stdout, proc
