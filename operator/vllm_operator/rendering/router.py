"""The router's objects: ConfigMap (`router.json`), ServiceAccount, Role and RoleBinding, and its Deployment.

`router.json` is `plan.router.to_wire()` as JSON with sorted keys (docs/architecture.md, RouterConfig); the pod
template carries the hash of that exact text as `constants.ANNOTATION_CONFIG_HASH`, so a config change rolls the router
pods while the engine Deployments, which do not depend on it, stay untouched. The router finds engine pods by watching
the pool Services' EndpointSlices (docs/architecture.md, Endpoint discovery), so its Role grants get/list/watch on
`discovery.k8s.io/endpointslices` and nothing else.

Every path the router reads is mounted where the RouterConfig says it is (api_keys_dir, tokenizer.path, the directory
of tokenizer.hfTokenFile), so the two cannot disagree. The router runs as a non-root user with a read-only root
filesystem; `/tmp` is an emptyDir, where the plan's `HF_HOME` points for a tokenizer downloaded from the Hub.
Replicas, image, resources, environment and the Secrets and ConfigMaps mounted are the plan's `routerPod`
(defaults in planning/pods.py).
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
from vllm_operator.rendering import common

CONTAINER = "router"
CONFIG_DIR = "/etc/vllm-operator/router"
CONFIG_PATH = f"{CONFIG_DIR}/{constants.ROUTER_CONFIG_KEY}"
TMP_DIR = "/tmp"
RUN_AS = 65532  # the conventional "nonroot" uid/gid of distroless images


def router_json(plan: Plan) -> str:
    """The ConfigMap's `router.json`: sorted keys, indented for reviewers of rendered manifests."""
    return json.dumps(plan.router.to_wire(), sort_keys=True, indent=2) + "\n"


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


def _mounts(plan: Plan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts), each path taken from the RouterConfig and each source from the plan's router pod."""
    name, pod, config = names.router(plan.name), plan.router_pod, plan.router
    vols: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": name}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": TMP_DIR},
    ]
    if config.api_keys_dir and pod.api_key_secret is not None:
        vols.append({"name": "api-keys", "secret": {"secretName": pod.api_key_secret}})
        mounts.append({"name": "api-keys", "mountPath": config.api_keys_dir, "readOnly": True})
    if config.tokenizer.path and pod.tokenizer_config_map is not None:
        vols.append({"name": "tokenizer", "configMap": {"name": pod.tokenizer_config_map}})
        mounts.append({"name": "tokenizer", "mountPath": config.tokenizer.path, "readOnly": True})
    token_file, token = config.tokenizer.hf_token_file, pod.hf_token_secret
    if token_file and token is not None:
        vols.append({"name": "hf-token", "secret": {
            "secretName": token.name, "items": [{"key": token.key, "path": posixpath.basename(token_file)}]}})
        mounts.append({"name": "hf-token", "mountPath": posixpath.dirname(token_file), "readOnly": True})
    return vols, mounts


def _probe(path: str, **timing: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http", "scheme": "HTTP"}, **timing}


def deployment(plan: Plan) -> common.Manifest:
    name, pod = names.router(plan.name), plan.router_pod
    vols, mounts = _mounts(plan)
    resources = {k: dict(v) for k, v in (("requests", pod.resources.requests), ("limits", pod.resources.limits)) if v}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pod.image,
        "command": ["vllm-operator", "router", "--config", CONFIG_PATH],
        "env": [{"name": k, "value": v} for k, v in sorted(pod.env.items())],
        "ports": [{"name": "http", "containerPort": plan.router.port, "protocol": "TCP"}],
        "resources": resources,
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
    if pod.image_pull_policy is not None:
        container["imagePullPolicy"] = pod.image_pull_policy
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
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pod.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(plan, name, labels(plan)),
        "spec": {
            "replicas": pod.replicas,
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
