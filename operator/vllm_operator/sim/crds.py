"""CustomResourceDefinitions: what a POSTed CRD registers, and how its objects are admitted.

On a real cluster a CRD is validated when created (one storage version, a structural schema, rules that compile),
becomes `Established`, and from then on every object of its kind is pruned, defaulted and validated against the
served version's schema. The operator's whole API surface is a CRD, so the emulator treats CRDs exactly that way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_operator.sim import errors
from vllm_operator.sim.errors import FieldCause
from vllm_operator.sim.schema import Issue, Structural, render_path

CRD_RESOURCE = ("apiextensions.k8s.io", "customresourcedefinitions")
_FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


@dataclass
class VersionDef:
    name: str
    served: bool
    storage: bool
    schema: Structural
    status: bool
    scale: tuple[str, str, str | None] | None
    selectable: frozenset[str]


@dataclass
class CustomResourceDefinition:
    name: str
    group: str
    plural: str
    singular: str
    kind: str
    list_kind: str
    short_names: list[str]
    categories: list[str]
    namespaced: bool
    versions: dict[str, VersionDef] = field(default_factory=dict)
    raw_names: dict[str, Any] = field(default_factory=dict)

    @property
    def storage_version(self) -> str:
        return next(v.name for v in self.versions.values() if v.storage)

    def served_versions(self) -> list[str]:
        return [v.name for v in self.versions.values() if v.served]

    def subresources(self, version: str) -> set[str]:
        found = self.versions.get(version)
        subs = set()
        if found is not None and found.status:
            subs.add("status")
        if found is not None and found.scale is not None:
            subs.add("scale")
        return subs

    def selectable_fields(self, version: str) -> frozenset[str]:
        found = self.versions.get(version)
        return found.selectable if found is not None else frozenset()

    def scale_paths(self, version: str) -> tuple[str, str, str | None] | None:
        found = self.versions.get(version)
        return found.scale if found is not None else None

    def initial_status(self) -> dict[str, Any]:
        """The status a real server reports within milliseconds: names accepted, established."""
        accepted = dict(self.raw_names)
        accepted.setdefault("singular", self.singular)
        accepted.setdefault("listKind", self.list_kind)
        conditions = [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": _now()},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": _now()},
        ]
        return {"conditions": conditions, "acceptedNames": accepted, "storedVersions": [self.storage_version]}

    def admit(self, obj: dict[str, Any], old: dict[str, Any] | None, *, version: str,
              params: Any) -> tuple[dict[str, Any], list[str]]:
        """Prune, default and validate an object of this kind; returns (object, warnings) or raises ApiError."""
        mode = params.get("fieldValidation") or "Warn"
        if mode not in _FIELD_VALIDATION:
            raise errors.bad_request(f'fieldValidation must be one of "Ignore", "Warn", "Strict", got "{mode}"')
        found = self.versions.get(version) or self.versions[self.storage_version]
        pruned, dropped = found.schema.prune(obj)
        if dropped and mode == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in dropped)
            raise errors.bad_request(f'{self.kind} in version "{version}" cannot be handled as a {self.kind}: '
                                     f"strict decoding error: {fields}")
        warnings = [f'unknown field "{path}"' for path in dropped] if mode == "Warn" else []
        defaulted = found.schema.apply_defaults(pruned)
        issues = found.schema.validate(defaulted, old)
        if old is not None:
            issues = _ratchet(issues, defaulted, old)
        if issues:
            name = (defaulted.get("metadata") or {}).get("name") or ""
            raise errors.invalid(self.kind, self.group, name, [i.cause for i in issues])
        return defaulted, warnings


def _ratchet(issues: list[Issue], new: dict[str, Any], old: dict[str, Any]) -> list[Issue]:
    """Validation ratcheting (on by default since 1.30): errors on values an update left unchanged are dropped."""
    kept = []
    for issue in issues:
        before, had = _lookup(old, issue.path)
        after, has = _lookup(new, issue.path)
        if had and has and before == after:
            continue
        kept.append(issue)
    return kept


def _lookup(obj: Any, path: tuple[str | int, ...]) -> tuple[Any, bool]:
    node = obj
    for part in path:
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                return None, False
            node = node[part]
        else:
            if not isinstance(node, dict) or part not in node:
                return None, False
            node = node[part]
    return node, True


def _now() -> str:
    import datetime

    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_crd(body: dict[str, Any]) -> CustomResourceDefinition:
    """Validate a CRD as the apiextensions API server does; raises a 422 ApiError listing every problem."""
    name = str((body.get("metadata") or {}).get("name") or "")
    causes: list[FieldCause] = []

    def problem(path: str, message: str, reason: str = "FieldValueInvalid") -> None:
        causes.append(FieldCause(path, reason, message))

    spec = body.get("spec") or {}
    names = spec.get("names") or {}
    group = str(spec.get("group") or "")
    plural = str(names.get("plural") or "")
    kind = str(names.get("kind") or "")
    if not group:
        problem("spec.group", "Required value", "FieldValueRequired")
    elif "." not in group:
        problem("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot')
    if not plural:
        problem("spec.names.plural", "Required value", "FieldValueRequired")
    if not kind:
        problem("spec.names.kind", "Required value", "FieldValueRequired")
    if plural and group and name != f"{plural}.{group}":
        problem("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
    scope = spec.get("scope")
    if scope not in ("Namespaced", "Cluster"):
        problem("spec.scope", f'Unsupported value: "{scope}": supported values: "Cluster", "Namespaced"',
                "FieldValueNotSupported")
    versions_spec = spec.get("versions") or []
    if not versions_spec:
        problem("spec.versions", "Invalid value: must have exactly one version marked as storage version")
    storage_count = sum(1 for v in versions_spec if v.get("storage"))
    if versions_spec and storage_count != 1:
        problem("spec.versions", f"Invalid value: {storage_count}: must have exactly one version marked as "
                                 "storage version")
    versions: dict[str, VersionDef] = {}
    for index, entry in enumerate(versions_spec):
        where = f"spec.versions[{index}]"
        vname = str(entry.get("name") or "")
        if not vname:
            problem(f"{where}.name", "Required value", "FieldValueRequired")
            continue
        raw_schema = ((entry.get("schema") or {}).get("openAPIV3Schema"))
        if not isinstance(raw_schema, dict):
            problem(f"{where}.schema.openAPIV3Schema", "Required value: schemas are required",
                    "FieldValueRequired")
            continue
        structural, problems = Structural.build(raw_schema)
        for path, message in problems:
            problem(f"{where}.schema.{path}", message)
        subresources = entry.get("subresources") or {}
        scale_spec = subresources.get("scale")
        scale = None
        if isinstance(scale_spec, dict):
            scale = (str(scale_spec.get("specReplicasPath", ".spec.replicas")).lstrip("."),
                     str(scale_spec.get("statusReplicasPath", ".status.replicas")).lstrip("."),
                     str(scale_spec["labelSelectorPath"]).lstrip(".") if scale_spec.get("labelSelectorPath")
                     else None)
        selectable = frozenset(str(f.get("jsonPath", "")).lstrip(".") for f in entry.get("selectableFields") or [])
        versions[vname] = VersionDef(
            name=vname, served=bool(entry.get("served", True)), storage=bool(entry.get("storage")),
            schema=structural, status="status" in subresources, scale=scale, selectable=selectable,
        )
    if causes:
        raise errors.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)
    return CustomResourceDefinition(
        name=name, group=group, plural=plural, singular=str(names.get("singular") or kind.lower()), kind=kind,
        list_kind=str(names.get("listKind") or f"{kind}List"), short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []), namespaced=scope == "Namespaced", versions=versions,
        raw_names=dict(names),
    )


__all__ = ["CRD_RESOURCE", "CustomResourceDefinition", "parse_crd", "render_path"]
