"""VLLMWorkloadClass on a real control plane: a class edit re-plans its dependents one after the other, an impossible
edit is refused on each dependent with its children untouched, a missing class is a condition, not a crash.

Classes are cluster-scoped and shared by every test of the session, so each test makes classes of its own (`unique`
names) and marks none default. The chart is installed without its built-in classes here (another module's release
owns those cluster-scoped objects; two releases cannot both own them); the operator runs with the ServiceAccount
token of this release's namespaced RBAC, class reader included.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.kube import add_gpu_nodes, apply, namespaced_release, operator_process, unique, wait_for
from tests.support.paths import ROOT
from vllm_operator import constants
from vllm_operator.handlers.classes import rolled_out
from vllm_operator.handlers.reconcile import child_selector

pytestmark = pytest.mark.integration

AGENT = ROOT / "examples" / "classes" / "agent.yaml"


@dataclass
class Setup:
    namespace: str
    label: dict[str, str]
    kubeconfig: Path
    nodes: list[str]


@pytest.fixture(scope="module")
def setup(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with namespaced_release(kube, "wc", tmp_path_factory.mktemp("wc")) as release:
        label = {"vllm-operator.dev/test-node": release.watched}
        nodes = add_gpu_nodes(kube, release.watched, 4, label=label)
        yield Setup(release.watched, label, release.kubeconfig, nodes)


def a_class(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(AGENT.read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["pools"]["long"]["maxModelLen"] = 16384  # fits an L4 with Llama-3.1-8B
    doc["spec"]["pools"]["long"]["typicalSequenceTokens"] = 8192
    return doc


def dependent(name: str, setup: Setup, klass: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"] = {"name": name, "namespace": setup.namespace}
    doc["spec"]["workloadClass"] = klass
    doc["spec"]["pools"] = {"short": {"replicas": 1, "nodeSelector": dict(setup.label)},
                            "long": {"replicas": 1, "nodeSelector": dict(setup.label)}}
    doc["spec"]["routing"] = {"overLimit": "clamp"}
    return dict(doc)


def get_json(kube: Cluster, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def status(kube: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(get_json(kube, "vllmd", name, "-n", ns).get("status") or {})


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == kind), {})


def engines(kube: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    return list(get_json(kube, "deployments", "-n", ns, "-l", child_selector(name))["items"])


def short_len(kube: Cluster, ns: str, name: str) -> int | None:
    for d in engines(kube, ns, name):
        if d["metadata"]["labels"].get(constants.LABEL_POOL) == constants.POOL_SHORT:
            args = d["spec"]["template"]["spec"]["containers"][0].get("args", [])
            for arg in args:
                if arg.startswith("--max-model-len="):
                    return int(arg.split("=", 1)[1])
    return None


def children_versions(kube: Cluster, ns: str, name: str) -> dict[str, str]:
    items = get_json(kube, "deployments,services,configmaps", "-n", ns, "-l", child_selector(name))["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in items}


def operator_requests(kube: Cluster, ns: str, name: str, since: datetime) -> Counter[str]:
    """What the operator's client sent since `since` about `name` in `ns`, from the API server's audit log: LISTs
    of its children by resource (`list deployments`; the watches' LISTs select all the operator's children, not one
    VLLMDeployment's), and its status writes refused with 409 (`conflicts`)."""
    selector = child_selector(name)
    found: Counter[str] = Counter()
    for e in kube.audit_events():
        ref = e.get("objectRef") or {}
        if ref.get("namespace") != ns or not e.get("userAgent", "").startswith(f"{constants.APP_NAME}/") or \
                datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")) < since:
            continue
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(e["requestURI"]).query)
        if e["verb"] == "list" and query.get("labelSelector") == [selector]:
            found[f"list {ref.get('resource')}"] += 1
        elif ref.get("name") == name and ref.get("subresource") == "status" and \
                e.get("responseStatus", {}).get("code") == 409:
            found["conflicts"] += 1
    return found


def ready(kube: Cluster, ns: str, name: str, generation: int) -> bool:
    st = status(kube, ns, name)
    return st.get("ready") == "2/2" and (st.get("workloadClass") or {}).get("generation") == generation


