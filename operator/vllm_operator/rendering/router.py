"""The router's objects: ConfigMap (`router.json`), ServiceAccount, Role and RoleBinding, and its Deployment.

`router.json` is `plan.router.to_wire()` as JSON with sorted keys (docs/architecture.md, RouterConfig); the pod
template carries the hash of that exact text as `constants.ANNOTATION_CONFIG_HASH`, so a config change rolls the router
pods while the engine Deployments, which do not depend on it, stay untouched. The router finds engine pods by watching
the pool Services' EndpointSlices (docs/architecture.md, Endpoint discovery), so its Role grants get/list/watch on
`discovery.k8s.io/endpointslices` and nothing else.

Every path the router reads is mounted where the RouterConfig says it is (api_keys_dir, tokenizer.path, the directory
of tokenizer.hfTokenFile), so the two cannot disagree. The router runs as a non-root user with a read-only root
filesystem; `/tmp` is an emptyDir and `HF_HOME` points into it for a tokenizer downloaded from the Hub.

Defaults: 2 replicas (one node drain or one crash never takes the endpoint away), the project's router image, and
requests of 250m CPU / 512 MiB (a tokenizer such as Llama-3's takes a few hundred MiB) with a 1 GiB memory limit.
Probes: readiness is `/health` (503 while no pool has a healthy engine, so Services skip a router that cannot
serve); startup and liveness are `/livez` (the process answers), because engines that take minutes to load must not
make the kubelet restart routers. Startup allows 2 minutes for a tokenizer download.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan
from vllm_operator.api.spec import VLLMDeploymentSpec
from vllm_operator.images import DEFAULT_IMAGES, ImageDefaults
from vllm_operator.rendering import common

DEFAULT_REPLICAS = 2
DEFAULT_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
CONTAINER = "router"
CONFIG_DIR = "/etc/vllm-operator/router"
CONFIG_PATH = f"{CONFIG_DIR}/{constants.ROUTER_CONFIG_KEY}"
TMP_DIR = "/tmp"
RUN_AS = 65532  # the conventional "nonroot" uid/gid of distroless images
HF_TOKEN_FILE_KEY = "token"


def router_json(plan: Plan) -> str:
    """The ConfigMap's `router.json`: sorted keys, indented for reviewers of rendered manifests."""
    return json.dumps(plan.router.to_wire(), sort_keys=True, indent=2) + "\n"


def replicas(spec: VLLMDeploymentSpec) -> int:
    if spec.router is not None and spec.router.replicas is not None:
        return spec.router.replicas
    return DEFAULT_REPLICAS


def labels(plan: Plan) -> dict[str, str]:
    return common.base_labels(plan, constants.COMPONENT_ROUTER)


def config_map(plan: Plan) -> common.Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": common.metadata(plan, names.router(plan.name), labels(plan)),
        "data": {constants.ROUTER_CONFIG_KEY: router_json(plan)},
    }


def service_account(plan: Plan) -> common.Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": common.metadata(plan, names.router(plan.name), labels(plan)),
    }


def role(plan: Plan) -> common.Manifest:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": common.metadata(plan, names.router(plan.name), labels(plan)),
        "rules": [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                   "verbs": ["get", "list", "watch"]}],
    }


def role_binding(plan: Plan) -> common.Manifest:
    name = names.router(plan.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": common.metadata(plan, name, labels(plan)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": plan.namespace}],
    }


