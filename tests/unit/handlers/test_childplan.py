"""The controller's decisions about children as tables: rendered vs listed -> which writes, in which wave, and why."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.rendering.plans import gpu_case
from vllm_operator import constants
from vllm_operator.handlers import childplan
from vllm_operator.handlers.childplan import Reason, Verb, key_of, plan_children
from vllm_operator.rendering import render

UID = "uid-1"
OWNER = {"metadata": {"name": "chat", "namespace": "ml", "uid": UID}}


def obj(kind: str, name: str, spec_hash: str = "h1", *, owner: str | None = UID, api: str | None = None,
        replicas: int | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"live-{name}", "labels": labels or {},
                            "annotations": {constants.ANNOTATION_SPEC_HASH: spec_hash}}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "kind": constants.KIND, "name": "chat"}]
    body: dict[str, Any] = {"apiVersion": api or ("apps/v1" if kind == "Deployment" else "v1"), "kind": kind,
                            "metadata": meta}
    if kind == "Deployment":
        body["spec"] = {"replicas": 1 if replicas is None else replicas, "template": {}}
    return body


def rendered(kind: str, name: str, spec_hash: str = "h1", **labels: str) -> dict[str, Any]:
    out = obj(kind, name, spec_hash, owner=None, labels=labels)
    del out["metadata"]["uid"]
    return out


def observed(*objs: dict[str, Any]) -> dict[childplan.Key, dict[str, Any]]:
    return {key_of(o): o for o in objs}


def summary(plan: childplan.ChildPlan) -> list[tuple[str, str, str, str]]:
    return [(a.verb.value, a.reason.value, a.kind, a.name) for a in plan.actions]


CM, SVC, DEP = ("ConfigMap", "chat-router"), ("Service", "chat-short"), ("Deployment", "chat-short")

CASES: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, str, str, str]]]] = [
    ("nothing-there-everything-applied-deployments-last",
     [rendered("Deployment", "chat-short"), rendered(*CM), rendered(*SVC)], [],
     [("apply", "missing", "ConfigMap", "chat-router"), ("apply", "missing", "Service", "chat-short"),
      ("apply", "missing", "Deployment", "chat-short")]),
    ("same-hash-and-owned-nothing-written",
     [rendered(*CM), rendered(*DEP)], [obj(*CM), obj(*DEP)], []),
    ("hash-differs-applied",
     [rendered(*CM, spec_hash="h2"), rendered(*DEP)], [obj(*CM), obj(*DEP)],
     [("apply", "changed", "ConfigMap", "chat-router")]),
    ("orphan-with-our-labels-adopted-even-with-the-same-hash",
     [rendered(*CM)], [obj(*CM, owner=None)], [("apply", "adopt", "ConfigMap", "chat-router")]),
    ("owned-by-another-parent-adopted",
     [rendered(*CM)], [obj(*CM, owner="uid-other")], [("apply", "adopt", "ConfigMap", "chat-router")]),
    ("owned-and-no-longer-rendered-deleted",
     [rendered(*CM)], [obj(*CM), obj("Deployment", "chat-long")], [("delete", "dropped", "Deployment", "chat-long")]),
    ("not-owned-and-not-rendered-left-alone",
     [rendered(*CM)], [obj(*CM), obj("Service", "someone-elses", owner="uid-other"),
                       obj("Service", "unowned", owner=None)], []),
    ("same-name-other-kind-is-another-child",
     [rendered("Service", "chat-router")], [obj(*CM)],
     [("apply", "missing", "Service", "chat-router"), ("delete", "dropped", "ConfigMap", "chat-router")]),
]


@pytest.mark.parametrize(("desired", "live", "expect"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decisions(desired: list[dict[str, Any]], live: list[dict[str, Any]],
                   expect: list[tuple[str, str, str, str]]) -> None:
    plan = plan_children(OWNER, desired, observed(*live))
    assert summary(plan) == expect
    assert (not plan.actions) == (not expect)
    written = {(a.kind, a.name) for a in plan.actions}
    assert {k[1:] for k in plan.unchanged} == {(d["kind"], d["metadata"]["name"]) for d in desired} - written


def test_applied_objects_carry_the_controller_reference_and_deletes_the_uid_precondition() -> None:
    plan = plan_children(OWNER, [rendered(*CM)], observed(obj("Deployment", "chat-long")))
    [apply] = plan.applies[0]
    assert apply.desired is not None
    assert apply.desired["metadata"]["ownerReferences"] == [
        {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "name": "chat", "uid": UID,
         "controller": True, "blockOwnerDeletion": True}]
    [delete] = plan.deletes
    assert (delete.verb, delete.uid) == (Verb.DELETE, "live-chat-long")


def test_reasons_name_the_hashes() -> None:
    [action] = plan_children(OWNER, [rendered(*CM, spec_hash="h2")], observed(obj(*CM))).actions
    assert action.describe() == "apply ConfigMap chat-router (changed: spec-hash h1 -> h2)"


@pytest.mark.parametrize("live", [[], [obj(*DEP, spec_hash="old", replicas=7)]], ids=["created", "updated"])
def test_autoscaled_replicas_are_never_applied(live: list[dict[str, Any]]) -> None:
    """The autoscaler owns them from the start: no apply carries them, so none resets them (not even the first)."""
    desired = [rendered(*DEP, **{constants.LABEL_POOL: "short"}), rendered("Deployment", "chat-long",
                                                                          **{constants.LABEL_POOL: "long"})]
    autoscaled = childplan.autoscaled_deployments(desired, {"short"})
    assert autoscaled == {"chat-short"}
    plan = plan_children(OWNER, desired, observed(*live), autoscaled=autoscaled)
    by_name = {a.name: a.desired for a in plan.actions}
    assert by_name["chat-short"] is not None and "replicas" not in by_name["chat-short"]["spec"]
    assert by_name["chat-long"] is not None and "replicas" in by_name["chat-long"]["spec"]


def test_a_real_rendering_against_itself_writes_nothing() -> None:
    """The rendered objects, as the API server would list them back (owned, same hash), plan no write at all."""
    plan_, _ = gpu_case()
    manifests = render(plan_)
    live = {key_of(m): {**m, "metadata": {**m["metadata"], "uid": "x", "ownerReferences": [{"uid": UID}]}}
            for m in manifests}
    plan = plan_children(OWNER, manifests, live)
    assert not plan.actions and len(plan.unchanged) == len(manifests)
    first = plan_children(OWNER, manifests, {})
    assert [a.kind for a in first.applies[1]] == ["RoleBinding"] + ["Deployment"] * 3
    assert all(a.reason is Reason.MISSING for a in first.actions) and len(first.actions) == len(manifests)


def test_role_bindings_are_written_after_their_roles() -> None:
    # kube-apiserver checks a RoleBinding against its Role's rules; without `bind` it answers 404 until the Role exists
    rbac = "rbac.authorization.k8s.io/v1"
    role, binding = (obj(kind, "chat-router", owner=None, api=rbac) for kind in ("Role", "RoleBinding"))
    for item in (role, binding):
        del item["metadata"]["uid"]
    plan = plan_children(OWNER, [binding, role, rendered("Deployment", "chat-router")], observed())
    assert [a.kind for a in plan.applies[0]] == ["Role"]
    assert sorted(a.kind for a in plan.applies[1]) == ["Deployment", "RoleBinding"]