def test_class_edit_replans_dependents_one_after_the_other(kube: Cluster, setup: Setup, tmp_path: Path) -> None:
    klass = unique("agent")
    apply(kube, a_class(klass))
    first, second = unique("wa"), unique("wb")
    ns = setup.namespace
    log = tmp_path / "operator.log"
    try:
        with operator_process(kube, setup.kubeconfig, log, f"--namespace={ns}", "--no-health"):
            apply(kube, dependent(first, setup, klass), dependent(second, setup, klass))
            for name in (first, second):
                wait_for(f"{name} Ready on {klass} generation 1", lambda n=name: ready(kube, ns, n, 1), timeout=120)
                assert short_len(kube, ns, name) == 12288
                assert status(kube, ns, name)["workloadClass"] == {"name": klass, "generation": 1}

            edited = datetime.now(UTC)
            kube.kubectl("patch", "vllmwc", klass, "--type=merge", "-p", json.dumps(
                {"spec": {"promptLengthThreshold": 7168, "pools": {"short": {"maxModelLen": 8192}}}}))
            # Watch both: the second's engines must not change before the first's have rolled out.
            order: list[str] = []
            first_done_at: float | None = None
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and len(order) < 2:
                for name in (first, second):
                    if name not in order and short_len(kube, ns, name) == 8192:
                        order.append(name)
                        if name == second:
                            assert first_done_at is not None, "the second dependent changed before the first " \
                                                              "had rolled out"
                if first in order and first_done_at is None and rolled_out(engines(kube, ns, first)):
                    first_done_at = time.monotonic()
                time.sleep(0.2)
            assert order == [first, second], order
            for name in (first, second):
                wait_for(f"{name} Ready on {klass} generation 2", lambda n=name: ready(kube, ns, n, 2), timeout=120)
                assert status(kube, ns, name)["plan"]["promptLengthThreshold"] == 7168
        text = log.read_text()
        assert "ERROR" not in text and "Traceback" not in text, text[-4000:]
        assert f"VLLMWorkloadClass {klass} was changed to generation 2; re-planning 2" in text, text[-4000:]
        assert text.index(f"{ns}/{first} for VLLMWorkloadClass {klass}") < \
            text.index(f"{ns}/{second} for VLLMWorkloadClass {klass}")
        # Waiting for each dependent to roll out read the operator's Deployment watch: the only LISTs of its
        # Deployments are its reconcile's, two each (with every child kind, then for the status, again after a
        # status write's 409). Up to issue 39 the wait also LISTed them, at once and every second until rolled out.
        for name in (first, second):
            sent = operator_requests(kube, ns, name, edited)
            reconciles = sent["list services"]
            assert reconciles >= 1 and sent["list deployments"] <= 2 * reconciles + sent["conflicts"], (name, sent)
    finally:
        kube.kubectl("delete", "vllmd", first, second, "-n", ns, "--wait=false", check=False)
        kube.kubectl("delete", "vllmwc", klass, "--wait=false", check=False)


def pin_of(kube: Cluster, ns: str, name: str) -> str | None:
    annotations = get_json(kube, "vllmd", name, "-n", ns)["metadata"].get("annotations") or {}
    return annotations.get(constants.ANNOTATION_CLASS_PIN)


def test_a_roll_out_survives_an_operator_restart_one_dependent_at_a_time(kube: Cluster, setup: Setup,
                                                                        tmp_path: Path) -> None:
    """The operator stops while the first dependent's engines roll (the nodes are cordoned, so its new pods wait) and
    the second is still pinned; the next operator plans the second with the class as it was (its pin is on the
    object, not in the stopped operator's memory), waits for the first to roll out, and only then re-plans the
    second. Up to 2d3eb9d the pins lived in memory: the restarted operator's resume handler re-planned the second at
    once."""
    klass = unique("agent")
    apply(kube, a_class(klass))
    first, second = unique("wr"), unique("ws")
    ns = setup.namespace
    try:
        with operator_process(kube, setup.kubeconfig, tmp_path / "before.log", f"--namespace={ns}", "--no-health"):
            apply(kube, dependent(first, setup, klass), dependent(second, setup, klass))
            for name in (first, second):
                wait_for(f"{name} Ready on {klass} generation 1", lambda n=name: ready(kube, ns, n, 1), timeout=120)
            kube.kubectl("cordon", *setup.nodes)
            kube.kubectl("patch", "vllmwc", klass, "--type=merge", "-p", json.dumps(
                {"spec": {"promptLengthThreshold": 7168, "pools": {"short": {"maxModelLen": 8192}}}}))
            wait_for(f"{first} re-planned", lambda: short_len(kube, ns, first) == 8192, timeout=60)
            assert pin_of(kube, ns, first) is None and pin_of(kube, ns, second) is not None
            assert short_len(kube, ns, second) == 12288
        log = tmp_path / "after.log"
        with operator_process(kube, setup.kubeconfig, log, f"--namespace={ns}", "--no-health"):
            wait_for("the roll-out resumed", lambda: f"Resumed the roll-out of VLLMWorkloadClass {klass}: 1 "
                     in log.read_text(), timeout=60)
            time.sleep(5)  # the resume handlers have run: the second keeps its plan while the first still rolls
            assert short_len(kube, ns, second) == 12288, "re-planned before the first had rolled out"
            assert pin_of(kube, ns, second) is not None
            kube.kubectl("uncordon", *setup.nodes)
            wait_for(f"{first} rolled out", lambda: rolled_out(engines(kube, ns, first)), timeout=120)
            wait_for(f"{second} re-planned", lambda: short_len(kube, ns, second) == 8192, timeout=120)
            for name in (first, second):
                wait_for(f"{name} Ready on {klass} generation 2", lambda n=name: ready(kube, ns, n, 2), timeout=120)
            assert pin_of(kube, ns, second) is None
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
    finally:
        kube.kubectl("uncordon", *setup.nodes, check=False)
        kube.kubectl("delete", "vllmd", first, second, "-n", ns, "--wait=false", check=False)
        kube.kubectl("delete", "vllmwc", klass, "--wait=false", check=False)


