"""An in-memory `KubeApi` for unit tests of code that talks to the API server (the controller's reconcile, the status
refresh, the router's discovery), with the server's behaviour where that code depends on it.

Why a fake rather than mocks: one reconcile makes dozens of requests whose answers feed each other (a list's
resourceVersion is where its watch starts; a status write is conditional on the version read), and a per-test mock
scripts answers no server would give. The fake is held to the real kube-apiserver by
tests/integration/kube/test_kubeapi_contract.py: the same scenarios with the same assertions on both.

`FakeCluster` is the server (objects, versions, watch history, served resources); `FakeKubeApi` is one client of it
(the verbs, a call count, injected faults).

What is modelled:
- Storage: objects keyed by (group, plural, namespace, name). One cluster-wide resourceVersion counter (an integer
  string, like etcd's revision), bumped by every write that changes something; a write that changes nothing is not
  stored and bumps nothing, as on the server. uid, creationTimestamp, generation (1 on create, +1 when anything
  outside metadata and status changes) and resourceVersion are the fake's whatever a request says; a
  resourceVersion or uid in a patch or apply body is a precondition (409 Conflict when it differs). Every answer is
  a deep copy: a caller can never alias the store.
- Status: on kinds with a status subresource (`STATUS_SUBRESOURCE`, or `FakeCluster.serve(..., status_subresource=)`)
  create, patch and apply leave status as it was and patch_status changes status only; elsewhere status is an
  ordinary field and patch_status is 404.
- Errors, with the server's status, reason and message: 404 NotFound; 409 AlreadyExists (create), Conflict
  (preconditions, a delete's uid precondition); 422 Invalid (create without a name); 400 BadRequest (a malformed
  label selector, a body whose name or namespace differs from the request's); a resource the cluster does not serve
  is 404 for every verb, which `get` reports as None and `delete` ignores, as ClientKubeApi does.
- patch: JSON merge patch (RFC 7386, null deletes).
- apply: creates the object when it is absent, else merges the body into it (maps key by key, lists and scalars
  replaced, nulls dropped). Field ownership is not modelled: what a server-side apply removes (a field the body no
  longer has), keeps (another manager's field) and contests (a 409 naming the field and its manager) only the real
  server decides, and tests/integration/kube/test_children_ssa.py proves the reconcile's use of it there; the fake
  keeps no managedFields.
- Label selectors: the labels.Parse grammar (`parse_selector`).
- delete: immediate, background propagation. An object with finalizers gets a deletionTimestamp and goes when a
  write leaves it without finalizers. Garbage collection, synchronous: when an object goes, the objects whose
  ownerReferences name its uid go too (recursively) when no other owner of theirs is there, and otherwise lose the
  dangling reference (as the garbage collector does).
- Events: emit_event creates the Event ClientKubeApi would (readable with `list(EVENTS, namespace)`).
- Discovery: every kind k8s.py names is served except the add-ons' (`ADDON_GROUPS`: the Prometheus operator's and
  KEDA's CRDs, absent on the test control plane too); `FakeCluster.serve` and `withdraw` change that.
- Watch, the watch cache's rules: each resource keeps its last `history` changes. A watch from resourceVersion R
  replays the changes after R, then waits for new ones; R older than the history (before the resource was served,
  older than its oldest kept change, or before `compact`) raises WatchExpired (410) on the first iteration, like
  the server's "too old resource version"; "" and "0" start with a synthetic ADDED per object. Namespace and label
  selector filter as on the server: an object that starts matching is ADDED, one that stops matching is DELETED
  (with its previous content at the new version). An idle watch yields a BOOKMARK (an object of only
  metadata.resourceVersion) every `bookmark_interval` seconds and ends after `timeout_seconds`, capped by
  `max_watch_seconds` so that tests need not wait minutes.
- Faults and counting, per client: `fail(verb, error, times=)` makes the next calls of a verb raise; `calls` counts
  every call by verb. Every call yields to the event loop once first, so concurrent callers interleave as they do
  against a server.

Not modelled: defaulting, validation and pruning by schema (OpenAPI or CRD: an object is stored as sent); admission
(webhooks, quotas, the existence of the namespace); RBAC (every call is allowed; a 403 comes only from `fail`);
strategic merge patch, dry run, field selectors, pagination; subresources other than status; conversion (an object
is stored once, answered with the apiVersion it is asked for); the watch cache's wait for a "too large"
resourceVersion (a 504 at once); foreground and orphan deletion; namespace deletion; the Deployment, ReplicaSet and
other controllers (nothing ever writes a child's status unless a test does).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import secrets
import string
import uuid
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_operator import constants, k8s
from vllm_operator.k8s import (
    DEPLOYMENTS,
    EVENTS,
    HPAS,
    NODES,
    PDBS,
    PODS,
    SCALED_OBJECTS,
    SERVICES,
    VLLM_DEPLOYMENTS,
    KubeError,
    Resource,
    WatchEvent,
    WatchExpired,
    event_body,
    now_rfc3339,
)

ADDON_GROUPS = frozenset({"monitoring.coreos.com", "keda.sh"})
"""API groups k8s.py names whose CRDs a cluster may lack: not served until a test serves them."""

BUILT_IN: tuple[Resource, ...] = tuple(r for r in vars(k8s).values()
                                       if isinstance(r, Resource) and r.group not in ADDON_GROUPS)
"""What a new FakeCluster serves: every Resource constant of k8s.py (the built-in kinds and this operator's CRDs) but
the add-ons'. Read from the module so that a kind added there is served here without a second list."""

STATUS_SUBRESOURCE = frozenset((r.group, r.plural) for r in (
    DEPLOYMENTS, SERVICES, PODS, NODES, PDBS, HPAS, VLLM_DEPLOYMENTS, SCALED_OBJECTS))
"""(group, plural) of the kinds among `BUILT_IN` and the add-ons that have a status subresource."""

VERBS = frozenset({"get", "list", "list_versioned", "create", "patch", "patch_status", "apply", "delete",
                   "emit_event", "has_resource", "watch"})
WRITE_VERBS = frozenset({"create", "patch", "patch_status", "apply", "delete"})
"""The verbs that write (events left out: they describe writes rather than being ones)."""

SERVER_METADATA = frozenset({"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                             "deletionGracePeriodSeconds", "selfLink", "managedFields"})
"""metadata the server sets: a request's values are preconditions (resourceVersion, uid) or ignored."""

ObjectKey = tuple[str, str, str, str]
"""(group, plural, namespace, name); namespace "" for cluster-scoped kinds."""


# --- label selectors -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One requirement of a label selector; `operator` is =, !=, in, notin, exists, !, > or <."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "exists":
                return self.key in labels
            case "!":
                return self.key not in labels
            case "=" | "in":
                return value is not None and value in self.values
            case "!=" | "notin":
                return value is None or value not in self.values
            case _:  # > and <: integer comparisons, false for a missing or non-integer value
                (bound,) = self.values
                try:
                    number = int(value or "")
                except ValueError:
                    return False
                return number > int(bound) if self.operator == ">" else number < int(bound)


_OPERATOR = re.compile(r"==|!=|=|!|\(|\)|,|<|>")
_WORD = re.compile(r"[^\s!=(),<>]+")


def _selector_error(text: str, why: str) -> KubeError:
    return KubeError(400, "BadRequest", f"unable to parse requirement: {why} (in {text!r})")


def parse_selector(text: str | None) -> tuple[Requirement, ...]:
    """A label selector in the grammar of the API server's labels.Parse: comma-joined `k=v` (or `k==v`), `k!=v`, `k`,
    `!k`, `k in (a,b)`, `k notin (a,b)`, `k>n`, `k<n`.

    Why a parser rather than splitting on commas: the controller sends comma-joined equalities (its child selector),
    the accelerator lookup sends a pool's nodeSelector, and a test may send any selector the server accepts; set-based
    requirements carry commas inside their parentheses, and `!=` must match objects without the label, as on the
    server. Keys and values are not validated as qualified names (the server refuses some this accepts)."""
    if text is None or not text.strip():
        return ()
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        found = _OPERATOR.match(text, pos) or _WORD.match(text, pos)
        assert found is not None  # every character is an operator character or part of a word
        tokens.append(found.group())
        pos = found.end()

    def is_word(i: int) -> bool:
        return i < len(tokens) and _WORD.fullmatch(tokens[i]) is not None

    requirements: list[Requirement] = []
    i = 0
    while True:
        if i < len(tokens) and tokens[i] == "!":
            if not is_word(i + 1):
                raise _selector_error(text, "expected a label key after '!'")
            requirements.append(Requirement(tokens[i + 1], "!"))
            i += 2
        elif is_word(i):
            key = tokens[i]
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following is None or following == ",":
                requirements.append(Requirement(key, "exists"))
                i += 1
            elif following in ("=", "==", "!="):
                value = tokens[i + 2] if is_word(i + 2) else ""
                requirements.append(Requirement(key, "!=" if following == "!=" else "=", frozenset({value})))
                i += 3 if value else 2
            elif following in ("in", "notin"):
                if i + 2 >= len(tokens) or tokens[i + 2] != "(":
                    raise _selector_error(text, f"expected '(' after {following!r}")
                values: set[str] = set()
                i += 3
                while True:
                    if not is_word(i):
                        raise _selector_error(text, f"expected a value in the set of {key!r}")
                    values.add(tokens[i])
                    if i + 1 < len(tokens) and tokens[i + 1] == ",":
                        i += 2
                        continue
                    if i + 1 < len(tokens) and tokens[i + 1] == ")":
                        i += 2
                        break
                    raise _selector_error(text, f"expected ',' or ')' in the set of {key!r}")
                requirements.append(Requirement(key, following, frozenset(values)))
            elif following in (">", "<"):
                if not is_word(i + 2) or not re.fullmatch(r"-?\d+", tokens[i + 2]):
                    raise _selector_error(text, f"expected an integer after {following!r}")
                requirements.append(Requirement(key, following, frozenset({tokens[i + 2]})))
                i += 3
            else:
                raise _selector_error(text, f"unexpected {following!r} after {key!r}")
        else:
            raise _selector_error(text, "expected a label key")
        if i == len(tokens):
            return tuple(requirements)
        if tokens[i] != ",":
            raise _selector_error(text, f"expected ',' before {tokens[i]!r}")
        i += 1


def selector_matches(requirements: Iterable[Requirement], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


# --- JSON values and patches -----------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """JSON equality: Python's `==` has True == 1, which JSON does not."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- apply -----------------------------------------------------------------------------------------------------


def _merge_applied(live: Any, config: Any) -> Any:
    """The applied configuration merged into the live object: maps key by key, anything else (lists included)
    replaced."""
    if isinstance(live, dict) and isinstance(config, Mapping):
        out = dict(live)
        for key, value in config.items():
            out[key] = _merge_applied(live.get(key), value)
        return out
    return copy.deepcopy(config)


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return copy.deepcopy(value)


# --- errors ----------------------------------------------------------------------------------------------------


def _qualified(res: Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def not_found(res: Resource, name: str) -> KubeError:
    return KubeError(404, "NotFound", f'{_qualified(res)} "{name}" not found')


def no_such_resource() -> KubeError:
    return KubeError(404, "NotFound", "the server could not find the requested resource")


def _modified(res: Resource, name: str) -> KubeError:
    return KubeError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(res)} "{name}": the object has '
                     "been modified; please apply your changes to the latest version and try again")


def _bad_request(message: str) -> KubeError:
    return KubeError(400, "BadRequest", message)


# --- the server ------------------------------------------------------------------------------------------------


@dataclass
class _Stored:
    res: Resource
    obj: dict[str, Any]
    """The object as answered; never changed, copied out."""


@dataclass(frozen=True)
class _Change:
    version: int
    type: str
    namespace: str
    obj: dict[str, Any]
    """The object after the change; for DELETED its last state, at the deletion's resourceVersion."""
    prev: dict[str, Any] | None


class _History:
    """One resource's recent changes, as the watch cache keeps them."""

    def __init__(self, floor: int, size: int) -> None:
        self.changes: deque[_Change] = deque()
        self.floor = floor
        """The oldest resourceVersion a watch may start from."""
        self.size = size

    def record(self, change: _Change) -> None:
        self.changes.append(change)
        if len(self.changes) > self.size:
            self.changes.popleft()
            self.floor = self.changes[0].version - 1

    def since(self, version: int) -> list[_Change]:
        return [c for c in self.changes if c.version > version]


class FakeCluster:
    """The API server of FakeKubeApi clients: objects, resourceVersions, the watch history, what is served.

    `history`: changes kept per resource for watches (the watch cache's window); `start_resource_version`: the
    counter's first value (versions below it are too old to watch from, as on a server whose cache started later);
    `bookmark_interval`: seconds a watch is idle before it yields a BOOKMARK; `max_watch_seconds`: a cap on every
    watch's `timeout_seconds` (None: none)."""

    def __init__(self, *, history: int = 1000, start_resource_version: int = 1000, bookmark_interval: float = 60.0,
                 max_watch_seconds: float | None = None) -> None:
        self.version = start_resource_version
        self.history_size = history
        self.bookmark_interval = bookmark_interval
        self.max_watch_seconds = max_watch_seconds
        self._objects: dict[ObjectKey, _Stored] = {}
        self._served: dict[tuple[str, str, str], Resource] = {}
        self._status: set[tuple[str, str]] = set(STATUS_SUBRESOURCE)
        self._histories: dict[tuple[str, str], _History] = {}
        self._waiters: set[asyncio.Event] = set()
        for res in BUILT_IN:
            self.serve(res)

    # Test controls.

    @property
    def resource_version(self) -> str:
        return str(self.version)

    def serve(self, res: Resource, *, status_subresource: bool | None = None) -> None:
        """Serve `res` from now on (a CRD installed): discovery lists it and its watch history starts here."""
        self._served[(res.group, res.version, res.plural)] = res
        if status_subresource is not None:
            (self._status.add if status_subresource else self._status.discard)((res.group, res.plural))
        self._histories.setdefault((res.group, res.plural), _History(self.version, self.history_size))

    def withdraw(self, res: Resource) -> None:
        """Stop serving `res` (every verb on it is 404); its objects are kept for when it is served again."""
        self._served.pop((res.group, res.version, res.plural), None)
        if not any((g, p) == (res.group, res.plural) for g, _, p in self._served):
            self._histories.pop((res.group, res.plural), None)

    def compact(self) -> None:
        """Forget every resource's watch history (the server restarted, or etcd compacted): a watch from any version
        before now raises WatchExpired."""
        for history in self._histories.values():
            history.changes.clear()
            history.floor = self.version

    # Reads.

    def served(self, group: str, version: str, plural: str) -> bool:
        return (group, version, plural) in self._served

    def _require(self, res: Resource) -> None:
        if not self.served(res.group, res.version, res.plural):
            raise no_such_resource()

    def _key(self, res: Resource, namespace: str | None, name: str) -> ObjectKey:
        if res.namespaced and not namespace:
            raise no_such_resource()  # the path has no namespace: no such route
        return res.group, res.plural, namespace if res.namespaced and namespace else "", name

    @staticmethod
    def _answer(res: Resource, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(dict(snapshot))
        out["apiVersion"], out["kind"] = res.api_version, res.kind
        return out

    def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        self._require(res)
        stored = self._objects.get(self._key(res, namespace, name))
        if stored is None:
            raise not_found(res, name)
        return self._answer(res, stored.obj)

    def _matching(self, res: Resource, namespace: str | None, selector: Sequence[Requirement]
                  ) -> list[dict[str, Any]]:
        ns = namespace if res.namespaced and namespace else None
        return [stored.obj for (group, plural, obj_ns, _), stored in sorted(self._objects.items())
                if (group, plural) == (res.group, res.plural) and ns in (None, obj_ns)
                and selector_matches(selector, stored.obj)]

    def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
             ) -> tuple[list[dict[str, Any]], str]:
        self._require(res)
        selector = parse_selector(label_selector)
        return [self._answer(res, s) for s in self._matching(res, namespace, selector)], self.resource_version

    # Writes.

    def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        self._require(res)
        if res.namespaced and not namespace:
            raise KubeError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        obj = copy.deepcopy(dict(body))
        meta = obj.setdefault("metadata", {})
        self._check_namespace(res, namespace, meta)
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
            meta["name"] = f"{meta['generateName']}{suffix}"
        if not meta.get("name"):
            raise KubeError(422, "Invalid", f'{res.kind} "" is invalid: metadata.name: Required value: name or '
                            "generateName is required")
        if meta.get("resourceVersion"):
            raise KubeError(500, "InternalError",
                            "Internal error occurred: resourceVersion should not be set on objects to be created")
        key = self._key(res, namespace, str(meta["name"]))
        if key in self._objects:
            raise KubeError(409, "AlreadyExists", f'{_qualified(res)} "{meta["name"]}" already exists')
        for field in SERVER_METADATA:
            meta.pop(field, None)
        if res.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if (res.group, res.plural) in self._status:
            obj.pop("status", None)
        return self._commit(res, key, None, obj)

    def update(self, res: Resource, namespace: str | None, name: str,
               change: Callable[[dict[str, Any]], Any], *, subresource: str = "") -> dict[str, Any]:
        """An Update: `change` maps the object as it is (a copy) to the object wanted."""
        self._require(res)
        if subresource and (res.group, res.plural) not in self._status:
            raise no_such_resource()
        key = self._key(res, namespace, name)
        before = self._objects.get(key)
        if before is None:
            raise not_found(res, name)
        wanted = change(copy.deepcopy(before.obj))
        meta = wanted.setdefault("metadata", {})
        self._check_preconditions(res, name, before, meta)
        self._check_namespace(res, namespace, meta)
        if meta.get("name") != name:
            raise _bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                               f"({name})")
        if subresource:
            obj = copy.deepcopy(before.obj)
            if "status" in wanted:
                obj["status"] = wanted["status"]
            else:
                obj.pop("status", None)
        else:
            obj = wanted
            if (res.group, res.plural) in self._status:
                obj.pop("status", None)
                if "status" in before.obj:
                    obj["status"] = copy.deepcopy(before.obj["status"])
        return self._commit(res, key, before, obj)

    def apply(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """An apply: the body merged into the object, which is created when absent (no field ownership)."""
        self._require(res)
        config = _without_nulls(body)
        meta = config.get("metadata")
        if not config.get("apiVersion") or not config.get("kind") or not isinstance(meta, dict):
            raise _bad_request("an apply body needs apiVersion, kind and metadata")
        if meta.get("name") != name:
            raise _bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                               f"({name})")
        self._check_namespace(res, namespace, meta)
        if "managedFields" in meta:
            raise _bad_request("metadata.managedFields must be nil")
        key = self._key(res, namespace, name)
        before = self._objects.get(key)
        if before is not None:
            self._check_preconditions(res, name, before, meta)
        if (res.group, res.plural) in self._status:
            config.pop("status", None)
        for field in SERVER_METADATA:
            meta.pop(field, None)
        live = before.obj if before is not None else {
            "metadata": {"name": name, **({"namespace": namespace} if res.namespaced else {})}}
        return self._commit(res, key, before, _merge_applied(copy.deepcopy(live), config))

    def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> None:
        self._require(res)
        key = self._key(res, namespace, name)
        before = self._objects.get(key)
        if before is None:
            raise not_found(res, name)
        actual = before.obj["metadata"]["uid"]
        if uid and uid != actual:
            raise KubeError(409, "Conflict", f'Operation cannot be fulfilled on {res.kind} "{name}": the UID in the '
                            f"precondition ({uid}) does not match the UID in record ({actual}). The object might "
                            "have been deleted and then recreated")  # the real server's text (contract test)
        self._delete(key)

    def _check_preconditions(self, res: Resource, name: str, before: _Stored, meta: Mapping[str, Any]) -> None:
        have = before.obj["metadata"]
        if meta.get("resourceVersion") and str(meta["resourceVersion"]) != have["resourceVersion"]:
            raise _modified(res, name)
        if meta.get("uid") and meta["uid"] != have["uid"]:
            raise KubeError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(res)} "{name}": '
                            f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                            f"{have['uid']}")

    @staticmethod
    def _check_namespace(res: Resource, namespace: str | None, meta: Mapping[str, Any]) -> None:
        if res.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise _bad_request("the namespace of the provided object does not match the namespace sent on the request")

    def _commit(self, res: Resource, key: ObjectKey, before: _Stored | None, obj: dict[str, Any], *,
                server: bool = False) -> dict[str, Any]:
        """Store `obj` unless nothing changed: its server metadata from `before` (or new) unless `server` (a write by
        the fake itself), a new resourceVersion, the change recorded for watches; an object that is being deleted
        and has no finalizers left goes."""
        meta = obj.setdefault("metadata", {})
        meta["name"] = key[3]
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        if before is None:
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
        else:
            old_meta = before.obj["metadata"]
            if not server:
                for field in SERVER_METADATA:
                    if field in old_meta:
                        meta[field] = old_meta[field]
                    else:
                        meta.pop(field, None)
            if same(obj, before.obj):
                return self._answer(res, before.obj)
            outside = ("metadata", "status", "apiVersion", "kind")
            if not same({k: v for k, v in obj.items() if k not in outside},
                        {k: v for k, v in before.obj.items() if k not in outside}):
                meta["generation"] = int(old_meta.get("generation") or 0) + 1
        self.version += 1
        meta["resourceVersion"] = self.resource_version
        snapshot = copy.deepcopy(obj)
        self._objects[key] = _Stored(res, snapshot)
        self._record(res, _Change(self.version, "ADDED" if before is None else "MODIFIED", key[2], snapshot,
                                  before.obj if before is not None else None))
        answer = self._answer(res, snapshot)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._delete(key)
        return answer

    def _delete(self, key: ObjectKey) -> None:
        """Delete, or start deleting: an object with finalizers only gets its deletionTimestamp."""
        stored = self._objects[key]
        meta = stored.obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                obj = copy.deepcopy(stored.obj)
                obj["metadata"].update(deletionTimestamp=now_rfc3339(), deletionGracePeriodSeconds=0)
                self._commit(stored.res, key, stored, obj, server=True)
            return
        del self._objects[key]
        self.version += 1
        last = copy.deepcopy(stored.obj)
        last["metadata"]["resourceVersion"] = self.resource_version
        self._record(stored.res, _Change(self.version, "DELETED", key[2], last, stored.obj))
        self._collect_garbage(str(meta["uid"]))

    def _collect_garbage(self, uid: str) -> None:
        """The dependents of a deleted owner: deleted when no other owner of theirs exists, else unlinked."""
        for key, stored in list(self._objects.items()):
            refs = stored.obj["metadata"].get("ownerReferences") or []
            if key not in self._objects or not any(ref.get("uid") == uid for ref in refs):
                continue
            live = {s.obj["metadata"]["uid"] for s in self._objects.values()}
            if any(ref.get("uid") in live for ref in refs):
                obj = copy.deepcopy(stored.obj)
                obj["metadata"]["ownerReferences"] = [ref for ref in refs if ref.get("uid") != uid]
                self._commit(stored.res, key, stored, obj)
            else:
                self._delete(key)

    def _record(self, res: Resource, change: _Change) -> None:
        history = self._histories.get((res.group, res.plural))
        if history is not None:
            history.record(change)
        for waiter in self._waiters:
            waiter.set()

    # Watch.

    async def watch(self, res: Resource, namespace: str | None, *, resource_version: str,
                    label_selector: str | None = None, timeout_seconds: float = 300
                    ) -> AsyncGenerator[WatchEvent, None]:
        """The changes after `resource_version` (see the module docstring)."""
        self._require(res)
        selector = parse_selector(label_selector)
        history = self._histories[(res.group, res.plural)]
        ns = namespace if res.namespaced and namespace else None
        loop = asyncio.get_running_loop()
        limit = timeout_seconds if self.max_watch_seconds is None else min(timeout_seconds, self.max_watch_seconds)
        deadline = loop.time() + limit
        if resource_version in ("", "0"):
            position = self.version
            for snapshot in self._matching(res, ns, selector):
                yield WatchEvent("ADDED", self._answer(res, snapshot))
        else:
            try:
                position = int(resource_version)
            except ValueError:
                raise _bad_request(f"invalid resource version {resource_version!r}") from None
            if position > self.version:
                raise KubeError(504, "Timeout", f"Too large resource version: {position}, current: {self.version}")
        wake = asyncio.Event()
        self._waiters.add(wake)
        try:
            quiet_since = loop.time()
            while True:
                wake.clear()
                if position < history.floor:
                    raise WatchExpired(f"too old resource version: {position} ({history.floor})")
                pending = history.since(position)
                for change in pending:
                    position = change.version
                    event = self._event(res, change, ns, selector)
                    if event is not None:
                        yield event
                        quiet_since = loop.time()
                now = loop.time()
                if now >= deadline:
                    return
                if pending or wake.is_set():
                    continue
                if now >= quiet_since + self.bookmark_interval:
                    # Every change of this resource up to now has been looked at: resuming from here misses nothing.
                    position = self.version
                    yield WatchEvent("BOOKMARK", {"apiVersion": res.api_version, "kind": res.kind,
                                                  "metadata": {"resourceVersion": self.resource_version}})
                    quiet_since = loop.time()
                    continue
                # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancellation that arrives as the event is
                # set (a write woke the watch), and the watcher's task then never ends.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(deadline, quiet_since + self.bookmark_interval) - now):
                        await wake.wait()
        finally:
            self._waiters.discard(wake)

    def _event(self, res: Resource, change: _Change, ns: str | None, selector: Sequence[Requirement]
               ) -> WatchEvent | None:
        """What a watcher of `ns` and `selector` sees of a change: the watch cache's filtering."""
        if ns is not None and change.namespace != ns:
            return None
        now_in = selector_matches(selector, change.obj)
        if change.type == "DELETED":
            return WatchEvent("DELETED", self._answer(res, change.obj)) if now_in else None
        was_in = change.prev is not None and selector_matches(selector, change.prev)
        if now_in:
            return WatchEvent("MODIFIED" if was_in else "ADDED", self._answer(res, change.obj))
        if was_in and change.prev is not None:
            gone = self._answer(res, change.prev)
            gone["metadata"]["resourceVersion"] = str(change.version)
            return WatchEvent("DELETED", gone)
        return None


