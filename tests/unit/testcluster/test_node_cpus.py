"""The CPUs each real node of a test cluster gives its pods (testcluster.node.cpus_of): the planned nodes' shares
never overlap while there are CPUs enough, together cover every CPU, and every node gets at least one."""

from __future__ import annotations

import pytest

from testcluster.node import NodeError, cpus_of


def share(index: int, nodes: int, allowed: list[int]) -> set[int]:
    return {int(c) for c in cpus_of(index, nodes, allowed).split(",")}


@pytest.mark.parametrize(("cpus", "nodes"), [(2, 2), (2, 1), (4, 2), (5, 2), (16, 3), (3, 3)])
def test_planned_nodes_split_the_cpus_without_overlap(cpus: int, nodes: int) -> None:
    allowed = list(range(cpus))
    shares = [share(i, nodes, allowed) for i in range(nodes)]
    assert all(shares), shares
    assert set().union(*shares) == set(allowed)
    assert sum(len(s) for s in shares) == cpus, "no CPU in two shares"
    assert max(len(s) for s in shares) - min(len(s) for s in shares) <= 1


def test_the_e2e_stacks_two_nodes_on_two_cores_get_one_core_each() -> None:
    assert [cpus_of(i, 2, [0, 1]) for i in range(2)] == ["0", "1"]


def test_more_nodes_than_cpus_and_nodes_beyond_the_plan_share_round_robin() -> None:
    assert [cpus_of(i, 3, [0, 1]) for i in range(3)] == ["0", "1", "0"]
    assert cpus_of(2, 2, [4, 5, 6, 7]) == cpus_of(0, 2, [4, 5, 6, 7]) == "4,5", "a third node shares node 0's CPUs"


def test_the_machines_own_cpu_numbers_are_used() -> None:
    assert [cpus_of(i, 2, [3, 9]) for i in range(2)] == ["3", "9"]


def test_no_cpus_is_refused() -> None:
    with pytest.raises(NodeError, match="no CPU share"):
        cpus_of(0, 2, [])
