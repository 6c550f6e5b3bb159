"""Many VLLMDeployments applied at once on a real kube-apiserver: reconciles finish a few at a time, in order.

What broke: kopf starts a handler for every object at once, and all reconciles shared the API client's few worker
threads. With 500 VLLMDeployments applied together every reconcile had written half its children and none had
written status after 240 s (benchmarks/webhook's load run); each got 1/500 of the requests. The operator now runs
at most `--max-concurrent-reconciles` at a time, in arrival order.

The check reads the kube-apiserver's audit log, not the clock, so a loaded machine cannot fail it: for each
VLLMDeployment the span from the operator's first child write to its first status write, and the most spans open at
one instant. Before the fix that was every VLLMDeployment of the batch; now it is at most the limit.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.kube import add_gpu_nodes, apply, namespaced_release, operator_process, wait_for
from tests.support.paths import ROOT

pytestmark = pytest.mark.integration

COUNT = 16
LIMIT = 2
MONITORING_DISCOVERY = "/apis/monitoring.coreos.com/v1"


@dataclass
class Setup:
    namespace: str
    label: dict[str, str]
    kubeconfig: Path
    user: str


@pytest.fixture(scope="module")
def setup(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with namespaced_release(kube, "many", tmp_path_factory.mktemp("many")) as release:
        label = {"vllm-operator.dev/test-node": release.watched}
        names = add_gpu_nodes(kube, release.watched, 2, label=label, gpus=2 * COUNT)
        try:
            yield Setup(release.watched, label, release.kubeconfig, release.user)
        finally:
            kube.kubectl("delete", "node", *names, "--wait=false", check=False)


def chat(name: str, setup: Setup) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"] = {"name": name, "namespace": setup.namespace}
    doc["spec"]["pools"] = {"short": {"replicas": 1, "nodeSelector": dict(setup.label)},
                            "long": {"replicas": 1, "nodeSelector": dict(setup.label)}}
    return dict(doc)


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def reconcile_spans(events: list[dict[str, Any]], user: str, namespace: str,
                    names: list[str]) -> dict[str, tuple[dt.datetime, dt.datetime]]:
    """Per VLLMDeployment: (first child write received, first status write completed), from the audit log."""
    first_child: dict[str, dt.datetime] = {}
    first_status: dict[str, dt.datetime] = {}
    for event in events:
        ref = event.get("objectRef") or {}
        if event["user"].get("username") != user or ref.get("namespace") != namespace:
            continue
        if event["verb"] not in {"patch", "create", "update"} or event["responseStatus"]["code"] >= 400:
            continue
        obj = ref.get("name", "")
        if ref.get("resource") == "vllmdeployments" and ref.get("subresource") == "status":
            first_status.setdefault(obj, _time(event["stageTimestamp"]))
        elif ref.get("resource") not in {"vllmdeployments", "events"}:
            owner = next((n for n in names if obj.startswith(f"{n}-")), None)
            if owner:
                received = _time(event["requestReceivedTimestamp"])
                first_child[owner] = min(first_child.get(owner, received), received)
    return {n: (first_child[n], first_status[n]) for n in names if n in first_child and n in first_status}


def most_open(spans: dict[str, tuple[dt.datetime, dt.datetime]]) -> tuple[int, list[str]]:
    """The most spans open at one instant, and which (a span ends before one that starts at the same time)."""
    edges = sorted([(start, 1, name) for name, (start, _) in spans.items()] +
                   [(end, 0, name) for name, (_, end) in spans.items()])
    open_now: set[str] = set()
    best: list[str] = []
    for _, starts, name in edges:
        if starts:
            open_now.add(name)
            if len(open_now) > len(best):
                best = sorted(open_now)
        else:
            open_now.discard(name)
    return len(best), best


def test_reconciles_of_a_batch_run_at_most_the_limit_at_once_in_arrival_order(
        kube: Cluster, setup: Setup, tmp_path: Path) -> None:
    names = [f"chat-{i:02d}" for i in range(COUNT)]
    ns = setup.namespace
    with operator_process(kube, setup.kubeconfig, tmp_path / "operator.log", f"--namespace={ns}", "--no-health",
                          f"--max-concurrent-reconciles={LIMIT}"):
        apply(kube, *(chat(name, setup) for name in names))

        def reconciled() -> list[str] | None:
            items = json.loads(kube.kubectl("get", "vllmd", "-n", ns, "-o", "json").stdout)["items"]
            done = [o["metadata"]["name"] for o in items
                    if (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]]
            return done if len(done) == COUNT else None

        wait_for(f"all {COUNT} VLLMDeployments reconciled", reconciled, timeout=300, interval=1)
    events = kube.audit_events()
    spans = reconcile_spans(events, setup.user, ns, names)
    assert sorted(spans) == names, f"spans found for {sorted(spans)}"
    peak, which = most_open(spans)
    assert peak <= LIMIT, f"{peak} reconciles were in flight at once ({', '.join(which)}); the limit is {LIMIT}"
    first_done = min(end for _, end in spans.values())
    last_started = max(start for start, _ in spans.values())
    assert first_done < last_started, "no reconcile finished before the last one started"
    # Concurrent reconciles share one discovery GET of the monitoring group (cached 60 s), not one each.
    discovery = [e for e in events if e["user"].get("username") == setup.user
                 and e.get("requestURI", "").split("?")[0] == MONITORING_DISCOVERY]
    seconds = (max(end for _, end in spans.values()) - min(start for start, _ in spans.values())).total_seconds()
    assert len(discovery) <= 2 + seconds / 60, f"{len(discovery)} discovery GETs in {seconds:.0f} s"
