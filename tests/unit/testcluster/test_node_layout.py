"""A real node's addresses (testcluster.node.Layout): no two nodes of a cluster, and no node and the cluster's own
link, share an address or a pod range; the pod ranges stay inside the cluster's and out of kwok's lower half; and
kubelet is built from the same k8s.io/kubernetes as the control plane."""

from __future__ import annotations

import ipaddress
import re

import pytest

from testcluster.netns import Netns
from testcluster.node import MAX_NODES, Layout
from tests.support.paths import ROOT


@pytest.mark.parametrize("slot", [0, 7, 15])
def test_nodes_of_a_slot_share_nothing(slot: int) -> None:
    ns = Netns(slot)
    layouts = [Layout(slot, i) for i in range(MAX_NODES)]
    links = [ipaddress.ip_network(f"{layout.node_ip}/30", strict=False) for layout in layouts]
    links.append(ipaddress.ip_network(f"{ns.address}/30", strict=False))
    assert len(set(links)) == len(links)
    for layout, link in zip(layouts, links, strict=False):
        assert ipaddress.ip_address(layout.cluster_end) in link and layout.cluster_end != layout.node_ip
        assert layout.api_address == ns.address
    pods = [ipaddress.ip_network(layout.pod_cidr) for layout in layouts]
    cluster_pods = ipaddress.ip_network(ns.pod_cidr)
    kwok_half = next(cluster_pods.subnets(prefixlen_diff=1))
    assert len(set(pods)) == len(pods)
    assert all(p.subnet_of(cluster_pods) and not p.overlaps(kwok_half) for p in pods)  # type: ignore[arg-type]


def test_kubelet_and_the_control_plane_pin_one_kubernetes() -> None:
    def pinned(module: str) -> str:
        found = re.search(r"^require k8s\.io/kubernetes (v\S+)$", (ROOT / "cluster" / module / "go.mod").read_text(),
                          re.MULTILINE)
        assert found, module
        return found.group(1)

    assert pinned("kubelet") == pinned("kube")
    script = (ROOT / "scripts" / "build-kubelet.sh").read_text()
    assert f"KUBE_VERSION={pinned('kube')}" in script