# --- the client ------------------------------------------------------------------------------------------------


@dataclass
class _Fault:
    verb: str
    error: KubeError
    left: int
    res: Resource | None


class FakeKubeApi:
    """A KubeApi client of a FakeCluster (a new one when none is given); `component` is its events' source."""

    def __init__(self, cluster: FakeCluster | None = None, *, component: str = constants.APP_NAME) -> None:
        self.cluster = cluster if cluster is not None else FakeCluster()
        self.component = component
        self.calls: Counter[str] = Counter()
        self.grace_periods: dict[tuple[str | None, str], int] = {}
        """(namespace, name) -> the gracePeriodSeconds a delete asked for."""
        """Every call by verb, failed ones included."""
        self._faults: list[_Fault] = []

    @property
    def writes(self) -> int:
        return sum(n for verb, n in self.calls.items() if verb in WRITE_VERBS)

    def fail(self, verb: str, error: KubeError, *, times: int = 1, res: Resource | None = None) -> None:
        """The next `times` calls of `verb` (on `res` only, when given) raise `error` and change nothing."""
        if verb not in VERBS:
            raise ValueError(f"{verb!r} is not a KubeApi verb: {sorted(VERBS)}")
        self._faults.append(_Fault(verb, error, times, res))

    async def _call(self, verb: str, res: Resource | None) -> None:
        self.calls[verb] += 1
        await asyncio.sleep(0)  # a request yields to the event loop, as a real one does
        for fault in self._faults:
            if fault.verb == verb and fault.left > 0 and fault.res in (None, res):
                fault.left -= 1
                raise fault.error.with_traceback(None)

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        await self._call("get", res)
        try:
            return self.cluster.get(res, namespace, name)
        except KubeError as err:
            if err.not_found:
                return None
            raise

    async def list_versioned(self, res: Resource, namespace: str | None, label_selector: str | None = None
                             ) -> tuple[list[dict[str, Any]], str]:
        await self._call("list_versioned", res)
        return self.cluster.list(res, namespace, label_selector)

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        await self._call("list", res)
        return self.cluster.list(res, namespace, label_selector)[0]

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        await self._call("create", res)
        return self.cluster.create(res, namespace, body)

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                    ) -> dict[str, Any]:
        await self._call("patch", res)
        return self.cluster.update(res, namespace, name, lambda obj: merge_patch(obj, patch))

    async def patch_status(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                           ) -> dict[str, Any]:
        await self._call("patch_status", res)
        return self.cluster.update(res, namespace, name, lambda obj: merge_patch(obj, patch),
                                   subresource="status")

    async def apply(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any], *,
                    force: bool = False) -> dict[str, Any]:
        await self._call("apply", res)
        return self.cluster.apply(res, namespace, name, body)  # `force`: no ownership, nothing to take

    async def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None,
                     grace_period_s: int | None = None) -> None:
        """Deleted at once (no kubelet here to wait for); the grace period asked for is kept in `grace_periods`."""
        await self._call("delete", res)
        if grace_period_s is not None:
            self.grace_periods[(namespace, name)] = grace_period_s
        try:
            self.cluster.delete(res, namespace, name, uid=uid)
        except KubeError as err:
            if not err.not_found:
                raise

    async def emit_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """The Event ClientKubeApi.emit_event posts, created in the involved object's namespace."""
        await self._call("emit_event", EVENTS)
        event = event_body(involved, type_, reason, message, self.component)
        self.cluster.create(EVENTS, event["metadata"]["namespace"], event)

    async def has_resource(self, group: str, version: str, plural: str) -> bool:
        await self._call("has_resource", None)
        return self.cluster.served(group, version, plural)

    async def watch(self, res: Resource, namespace: str | None, *, resource_version: str,
                    label_selector: str | None = None, timeout_seconds: int = 300) -> AsyncIterator[WatchEvent]:
        await self._call("watch", res)
        stream = self.cluster.watch(res, namespace, resource_version=resource_version,
                                    label_selector=label_selector, timeout_seconds=timeout_seconds)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()


__all__ = ["ADDON_GROUPS", "BUILT_IN", "STATUS_SUBRESOURCE", "WRITE_VERBS", "FakeCluster", "FakeKubeApi",
           "Requirement", "merge_patch", "parse_selector", "same"]
