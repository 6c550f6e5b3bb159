"""Kubernetes access for the operator and the router: a small `KubeApi` Protocol and one asyncio implementation.

The controller, the health loop and the router's discovery only need a handful of verbs on a known set of kinds, so
they talk to this Protocol rather than to a client library; unit tests hand them tests/support/fakekube.FakeKubeApi,
integration tests the real implementation pointed at the test control plane (testcluster), and
tests/integration/kube/test_kubeapi_contract.py holds the two to the same behaviour. kopf keeps its own client, logged
in with this one's credentials (`ClientKubeApi.connection`).

`ClientKubeApi` sits on kubernetes_asyncio (its configuration loaders and aiohttp REST layer; chosen over kr8s and
lightkube because it is the official client's asyncio twin, with the same in-cluster and kubeconfig loaders, exec
plugins and token refresh, and raw calls that keep objects as plain dicts). It builds its own client (no
module-level one), caches discovery, and `list_watch` keeps a set of objects current from a list and watches that
resume from bookmarks.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import kubernetes_asyncio.client
import kubernetes_asyncio.config
import yaml

from vllm_operator import __version__, constants


@dataclass(frozen=True)
class Resource:
    """A REST resource: how to build its URL."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


VLLM_DEPLOYMENTS = Resource(constants.GROUP, constants.VERSION, constants.PLURAL, constants.KIND)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
SERVICES = Resource("", "v1", "services", "Service")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
WORKLOAD_CLASSES = Resource(constants.GROUP, constants.VERSION, constants.CLASS_PLURAL, constants.CLASS_KIND,
                            namespaced=False)
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
POD_MONITORS = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
PROMETHEUS_RULES = Resource("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule")
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")  # the weights cache's claim form
SECRETS = Resource("", "v1", "secrets", "Secret")  # the webhook CA's Secret only (handlers/webhook.py)
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                               "ValidatingWebhookConfiguration", namespaced=False)

# Every kind the operator renders as a child, keyed by (apiVersion, kind).
CHILD_RESOURCES: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (DEPLOYMENTS, SERVICES, CONFIGMAPS, SERVICE_ACCOUNTS, ROLES, ROLE_BINDINGS, PDBS, NETWORK_POLICIES,
              POD_MONITORS, PROMETHEUS_RULES, SCALED_OBJECTS, PVCS)
}


class KubeError(Exception):
    """An API call that failed; `status` is the HTTP status (0 for transport errors); `causes` are the Status
    object's `details.causes` (for a server-side apply conflict: one per contested field, naming its manager)."""

    def __init__(self, status: int, reason: str, message: str,
                 causes: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes or []

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class WatchExpired(KubeError):
    """The watch's resourceVersion is older than the server keeps (410 Gone): list again, then watch from there."""

    def __init__(self, message: str) -> None:
        super().__init__(410, "Expired", message)


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: `type` is ADDED, MODIFIED, DELETED or BOOKMARK (a bookmark's object carries only
    metadata.resourceVersion: where to resume)."""

    type: str
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        return str((self.object.get("metadata") or {}).get("resourceVersion") or "")


class KubeApi(Protocol):
    """The verbs the operator and the router use."""

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None: ...

    async def list_versioned(self, res: Resource, namespace: str | None, label_selector: str | None = None
                             ) -> tuple[list[dict[str, Any]], str]:
        """The items and the list's resourceVersion (where a watch of the same selector starts)."""
        ...

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]: ...

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                    ) -> dict[str, Any]: ...

    async def patch_status(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                           ) -> dict[str, Any]: ...

    async def apply(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any], *,
                    force: bool = False) -> dict[str, Any]: ...

    async def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None,
                     grace_period_s: int | None = None) -> None:
        """Background propagation; `uid` a precondition; `grace_period_s` overrides the object's own (pods)."""
        ...

    async def emit_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...

    async def has_resource(self, group: str, version: str, plural: str) -> bool: ...

    def watch(self, res: Resource, namespace: str | None, *, resource_version: str,
              label_selector: str | None = None, timeout_seconds: int = 300) -> AsyncIterator[WatchEvent]:
        """Changes after `resource_version`, with bookmarks, until the server ends the watch (about
        `timeout_seconds`); raises `WatchExpired` when that version is too old."""
        ...


def merge_diff(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns `old` into `new`: keys that disappeared become null (a merge patch built
    from `new` alone cannot delete anything); None when the two are equal. Lists are replaced whole."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return None if old == new else new
    patch: dict[str, Any] = {key: None for key in old.keys() - new.keys()}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_diff(old[key], value) if isinstance(value, Mapping) else value
    return patch or None


DesiredStatus = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any] | None]]
"""A status writer's computation: the object as read -> the whole status it should have (wire form), or None to
write nothing (the object moved on, the writer has nothing to say)."""

