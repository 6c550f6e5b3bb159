"""Control-plane faults under the operator, on a real control plane of this module's own (faults would break the
session's shared one): kube-apiserver killed while reconciles are in flight and started again, etcd killed and
started again, and a watch that expires (410 Gone) through a proxy. Each test checks that the operator resumes and
converges: every VLLMDeployment reconciled at its generation, and its children exactly the rendered set — none
missing (half-created), none extra (duplicated), each at the rendered spec-hash (none half-written).

Waits are on conditions (the audit log, the objects, the operator's log), never sleeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import cluster
from testcluster.cluster import Cluster
from tests.support.apiproxy import ApiProxy
from tests.support.helm import CHART_DIR
from tests.support.kube import add_gpu_nodes, apply, helm, operator_process, unique, wait_for
from tests.support.paths import ROOT
from vllm_operator import constants
from vllm_operator.handlers.reconcile import MONITORING_KINDS, child_selector
from vllm_operator.k8s import CHILD_RESOURCES
from vllm_operator.rendering.cli import render_documents

pytestmark = pytest.mark.integration

BATCH = 10


@dataclass
class Setup:
    kube: Cluster
    namespace: str
    system: str
    account: str
    label: dict[str, str]
    kubeconfig: Path


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """A control plane of this module's own, the chart installed namespaced, the operator's token."""
    with cluster.running(tmp_path_factory.mktemp("faulty")) as kube:
        release, system, watched = unique("vofault"), unique("vofault-sys"), unique("fault")
        kube.kubectl("create", "namespace", watched)
        helm(kube, "install", release, str(CHART_DIR), "--namespace", system, "--create-namespace",
             "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}",
             "--set", "workloadClasses.builtins=false")
        label = {"vllm-operator.dev/test-node": watched}
        add_gpu_nodes(kube, watched, 2, label=label, gpus=64)
        account = f"{release}-vllm-operator"
        token = kube.token_kubeconfig(system, account, tmp_path_factory.mktemp("fault") / "operator.kubeconfig")
        yield Setup(kube, watched, system, account, label, token)


def chat(name: str, setup: Setup, replicas: int = 1) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"] = {"name": name, "namespace": setup.namespace}
    doc["spec"]["pools"] = {"short": {"replicas": replicas, "nodeSelector": dict(setup.label)},
                            "long": {"replicas": 1, "nodeSelector": dict(setup.label)}}
    doc["spec"]["router"] = {"replicas": 1}
    return dict(doc)


def get(kube: Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def reconciled(kube: Cluster, namespace: str, names: list[str]) -> list[str]:
    """Names whose status was written for their current generation."""
    items = get(kube, "vllmd", "-n", namespace)["items"]
    return sorted(o["metadata"]["name"] for o in items if o["metadata"]["name"] in names
                  and (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"])


def children(kube: Cluster, namespace: str, name: str) -> set[tuple[str, str, str]]:
    """(kind, name, spec-hash) of every object carrying the VLLMDeployment's child labels."""
    kinds = [r for key, r in CHILD_RESOURCES.items() if key not in MONITORING_KINDS and r.group != "keda.sh"]
    resources = ",".join(f"{r.plural}.{r.group}" if r.group else r.plural for r in kinds)
    items = get(kube, resources, "-n", namespace, "-l", child_selector(name))["items"]
    return {(o["kind"], o["metadata"]["name"],
             (o["metadata"].get("annotations") or {}).get(constants.ANNOTATION_SPEC_HASH, "")) for o in items}


