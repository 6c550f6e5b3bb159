"""Defaulting and validation of the built-in kinds the operator writes, as kube-apiserver's strategies do them.

A renderer that puts a model name ("meta-llama/Llama-3.1-8B") into a label value, or a Deployment whose selector
does not match its template, works against a store that accepts anything and fails on every real cluster. So the
emulator refuses what the real server refuses for the kinds we create (metadata of every kind; Pods and pod
templates; Deployments, ReplicaSets, StatefulSets; Services; ConfigMaps and Secrets), with the same field paths,
and fills the defaults clients observe (`spec.replicas: 1`, container `imagePullPolicy`, Service ports' `protocol`
and `targetPort`, ...). It is not the whole of Kubernetes validation: kinds and fields not listed pass unchecked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from vllm_operator.sim.errors import FieldCause

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_WORKLOADS = frozenset({("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"),
                        ("apps", "daemonsets")})
_ANNOTATIONS_MAX = 256 * 1024

Causes = list[FieldCause]


def _invalid(field: str, value: Any, why: str) -> FieldCause:
    shown = json.dumps(value) if isinstance(value, (str, int, float, bool)) else json.dumps(value, sort_keys=True)
    return FieldCause(field, "FieldValueInvalid", f"Invalid value: {shown}: {why}")


def _required(field: str, why: str = "") -> FieldCause:
    return FieldCause(field, "FieldValueRequired", f"Required value{': ' + why if why else ''}")


def _qualified_name_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if "/" in prefix:
        return "a qualified name must consist of an optional DNS subdomain prefix and a name, separated by '/'"
    if prefix and (len(prefix) > 253 or not _PREFIX.match(prefix)):
        return "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, " \
               "'-' or '.', and must start and end with an alphanumeric character"
    if not name or len(name) > 63 or not _NAME.match(name):
        return "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with " \
               "an alphanumeric character (max 63 characters)"
    return None


def validate_metadata(meta: dict[str, Any], path: str = "metadata") -> Causes:
    causes: Causes = []
    for key, value in (meta.get("labels") or {}).items():
        problem = _qualified_name_problem(str(key))
        if problem:
            causes.append(_invalid(f"{path}.labels", key, problem))
        if not isinstance(value, str) or len(value) > 63 or (value and not _NAME.match(value)):
            causes.append(_invalid(f"{path}.labels", value,
                                   "a valid label must be an empty string or consist of alphanumeric characters, "
                                   "'-', '_' or '.', and must start and end with an alphanumeric character "
                                   "(max 63 characters)"))
    annotations = meta.get("annotations") or {}
    for key, value in annotations.items():
        problem = _qualified_name_problem(str(key))
        if problem:
            causes.append(_invalid(f"{path}.annotations", key, problem))
        if not isinstance(value, str):
            causes.append(_invalid(f"{path}.annotations", value, "annotation values must be strings"))
    size = sum(len(str(k)) + len(str(v)) for k, v in annotations.items())
    if size > _ANNOTATIONS_MAX:
        causes.append(FieldCause(f"{path}.annotations", "FieldValueTooLong",
                                 f"Too long: may not be more than {_ANNOTATIONS_MAX} bytes"))
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                causes.append(_required(f"{path}.ownerReferences[{i}].{field}"))
        controllers += 1 if ref.get("controller") else 0
    if controllers > 1:
        causes.append(_invalid(f"{path}.ownerReferences", meta.get("ownerReferences"),
                               "Only one reference can have Controller set to true"))
    return causes


# ---------------------------------------------------------------------------------------------------- defaults
def _pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def default_pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            if not isinstance(container, dict):
                continue
            if isinstance(container.get("image"), str):
                container.setdefault("imagePullPolicy", _pull_policy(container["image"]))
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("resources", {})
            for port in container.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")


def _default_template(obj: dict[str, Any]) -> None:
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        template.setdefault("metadata", {})
        default_pod_spec(template["spec"])


def apply_defaults(group_plural: tuple[str, str], obj: dict[str, Any],
                   allocate_ip: Callable[[], str]) -> None:
    """Fill server-side defaults in place (on every create and update, as decoding does)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if group_plural == ("", "pods"):
        default_pod_spec(spec)
        spec.setdefault("serviceAccountName", "default")  # the ServiceAccount admission plugin
        spec.setdefault("enableServiceLinks", True)
    elif group_plural == ("apps", "deployments"):
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {})
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxUnavailable", "25%")
            rolling.setdefault("maxSurge", "25%")
        _default_template(obj)
    elif group_plural == ("apps", "replicasets"):
        spec.setdefault("replicas", 1)
        _default_template(obj)
    elif group_plural == ("apps", "statefulsets"):
        spec.setdefault("replicas", 1)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        _default_template(obj)
    elif group_plural == ("apps", "daemonsets"):
        _default_template(obj)
    elif group_plural == ("", "services"):
        kind = spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        if kind != "ExternalName":
            if not spec.get("clusterIP"):
                spec["clusterIP"] = allocate_ip()
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            if spec["clusterIP"] != "None":
                spec.setdefault("ipFamilies", ["IPv4"])
                spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])