def test_impossible_class_edit_is_refused_on_each_dependent(kube: Cluster, setup: Setup, tmp_path: Path) -> None:
    klass = unique("agent")
    apply(kube, a_class(klass))
    deps = [unique("wi"), unique("wj")]
    ns = setup.namespace
    log = tmp_path / "operator.log"
    try:
        with operator_process(kube, setup.kubeconfig, log, f"--namespace={ns}", "--no-health"):
            apply(kube, *(dependent(name, setup, klass) for name in deps))
            for name in deps:
                wait_for(f"{name} Ready", lambda n=name: ready(kube, ns, n, 1), timeout=120)
            before = {name: children_versions(kube, ns, name) for name in deps}
            # 10 % of an L4 cannot hold the 8B model's weights: no plan exists for either dependent.
            kube.kubectl("patch", "vllmwc", klass, "--type=merge", "-p", json.dumps(
                {"spec": {"pools": {"short": {"gpuMemoryUtilization": 0.1}}}}))
            for name in deps:
                refused = wait_for(f"{name} SpecValid=False", lambda n=name: (
                    c if (c := condition(status(kube, ns, n), constants.COND_SPEC_VALID)).get("status") == "False"
                    else None), timeout=60)
                assert "nothing is left for the KV cache" in refused["message"], refused
            time.sleep(2)  # anything the refusal wrongly triggered would have been written by now
            for name in deps:
                assert children_versions(kube, ns, name) == before[name], name
                assert status(kube, ns, name)["workloadClass"]["generation"] == 1  # the plan in effect
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
    finally:
        kube.kubectl("delete", "vllmd", *deps, "-n", ns, "--wait=false", check=False)
        kube.kubectl("delete", "vllmwc", klass, "--wait=false", check=False)


def test_missing_class_is_a_condition_and_creating_it_plans(kube: Cluster, setup: Setup, tmp_path: Path) -> None:
    klass, name, ns = unique("later"), unique("wm"), setup.namespace
    try:
        with operator_process(kube, setup.kubeconfig, tmp_path / "operator.log", f"--namespace={ns}", "--no-health"):
            apply(kube, dependent(name, setup, klass))
            refused = wait_for("SpecValid=False", lambda: (
                c if (c := condition(status(kube, ns, name), constants.COND_SPEC_VALID)).get("status") == "False"
                else None), timeout=60)
            assert f"VLLMWorkloadClass '{klass}' does not exist" in refused["message"], refused
            assert not engines(kube, ns, name)
            apply(kube, a_class(klass))
            wait_for(f"{name} Ready once {klass} exists", lambda: ready(kube, ns, name, 1), timeout=120)
    finally:
        kube.kubectl("delete", "vllmd", name, "-n", ns, "--wait=false", check=False)
        kube.kubectl("delete", "vllmwc", klass, "--wait=false", check=False)


def test_two_defaults_are_a_condition_and_unmarking_one_plans(kube: Cluster, setup: Setup, tmp_path: Path) -> None:
    """Two classes marked default: a VLLMDeployment naming no class is refused naming both, with no children; once
    one is unmarked, it plans with the other. (The only test that marks a class default: no other test's
    deployments may be left without a class while these two exist, so both are removed in `finally`.)"""
    first, second = sorted((unique("dflt"), unique("dflt")))
    name, ns = unique("wd"), setup.namespace
    try:
        for klass in (first, second):
            doc = a_class(klass)
            doc["spec"]["default"] = True
            apply(kube, doc)
        with operator_process(kube, setup.kubeconfig, tmp_path / "operator.log", f"--namespace={ns}", "--no-health"):
            unnamed = dependent(name, setup, first)
            del unnamed["spec"]["workloadClass"]
            apply(kube, unnamed)
            refused = wait_for("SpecValid=False", lambda: (
                c if (c := condition(status(kube, ns, name), constants.COND_SPEC_VALID)).get("status") == "False"
                else None), timeout=60)
            assert f"2 VLLMWorkloadClasses are marked default ({first}, {second})" in refused["message"], refused
            assert not engines(kube, ns, name)
            kube.kubectl("patch", "vllmwc", second, "--type=merge", "-p", json.dumps({"spec": {"default": False}}))
            wait_for(f"{name} Ready on {first}", lambda: ready(kube, ns, name, 1), timeout=120)
            assert status(kube, ns, name)["workloadClass"] == {"name": first, "generation": 1}
    finally:
        kube.kubectl("delete", "vllmd", name, "-n", ns, "--wait=false", check=False)
        kube.kubectl("delete", "vllmwc", first, second, "--wait=false", check=False)