def _mounts(plan: Plan, spec: VLLMDeploymentSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts), each path taken from the RouterConfig."""
    name = names.router(plan.name)
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": name}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_DIR},
    ]
    routing = spec.routing
    if plan.router.api_keys_dir and routing is not None and routing.api_key_secret_ref is not None:
        vols.append({"name": "api-keys", "secret": {"secretName": routing.api_key_secret_ref.name}})
        mounts.append({"name": "api-keys", "mountPath": plan.router.api_keys_dir, "readOnly": True})
    tokenizer = spec.model.tokenizer
    if plan.router.tokenizer.path and tokenizer is not None and tokenizer.config_map is not None:
        vols.append({"name": "tokenizer", "configMap": {"name": tokenizer.config_map.name}})
        mounts.append({"name": "tokenizer", "mountPath": plan.router.tokenizer.path, "readOnly": True})
    token_file = plan.router.tokenizer.hf_token_file
    token_ref = _hf_token_ref(spec)
    if token_file and token_ref is not None:
        vols.append({"name": "hf-token", "secret": {
            "secretName": token_ref[0], "items": [{"key": token_ref[1], "path": posixpath.basename(token_file)}]}})
        mounts.append({"name": "hf-token", "mountPath": posixpath.dirname(token_file), "readOnly": True})
    return vols, mounts


def _hf_token_ref(spec: VLLMDeploymentSpec) -> tuple[str, str] | None:
    """The Secret key holding the HF token for the tokenizer: the tokenizer's own source, else the model's."""
    sources = []
    if spec.model.tokenizer is not None:
        sources.append(spec.model.tokenizer.hugging_face)
    if spec.model.source is not None:
        sources.append(spec.model.source.hugging_face)
    for hub in sources:
        if hub is not None and hub.token_secret_ref is not None:
            return hub.token_secret_ref.name, hub.token_secret_ref.key
    return None


def _probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http", "scheme": "HTTP"}, **timing}


def deployment(plan: Plan, spec: VLLMDeploymentSpec, images: ImageDefaults = DEFAULT_IMAGES) -> common.Manifest:
    name = names.router(plan.name)
    vols, mounts = _mounts(plan, spec)
    router_spec = spec.router
    resources: dict[str, Any] = {k: dict(v) for k, v in DEFAULT_RESOURCES.items()}
    if router_spec is not None and router_spec.resources is not None:
        if router_spec.resources.requests is not None:
            resources["requests"] = dict(router_spec.resources.requests)
        if router_spec.resources.limits is not None:
            resources["limits"] = dict(router_spec.resources.limits)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": (router_spec.image if router_spec is not None and router_spec.image else images.router()),
        "command": ["vllm-operator", "router", "--config", CONFIG_PATH],
        "env": [{"name": "HF_HOME", "value": f"{TMP_DIR}/hf-home"}],
        "ports": [{"name": "http", "containerPort": plan.router.port, "protocol": "TCP"}],
        "resources": {k: v for k, v in resources.items() if v},
        "volumeMounts": mounts,
        "startupProbe": _probe("/livez", periodSeconds=2, timeoutSeconds=2, failureThreshold=60,
                               successThreshold=1),
        "readinessProbe": _probe("/health", periodSeconds=5, timeoutSeconds=2, failureThreshold=3,
                                 successThreshold=1),
        "livenessProbe": _probe("/livez", periodSeconds=10, timeoutSeconds=3, failureThreshold=3,
                                successThreshold=1),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.engine is not None and spec.engine.image_pull_policy is not None:
        container["imagePullPolicy"] = spec.engine.image_pull_policy
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": vols,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "fsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # Spread replicas over nodes when there are several; never block scheduling for it.
        "topologySpreadConstraints": [{
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": common.router_selector(plan)},
        }],
    }
    own = [s.name for s in (spec.engine.image_pull_secrets or [])] if spec.engine is not None else []
    if pull_secrets := images.pull_secret_refs(own):
        pod_spec["imagePullSecrets"] = pull_secrets
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(plan, name, labels(plan)),
        "spec": {
            "replicas": replicas(spec),
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": common.router_selector(plan)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels(plan),
                    "annotations": {
                        constants.ANNOTATION_CONFIG_HASH: common.content_hash(router_json(plan)),
                        "kubectl.kubernetes.io/default-container": CONTAINER,
                    },
                },
                "spec": pod_spec,
            },
        },
    }