def rendered(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    objects, _ = render_documents([doc])
    return {(o["kind"], o["metadata"]["name"], o["metadata"]["annotations"][constants.ANNOTATION_SPEC_HASH])
            for o in objects if (o["apiVersion"], o["kind"]) not in MONITORING_KINDS}


def assert_children_exactly_rendered(kube: Cluster, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        want, have = rendered(doc), children(kube, doc["metadata"]["namespace"], doc["metadata"]["name"])
        assert have == want, (f"{doc['metadata']['name']}: missing {sorted(want - have)}, "
                              f"extra or stale {sorted(have - want)}")


def operator_writes(kube: Cluster, setup: Setup) -> int:
    user = f"system:serviceaccount:{setup.system}:{setup.account}"
    return sum(1 for e in kube.audit_events() if e["user"].get("username") == user
               and e["verb"] in {"create", "patch", "update"} and e["responseStatus"]["code"] < 400)


@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_control_plane_component_killed_mid_reconcile_and_restarted_leaves_no_half_or_duplicate_children(
        faulty: Setup, tmp_path: Path, component: str) -> None:
    """SIGKILL (a crash) of the API server or of etcd while reconciles are under way, then a restart: every
    VLLMDeployment converges to exactly its rendered children, none missing, extra or half-written."""
    kube, ns = faulty.kube, faulty.namespace
    docs = [chat(f"{'api' if component == 'kube-apiserver' else component}-{i:02d}", faulty) for i in range(BATCH)]
    names = [d["metadata"]["name"] for d in docs]
    log = tmp_path / "operator.log"
    with operator_process(kube, faulty.kubeconfig, log, f"--namespace={ns}", "--no-health",
                          "--max-concurrent-reconciles=2"):
        before = operator_writes(kube, faulty)
        apply(kube, *docs)
        # Mid-reconcile: the operator has written children (some reconciles are under way), not all are done.
        wait_for("the operator writing children", lambda: operator_writes(kube, faulty) > before + 5, timeout=120,
                 interval=0.05)
        kube.stop_component(component)
        # A reconcile under way failed on the missing component (what makes this a mid-reconcile fault).
        wait_for(f"a reconcile failing with {component} stopped", lambda: "failed temporarily" in log.read_text(),
                 timeout=180)
        kube.start_component(component)
        wait_for(f"all {BATCH} reconciled after {component} came back",
                 lambda: reconciled(kube, ns, names) == sorted(names), timeout=300, interval=1)
        assert_children_exactly_rendered(kube, docs)


def test_an_expired_watch_410_makes_the_operator_relist_and_converge(faulty: Setup, tmp_path: Path) -> None:
    kube, ns = faulty.kube, faulty.namespace
    first, late = chat("watch-a", faulty), chat("watch-b", faulty)
    token = kube.kubectl("create", "token", faulty.account, "-n", faulty.system, "--duration=1h").stdout.strip()
    with ApiProxy(kube, tmp_path / "proxy") as proxy:
        kubeconfig = proxy.kubeconfig(tmp_path / "proxied.kubeconfig", token, ns)
        with operator_process(kube, kubeconfig, tmp_path / "operator.log", f"--namespace={ns}", "--no-health"):
            apply(kube, first)
            wait_for("watch-a reconciled", lambda: reconciled(kube, ns, ["watch-a"]) == ["watch-a"], timeout=120)
            # The operator's watch of VLLMDeployments drops and reconnects to a watch that stays silent.
            proxy.hold(constants.PLURAL)
            wait_for("the operator's watch held", lambda: proxy.held_watches(constants.PLURAL) >= 1, timeout=60)
            # Behind the silent watch: a new VLLMDeployment and an edit of the first.
            apply(kube, late)
            edited = chat("watch-a", faulty, replicas=2)
            apply(kube, edited)
            assert reconciled(kube, ns, ["watch-a", "watch-b"]) == [], "the operator saw past a held watch"
            mark = len(proxy.requests)
            proxy.expire(constants.PLURAL)
            wait_for("watch-b and the edited watch-a reconciled",
                     lambda: reconciled(kube, ns, ["watch-a", "watch-b"]) == ["watch-a", "watch-b"], timeout=120)
            assert proxy.gone_sent >= 1
            relists = list(proxy.lists_after(mark, constants.PLURAL))
            assert relists, f"no list of {constants.PLURAL} after the 410 (requests: {proxy.requests[mark:][:20]})"
            assert_children_exactly_rendered(kube, [edited, late])
