"""What every renderer shares: the label contract, object metadata, content hashes and the order objects come out in.

The operator decides whether to patch a child by comparing one annotation (docs/architecture.md, Conventions: hash what
you render, compare hashes, not fields), so the hash must depend on nothing but the object's own content: canonical
JSON with sorted keys, computed before the hash annotation is added. Dict key order is normalised here too, so two
renders of the same plan are equal byte for byte whichever order a renderer happened to build its dicts in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan

Manifest = dict[str, Any]

# The order objects are listed in (and applied in by `kubectl apply -f`): identities and permissions first, then the
# configuration pods read, the network rules and Services they are reached through, disruption budgets, the
# workloads themselves, and last the monitoring objects whose CRDs may be absent.
KIND_ORDER: tuple[str, ...] = (
    "PersistentVolumeClaim",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "NetworkPolicy",
    "Service",
    "PodDisruptionBudget",
    "Deployment",
    "ScaledObject",
    "PodMonitor",
    "PrometheusRule",
)

HASH_LENGTH = 16  # hex digits: 64 bits, plenty to tell two renders apart and short enough to read in `kubectl get`


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the byte string hashes are computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any) -> str:
    """Short sha256 of a value's canonical JSON (or of a string as it is)."""
    text = value if isinstance(value, str) else canonical_json(value)
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def deployment_label(plan: Plan) -> str:
    """The value of the deployment label: the VLLMDeployment name, fitted into a 63-character label value."""
    return names.dns_label(plan.name)


def base_labels(plan: Plan, component: str) -> dict[str, str]:
    """The label contract (docs/architecture.md, Labels) shared by every child object of a VLLMDeployment."""
    return {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_INSTANCE: deployment_label(plan),
        constants.LABEL_COMPONENT: component,
        constants.LABEL_MANAGED_BY: constants.APP_NAME,
        constants.LABEL_DEPLOYMENT: deployment_label(plan),
    }


def pool_labels(plan: Plan, pool: str) -> dict[str, str]:
    """Labels of a pool's objects: the contract plus the pool."""
    return {**base_labels(plan, constants.COMPONENT_ENGINE), constants.LABEL_POOL: pool}


def engine_selector(plan: Plan, pool: str | None = None) -> dict[str, str]:
    """Pod selector for the engine pods of one pool (or of both pools when pool is None).

    Deployment selectors are immutable, so they hold only labels that never change for the life of the object.
    """
    selector = {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_DEPLOYMENT: deployment_label(plan),
        constants.LABEL_COMPONENT: constants.COMPONENT_ENGINE,
    }
    if pool is not None:
        selector[constants.LABEL_POOL] = pool
    return selector


def router_selector(plan: Plan) -> dict[str, str]:
    """Pod selector for the router pods."""
    return {
        constants.LABEL_NAME: constants.APP_NAME,
        constants.LABEL_DEPLOYMENT: deployment_label(plan),
        constants.LABEL_COMPONENT: constants.COMPONENT_ROUTER,
    }


def metadata(plan: Plan, name: str, labels: Mapping[str, str],
             annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Object metadata in the plan's namespace (no ownerReferences: the handler adopts)."""
    meta: dict[str, Any] = {"name": name, "namespace": plan.namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def sorted_dict(value: Any) -> Any:
    """Recursively rebuild dicts with sorted keys; lists keep their order (argv order matters)."""
    if isinstance(value, Mapping):
        return {k: sorted_dict(value[k]) for k in sorted(value)}
    if isinstance(value, list | tuple):
        return [sorted_dict(v) for v in value]
    return value


def finalize(obj: Manifest) -> Manifest:
    """Normalise key order and stamp the spec-hash annotation (hash of the object without that annotation)."""
    meta = obj.setdefault("metadata", {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != constants.ANNOTATION_SPEC_HASH}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    digest = content_hash(sorted_dict(obj))
    meta["annotations"] = {**annotations, constants.ANNOTATION_SPEC_HASH: digest}
    normalised: Manifest = sorted_dict(obj)
    return normalised


def sort_key(obj: Mapping[str, Any]) -> tuple[int, str]:
    kind = str(obj["kind"])
    index = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return index, str(obj["metadata"]["name"])


def env_list(env: Mapping[str, Mapping[str, Any]], first: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Container env from name -> EnvVar body (without name): the `first` names in that order (variables others may
    reference as $(VAR) must come earlier in the list), then the rest sorted by name."""
    order = [n for n in first if n in env] + sorted(n for n in env if n not in first)
    return [{"name": n, **env[n]} for n in order]