STATUS_WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class StatusWrite:
    """What `write_status` did: `written` (a PATCH was accepted), and the object the last computation read (the
    written object when written; None when it was gone on a re-read)."""

    written: bool
    obj: Mapping[str, Any] | None


async def write_status(kube: KubeApi, obj: Mapping[str, Any], desired: DesiredStatus) -> StatusWrite:
    """The one status writer (docs/architecture.md, Status): every status write of the operator (to a VLLMDeployment,
    the only object whose status it writes) comes through here.

    `desired(obj)` computes the whole status from the object as read; the write is the diff against that object's
    status with nulls for what went away (a disabled pool's `status.pools.long` and `status.plan.long` are removed,
    which the whole-status merge patch this replaced could not do), guarded by that object's resourceVersion. An
    unchanged status sends nothing. A 409 means someone wrote since the read: the object is read again and
    `desired` runs again on it, so no writer's update is lost and none acts on what it did not see; after
    `STATUS_WRITE_ATTEMPTS` reads the conflict goes to the caller, whose own retry (kopf's, or the next check)
    takes over.
    """
    meta = obj["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    current: Mapping[str, Any] = obj
    for attempt in range(1, STATUS_WRITE_ATTEMPTS + 1):
        want = await desired(current)
        if want is None:
            return StatusWrite(False, current)
        patch = merge_diff(dict(current.get("status") or {}), dict(want))
        if not patch:
            return StatusWrite(False, current)
        body: dict[str, Any] = {"status": patch}
        version = current["metadata"].get("resourceVersion")
        if version:
            body["metadata"] = {"resourceVersion": version}
        try:
            return StatusWrite(True, await kube.patch_status(VLLM_DEPLOYMENTS, namespace, name, body))
        except KubeError as err:
            if not err.conflict or attempt == STATUS_WRITE_ATTEMPTS:
                raise
        fresh = await kube.get(VLLM_DEPLOYMENTS, namespace, name)
        if fresh is None:
            return StatusWrite(False, None)
        current = fresh
    raise AssertionError("unreachable: the last attempt returns or raises")


FIELD_MANAGER = constants.APP_NAME
"""The field manager of the operator's server-side applies (managedFields entries with operation Apply)."""
APPLY_PATCH = "application/apply-patch+yaml"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


DISCOVERY_TTL_SECONDS = 60.0
"""How long an API group's resource list is reused. Installing a CRD (e.g. the Prometheus operator's) is noticed by
the next reconcile after this; without the cache every reconcile and status refresh paid a discovery GET."""


class CredentialsError(Exception):
    """Neither an in-cluster service account nor a usable kubeconfig: a setup mistake, said in one line."""


def _credentials_problem(kubeconfig: str | None, context: str | None, err: BaseException) -> str:
    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    first = os.path.expanduser(path.split(os.pathsep)[0])
    if not os.path.exists(first):
        why = "does not exist"
    else:
        text = " ".join(str(err).split()) or type(err).__name__
        why = f"is unusable ({text})" if context is None else f"is unusable for context {context!r} ({text})"
    return (f"no Kubernetes credentials: not running in a cluster (no service-account token) and the kubeconfig "
            f"{path} {why}; set KUBECONFIG to a kubeconfig for the target cluster")


EXEC_TOKEN_SKEW = dt.timedelta(minutes=5)
"""An exec plugin's token is renewed this long before its expirationTimestamp (the loader's own margin)."""


def _exec_token_refresher(loader: Any) -> Callable[[Any], Awaitable[None]]:
    """A refresh hook (run before every request) that reruns the kubeconfig's exec plugin once its token is about to
    expire, as the synchronous client's loader did; kubernetes_asyncio's loader sets no hook of its own, so an EKS-style
    15-minute token would otherwise be sent expired. It reads the loader's `exec_plugin_expiry`, set only for exec
    tokens that carry an expirationTimestamp; other credentials are left as loaded."""

    async def refresh(configuration: Any) -> None:
        expiry = getattr(loader, "exec_plugin_expiry", None)
        if isinstance(expiry, dt.datetime) and expiry - EXEC_TOKEN_SKEW <= dt.datetime.now(dt.UTC):
            await loader.load_and_set(configuration)

    return refresh


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, component: str) -> dict[str, Any]:
    """The core/v1 Event about `involved` (in its namespace, "default" for a cluster-scoped object) that
    `KubeApi.emit_event` posts; the message is cut to 1,024 characters, the API server's limit."""
    meta = involved.get("metadata", {})
    namespace = meta.get("namespace") or "default"
    stamp = now_rfc3339()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"), "name": meta.get("name"),
            "namespace": namespace, "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _kubeconfig_exists(kubeconfig: str | None) -> bool:
    """Whether any file of `kubeconfig` (else $KUBECONFIG, a path list, else ~/.kube/config) exists."""
    paths = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return any(os.path.exists(os.path.expanduser(p)) for p in paths.split(os.pathsep) if p)