# ------------------------------------------------------------------------------------------------- validation
def validate_pod_spec(spec: Any, path: str) -> Causes:
    if not isinstance(spec, dict):
        return [_required(path)]
    causes: Causes = []
    containers = spec.get("containers")
    if not containers:
        causes.append(_required(f"{path}.containers"))
    seen: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            if not isinstance(container, dict):
                causes.append(_invalid(where, container, "must be an object"))
                continue
            name = container.get("name")
            if not name:
                causes.append(_required(f"{where}.name"))
            elif not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
                causes.append(_invalid(f"{where}.name", name, "a lowercase RFC 1123 label must consist of lower "
                                       "case alphanumeric characters or '-', and must start and end with an "
                                       "alphanumeric character"))
            elif name in seen:
                causes.append(FieldCause(f"{where}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
            else:
                seen.add(name)
            if not container.get("image"):
                causes.append(_required(f"{where}.image"))
            for j, port in enumerate(container.get("ports") or []):
                number = port.get("containerPort") if isinstance(port, dict) else None
                if not isinstance(number, int) or not 1 <= number <= 65535:
                    causes.append(_invalid(f"{where}.ports[{j}].containerPort", number,
                                           "must be between 1 and 65535, inclusive"))
            for j, env in enumerate(container.get("env") or []):
                if not isinstance(env, dict) or not env.get("name"):
                    causes.append(_required(f"{where}.env[{j}].name"))
    return causes


def _selector_matches(selector: dict[str, Any], labels: dict[str, Any]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (op == "In" and (not present or labels[key] not in values)) or \
                (op == "NotIn" and present and labels[key] in values) or \
                (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


def _validate_workload(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec") or {}
    causes: Causes = []
    replicas = spec.get("replicas")
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        causes.append(_invalid("spec.replicas", replicas, "must be greater than or equal to 0"))
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(_required("spec.selector") if not selector else
                      _invalid("spec.selector", selector, "empty selector is invalid for deployment"))
    template = spec.get("template")
    if not isinstance(template, dict):
        causes.append(_required("spec.template"))
        return causes
    labels = (template.get("metadata") or {}).get("labels") or {}
    if isinstance(selector, dict) and (selector.get("matchLabels") or selector.get("matchExpressions")) and \
            not _selector_matches(selector, labels):
        causes.append(_invalid("spec.template.metadata.labels", labels,
                               "`selector` does not match template `labels`"))
    causes += validate_metadata(template.get("metadata") or {}, "spec.template.metadata")
    causes += validate_pod_spec(template.get("spec"), "spec.template.spec")
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        causes.append(_invalid("spec.selector", selector, "field is immutable"))
    return causes


def _validate_service(obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    spec = obj.get("spec") or {}
    causes: Causes = []
    kind = spec.get("type", "ClusterIP")
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        causes.append(FieldCause("spec.type", "FieldValueNotSupported",
                                 f'Unsupported value: "{kind}": supported values: "ClusterIP", "ExternalName", '
                                 '"LoadBalancer", "NodePort"'))
    ports = spec.get("ports") or []
    if not ports and kind != "ExternalName" and spec.get("clusterIP") != "None":
        causes.append(_required("spec.ports"))
    names = [p.get("name") for p in ports if isinstance(p, dict)]
    for i, port in enumerate(ports):
        number = port.get("port") if isinstance(port, dict) else None
        if not isinstance(number, int) or not 1 <= number <= 65535:
            causes.append(_invalid(f"spec.ports[{i}].port", number, "must be between 1 and 65535, inclusive"))
        if len(ports) > 1 and not (isinstance(port, dict) and port.get("name")):
            causes.append(_required(f"spec.ports[{i}].name"))
    duplicates = {n for n in names if n and names.count(n) > 1}
    for name in sorted(duplicates):
        causes.append(FieldCause("spec.ports", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
    old_ip = ((old or {}).get("spec") or {}).get("clusterIP")
    if old is not None and old_ip and spec.get("clusterIP") not in (None, old_ip):
        causes.append(_invalid("spec.clusterIPs[0]", spec.get("clusterIP"), "may not change once set"))
    return causes


def _validate_keys(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    for section in ("data", "binaryData", "stringData"):
        for key in obj.get(section) or {}:
            if len(key) > 253 or not _CONFIG_KEY.match(key):
                causes.append(_invalid(f"{section}[{key}]", key, "a valid config key must consist of alphanumeric "
                                       "characters, '-', '_' or '.'"))
    return causes


def validate(group_plural: tuple[str, str], obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
    """Field errors the real server would report for this built-in object (empty when it is acceptable)."""
    causes = validate_metadata(obj.get("metadata") or {})
    if group_plural in _WORKLOADS:
        causes += _validate_workload(obj, old)
    elif group_plural == ("", "pods"):
        causes += validate_pod_spec(obj.get("spec"), "spec")
    elif group_plural == ("", "services"):
        causes += _validate_service(obj, old)
    elif group_plural in (("", "configmaps"), ("", "secrets")):
        causes += _validate_keys(obj)
        if old is not None and old.get("immutable") and (
                {k: old.get(k) for k in ("data", "binaryData")} != {k: obj.get(k) for k in ("data", "binaryData")}):
            causes.append(FieldCause("data", "FieldValueForbidden",
                                     "Forbidden: field is immutable when `immutable` is set"))
    return causes
