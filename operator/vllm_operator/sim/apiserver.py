"""The simulated cluster's API server: kmock's KubernetesEmulator made to behave like kube-apiserver.

No real API server can be installed on our machines, so every integration test, e2e test and `make demo` talks to
this one. It is only worth having if clients cannot tell the difference for the operations we use, so it keeps
the contracts that clients and controllers depend on: server-set metadata (uid, resourceVersion, generation,
creationTimestamp), optimistic concurrency (409 on a stale resourceVersion), the status subresource isolated both
ways, selectors, list-then-watch without gaps, ownerReference garbage collection with finalizers, CRDs that
register their resources and validate, prune and default their objects, and the error bodies of the real server.

kmock provides the HTTP server, request parsing, discovery scaffolding, the object store (`.objects`) and a DSL to
override any response (`server['patch', ...] << 500`); this subclass replaces the naive store semantics. Talk to
it over HTTP like a real controller would; `README.md` next to this file says how.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import datetime
import gzip
import importlib.resources
import json
import logging
import random
import re
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import apps, parsing, rendering

from vllm_operator.sim import applying, builtin, builtin_admission, errors, patching, selectors
from vllm_operator.sim.crds import CRD_RESOURCE, CustomResourceDefinition, parse_crd
from vllm_operator.sim.errors import ApiError, FieldCause
from vllm_operator.sim.faults import Fault, FaultHook
from vllm_operator.sim.kubeconfig import write_kubeconfig
from vllm_operator.sim.requestlog import RequestLog, RequestRecord, request_verb
from vllm_operator.sim.watching import EventHistory, WatchEvent

logger = logging.getLogger(__name__)

ObjKey = tuple[kmock.resource, str | None, str]
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's SimpleNameGenerator alphabet
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SERVER_META = ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
                "deletionGracePeriodSeconds", "selfLink", "managedFields")
SIM_PREFIX = "/_sim"
_JSON_TYPES = frozenset({"", "application/json", "application/yaml", "*/*"})


_RESOURCES: dict[tuple[str | None, str | None, str | None], kmock.resource] = {}


def make_resource(group: str | None, version: str | None, plural: str | None) -> kmock.resource:
    """A cached kmock.resource (constructing one runs slow Protocol isinstance checks)."""
    key = (group, version, plural)
    found = _RESOURCES.get(key)
    if found is None:
        found = _RESOURCES[key] = kmock.resource(group=group, version=version, plural=plural)
    return found


def now_rfc3339(offset_s: float = 0.0) -> str:
    moment = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _dig(obj: dict[str, Any], dotted: str) -> Any:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _set_dotted(obj: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


@attrs.define(kw_only=True, eq=False)
class ApiServer(kmock.KubernetesEmulator):
    """A Kubernetes API server in memory. Enter it together with a `kmock.Server` (see `serve()`).

    Options:
      faults: a hook `(RequestRecord) -> Fault | None` consulted for every request (see `faults.py`).
      gc_delay: seconds the garbage collector waits before acting, as the real one lags a little.
      graceful_pod_deletion: deleting a Pod bound to a node only marks it (deletionTimestamp + grace period)
        until a kubelet deletes it with gracePeriodSeconds=0, as on a real cluster; off unless a kubelet runs.
      enforce_namespaces: refuse writes into namespaces that do not exist or are terminating.
      history_size: watch-cache events kept per resource; older resourceVersions get 410 Gone.
      bookmark_interval: seconds between BOOKMARK events on watches that allow them.
    """

    faults: FaultHook | None = None
    gc_delay: float = 0.0
    graceful_pod_deletion: bool = False
    enforce_namespaces: bool = True
    history_size: int = 10_000
    bookmark_interval: float = 30.0
    object_history_limit: int = 8

    request_log: RequestLog = attrs.field(factory=RequestLog)
    _rv: int = attrs.field(default=1, init=False)
    _uids: dict[str, ObjKey] = attrs.field(factory=dict, init=False)
    _crds: dict[tuple[str, str], CustomResourceDefinition] = attrs.field(factory=dict, init=False)
    _histories: dict[tuple[str, str], EventHistory] = attrs.field(factory=dict, init=False)
    _replies: dict[int, rendering.Response] = attrs.field(factory=dict, init=False)
    _gc_wakeup: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)
    _gc_idle: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _internal_errors: list[BaseException] = attrs.field(factory=list, init=False)
    _builtin_payloads: int = attrs.field(default=0, init=False)
    # The live objects per storage resource, as served: LISTs read this instead of walking kmock's versioned
    # storage (Object.raw copies and walks the history on every access; at 500 VLLMDeployments that made LISTs the
    # emulator's main cost). Kept in step by _store_new, _commit and _remove, the only writers of objects.
    _live: dict[kmock.resource, dict[ObjKey, dict[str, Any]]] = attrs.field(factory=dict, init=False)
    _cluster_ips: set[str] = attrs.field(factory=set, init=False)
    _apply_owners: dict[str, applying.Owners] = attrs.field(factory=dict, init=False)
    _next_ip: int = attrs.field(default=10, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        bundled = importlib.resources.files("kmock._internal").joinpath("resources.json.gz").read_bytes()
        self.resources.load_data(gzip.decompress(bundled))
        for res in self._all_resources():
            if res.group in builtin.NON_BUILTIN_GROUPS:
                del self.resources[res]
        (self.fallback ** 1)[self._has_reply] << self._take_reply
        self.fallback["get /version/"] << self._serve_server_version
        self.fallback[re.compile(r"/_sim/requests/?")] << self._serve_request_log
        self._builtin_payloads = len(self._payloads)
        self._gc_idle.set()
        for name in builtin.INITIAL_NAMESPACES:
            self._store_new(make_resource("", "v1", "namespaces"), None, {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": str(self._next_rv()),
                             "creationTimestamp": now_rfc3339(),
                             "labels": {"kubernetes.io/metadata.name": name}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            })

    # ----------------------------------------------------------------------------------------------- lifecycle
    async def __aenter__(self) -> ApiServer:
        await super().__aenter__()
        if self._gc_task is None:
            self._gc_task = asyncio.create_task(self._gc_loop(), name="sim-apiserver-gc")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._entered == 1 and self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
            self._gc_task = None
        await super().__aexit__(exc_type, exc, tb)

    @property
    def internal_errors(self) -> list[BaseException]:
        """Exceptions the emulator itself raised while serving (bugs, not API refusals); tests assert empty."""
        return list(self._internal_errors)

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (the cluster-wide counter, like etcd's revision)."""
        return self._rv

    async def settled(self, timeout: float = 5.0) -> None:
        """Wait until the garbage collector has nothing left to do (for tests that assert on cascades)."""
        async def wait() -> None:
            while True:
                await asyncio.sleep(0)
                if not self._gc_wakeup.is_set() and self._gc_idle.is_set():
                    return
                await asyncio.sleep(0.01)
        await asyncio.wait_for(wait(), timeout)

    # ---------------------------------------------------------------------------------------- request entry
    def _has_reply(self, request: rendering.Request) -> bool:
        return id(request) in self._replies

    def _take_reply(self, request: rendering.Request) -> rendering.Response:
        return self._replies.pop(id(request))

    def _record(self, request: rendering.Request) -> RequestRecord:
        res = request.resource
        raw_ct = request.headers.get("Content-Type", "")
        record = RequestRecord(
            seq=self.request_log.next_seq,
            method=str(request.method.value),
            path=request.url.path,
            verb=request_verb(str(request.method.value), request.name is not None, dict(request.params))
            if res is not None and res.plural else str(request.method.value).lower(),
            group=(res.group or "") if res is not None else "",
            version=(res.version or "") if res is not None else "",
            resource=(res.plural or "") if res is not None else "",
            subresource=request.subresource or "",
            namespace=request.namespace or "",
            name=request.name or "",
            user_agent=request.headers.get("User-Agent", ""),
            content_type=raw_ct.split(";")[0].strip(),
            field_manager=request.params.get("fieldManager", ""),
            query=request.url.query_string,
        )
        if record.resource == "namespaces" and record.group == "" and record.name:
            record.namespace = record.name  # RBAC treats namespace objects as living in themselves
        self.request_log.append(record)
        return record

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """The aiohttp entry point; replaces kmock's to parse URLs as kube-apiserver does.

        kmock's parser reads `/api/v1/namespaces` and `/api/v1/namespaces/x/status` as namespaced URLs and fails
        or misroutes them; the real RequestInfo rules treat `namespaces/<name>/{status,finalize}` as the Namespace
        resource itself.
        """
        body = await raw_request.read()
        request = self._parse_request(raw_request, body)
        self._requests.append(request)
        try:
            return await self._handle(request)
        except rendering.StreamingError as exc:  # an exception inside a watch stream after the headers went out
            raw_response = exc.args[0]
            cause = exc.__cause__ or exc
            logger.error("Emulator failed inside a stream for %s: %r", raw_request.path, cause)
            self._internal_errors.append(cause)
            with contextlib.suppress(ConnectionError, RuntimeError):
                error = ApiError(500, "InternalError", f"emulator bug: {cause!r}")
                await raw_response.write(json.dumps({"type": "ERROR", "object": error.body()}).encode() + b"\n")
                await raw_response.write_eof()
            return cast(aiohttp.web.StreamResponse, raw_response)
        except kmock.KubernetesError as exc:  # kmock's own refusals (unknown endpoints, undeclared groups)
            return self._error_response(ApiError(exc.status, "NotFound" if exc.status == 404 else "InternalError",
                                                 "the server could not find the requested resource"
                                                 if exc.status == 404 else str(exc.message), {}))
        except Exception as exc:
            logger.exception("Emulator failed on %s %s", raw_request.method, raw_request.path)
            self._internal_errors.append(exc)
            return self._error_response(ApiError(500, "InternalError", f"emulator bug: {exc!r}"))

    def _parse_request(self, raw_request: aiohttp.web.BaseRequest, body: bytes) -> rendering.Request:
        text = body.decode("utf-8", errors="replace")
        data: Any = None
        if body:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        parsed = parse_api_path(raw_request.path)
        method = kmock.method(raw_request.method)
        query = dict(raw_request.query)
        resource = None if parsed.group is None else make_resource(parsed.group, parsed.version, parsed.plural)
        return rendering.Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
            params=query, headers=dict(raw_request.headers), cookies=dict(raw_request.cookies),
            data=data, body=body, text=text,
            action=parsing.guess_k8s(parsed, method, query), resource=resource, namespace=parsed.namespace,
            name=parsed.name, subresource=parsed.subresource,
        )

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        record = self._record(request)
        fault: Fault | None = self.faults(record) if self.faults is not None else None
        if fault is not None:
            record.fault = fault.describe()
            if not fault.after_commit:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                    transport = request._raw_request.transport if request._raw_request is not None else None
                    if transport is None or transport.is_closing():
                        # The client gave up while the server "hung": like a cancelled request context on a
                        # real server, the request is dropped unserved (use after_commit for "applied, reply lost").
                        record.status = 504
                        return self._fault_response(Fault(status=504), record)
                if fault.status:
                    record.status = fault.status
                    return self._fault_response(fault, record, request)
        try:
            response = await self._dispatch(request)
        except ApiError as exc:
            response = self._error_response(exc)
        if fault is not None and fault.after_commit:
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status:
                record.status = fault.status
                return self._fault_response(fault, record, request)
        record.status = response.status
        # kmock keeps every request for its DSL assertions; bound that so long demos do not grow forever.
        if len(self._requests) > 20_000:
            del self._requests[:5_000]
        return response

    def _fault_response(self, fault: Fault, record: RequestRecord,
                        request: rendering.Request | None = None) -> aiohttp.web.StreamResponse:
        name = record.name
        if not name and request is not None and isinstance(request.data, dict):
            name = str((request.data.get("metadata") or {}).get("name") or "")
        if fault.status == 409 and not fault.message:
            err = errors.conflict(record.resource, record.group, name)
        else:
            details = {k: v for k, v in (("name", record.name), ("group", record.group),
                                         ("kind", record.resource)) if v}
            err = ApiError(fault.status or 500, fault.reason, fault.text, details)
        if fault.retry_after is not None:
            err.headers["Retry-After"] = str(fault.retry_after)
        return self._error_response(err)

    def _error_response(self, exc: ApiError) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(exc.body(), status=exc.code, headers=exc.headers or None)

    @property
    def _user_reactions(self) -> bool:
        """Whether a test added kmock DSL reactions (`server[...] << ...`) beyond the built-in fallbacks."""
        return len(self._payloads) > self._builtin_payloads

    async def _dispatch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is not None and res.plural and res.version:
            reply = await self._serve_resource(request)
        else:
            reply = await self._serve_plain(request)
        if not self._user_reactions:
            # kmock's DSL matching scans every past request per reaction (quadratic over a run), so it is only
            # consulted when a test actually scripted a reaction.
            return await reply(request)
        self._replies[id(request)] = reply
        try:
            return await apps.RawHandler._handle(self, request)
        finally:
            self._replies.pop(id(request), None)

    async def _serve_plain(self, request: rendering.Request) -> rendering.Response:
        """Discovery, /version and the simulator's own endpoints."""
        path = request.url.path.rstrip("/") or "/"
        if str(request.method.value).upper() != "GET":
            raise errors.method_not_allowed()
        handler: Callable[[rendering.Request], Awaitable[rendering.Payload]] | None = {
            "/version": self._serve_server_version, "/api": self._serve_api, "/apis": self._serve_apis,
            "/": self._serve_root, f"{SIM_PREFIX}/requests": self._serve_request_log,
        }.get(path)
        res = request.resource
        if handler is None and res is not None and res.group is not None and not res.plural:
            handler = self._serve_version if res.version else self._serve_group
        if handler is None:
            raise errors.no_route()
        try:
            payload = await handler(request)
        except kmock.KubernetesError as exc:
            raise errors.no_route() from exc
        return rendering.Response(status=200, payload=payload)

    async def _serve_resource(self, request: rendering.Request) -> rendering.Response:
        res = request.resource
        assert res is not None and res.plural is not None
        lookup = make_resource(res.group, res.version, res.plural)
        if lookup not in self.resources:
            raise errors.no_route()
        method = str(request.method.value).upper()
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        if request.body and method in ("POST", "PUT") and content_type not in _JSON_TYPES:
            # protobuf and CBOR are not served; clients (client-go/kubectl) fall back to JSON on 415
            raise errors.unsupported_media_type(content_type, ["application/json", "application/yaml"])
        sub = request.subresource or ""
        params = dict(request.params)
        try:
            if method == "GET" and params.get("watch") in ("true", "1"):
                return await self._watch(lookup, request)
            if method == "GET" and request.name is None:
                return self._list(lookup, request)
            if method == "GET":
                return self._get(lookup, request)
            async with self._lock:
                if method == "POST" and request.name is None:
                    return await self._create(lookup, request)
                if method == "PUT" and request.name is not None:
                    return await self._replace(lookup, request)
                if method == "PATCH" and request.name is not None:
                    return await self._patch(lookup, request)
                if method == "DELETE" and request.name is not None and not sub:
                    return await self._delete(lookup, request)
                if method == "DELETE" and request.name is None:
                    return await self._delete_collection(lookup, request)
        except ApiError:
            raise
        except Exception as exc:  # a bug in the emulator: answer 500 and keep it for the test to see
            logger.exception("Emulator failed on %s %s", method, request.url.path)
            self._internal_errors.append(exc)
            raise ApiError(500, "InternalError", f"emulator bug: {exc!r}") from exc
        raise errors.method_not_allowed()

    # --------------------------------------------------------------------------------------------- helpers
    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _all_resources(self) -> list[kmock.resource]:
        return [r for r in self.resources if isinstance(r, kmock.resource)]

    def _info(self, res: kmock.resource) -> kmock.ResourceInfo:
        return self.resources[res]

    def _crd_for(self, res: kmock.resource) -> CustomResourceDefinition | None:
        return self._crds.get((res.group or "", res.plural or ""))

    def _storage_resource(self, res: kmock.resource) -> kmock.resource:
        crd = self._crd_for(res)
        if crd is not None:
            return make_resource(res.group, crd.storage_version, res.plural)
        return make_resource(res.group, res.version, res.plural)

    def _history(self, res: kmock.resource) -> EventHistory:
        key = (res.group or "", res.plural or "")
        if key not in self._histories:
            self._histories[key] = EventHistory(self.history_size)
        return self._histories[key]

    def _key(self, res: kmock.resource, namespace: str | None, name: str) -> ObjKey:
        return (self._storage_resource(res), namespace if self._info(res).namespaced else None, name)

    def _current(self, key: ObjKey) -> dict[str, Any] | None:
        if key not in self._objects:
            return None
        stored = self._objects[key]
        if stored.deleted:
            return None
        return stored.raw

    def _require(self, res: kmock.resource, namespace: str | None, name: str) -> tuple[ObjKey, dict[str, Any]]:
        key = self._key(res, namespace, name)
        current = self._current(key)
        if current is None:
            raise errors.not_found(res.plural or "", res.group or "", name)
        return key, current

    def _present(self, res: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as served for the requested version (conversion strategy None: apiVersion only).

        A shallow copy: it is serialized at once, and stored versions are never mutated in place (every write
        builds a new deep copy), so sharing nested values is safe and keeps large LISTs cheap.
        """
        out: dict[str, Any] = {"apiVersion": f"{res.group}/{res.version}" if res.group else str(res.version),
                               "kind": obj.get("kind") or self._kind(res)}
        if "metadata" in obj:
            out["metadata"] = obj["metadata"]
        for key, value in obj.items():
            if key not in out:
                out[key] = value
        return out

    def _has_status_subresource(self, res: kmock.resource) -> bool:
        return "status" in self._info(res).subresources

    def _has_generation(self, res: kmock.resource) -> bool:
        return self._crd_for(res) is not None or (res.group or "", res.plural or "") in builtin.HAS_GENERATION

    def _store_new(self, res: kmock.resource, namespace: str | None, obj: dict[str, Any]) -> None:
        key = (res, namespace, obj["metadata"]["name"])
        if key in self._objects:
            self._objects[key].create(obj)
            self._trim(key)
        else:
            self._objects[key] = obj
        self._live.setdefault(res, {})[key] = self._objects[key].raw
        self._uids[obj["metadata"]["uid"]] = key

    def _trim(self, key: ObjKey) -> None:
        history = self._objects[key].history
        if len(history) > self.object_history_limit:
            del history[: len(history) - self.object_history_limit]

    async def _emit(self, res: kmock.resource, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        history = self._history(res)
        history.append(WatchEvent(int(obj["metadata"]["resourceVersion"]), kind, obj, old))
        await history.notify()

    def _body(self, request: rendering.Request) -> Any:
        if request.data is not None and not (isinstance(request.data, dict) and not request.data and request.body):
            return copy.deepcopy(request.data)
        if not request.body:
            return None
        try:
            return json.loads(request.body)
        except ValueError:
            try:
                return yaml.safe_load(request.body)
            except yaml.YAMLError as exc:
                raise errors.bad_request(f"the request body could not be decoded: {exc}") from exc

    def _check_namespace_writable(self, res: kmock.resource, namespace: str | None, name: str) -> None:
        if not self.enforce_namespaces or namespace is None or not self._info(res).namespaced:
            return
        ns = self._current((make_resource("", "v1", "namespaces"), None, namespace))
        if ns is None:
            raise errors.not_found("namespaces", "", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(res.plural or "", res.group or "", name,
                                   f"unable to create new content in namespace {namespace} "
                                   "because it is being terminated")

    def _kind(self, res: kmock.resource) -> str:
        info = self._info(res)
        return info.kind or (res.plural or "").capitalize()

    # ------------------------------------------------------------------------------------------------ reads
    def _get(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        assert request.name is not None
        _, current = self._require(res, request.namespace, request.name)
        sub = request.subresource or ""
        if sub == "scale":
            return rendering.Response(status=200, payload=self._scale_of(res, current))
        if sub and sub != "status":
            raise errors.no_route()
        if sub == "status" and not self._has_status_subresource(res):
            raise errors.no_route()
        return rendering.Response(status=200, payload=self._present(res, current))

    def _field_allowed(self, res: kmock.resource) -> Callable[[str], bool]:
        extras = builtin.EXTRA_FIELD_SELECTORS.get((res.group or "", res.plural or ""), frozenset())
        crd = self._crd_for(res)
        if crd is not None:
            extras = extras | crd.selectable_fields(res.version or "")
        return lambda path: path in ("metadata.name", "metadata.namespace") or path in extras

    def _selection(self, res: kmock.resource, request: rendering.Request) -> Callable[[dict[str, Any]], bool]:
        params = request.params
        try:
            labels = selectors.parse_label_selector(params.get("labelSelector"))
            fields = selectors.parse_field_selector(params.get("fieldSelector"), self._field_allowed(res))
        except selectors.SelectorError as exc:
            raise errors.bad_request(str(exc)) from exc
        namespace = request.namespace
        name = request.name

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            if name is not None and meta.get("name") != name:
                return False
            return selectors.labels_match(labels, obj) and selectors.fields_match(fields, obj)
        return matches

    def _objects_of(self, res: kmock.resource, matches: Callable[[dict[str, Any]], bool] | None = None
                    ) -> list[dict[str, Any]]:
        """The live objects of `res` that `matches` selects, in (namespace, name) order (filtered first, so a
        selective LIST sorts only what it returns)."""
        live = self._live.get(self._storage_resource(res), {}).values()
        items = [o for o in live if matches(o)] if matches is not None else list(live)
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return items

    def _list(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        if request.subresource:
            raise errors.no_route()
        items = self._objects_of(res, self._selection(res, request))
        rv = str(self._rv)
        start = 0
        cont = request.params.get("continue")
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont.encode()))
                after = (token["ns"], token["name"])
            except (ValueError, KeyError) as exc:
                raise errors.bad_request(f"continue key is not valid: {exc}") from exc
            start = next((i for i, o in enumerate(items)
                          if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > after), len(items))
        limit_text = request.params.get("limit")
        limit = int(limit_text) if limit_text and limit_text.isdigit() and int(limit_text) > 0 else None
        page = items[start:start + limit] if limit else items[start:]
        metadata: dict[str, Any] = {"resourceVersion": rv}
        if limit and start + limit < len(items):
            last = page[-1]["metadata"]
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"ns": last.get("namespace") or "", "name": last["name"], "rv": rv}).encode()).decode()
            metadata["remainingItemCount"] = len(items) - start - limit
        return rendering.Response(status=200, payload={
            "kind": f"{self._kind(res)}List",
            "apiVersion": f"{res.group}/{res.version}" if res.group else str(res.version),
            "metadata": metadata,
            "items": [self._present(res, obj) for obj in page],
        })

    async def _watch(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        matches = self._selection(res, request)
        history = self._history(res)
        params = request.params
        since_text = params.get("resourceVersion") or "0"
        try:
            since = int(since_text)
        except ValueError as exc:
            raise errors.bad_request(f"invalid resourceVersion {since_text!r}") from exc
        initial: list[dict[str, Any]] = []
        if since == 0:
            initial = [{"type": "ADDED", "object": self._present(res, o)} for o in self._objects_of(res, matches)]
            since = self._rv
        timeout_text = params.get("timeoutSeconds")
        timeout = float(timeout_text) if timeout_text else None
        bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
        raw_request = request._raw_request
        expired = since < history.expired_upto

        async def stream() -> AsyncIterator[Any]:
            yield b""
            if expired:
                yield {"type": "ERROR", "object": errors.gone(
                    f"too old resource version: {since} ({history.expired_upto + 1})").body()}
                return
            for initial_event in initial:
                yield initial_event
            cursor = since
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            next_bookmark = loop.time() + self.bookmark_interval
            while True:
                for event in history.after(cursor):
                    cursor = event.rv
                    rendered = self._watch_event(res, event, matches)
                    if rendered is not None:
                        yield rendered
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return
                if raw_request is not None and (raw_request.transport is None or raw_request.transport.is_closing()):
                    return
                if bookmarks and now >= next_bookmark:
                    next_bookmark = now + self.bookmark_interval
                    yield {"type": "BOOKMARK", "object": {
                        "kind": self._kind(res),
                        "apiVersion": f"{res.group}/{res.version}" if res.group else str(res.version),
                        "metadata": {"resourceVersion": str(max(cursor, self._rv))}}}
                wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - now))
                if bookmarks:
                    wait = max(0.0, min(wait, next_bookmark - now))
                async with history.changed:
                    if not history.after(cursor):
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(history.changed.wait(), wait)

        return rendering.Response(status=200, headers={"Content-Type": "application/json"}, payload=stream())

    def _watch_event(self, res: kmock.resource, event: WatchEvent,
                     matches: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        now_match = matches(event.obj)
        was_match = event.old is not None and matches(event.old)
        kind = event.type
        if kind == "MODIFIED":
            if now_match and not was_match:
                kind = "ADDED"
            elif was_match and not now_match:
                kind = "DELETED"
            elif not now_match:
                return None
        elif not now_match:
            return None
        return {"type": kind, "object": self._present(res, event.obj)}

    # ----------------------------------------------------------------------------------------------- create
    async def _create(self, res: kmock.resource, request: rendering.Request,
                      body: dict[str, Any] | None = None) -> rendering.Response:
        if request.subresource:
            raise errors.method_not_allowed()
        info = self._info(res)
        if body is None:
            raw = self._body(request)
            if not isinstance(raw, dict):
                raise errors.bad_request("the body of the request must be a JSON object")
            body = raw
        kind = self._kind(res)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        namespace: str | None = None
        if info.namespaced:
            if request.namespace is None:
                raise errors.no_route()
            if meta.get("namespace") not in (None, "", request.namespace):
                raise errors.bad_request("the namespace of the provided object does not match the namespace sent "
                                         "on the request")
            namespace = request.namespace
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
            else:
                raise errors.invalid(kind, res.group or "", "", [FieldCause(
                    "metadata.name", "FieldValueRequired", "Required value: name or generateName is required")])
        name = str(meta["name"])
        self._validate_name(res, kind, name)
        self._check_namespace_writable(res, namespace, name)
        key = self._key(res, namespace, name)
        if self._current(key) is not None:
            raise errors.already_exists(res.plural or "", res.group or "", name)
        for field in _SERVER_META:
            meta.pop(field, None)
        body["apiVersion"] = f"{res.group}/{res.version}" if res.group else str(res.version)
        body["kind"] = kind
        group_plural = (res.group or "", res.plural or "")
        if self._has_status_subresource(res) and group_plural not in builtin.STATUS_KEPT_ON_CREATE:
            body.pop("status", None)
            if self._crd_for(res) is None:  # typed built-ins always serialize their (empty) status struct
                body["status"] = copy.deepcopy(builtin.STATUS_ON_CREATE.get(group_plural, {}))
        if group_plural == ("", "namespaces"):
            body.setdefault("spec", {})["finalizers"] = ["kubernetes"]  # namespace strategy's PrepareForCreate
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
        warnings: list[str] = []
        crd_def = self._crd_for(res)
        self._admit_builtin(res, kind, name, body, None)
        if crd_def is not None:
            body, warnings = crd_def.admit(body, None, version=res.version or "", params=request.params)
        new_crd: CustomResourceDefinition | None = None
        if group_plural == CRD_RESOURCE:
            new_crd = self._admit_crd(body, name)
            meta.setdefault("finalizers", [])
            if "customresourcecleanup.apiextensions.k8s.io" not in meta["finalizers"]:
                meta["finalizers"].append("customresourcecleanup.apiextensions.k8s.io")
        meta = body["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        if self._has_generation(res):
            meta["generation"] = 1
        if request.params.get("dryRun") == "All":
            meta["resourceVersion"] = str(self._rv)
            return self._reply(201, self._present(res, body), warnings)
        meta["resourceVersion"] = str(self._next_rv())
        if new_crd is not None:
            body["status"] = new_crd.initial_status()
            self._register_crd(new_crd)
        self._store_new(key[0], key[1], body)
        await self._emit(res, "ADDED", copy.deepcopy(body), None)
        if self._has_dead_owner(meta, key[1]):  # a dependent of a missing owner is collected, as on a cluster
            self._gc_wakeup.set()
        return self._reply(201, self._present(res, body), warnings)

    def _admit_builtin(self, res: kmock.resource, kind: str, name: str, obj: dict[str, Any],
                       old: dict[str, Any] | None) -> None:
        """Defaults and validation of built-in kinds (metadata only for custom resources); raises 422."""
        group_plural = (res.group or "", res.plural or "")
        if self._crd_for(res) is not None or group_plural == CRD_RESOURCE:
            causes = builtin_admission.validate_metadata(obj.get("metadata") or {})
        else:
            builtin_admission.apply_defaults(group_plural, obj, self._allocate_cluster_ip)
            causes = builtin_admission.validate(group_plural, obj, old)
        if causes:
            raise errors.invalid(kind, res.group or "", name, causes)

    def _allocate_cluster_ip(self) -> str:
        while True:
            self._next_ip += 1
            address = f"10.96.{self._next_ip // 250}.{self._next_ip % 250 + 1}"
            if address not in self._cluster_ips:
                self._cluster_ips.add(address)
                return address

    def _reply(self, status: int, payload: Any, warnings: Iterable[str] = ()) -> rendering.Response:
        headers = {"Warning": ", ".join(f'299 - "{w}"' for w in warnings)} if warnings else None
        return rendering.Response(status=status, payload=payload, headers=headers)

    def _validate_name(self, res: kmock.resource, kind: str, name: str) -> None:
        if (res.group or "") == "rbac.authorization.k8s.io":
            ok = "/" not in name and "%" not in name and name not in (".", "..")
        else:
            ok = len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))
        if not ok:
            raise errors.invalid(kind, res.group or "", name, [FieldCause(
                "metadata.name", "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")])

    # ----------------------------------------------------------------------------------------------- update
    async def _replace(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        assert request.name is not None
        sub = request.subresource or ""
        body = self._body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        if sub == "scale":
            key, current = self._require(res, request.namespace, request.name)
            return await self._write_scale(res, key, current, body, request)
        key, current = self._require(res, request.namespace, request.name)
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, request.name):
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not match the name on "
                                     f"the URL ({request.name})")
        sent_rv = meta.get("resourceVersion")
        if not sent_rv and self._crd_for(res) is not None:
            raise errors.invalid(self._kind(res), res.group or "", request.name, [FieldCause(
                "metadata.resourceVersion", "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update")])
        if sent_rv and str(sent_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(res.plural or "", res.group or "", request.name)
        return await self._update(res, key, current, body, request, sub)

    async def _patch(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        assert request.name is not None
        sub = request.subresource or ""
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        crd_def = self._crd_for(res)
        accepted = [patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH]
        if crd_def is None:
            accepted.append(patching.STRATEGIC_MERGE_PATCH)
        if content_type not in accepted:
            raise errors.unsupported_media_type(content_type, accepted)
        patch = self._body(request)
        key = self._key(res, request.namespace, request.name)
        current = self._current(key)
        if content_type == patching.APPLY_PATCH:
            return await self._server_side_apply(res, request, key, current, patch, sub)
        if current is None:
            raise errors.not_found(res.plural or "", res.group or "", request.name)
        if sub == "scale":
            scale = self._scale_of(res, current)
            try:
                scale = self._apply_patch(content_type, scale, patch)
            except patching.PatchError as exc:
                raise ApiError(422, "Invalid", str(exc), {}) from exc
            return await self._write_scale(res, key, current, scale, request)
        try:
            patched = self._apply_patch(content_type, copy.deepcopy(current), patch)
        except patching.PatchError as exc:
            code = 422 if content_type == patching.JSON_PATCH else 400
            raise ApiError(code, "Invalid" if code == 422 else "BadRequest", str(exc), {}) from exc
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch did not produce an object")
        patched_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if patched_rv is not None and str(patched_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(res.plural or "", res.group or "", request.name)
        return await self._update(res, key, current, patched, request, sub)

    async def _server_side_apply(self, res: kmock.resource, request: rendering.Request, key: ObjKey,
                                 current: dict[str, Any] | None, applied: Any, sub: str) -> rendering.Response:
        assert request.name is not None
        manager = request.params.get("fieldManager")
        if not manager:
            raise errors.invalid("PatchOptions", "meta.k8s.io", "", [FieldCause(
                "fieldManager", "FieldValueRequired", "Required value: is required for apply patch")])
        if not isinstance(applied, dict):
            raise errors.bad_request("an apply patch must be an object (JSON or YAML)")
        if sub and sub != "status":
            raise errors.no_route()
        if current is None:
            if sub:
                raise errors.not_found(res.plural or "", res.group or "", request.name)
            body = copy.deepcopy(applied)
            body.setdefault("metadata", {})["name"] = request.name
            reply = await self._create(res, request, body=body)
            if isinstance(reply.payload, dict):
                self._apply_owners[reply.payload["metadata"]["uid"]] = {manager: set(applying.leaf_paths(applied))}
            return reply
        uid = str(current["metadata"].get("uid"))

        def merge(target: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
            if self._crd_for(res) is None:
                return cast(dict[str, Any], patching.strategic_merge_patch(target, config))
            return cast(dict[str, Any], patching.merge_patch(target, config))

        try:
            patched, owners = applying.apply(current, applied, manager, self._apply_owners.get(uid, {}),
                                             force=request.params.get("force") == "true", merge=merge)
        except applying.ApplyConflict as exc:
            raise ApiError(409, "Conflict", str(exc), {
                "name": request.name, "kind": res.plural, **({"group": res.group} if res.group else {}),
                "causes": [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}"',
                            "field": "." + ".".join(path)} for m, path in exc.conflicts]}) from exc
        patched_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if patched_rv is not None and str(patched_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(res.plural or "", res.group or "", request.name)
        reply = await self._update(res, key, current, patched, request, sub)
        self._apply_owners[uid] = owners
        return reply

    def _apply_patch(self, content_type: str, target: dict[str, Any], patch: Any) -> Any:
        if content_type == patching.JSON_PATCH:
            return patching.json_patch(target, patch)
        if content_type == patching.STRATEGIC_MERGE_PATCH:
            return patching.strategic_merge_patch(target, patch)
        if not isinstance(patch, dict):
            raise patching.PatchError("a merge patch must be a JSON object")
        return patching.merge_patch(target, patch)

    async def _update(self, res: kmock.resource, key: ObjKey, current: dict[str, Any], body: dict[str, Any],
                      request: rendering.Request, sub: str) -> rendering.Response:
        name = key[2]
        if sub and sub != "status":
            raise errors.no_route()
        has_status = self._has_status_subresource(res)
        if sub == "status" and not has_status:
            raise errors.no_route()
        if sub == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            if has_status:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
            meta = new.setdefault("metadata", {})
            old_meta = current["metadata"]
            for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                          "deletionGracePeriodSeconds", "generation", "generateName"):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            meta.pop("managedFields", None)
            new["apiVersion"] = current["apiVersion"]
            new["kind"] = current["kind"]
            if old_meta.get("deletionTimestamp"):
                added = [f for f in meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])]
                if added:
                    raise errors.invalid(self._kind(res), res.group or "", name, [FieldCause(
                        "metadata.finalizers", "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being deleted, "
                        f"found new finalizers {json.dumps(added)}")])
            if not meta.get("finalizers"):
                meta.pop("finalizers", None)
            if not meta.get("ownerReferences"):
                meta.pop("ownerReferences", None)
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if sub != "status":
            if (res.group or "", res.plural or "") == ("", "services"):
                for field in ("clusterIP", "clusterIPs"):  # an update that omits them keeps the allocation
                    if field in (current.get("spec") or {}) and field not in (new.get("spec") or {}):
                        new.setdefault("spec", {})[field] = copy.deepcopy(current["spec"][field])
            self._admit_builtin(res, self._kind(res), name, new, current)
        warnings: list[str] = []
        crd_def = self._crd_for(res)
        if crd_def is not None:
            new, warnings = crd_def.admit(new, current, version=res.version or "", params=request.params)
        if (res.group or "", res.plural or "") == CRD_RESOURCE and sub != "status":
            self._admit_crd(new, name)
        if self._has_generation(res) and self._spec_changed(current, new, has_status):
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        if new == current:
            return self._reply(200, self._present(res, current), warnings)
        if request.params.get("dryRun") == "All":
            return self._reply(200, self._present(res, new), warnings)
        result = await self._commit(res, key, current, new)
        return self._reply(200, self._present(res, result), warnings)

    @staticmethod
    def _spec_changed(old: dict[str, Any], new: dict[str, Any], has_status: bool) -> bool:
        skip = {"metadata", "status"} if has_status else {"metadata"}
        return {k: v for k, v in old.items() if k not in skip} != {k: v for k, v in new.items() if k not in skip}

    async def _commit(self, res: kmock.resource, key: ObjKey, current: dict[str, Any],
                      new: dict[str, Any]) -> dict[str, Any]:
        """Store a changed object (new resourceVersion, MODIFIED event); finish deletions that were unblocked."""
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not self._finalizers_pending(res, new):
            await self._remove(res, key, new)
            return new
        self._objects[key].create(new)
        self._trim(key)
        self._live.setdefault(key[0], {})[key] = self._objects[key].raw
        await self._emit(res, "MODIFIED", copy.deepcopy(new), current)
        if (res.group or "", res.plural or "") == CRD_RESOURCE:
            crd_def = parse_crd(new)
            self._register_crd(crd_def)
        if meta.get("deletionTimestamp") or (meta.get("ownerReferences") != current["metadata"].get(
                "ownerReferences") and self._has_dead_owner(meta, key[1])):
            self._gc_wakeup.set()
        return new

    @staticmethod
    def _finalizers_pending(res: kmock.resource, obj: dict[str, Any]) -> bool:
        if obj["metadata"].get("finalizers"):
            return True
        # A Namespace is also held by its spec.finalizers until the namespace controller empties it.
        return (res.group or "", res.plural or "") == ("", "namespaces") and bool(
            (obj.get("spec") or {}).get("finalizers"))

    async def _remove(self, res: kmock.resource, key: ObjKey, final: dict[str, Any]) -> None:
        """Delete for good: DELETED event with a fresh resourceVersion, wake the garbage collector."""
        if final["metadata"]["resourceVersion"] == self._current_rv(key):
            final["metadata"]["resourceVersion"] = str(self._next_rv())
        old = self._current(key)
        self._objects[key].delete()
        self._live.get(key[0], {}).pop(key, None)
        self._uids.pop(final["metadata"].get("uid", ""), None)
        self._apply_owners.pop(str(final["metadata"].get("uid", "")), None)
        await self._emit(res, "DELETED", copy.deepcopy(final), old)
        if (res.group or "", res.plural or "") == CRD_RESOURCE:
            self._unregister_crd(final)
        self._gc_wakeup.set()

    def _current_rv(self, key: ObjKey) -> str | None:
        current = self._current(key)
        return None if current is None else str(current["metadata"]["resourceVersion"])

    # ------------------------------------------------------------------------------------------------ scale
    def _scale_paths(self, res: kmock.resource) -> tuple[str, str, str | None]:
        crd_def = self._crd_for(res)
        if crd_def is not None:
            paths = crd_def.scale_paths(res.version or "")
            if paths is None:
                raise errors.no_route()
            return paths
        found = builtin.SCALE_PATHS.get((res.group or "", res.plural or ""))
        if found is None:
            raise errors.no_route()
        return found

    def _scale_of(self, res: kmock.resource, obj: dict[str, Any]) -> dict[str, Any]:
        spec_path, status_path, selector_path = self._scale_paths(res)
        selector = _dig(obj, selector_path) if selector_path else None
        if isinstance(selector, dict):
            selector = ",".join(f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or selector).items()))
        meta = obj["metadata"]
        scale: dict[str, Any] = {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                         if k in meta},
            "spec": {"replicas": _dig(obj, spec_path) or 0},
            "status": {"replicas": _dig(obj, status_path) or 0},
        }
        if selector:
            scale["status"]["selector"] = selector
        return scale

    async def _write_scale(self, res: kmock.resource, key: ObjKey, current: dict[str, Any], scale: dict[str, Any],
                           request: rendering.Request) -> rendering.Response:
        sent_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if sent_rv and str(sent_rv) != current["metadata"]["resourceVersion"]:
            raise errors.conflict(res.plural or "", res.group or "", key[2])
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise errors.invalid("Scale", "autoscaling", key[2], [FieldCause(
                "spec.replicas", "FieldValueInvalid",
                f"Invalid value: {json.dumps(replicas)}: must be greater than or equal to 0")])
        spec_path, _, _ = self._scale_paths(res)
        new = copy.deepcopy(current)
        _set_dotted(new, spec_path, replicas)
        if self._has_generation(res) and new != current:
            new["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
        result = current if new == current else await self._commit(res, key, current, new)
        return rendering.Response(status=200, payload=self._scale_of(res, result))

    # ----------------------------------------------------------------------------------------------- delete
    def _delete_options(self, request: rendering.Request) -> dict[str, Any]:
        options: dict[str, Any] = {}
        body = self._body(request)
        if isinstance(body, dict):
            options.update(body)
        params = request.params
        if "propagationPolicy" in params:
            options["propagationPolicy"] = params["propagationPolicy"]
        if "gracePeriodSeconds" in params:
            options["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
        if "orphanDependents" in params:
            options["orphanDependents"] = params["orphanDependents"] == "true"
        if params.get("dryRun") == "All":
            options["dryRun"] = ["All"]
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            options["propagationPolicy"] = "Orphan" if options["orphanDependents"] else "Background"
        if options.get("propagationPolicy") not in (None, "Orphan", "Background", "Foreground"):
            raise errors.invalid("DeleteOptions", "meta.k8s.io", "", [FieldCause(
                "propagationPolicy", "FieldValueNotSupported",
                f'Unsupported value: "{options["propagationPolicy"]}": supported values: '
                '"Foreground", "Background", "Orphan", "nil"')])
        return options

    async def _delete(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        assert request.name is not None
        key, current = self._require(res, request.namespace, request.name)
        options = self._delete_options(request)
        preconditions = options.get("preconditions") or {}
        meta = current["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != meta.get("uid"):
            raise errors.conflict(res.plural or "", res.group or "", request.name,
                                  f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                                  f"UID in object meta: {meta.get('uid')}")
        if preconditions.get("resourceVersion") and preconditions["resourceVersion"] != meta.get("resourceVersion"):
            raise errors.conflict(res.plural or "", res.group or "", request.name,
                                  f"Precondition failed: ResourceVersion in precondition: "
                                  f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                                  f"{meta.get('resourceVersion')}")
        if options.get("dryRun"):
            return rendering.Response(status=200, payload=self._present(res, current))
        final, removed = await self._delete_object(res, key, current, options)
        group_plural = (res.group or "", res.plural or "")
        if removed and group_plural not in builtin.RETURN_DELETED_OBJECT:
            return rendering.Response(status=200, payload={
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {k: v for k, v in (("name", request.name), ("group", res.group or ""),
                                              ("kind", res.plural), ("uid", meta.get("uid"))) if v},
            })
        return rendering.Response(status=200, payload=self._present(res, final))

    async def _delete_object(self, res: kmock.resource, key: ObjKey, current: dict[str, Any],
                             options: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Delete or mark for deletion; returns the final state and whether it is gone."""
        group_plural = (res.group or "", res.plural or "")
        policy = options.get("propagationPolicy") or "Background"
        new = copy.deepcopy(current)
        meta = new["metadata"]
        finalizers: list[str] = list(meta.get("finalizers") or [])
        if policy == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if group_plural == ("", "namespaces"):
            new.setdefault("status", {})["phase"] = "Terminating"
        grace = options.get("gracePeriodSeconds")
        graceful = (self.graceful_pod_deletion and group_plural == ("", "pods")
                    and (new.get("spec") or {}).get("nodeName") and grace != 0)
        if meta.get("deletionTimestamp"):
            if graceful or (group_plural == ("", "pods") and grace != 0 and meta.get("deletionGracePeriodSeconds")):
                return current, False
            if not finalizers:
                await self._remove(res, key, new)
                return new, True
            if finalizers != (meta.get("finalizers") or []):
                meta["finalizers"] = finalizers
                return await self._commit(res, key, current, new), False
            return current, False
        if finalizers or graceful or group_plural == ("", "namespaces"):
            period = 0
            if graceful:
                period = int(grace if grace is not None else
                             (new.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            meta["deletionTimestamp"] = now_rfc3339(period)
            meta["deletionGracePeriodSeconds"] = period
            if finalizers:
                meta["finalizers"] = finalizers
            if self._has_generation(res):
                meta["generation"] = int(meta.get("generation", 1)) + 1
            committed = await self._commit(res, key, current, new)
            self._gc_wakeup.set()
            return committed, self._current(key) is None
        await self._remove(res, key, new)
        return new, True

    async def _delete_collection(self, res: kmock.resource, request: rendering.Request) -> rendering.Response:
        if request.subresource:
            raise errors.no_route()
        matches = self._selection(res, request)
        options = self._delete_options(request)
        deleted = []
        for obj in self._objects_of(res):
            if not matches(obj):
                continue
            key = self._key(res, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            if options.get("dryRun"):
                deleted.append(obj)
                continue
            final, _ = await self._delete_object(res, key, obj, options)
            deleted.append(final)
        return rendering.Response(status=200, payload={
            "kind": f"{self._kind(res)}List",
            "apiVersion": f"{res.group}/{res.version}" if res.group else str(res.version),
            "metadata": {"resourceVersion": str(self._rv)},
            "items": [self._present(res, obj) for obj in deleted],
        })

    # ------------------------------------------------------------------------------------- garbage collector
    async def _gc_loop(self) -> None:
        while True:
            await self._gc_wakeup.wait()
            self._gc_idle.clear()
            try:
                if self.gc_delay:
                    await asyncio.sleep(self.gc_delay)
                self._gc_wakeup.clear()
                async with self._lock:
                    for _ in range(100):  # cascades settle in a few rounds; bound it against cycles
                        if not await self._gc_round():
                            break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.exception("Emulator garbage collector failed")
                self._internal_errors.append(exc)
            finally:
                self._gc_idle.set()

    def _resource_of_key(self, key: ObjKey) -> kmock.resource:
        return key[0]

    def _has_dead_owner(self, meta: dict[str, Any], namespace: str | None) -> bool:
        return any(not self._owner_alive(ref, namespace) for ref in meta.get("ownerReferences") or [])

    def _owner_alive(self, ref: dict[str, Any], child_ns: str | None) -> bool:
        owner_key = self._uids.get(str(ref.get("uid")))
        if owner_key is None or self._current(owner_key) is None:
            return False
        owner_ns = owner_key[1]
        return owner_ns is None or owner_ns == child_ns

    async def _gc_round(self) -> bool:
        """One pass of the garbage collector, namespace controller and CRD finalizer; True if it changed anything."""
        changed = False
        live = [(key, stored.raw) for key, stored in self._objects.items() if not stored.deleted]
        children_of: dict[str, list[tuple[ObjKey, dict[str, Any]]]] = {}
        for key, obj in live:
            for ref in obj["metadata"].get("ownerReferences") or []:
                children_of.setdefault(str(ref.get("uid")), []).append((key, obj))
        for key, obj in live:
            current = self._current(key)
            if current is None or (current is not obj and current != obj):
                continue  # changed earlier in this round; look again next round
            res = self._resource_of_key(key)
            meta = obj["metadata"]
            refs = meta.get("ownerReferences") or []
            if refs:
                alive = [r for r in refs if self._owner_alive(r, key[1])]
                if not alive and not meta.get("deletionTimestamp"):
                    await self._delete_object(res, key, obj, {"propagationPolicy": "Background"})
                    changed = True
                    continue
                if alive and len(alive) != len(refs):
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = alive
                    await self._commit(res, key, obj, new)
                    changed = True
                    continue
            if not meta.get("deletionTimestamp"):
                continue
            finalizers = list(meta.get("finalizers") or [])
            uid = str(meta.get("uid"))
            kids = [(k, o) for k, o in children_of.get(uid, []) if self._current(k) is not None]
            if "orphan" in finalizers:
                for kid_key, kid in kids:
                    kid_new = copy.deepcopy(kid)
                    kid_new["metadata"]["ownerReferences"] = [
                        r for r in kid["metadata"].get("ownerReferences") or [] if str(r.get("uid")) != uid]
                    if not kid_new["metadata"]["ownerReferences"]:
                        del kid_new["metadata"]["ownerReferences"]
                    await self._commit(self._resource_of_key(kid_key), kid_key, kid, kid_new)
                finalizers.remove("orphan")
                changed = await self._set_finalizers(res, key, obj, finalizers) or changed
                continue
            if "foregroundDeletion" in finalizers:
                if kids:
                    for kid_key, kid in kids:
                        if not kid["metadata"].get("deletionTimestamp"):
                            await self._delete_object(self._resource_of_key(kid_key), kid_key, kid,
                                                      {"propagationPolicy": "Foreground"})
                            changed = True
                    continue
                finalizers.remove("foregroundDeletion")
                changed = await self._set_finalizers(res, key, obj, finalizers) or changed
                continue
            if (res.group or "", res.plural or "") == ("", "namespaces"):
                changed = await self._finalize_namespace(res, key, obj) or changed
            elif (res.group or "", res.plural or "") == CRD_RESOURCE:
                changed = await self._finalize_crd(res, key, obj) or changed
        return changed

    async def _set_finalizers(self, res: kmock.resource, key: ObjKey, obj: dict[str, Any],
                              finalizers: list[str]) -> bool:
        new = copy.deepcopy(obj)
        if finalizers:
            new["metadata"]["finalizers"] = finalizers
        else:
            new["metadata"].pop("finalizers", None)
        await self._commit(res, key, obj, new)
        return True

    async def _finalize_namespace(self, res: kmock.resource, key: ObjKey, ns_obj: dict[str, Any]) -> bool:
        namespace = key[2]
        remaining = [(k, s.raw) for k, s in self._objects.items() if k[1] == namespace and not s.deleted]
        changed = False
        for kid_key, kid in remaining:
            if not kid["metadata"].get("deletionTimestamp"):
                await self._delete_object(self._resource_of_key(kid_key), kid_key, kid,
                                          {"propagationPolicy": "Background", "gracePeriodSeconds": 0})
                changed = True
        if any(self._current(k) is not None for k, _ in remaining):
            return changed
        if (ns_obj.get("spec") or {}).get("finalizers"):
            new = copy.deepcopy(ns_obj)
            new["spec"]["finalizers"] = []
            await self._commit(res, key, ns_obj, new)
            return True
        return changed

    async def _finalize_crd(self, res: kmock.resource, key: ObjKey, crd_obj: dict[str, Any]) -> bool:
        group = crd_obj["spec"]["group"]
        plural = crd_obj["spec"]["names"]["plural"]
        instances = [(k, s.raw) for k, s in self._objects.items()
                     if (k[0].group, k[0].plural) == (group, plural) and not s.deleted]
        changed = False
        for kid_key, kid in instances:
            if not kid["metadata"].get("deletionTimestamp"):
                await self._delete_object(kid_key[0], kid_key, kid, {"propagationPolicy": "Background"})
                changed = True
        if any(self._current(k) is not None for k, _ in instances):
            return changed
        finalizers = [f for f in crd_obj["metadata"].get("finalizers") or []
                      if f != "customresourcecleanup.apiextensions.k8s.io"]
        if finalizers != (crd_obj["metadata"].get("finalizers") or []):
            return await self._set_finalizers(res, key, crd_obj, finalizers)
        return changed

    # ------------------------------------------------------------------------------------------------- CRDs
    def _admit_crd(self, body: dict[str, Any], name: str) -> CustomResourceDefinition:
        try:
            crd_def = parse_crd(body)
        except errors.ApiError:
            raise
        existing = self._crds.get((crd_def.group, crd_def.plural))
        if existing is not None and existing.name != crd_def.name:
            raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, [FieldCause(
                "spec.names.plural", "FieldValueInvalid", "Invalid value: already in use")])
        return crd_def

    def _register_crd(self, crd_def: CustomResourceDefinition) -> None:
        for res in [r for r in self._all_resources() if (r.group, r.plural) == (crd_def.group, crd_def.plural)]:
            del self.resources[res]
        for version in crd_def.served_versions():
            self.resources[make_resource(crd_def.group, version, crd_def.plural)] = kmock.ResourceInfo(
                kind=crd_def.kind, singular=crd_def.singular, namespaced=crd_def.namespaced,
                verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
                shortnames=set(crd_def.short_names), categories=set(crd_def.categories),
                subresources=crd_def.subresources(version),
            )
        self._crds[(crd_def.group, crd_def.plural)] = crd_def
        logger.debug("Registered CRD %s", crd_def.name)

    def _unregister_crd(self, crd_obj: dict[str, Any]) -> None:
        group = crd_obj["spec"]["group"]
        plural = crd_obj["spec"]["names"]["plural"]
        for res in [r for r in self._all_resources() if (r.group, r.plural) == (group, plural)]:
            del self.resources[res]
        self._crds.pop((group, plural), None)

    # -------------------------------------------------------------------------------------------- discovery
    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        return {
            "major": "1", "minor": "34", "gitVersion": "v1.34.0-vllm-operator-sim",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
            "platform": "linux/amd64",
        }

    async def _serve_api(self, request: rendering.Request) -> rendering.Payload:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for res in self._all_resources():
            if res.group and res.version:
                groups.setdefault(res.group, [])
                if res.version not in groups[res.group]:
                    groups[res.group].append(res.version)
        for group, versions in groups.items():
            versions.sort(key=_version_priority)
            crd_def = next((c for c in self._crds.values() if c.group == group), None)
            if crd_def is not None and crd_def.storage_version in versions:
                versions.remove(crd_def.storage_version)
                versions.insert(0, crd_def.storage_version)
        return groups

    def _group_entry(self, group: str, versions: list[str]) -> dict[str, Any]:
        return {
            "name": group,
            "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
            "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
        }

    async def _serve_apis(self, request: rendering.Request) -> rendering.Payload:
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self._group_entry(g, v) for g, v in sorted(self._groups().items())]}

    async def _serve_group(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        group = request.resource.group or ""
        versions = self._groups().get(group)
        if not versions:
            raise kmock.KubernetesResourceNotFoundError()
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_entry(group, versions)}

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        assert request.resource is not None
        group = request.resource.group or ""
        version = request.resource.version
        entries: list[dict[str, Any]] = []
        for res in sorted(self._all_resources(), key=lambda r: r.plural or ""):
            if res.group != group or res.version != version:
                continue
            info = self.resources[res]
            entry: dict[str, Any] = {
                "name": res.plural, "singularName": info.singular or res.plural,
                "namespaced": bool(info.namespaced), "kind": info.kind, "verbs": sorted(info.verbs),
            }
            if info.shortnames:
                entry["shortNames"] = sorted(info.shortnames)
            if info.categories:
                entry["categories"] = sorted(info.categories)
            entries.append(entry)
            for sub in sorted(info.subresources):
                sub_entry: dict[str, Any] = {"name": f"{res.plural}/{sub}", "singularName": "",
                                             "namespaced": bool(info.namespaced), "kind": info.kind,
                                             "verbs": ["get", "patch", "update"]}
                if sub == "scale":
                    sub_entry.update(group="autoscaling", version="v1", kind="Scale")
                entries.append(sub_entry)
        if not entries:
            raise kmock.KubernetesResourceNotFoundError()
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else str(version), "resources": entries}

    async def _serve_request_log(self, request: rendering.Request) -> rendering.Payload:
        since = int(request.params.get("since", "0") or 0)
        return {"records": [r.as_dict() for r in self.request_log.since(since)],
                "next": self.request_log.next_seq}