def _status_error(status: int, reason: str, raw: bytes) -> KubeError:
    """The KubeError of an error answer: the Status object's reason, message and causes when the body is one."""
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = raw.decode(errors="replace")
    if not isinstance(data, dict):
        return KubeError(status, reason, str(data or ""))
    details = data.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return KubeError(status, str(data.get("reason") or reason), str(data.get("message") or ""),
                     causes if isinstance(causes, list) else None)


@dataclass(frozen=True)
class Connection:
    """The server and credentials a client talks to: what kopf's own client is logged in with, so that kopf and the
    operator's client are always the same user on the same cluster (see `handlers.run`)."""

    server: str
    ca_path: str | None
    insecure: bool
    token: str | None
    certificate_path: str | None
    private_key_path: str | None


class ClientKubeApi:
    """KubeApi over `kubernetes_asyncio`: its configuration loaders (in-cluster service account, kubeconfig with exec
    plugins and token refresh) and its aiohttp REST layer, used raw (paths and JSON, none of the generated models:
    the operator works on plain dicts, and the models would drop fields of kinds newer than the client).

    Construct it inside the event loop it will serve (`from_environment`, or `__init__` from a coroutine): its
    aiohttp session belongs to that loop.
    """

    def __init__(self, configuration: kubernetes_asyncio.client.Configuration, *, timeout: float = 30.0,
                 component: str = constants.APP_NAME, max_connections: int = 8,
                 discovery_ttl: float = DISCOVERY_TTL_SECONDS) -> None:
        # At most `max_connections` requests in flight; the rest wait for a connection (what the 8 worker threads of
        # the synchronous client this replaced allowed: 500 VLLMDeployments reconciled at once must not open 500
        # connections to the API server).
        configuration.connection_pool_maxsize = max_connections
        self._client = kubernetes_asyncio.client.ApiClient(configuration)
        self._client.user_agent = f"{constants.APP_NAME}/{__version__}"  # tells our requests apart in audit logs
        self._timeout = timeout
        self._component = component
        self._discovery_ttl = discovery_ttl
        self._discovery: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        self._discovery_locks: dict[tuple[str, str], asyncio.Lock] = {}

    @classmethod
    async def from_environment(cls, kubeconfig: str | None = None, context: str | None = None, *,
                               timeout: float = 30.0, component: str = constants.APP_NAME) -> ClientKubeApi:
        """In-cluster service account when present (and no kubeconfig is given), else the kubeconfig (KUBECONFIG or
        ~/.kube/config); `CredentialsError` in one line when neither works."""
        configuration = kubernetes_asyncio.client.Configuration()
        try:
            if kubeconfig is not None:
                raise kubernetes_asyncio.config.ConfigException("explicit kubeconfig")
            kubernetes_asyncio.config.load_incluster_config(client_configuration=configuration)
        except kubernetes_asyncio.config.ConfigException:
            if not _kubeconfig_exists(kubeconfig):  # said here in one line: the loader would log a warning first
                raise CredentialsError(_credentials_problem(kubeconfig, context, FileNotFoundError())) from None
            try:
                loader = await kubernetes_asyncio.config.load_kube_config(config_file=kubeconfig, context=context,
                                                                          client_configuration=configuration)
            except (kubernetes_asyncio.config.ConfigException, OSError, ValueError, TypeError,
                    yaml.YAMLError) as err:
                raise CredentialsError(_credentials_problem(kubeconfig, context, err)) from None
            configuration.refresh_api_key_hook = _exec_token_refresher(loader)
        return cls(configuration, timeout=timeout, component=component)

    def sibling(self, max_connections: int) -> ClientKubeApi:
        """A client of the same server and credentials with a connection pool of its own, for watches: each holds
        its connection for minutes, and must not hold one of those the requests share. The configuration object is
        shared (the pool size is read when a client is made), so a refreshed token serves both. Close it too."""
        return ClientKubeApi(self._client.configuration, timeout=self._timeout, component=self._component,
                             max_connections=max_connections, discovery_ttl=self._discovery_ttl)

    async def connection(self) -> Connection:
        """This client's server and credentials, the bearer token re-read first (a projected service-account token
        rotates; an exec plugin's expires), so a login after a 401 gets the current one."""
        config = self._client.configuration
        authorization = await config.get_api_key_with_prefix("BearerToken") or ""
        scheme, _, token = authorization.partition(" ")
        return Connection(server=str(config.host), ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl,
                          token=(token if scheme.lower() == "bearer" else authorization) or None,
                          certificate_path=config.cert_file, private_key_path=config.key_file)

    async def close(self) -> None:
        """Close the connection pool; requests still waiting for a connection fail rather than being sent (a
        stopping operator with hundreds of requests queued must not take minutes to exit)."""
        await self._client.close()

    async def _send(self, method: str, path: str, query: Mapping[str, str] | None, body: Any,
                    content_type: str | None, timeout: float | aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        """The raw response of a request whose status is below 400; KubeError otherwise (0 for transport errors)."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        try:
            response: aiohttp.ClientResponse = await self._client.call_api(
                path, method, query_params=dict(query or {}), header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:  # refused, reset, timed out
            raise KubeError(0, type(err).__name__, str(err)) from err
        if response.status >= 400:
            try:
                raw = await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                raise KubeError(response.status, str(response.reason), f"(body unreadable: {err!r})") from err
            finally:
                response.release()
            raise _status_error(response.status, str(response.reason), raw)
        return response

    async def _request(self, method: str, path: str, *, query: Mapping[str, str] | None = None, body: Any = None,
                       content_type: str | None = None) -> Any:
        response = await self._send(method, path, query, body, content_type, self._timeout)
        try:
            raw = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise KubeError(0, type(err).__name__, str(err)) from err
        finally:
            response.release()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = await self._request("GET", res.path(namespace, name))
        except KubeError as err:
            if err.not_found:
                return None
            raise
        return data

    async def list_versioned(self, res: Resource, namespace: str | None, label_selector: str | None = None, *,
                             field_selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """`field_selector` beyond the Protocol: the process node's agent selects its pods by spec.nodeName."""
        query = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            query["fieldSelector"] = field_selector
        data = await self._request("GET", res.path(namespace), query=query)
        items: list[dict[str, Any]] = data.get("items", []) if isinstance(data, dict) else []
        for item in items:  # list items omit apiVersion/kind on a real server
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        version = str((data.get("metadata") or {}).get("resourceVersion") or "") if isinstance(data, dict) else ""
        return items, version

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        items, _ = await self.list_versioned(res, namespace, label_selector)
        return items

    async def watch(self, res: Resource, namespace: str | None, *, resource_version: str,
                    label_selector: str | None = None, timeout_seconds: int = 300,
                    field_selector: str | None = None) -> AsyncIterator[WatchEvent]:
        """A streamed GET (`watch=true`, bookmarks on); the server ends it after about `timeout_seconds`, and a
        read that sees nothing (not even a bookmark, which the server sends about once a minute) for a minute
        longer than that ends it as a transport error."""
        query = {"watch": "true", "allowWatchBookmarks": "true", "resourceVersion": resource_version,
                 "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 60)
        try:
            response = await self._send("GET", res.path(namespace), query, None, None, timeout)
        except KubeError as err:
            if err.status == 410:
                raise WatchExpired(err.message) from err
            raise
        try:
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = str(event.get("type") or ""), event.get("object") or {}
                if kind == "ERROR":  # a Status object; 410 when resource_version is older than the server keeps
                    code, message = obj.get("code"), str(obj.get("message") or obj)
                    if code == 410:
                        raise WatchExpired(message)
                    raise KubeError(int(code or 0), str(obj.get("reason") or "WatchError"), message)
                if kind != "BOOKMARK":
                    obj.setdefault("apiVersion", res.api_version)
                    obj.setdefault("kind", res.kind)
                yield WatchEvent(kind, obj)
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise KubeError(0, type(err).__name__, str(err)) from err
        finally:
            response.release()

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = await self._request("POST", res.path(namespace), body=dict(body),
                                                   content_type="application/json")
        return data

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                    ) -> dict[str, Any]:
        data: dict[str, Any] = await self._request("PATCH", res.path(namespace, name), body=dict(patch),
                                                   content_type="application/merge-patch+json")
        return data

    async def patch_status(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                           ) -> dict[str, Any]:
        data: dict[str, Any] = await self._request("PATCH", res.path(namespace, name, "status"), body=dict(patch),
                                                   content_type="application/merge-patch+json")
        return data

    async def apply(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any], *,
                    force: bool = False) -> dict[str, Any]:
        """Server-side apply as field manager `FIELD_MANAGER`; `force` takes contested fields from other managers.
        The body goes out as JSON (JSON is YAML): the REST layer encodes it for this content type."""
        query = {"fieldManager": FIELD_MANAGER, **({"force": "true"} if force else {})}
        data: dict[str, Any] = await self._request("PATCH", res.path(namespace, name), query=query,
                                                   body=dict(body), content_type=APPLY_PATCH)
        return data

    async def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None,
                     grace_period_s: int | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            await self._request("DELETE", res.path(namespace, name), body=body, content_type="application/json")
        except KubeError as err:
            if not err.not_found:
                raise

    async def emit_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        event = event_body(involved, type_, reason, message, self._component)
        namespace = event["metadata"]["namespace"]
        await self._request("POST", EVENTS.path(namespace), body=event, content_type="application/json")

    async def has_resource(self, group: str, version: str, plural: str) -> bool:
        """Whether the API serves `plural` in group/version (discovery, cached for `discovery_ttl` seconds; a group
        that is not served at all is cached as empty, errors are not cached)."""
        key = (group, version)
        cached = self._discovery.get(key)
        if cached is None or time.monotonic() - cached[0] > self._discovery_ttl:
            # One request per group however many reconciles ask at once: without the lock every reconcile
            # started while the entry was missing sent its own GET (190 of them in a 500-VLLMDeployment run).
            async with self._discovery_locks.setdefault(key, asyncio.Lock()):
                cached = self._discovery.get(key)
                if cached is None or time.monotonic() - cached[0] > self._discovery_ttl:
                    cached = await self._discover(group, version)
                    self._discovery[key] = cached
        return plural in cached[1]

    async def _discover(self, group: str, version: str) -> tuple[float, frozenset[str]]:
        try:
            data = await self._request("GET", f"/apis/{group}/{version}")
        except KubeError as err:
            if not err.not_found:
                raise
            data = None
        resources = data.get("resources", []) if isinstance(data, dict) else []
        return time.monotonic(), frozenset(str(r.get("name")) for r in resources)


