"""Kubernetes access for the operator: a small `KubeApi` Protocol and one implementation on the official client.

The controller and the health loop only need a handful of verbs on a known set of kinds, so they talk to this
Protocol rather than to a client library; tests hand them the same implementation pointed at the test control
plane (testcluster).
The implementation builds its own `ApiClient` from a kubeconfig or the in-cluster service account (no module-level
client) and runs the synchronous official client in worker threads of its own, so kopf's event loop never blocks on
I/O and closing it drops queued requests instead of waiting for them (a stopping operator with hundreds of requests
queued must not take minutes to exit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import functools
import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kubernetes.client
import kubernetes.config
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
SECRETS = Resource("", "v1", "secrets", "Secret")  # the webhook CA's Secret only (handlers/webhook.py)
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                               "ValidatingWebhookConfiguration", namespaced=False)
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                namespaced=False)

# Every kind the operator renders as a child, keyed by (apiVersion, kind).
CHILD_RESOURCES: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (DEPLOYMENTS, SERVICES, CONFIGMAPS, SERVICE_ACCOUNTS, ROLES, ROLE_BINDINGS, PDBS, NETWORK_POLICIES,
              POD_MONITORS, PROMETHEUS_RULES, SCALED_OBJECTS)
}


def resource_of(obj: Mapping[str, Any]) -> Resource:
    """The Resource for a rendered child object (KeyError for kinds the operator does not manage)."""
    return CHILD_RESOURCES[(str(obj["apiVersion"]), str(obj["kind"]))]


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


class KubeApi(Protocol):
    """The verbs the operator uses."""

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None: ...

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]: ...

    async def create(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                    ) -> dict[str, Any]: ...

    async def patch_status(self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any]
                           ) -> dict[str, Any]: ...

    async def apply(self, res: Resource, namespace: str | None, name: str, body: Mapping[str, Any], *,
                    force: bool = False) -> dict[str, Any]: ...

    async def json_patch(self, res: Resource, namespace: str | None, name: str, ops: Sequence[Mapping[str, Any]]
                         ) -> dict[str, Any]: ...

    async def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> None: ...

    async def emit_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None: ...

    async def has_resource(self, group: str, version: str, plural: str) -> bool: ...


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
    """KubeApi over the official `kubernetes` client's REST layer."""

    def __init__(self, api_client: kubernetes.client.ApiClient, *, timeout: float = 30.0,
                 component: str = constants.APP_NAME, workers: int = 8,
                 discovery_ttl: float = DISCOVERY_TTL_SECONDS) -> None:
        api_client.user_agent = f"{constants.APP_NAME}/{__version__}"  # tells our requests apart in audit logs
        self._client = api_client
        self._timeout = timeout
        self._component = component
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        self._discovery_ttl = discovery_ttl
        self._discovery: dict[tuple[str, str], tuple[float, frozenset[str]]] = {}
        self._discovery_locks: dict[tuple[str, str], asyncio.Lock] = {}

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None, *,
                         timeout: float = 30.0) -> ClientKubeApi:
        """In-cluster service account when present, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
        configuration = kubernetes.client.Configuration()
        try:
            if kubeconfig is not None:
                raise kubernetes.config.ConfigException("explicit kubeconfig")
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        except kubernetes.config.ConfigException:
            try:
                kubernetes.config.load_kube_config(config_file=kubeconfig, context=context,
                                                   client_configuration=configuration)
            except (kubernetes.config.ConfigException, OSError, ValueError, yaml.YAMLError) as err:
                raise CredentialsError(_credentials_problem(kubeconfig, context, err)) from None
        return cls(kubernetes.client.ApiClient(configuration), timeout=timeout)

    def connection(self) -> Connection:
        """This client's server and credentials, the bearer token re-read first (a projected service-account token
        rotates; an exec plugin's expires), so a login after a 401 gets the current one."""
        config = self._client.configuration
        authorization = config.get_api_key_with_prefix("BearerToken") or ""
        scheme, _, token = authorization.partition(" ")
        return Connection(server=config.host, ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl,
                          token=(token if scheme.lower() == "bearer" else authorization) or None,
                          certificate_path=config.cert_file, private_key_path=config.key_file)

    def close(self) -> None:
        """Drop queued requests (their callers are being cancelled anyway) and close the connection pool."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def _call(self, method: str, path: str, query: Mapping[str, str] | None, body: Any,
              content_type: str | None) -> tuple[int, Any]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if query:
            path = f"{path}?{urllib.parse.urlencode(query)}"
        method_, url, headers_, body_, post_ = self._client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"])
        try:
            response = self._client.call_api(method_, url, headers_, body_, post_, _request_timeout=self._timeout)
            response.read()
        except kubernetes.client.ApiException as err:
            raise KubeError(err.status or 0, str(err.reason), str(err.body)) from err
        except Exception as err:  # urllib3 transport errors: connection refused, timeouts
            raise KubeError(0, type(err).__name__, str(err)) from err
        raw = response.data or b""
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = raw.decode(errors="replace")
        if response.status >= 400:
            message = data.get("message", "") if isinstance(data, dict) else str(data)
            reason = data.get("reason", "") if isinstance(data, dict) else ""
            details = data.get("details") if isinstance(data, dict) else None
            causes = details.get("causes") if isinstance(details, dict) else None
            raise KubeError(response.status, reason or str(response.reason), message,
                            causes if isinstance(causes, list) else None)
        return response.status, data

    async def _request(self, method: str, path: str, *, query: Mapping[str, str] | None = None, body: Any = None,
                       content_type: str | None = None) -> Any:
        call = functools.partial(self._call, method, path, query, body, content_type)
        _, data = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        return data

    async def get(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = await self._request("GET", res.path(namespace, name))
        except KubeError as err:
            if err.not_found:
                return None
            raise
        return data

    async def list(self, res: Resource, namespace: str | None, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        data = await self._request("GET", res.path(namespace), query=query)
        items: list[dict[str, Any]] = data.get("items", []) if isinstance(data, dict) else []
        for item in items:  # list items omit apiVersion/kind on a real server
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items

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
        The body goes out as JSON text (JSON is YAML), so the client sends it as it is."""
        query = {"fieldManager": FIELD_MANAGER, **({"force": "true"} if force else {})}
        data: dict[str, Any] = await self._request("PATCH", res.path(namespace, name), query=query,
                                                   body=json.dumps(dict(body)), content_type=APPLY_PATCH)
        return data

    async def json_patch(self, res: Resource, namespace: str | None, name: str, ops: Sequence[Mapping[str, Any]]
                         ) -> dict[str, Any]:
        """RFC 6902 operations (a `test` of resourceVersion makes the write conditional)."""
        data: dict[str, Any] = await self._request("PATCH", res.path(namespace, name), body=[dict(op) for op in ops],
                                                   content_type="application/json-patch+json")
        return data

    async def delete(self, res: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._request("DELETE", res.path(namespace, name), body=body, content_type="application/json")
        except KubeError as err:
            if not err.not_found:
                raise

    async def emit_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        stamp = now_rfc3339()
        event = {
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
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
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