_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def parse_api_path(path: str) -> parsing.ParsedPath:
    """Split an API path into group/version/namespace/resource/name/subresource like apiserver's RequestInfo."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) == 2 and parts[0] == "apis":
        return parsing.ParsedPath(group=parts[1])
    else:
        return parsing.ParsedPath()
    namespace: str | None = None
    if rest and rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace = rest[1]
        rest = rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return parsing.ParsedPath(group, version, plural, namespace, name, subresource)


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version ordering: GA > beta > alpha, then by numbers, highest first."""
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (3, 0, 0)
    major = int(match.group(1))
    stability = {"alpha": 2, "beta": 1, None: 0}[match.group(2)]
    minor = int(match.group(3) or 0)
    return (stability, -major, -minor)


@contextlib.asynccontextmanager
async def serve(server: ApiServer | None = None, *, host: str = "127.0.0.1",
                port: int | None = None) -> AsyncIterator[tuple[ApiServer, str]]:
    """Run an ApiServer on real HTTP; yields (server, base URL).

    A plain aiohttp server rather than `kmock.Server`: the latter also patches aiohttp's resolver process-wide
    and must be exited in LIFO order, which several servers on several threads (tests, the demo) cannot promise.
    """
    api = server if server is not None else ApiServer()
    async with api:
        runner = aiohttp.web.ServerRunner(aiohttp.web.Server(api), shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, host, port or 0)
            await site.start()
            bound_port = runner.addresses[0][1]
            yield api, f"http://{host}:{bound_port}"
        finally:
            await runner.cleanup()


