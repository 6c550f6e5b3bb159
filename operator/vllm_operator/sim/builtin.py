"""Per-kind behaviour of the built-in resources that a generic store would get wrong.

The real API server runs a "strategy" per kind: Pods start `Pending` whatever status the client sent, ConfigMaps have
no `generation`, deleting a Pod returns the Pod but deleting a ConfigMap returns a `Status`, Pods can be listed by
`spec.nodeName`. These tables hold exactly the differences our clients can observe; everything else is generic.
"""

from __future__ import annotations

from typing import Any, Final

GroupPlural = tuple[str, str]

# Groups that kmock's bundled discovery data carries but a vanilla cluster does not serve (CRDs, aggregated APIs).
NON_BUILTIN_GROUPS: Final = frozenset({"gateway.networking.k8s.io", "metrics.k8s.io"})

# Status the server sets on create, discarding what the client sent (kinds with a status subresource that are
# absent here get an empty status; nodes keep theirs — the kubelet registers a Node with its capacity).
STATUS_ON_CREATE: Final[dict[GroupPlural, dict[str, Any]]] = {
    ("", "pods"): {"phase": "Pending"},
    ("", "namespaces"): {"phase": "Active"},
}
STATUS_KEPT_ON_CREATE: Final = frozenset({("", "nodes"), ("apiextensions.k8s.io", "customresourcedefinitions")})

# Kinds whose objects carry metadata.generation (their strategies set and bump it); custom resources always do.
HAS_GENERATION: Final = frozenset({
    ("", "pods"), ("", "replicationcontrollers"),
    ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets"),
    ("batch", "jobs"), ("batch", "cronjobs"),
    ("autoscaling", "horizontalpodautoscalers"), ("policy", "poddisruptionbudgets"),
    ("networking.k8s.io", "ingresses"), ("networking.k8s.io", "networkpolicies"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
})

# Stores with ReturnDeletedObject: a DELETE answers with the object rather than a Status.
RETURN_DELETED_OBJECT: Final = frozenset({
    ("", "pods"), ("", "serviceaccounts"), ("storage.k8s.io", "storageclasses"),
})

# Field selectors beyond metadata.name / metadata.namespace, per kind (from each kind's GetAttrs).
EXTRA_FIELD_SELECTORS: Final[dict[GroupPlural, frozenset[str]]] = {
    ("", "pods"): frozenset({
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
    }),
    ("", "events"): frozenset({
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
        "reason", "reportingComponent", "source", "type",
    }),
    ("events.k8s.io", "events"): frozenset({"regarding.kind", "regarding.name", "regarding.namespace",
                                            "reason", "type", "reportingController"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("apps", "replicasets"): frozenset({"status.replicas"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
}

# Namespaces every cluster starts with.
INITIAL_NAMESPACES: Final = ("default", "kube-system", "kube-public", "kube-node-lease")

# Kinds with a `scale` subresource and where their replica count and selector live.
SCALE_PATHS: Final[dict[GroupPlural, tuple[str, str, str]]] = {
    ("apps", "deployments"): ("spec.replicas", "status.replicas", "spec.selector"),
    ("apps", "replicasets"): ("spec.replicas", "status.replicas", "spec.selector"),
    ("apps", "statefulsets"): ("spec.replicas", "status.replicas", "spec.selector"),
    ("", "replicationcontrollers"): ("spec.replicas", "status.replicas", "spec.selector"),
}