def changes(old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]],
            emit: Callable[[str, dict[str, Any]], None]) -> None:
    """Tell `emit` what a fresh list changed against the objects known before it (by resourceVersion): a watch
    that fell behind or failed lists again, and the events it missed are these."""
    for key, obj in new.items():
        before = old.get(key)
        if before is None:
            emit("ADDED", dict(obj))
        elif (before.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get(
                "resourceVersion"):
            emit("MODIFIED", dict(obj))
    for key, obj in old.items():
        if key not in new:
            emit("DELETED", dict(obj))


async def list_watch(kube: KubeApi, res: Resource, namespace: str | None, *, label_selector: str | None = None,
                     timeout_seconds: int = 300,
                     transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                     on_event: Callable[[str, dict[str, Any]], None] | None = None,
                     ) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """The objects matching `label_selector`, keyed `namespace/name`: once after the list, then after every change.

    A watch the server ends (every `timeout_seconds`) resumes from the last resourceVersion seen, a bookmark's
    included, without listing again; only a version the server no longer keeps (`WatchExpired`, 410) lists again.
    Other errors reach the caller, whose retry starts over with a list. Each snapshot is a new dict (the caller may
    keep it); the objects in it are shared between snapshots and must not be changed. `transform` is applied to
    every object before it is kept (a cache drops what it never reads). `on_event` is told of every change after
    the first list, as (ADDED | MODIFIED | DELETED, the kept object), a list again after a 410 included.
    """
    shape = transform or (lambda obj: obj)

    def key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"

    items, version = await kube.list_versioned(res, namespace, label_selector)
    objects = {key(item): shape(item) for item in items}
    yield dict(objects)
    while True:
        try:
            async for event in kube.watch(res, namespace, resource_version=version, label_selector=label_selector,
                                          timeout_seconds=timeout_seconds):
                version = event.resource_version or version
                if event.type == "BOOKMARK":
                    continue
                if event.type == "DELETED":
                    gone = objects.pop(key(event.object), None)
                    if on_event is not None:
                        on_event("DELETED", gone if gone is not None else shape(event.object))
                else:
                    kept = objects[key(event.object)] = shape(event.object)
                    if on_event is not None:
                        on_event(event.type, kept)
                yield dict(objects)
        except WatchExpired:
            items, version = await kube.list_versioned(res, namespace, label_selector)
            before, objects = objects, {key(item): shape(item) for item in items}
            if on_event is not None:
                changes(before, objects, on_event)
            yield dict(objects)