async def _run_standalone(args: argparse.Namespace) -> int:
    from vllm_operator.sim.faults import RandomFaults

    faults = RandomFaults(args.fault_rate, seed=args.fault_seed) if args.fault_rate else None
    api = ApiServer(faults=faults, gc_delay=args.gc_delay, graceful_pod_deletion=args.graceful_pod_deletion)
    async with serve(api, host=args.host, port=args.port) as (_, url):
        if args.kubeconfig:
            write_kubeconfig(args.kubeconfig, url)
        for crd_path in args.crd or []:
            await _load_crds_over_http(url, crd_path)
        print(f"vllm-operator simulated API server listening on {url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    return 0


async def _load_crds_over_http(url: str, path: str) -> None:
    docs = [d for d in yaml.safe_load_all(await asyncio.to_thread(Path(path).read_text, encoding="utf-8")) if d]
    async with aiohttp.ClientSession() as session:
        for doc in docs:
            async with session.post(f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                    json=doc) as resp:
                if resp.status not in (200, 201):
                    raise SystemExit(f"loading CRD from {path} failed: {resp.status} {await resp.text()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_operator.sim.apiserver",
                                     description="Run the simulated Kubernetes API server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 picks a free one)")
    parser.add_argument("--kubeconfig", help="write a kubeconfig pointing at this server to PATH")
    parser.add_argument("--crd", action="append", help="a CRD YAML file to load at start (repeatable)")
    parser.add_argument("--gc-delay", type=float, default=0.0)
    parser.add_argument("--graceful-pod-deletion", action="store_true")
    parser.add_argument("--fault-rate", type=float, default=0.0, help="fraction of writes answered with a fault")
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    if args.port == 0:
        args.port = None
    return asyncio.run(_run_standalone(args))


if __name__ == "__main__":
    raise SystemExit(main())
