"""The product on a real control plane (upstream kube-apiserver, controller manager, scheduler; kwok nodes).

What only a real API server can say: that it accepts the generated CRD (`kubectl apply --server-side`, `helm
install`) and marks it Established, so a schema it refuses can never land again; that the operator, run with the
ServiceAccount token the chart's namespaced RBAC binds, turns examples/chat.yaml into its children with no ERROR in
its log (the first reconcile once hit a 404 on its RoleBinding); that the real deployment controller, scheduler and
kwok make the pods Ready; that `kubectl get/describe/delete` show what the docs promise and the garbage collector
removes every child.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.helm import CHART_DIR
from tests.support.kube import add_gpu_nodes, apply, helm, operator_process, unique, wait_for
from tests.support.paths import CRD_FILE, ROOT
from vllm_operator import constants
from vllm_operator.api import crdgen
from vllm_operator.handlers.reconcile import child_selector
from vllm_operator.planning import profiles

pytestmark = pytest.mark.integration

CHILD_KINDS = "deployments,services,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets,networkpolicies"


@dataclass
class Release:
    name: str
    namespace: str  # where the operator (chart) lives
    watched: str  # the one namespace it watches (namespaced mode)
    service_account: str


@pytest.fixture(scope="module")
def release(kube: Cluster) -> Iterator[Release]:
    """`helm install` of the chart, namespaced to one watched namespace (creating the CRD if nobody did yet)."""
    rel = Release(name=unique("vo"), namespace=unique("vo-sys"), watched=unique("team"), service_account="")
    rel.service_account = f"{rel.name}-vllm-operator"
    kube.kubectl("create", "namespace", rel.watched)
    helm(kube, "install", rel.name, str(CHART_DIR), "--namespace", rel.namespace, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{rel.watched}}}")
    yield rel
    helm(kube, "uninstall", rel.name, "--namespace", rel.namespace, check=False)
    kube.kubectl("delete", "namespace", rel.watched, rel.namespace, "--wait=false", check=False)


def test_crd_is_established(kube: Cluster, release: Release) -> None:
    kube.wait_established(constants.CRD_NAME)
    crd = json.loads(kube.kubectl("get", "crd", constants.CRD_NAME, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("NamesAccepted") == "True", conditions
    assert conditions.get("NonStructuralSchema") is None, conditions


def test_kubectl_server_side_apply_of_crds_dir_succeeds(kube: Cluster, release: Release) -> None:
    proc = kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE.parent))
    assert f"customresourcedefinition.apiextensions.k8s.io/{constants.CRD_NAME} serverside-applied" in proc.stdout
    kube.kubectl("api-resources")  # refreshes kubectl's discovery cache, written before the CRD existed
    explained = kube.kubectl("explain", "vllmd.spec.pools.long").stdout
    assert "maxModelLen" in explained


def test_every_example_passes_strict_server_validation(kube: Cluster, release: Release) -> None:
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(example.read_text()) if d and d.get("kind") == constants.KIND]
        for doc in docs:
            doc["metadata"]["namespace"] = release.watched
            proc = kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                                input=yaml.safe_dump(doc), check=False)
            assert proc.returncode == 0, f"{example.name}: {proc.stderr}"


def test_chart_installs_the_builtin_classes_equal_to_the_profiles(kube: Cluster, release: Release) -> None:
    kube.wait_established(constants.CLASS_CRD_NAME)
    for name, spec in profiles.BUILTINS.items():
        obj = json.loads(kube.kubectl("get", "vllmwc", name.value, "-o", "json").stdout)
        assert profiles.parse_class(obj).spec == spec
        assert obj["spec"] == spec.to_wire(), name
    table = kube.kubectl("get", "vllmwc").stdout.splitlines()
    shown = [c["name"].upper() for c in crdgen.CLASS_PRINTER_COLUMNS if not c.get("priority")]
    assert table[0].split() == ["NAME", *shown], table
    chat = next(line.split() for line in table[1:] if line.split()[0] == "chat")
    assert "3584 4096 512 16384 1024 model" in " ".join(chat), table  # Default is blank when unset


def test_helm_upgrade_succeeds(kube: Cluster, release: Release) -> None:
    helm(kube, "upgrade", release.name, str(CHART_DIR), "--namespace", release.namespace, "--reuse-values",
         "--set", "operator.verbose=true")
    status = json.loads(helm(kube, "status", release.name, "--namespace", release.namespace, "-o", "json").stdout)
    assert status["version"] == 2 and status["info"]["status"] == "deployed", status["info"]


def _chat(namespace: str, node_label: dict[str, str]) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"]["namespace"] = namespace
    for pool in doc["spec"]["pools"].values():
        pool["nodeSelector"] = dict(node_label)
    return dict(doc)


def _children(kube: Cluster, namespace: str, name: str) -> list[str]:
    out = kube.kubectl("get", CHILD_KINDS, "-n", namespace, "-l", child_selector(name), "-o", "name").stdout
    return sorted(out.split())


def test_operator_with_chart_rbac_runs_chat_to_ready_and_gc_removes_children(kube: Cluster, release: Release,
                                                                             tmp_path: Path) -> None:
    label = {"vllm-operator.dev/test-node": release.watched}
    nodes = add_gpu_nodes(kube, release.watched, 2, label=label)
    try:
        _run_chat_under_chart_rbac(kube, release, tmp_path, label)
    finally:  # Nodes are cluster-scoped: other tests' planners and webhooks must not see these L4s
        kube.kubectl("delete", "node", *nodes, "--wait=false", check=False)


def _run_chat_under_chart_rbac(kube: Cluster, release: Release, tmp_path: Path, label: dict[str, str]) -> None:
    token = kube.token_kubeconfig(release.namespace, release.service_account, tmp_path / "operator.kubeconfig")
    log = tmp_path / "operator.log"
    with operator_process(kube, token, log, f"--namespace={release.watched}", "--no-health"):
        apply(kube, _chat(release.watched, label))

        def ready() -> str:
            return kube.kubectl("get", "vllmd", "chat", "-n", release.watched, "-o",
                                "jsonpath={.status.ready}", check=False).stdout

        wait_for("chat Ready 3/3", lambda: ready() == "3/3", timeout=90)
        children = _children(kube, release.watched, "chat")
        assert len(children) >= 10, children
        table = kube.kubectl("get", "vllmd", "-n", release.watched).stdout
        header = table.splitlines()[0].split()
        shown = [c["name"].upper() for c in crdgen.PRINTER_COLUMNS if not c.get("priority")]  # not just -o wide
        assert header == ["NAME", *shown], table
        assert table.splitlines()[1].split()[:5] == ["chat", "chat", "3/3", "2/2", "1/1"], table
        described = kube.kubectl("describe", "vllmd", "chat", "-n", release.watched).stdout
        assert "Conditions:" in described and "Ready" in described, described
        assert "Events:" in described and "Created" in described, described
        engine_pods = json.loads(kube.kubectl("get", "pods", "-n", release.watched, "-l",
                                              f"{constants.LABEL_POOL}", "-o", "json").stdout)["items"]
        assert {p["spec"]["nodeName"] for p in engine_pods} <= {f"{release.watched}-0", f"{release.watched}-1"}

        deleted = kube.kubectl("delete", "vllmd", "chat", "-n", release.watched, "--timeout=30s", timeout=40)
        assert 'vllmdeployment.vllm-operator.dev "chat" deleted' in deleted.stdout
        wait_for("the garbage collector to remove every child",
                 lambda: not _children(kube, release.watched, "chat"), timeout=60)
    text = log.read_text()
    assert "ERROR" not in text and "Traceback" not in text, text[-4000:]
    forbidden = [e for e in kube.audit_events()
                 if e.get("user", {}).get("username", "").endswith(f":{release.service_account}")
                 and e.get("responseStatus", {}).get("code") in (403, 404)
                 and e.get("verb") not in ("get", "watch")]
    assert not forbidden, [(e["verb"], e["requestURI"], e["responseStatus"]) for e in forbidden]
