"""What to do with a VLLMDeployment's children, decided from two snapshots and nothing else.

Why a module of its own: the controller's decisions (which child to write, which to delete, why) used to be made
inside the closure that also wrote them, so they could only be tested against a whole API server. Here they are a
pure function of the rendered manifests and the listed children (`plan_children`), returning a `ChildPlan` whose
actions each carry their reason; the reconcile routine only executes it (docs/architecture.md, Conventions: plan as
data, then execute). The table tests in `tests/unit/handlers/test_childplan.py` need no server.

The rules:
- a rendered child that is not there is applied (reason `missing`);
- one that is there, owned by this VLLMDeployment and carries the same spec-hash annotation is left alone — the hash
  covers the whole rendered object, so an unchanged rendering writes nothing on resync;
- one whose hash differs is applied (`changed`); one that exists but is not owned by this VLLMDeployment (an orphan of
  a deleted parent, or an object someone made by hand with the same name) is applied and so adopted (`adopt`);
- a listed child owned by this VLLMDeployment that the rendering no longer has is deleted (`dropped`), with its uid as
  the precondition so that a same-named successor is never removed; children owned by others are never touched.
- replicas of a pool whose replicas an external autoscaler owns are never in the applied object: the autoscaler owns
  them from the start, and no apply ever resets them.

Applied children come in two waves: everything pods refer to (ServiceAccount, Role, ConfigMap, Services, ...)
first, the Deployments after, so no pod is created before what it mounts or runs as. RoleBindings go in the second
wave too: the API server checks a binding against the rules of the Role it names (RBAC's escalation check) and,
for a writer without the `bind` verb (the operator under the chart's RBAC), refuses it with 404 while that Role does
not exist yet.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_operator import constants

Key = tuple[str, str, str]
"""(apiVersion, kind, name) of a child."""

DEPLOYMENT = ("apps/v1", "Deployment")
SECOND_WAVE = {DEPLOYMENT, ("rbac.authorization.k8s.io/v1", "RoleBinding")}


class Verb(enum.StrEnum):
    APPLY = "apply"
    DELETE = "delete"


class Reason(enum.StrEnum):
    MISSING = "missing"
    CHANGED = "changed"
    ADOPT = "adopt"
    DROPPED = "dropped"


@dataclass(frozen=True)
class ChildAction:
    """One write: apply `desired` over `observed` (None: the child does not exist yet), or delete `observed`."""

    verb: Verb
    reason: Reason
    key: Key
    desired: Mapping[str, Any] | None = None
    observed: Mapping[str, Any] | None = None
    detail: str = ""

    @property
    def kind(self) -> str:
        return self.key[1]

    @property
    def name(self) -> str:
        return self.key[2]

    @property
    def uid(self) -> str | None:
        """The observed object's uid: the precondition of a delete."""
        value = (self.observed or {}).get("metadata", {}).get("uid")
        return str(value) if value else None

    def describe(self) -> str:
        """"apply Deployment chat-short (changed: spec-hash 1a2b… -> 3c4d…)" — for logs and tests."""
        why = f"{self.reason}: {self.detail}" if self.detail else str(self.reason)
        return f"{self.verb} {self.kind} {self.name} ({why})"


@dataclass(frozen=True)
class ChildPlan:
    """Every write one reconcile makes to the children, in the order they must happen."""

    applies: tuple[tuple[ChildAction, ...], tuple[ChildAction, ...]] = ((), ())
    """Two waves: what pods refer to, then the Deployments."""
    deletes: tuple[ChildAction, ...] = ()
    unchanged: tuple[Key, ...] = field(default=())

    @property
    def actions(self) -> tuple[ChildAction, ...]:
        return (*self.applies[0], *self.applies[1], *self.deletes)


def spec_hash(obj: Mapping[str, Any] | None) -> str | None:
    """The spec-hash annotation of a rendered or live object (None when absent)."""
    if not obj:
        return None
    value = (obj.get("metadata", {}).get("annotations") or {}).get(constants.ANNOTATION_SPEC_HASH)
    return str(value) if value is not None else None


def is_owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences", []) or [])


def key_of(obj: Mapping[str, Any]) -> Key:
    return str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"])


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller reference every child carries (garbage collection deletes children with their parent)."""
    meta = owner["metadata"]
    return {"apiVersion": constants.API_VERSION, "kind": constants.KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _owned(rendered: Mapping[str, Any], ref: Mapping[str, Any]) -> dict[str, Any]:
    return {**rendered, "metadata": {**rendered["metadata"], "ownerReferences": [dict(ref)]}}


def _without_replicas(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}


def autoscaled_deployments(manifests: Sequence[Mapping[str, Any]], pools: Collection[str]) -> set[str]:
    """Names of the rendered pool Deployments whose replicas an external autoscaler owns."""
    return {m["metadata"]["name"] for m in manifests if (m["apiVersion"], m["kind"]) == DEPLOYMENT
            and (m["metadata"].get("labels") or {}).get(constants.LABEL_POOL) in pools}


def plan_children(owner: Mapping[str, Any], manifests: Sequence[Mapping[str, Any]],
                  observed: Mapping[Key, Mapping[str, Any]], *, autoscaled: Collection[str] = ()) -> ChildPlan:
    """Desired (`manifests`, rendered) against observed (the listed children, keyed by `key_of`) -> the writes.

    `owner` is the VLLMDeployment (its uid decides ownership); `autoscaled` names the Deployments whose replicas
    belong to an external autoscaler.
    """
    uid = owner["metadata"]["uid"]
    ref = owner_reference(owner)
    waves: tuple[list[ChildAction], list[ChildAction]] = ([], [])
    unchanged: list[Key] = []
    wanted: set[Key] = set()
    for rendered in manifests:
        key = key_of(rendered)
        wanted.add(key)
        desired = _owned(rendered, ref)
        have = observed.get(key)
        if key[2] in autoscaled and (key[0], key[1]) == DEPLOYMENT:
            desired = _without_replicas(desired)
        if have is None:
            action = ChildAction(Verb.APPLY, Reason.MISSING, key, desired)
        elif not is_owned_by(have, uid):
            action = ChildAction(Verb.APPLY, Reason.ADOPT, key, desired, have, "not owned by this VLLMDeployment")
        elif spec_hash(have) != spec_hash(rendered):
            action = ChildAction(Verb.APPLY, Reason.CHANGED, key, desired, have,
                                 f"spec-hash {spec_hash(have)} -> {spec_hash(rendered)}")
        else:
            unchanged.append(key)
            continue
        waves[1 if (key[0], key[1]) in SECOND_WAVE else 0].append(action)
    deletes = tuple(ChildAction(Verb.DELETE, Reason.DROPPED, key, None, have, "no longer rendered")
                    for key, have in sorted(observed.items()) if key not in wanted and is_owned_by(have, uid))
    return ChildPlan(applies=(tuple(waves[0]), tuple(waves[1])), deletes=deletes, unchanged=tuple(unchanged))


__all__ = ["ChildAction", "ChildPlan", "Key", "Reason", "Verb", "autoscaled_deployments", "is_owned_by", "key_of",
           "owner_reference", "plan_children", "spec_hash"]
