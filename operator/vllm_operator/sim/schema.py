"""Structural-schema admission of custom resources: prune, default, validate — in the API server's order.

A real API server silently drops every field a CRD's schema does not declare (status fields included), fills in
`default`s, and refuses invalid objects with 422 and one cause per field. An operator whose status writes include an
undeclared field "works" against a naive fake and loses that field in production, so this module reproduces the
three steps and the wording of the server's field errors (`spec.x: Invalid value: 3: spec.x in body should be
less than or equal to 2`).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm_operator.sim.cel import CelCompileError, CompiledRule, compile_rule
from vllm_operator.sim.errors import FieldCause

Path = tuple[str | int, ...]

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
})


def render_path(path: Path) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif out:
            out += f".{part}"
        else:
            out = part
    return out


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _show(value: Any) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return json.dumps(value)
    return f'"{_type_name(value)}"'


@dataclass
class Issue:
    path: Path
    cause: FieldCause


@dataclass
class Structural:
    """A CRD version's openAPIV3Schema with its CEL rules compiled."""

    schema: dict[str, Any]
    rules: dict[int, list[CompiledRule]] = field(default_factory=dict)

    @classmethod
    def build(cls, schema: dict[str, Any]) -> tuple[Structural, list[tuple[str, str]]]:
        """Compile; returns the structural schema and (schema path, problem) pairs that make the CRD invalid."""
        built = cls(schema)
        problems: list[tuple[str, str]] = []
        built._walk_compile(schema, "openAPIV3Schema", problems)
        return built, problems

    def _walk_compile(self, node: dict[str, Any], where: str, problems: list[tuple[str, str]]) -> None:
        if not isinstance(node, dict):
            problems.append((where, "must be an object"))
            return
        if ("type" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
                and not node.get("x-kubernetes-int-or-string") and where != "openAPIV3Schema"
                and not any(k in node for k in ("allOf", "anyOf", "oneOf", "not"))):
            problems.append((f"{where}.type", "Required value: must not be empty for specified object fields"))
        if where == "openAPIV3Schema" and node.get("type") not in ("object", None):
            problems.append((f"{where}.type", 'Invalid value: must be object at the root'))
        compiled = []
        for index, rule in enumerate(node.get("x-kubernetes-validations") or []):
            try:
                compiled.append(compile_rule(rule))
            except CelCompileError as exc:
                problems.append((f"{where}.x-kubernetes-validations[{index}].rule", f"Invalid value: {exc}"))
        if compiled:
            self.rules[id(node)] = compiled
        for name, sub in (node.get("properties") or {}).items():
            self._walk_compile(sub, f"{where}.properties[{name}]", problems)
        if isinstance(node.get("items"), dict):
            self._walk_compile(node["items"], f"{where}.items", problems)
        if isinstance(node.get("additionalProperties"), dict):
            self._walk_compile(node["additionalProperties"], f"{where}.additionalProperties", problems)

    # ------------------------------------------------------------------------------------------------ prune
    def prune(self, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Drop undeclared fields; returns the pruned copy and the dotted paths of what was dropped."""
        dropped: list[str] = []
        result: dict[str, Any] = {}
        props = self.schema.get("properties") or {}
        for key, value in obj.items():
            if key in ("apiVersion", "kind"):
                result[key] = value
            elif key == "metadata":
                result[key] = self._prune_meta(value, ("metadata",), dropped)
            elif key in props:
                result[key] = self._prune(value, props[key], (key,), dropped)
            elif self.schema.get("x-kubernetes-preserve-unknown-fields"):
                result[key] = value
            else:
                dropped.append(key)
        return result, dropped

    def _prune_meta(self, meta: Any, path: Path, dropped: list[str]) -> Any:
        if not isinstance(meta, dict):
            return meta
        kept = {}
        for key, value in meta.items():
            if key in OBJECT_META_FIELDS:
                kept[key] = value
            else:
                dropped.append(render_path((*path, key)))
        return kept

    def _prune(self, value: Any, node: dict[str, Any], path: Path, dropped: list[str]) -> Any:
        if isinstance(value, dict):
            if node.get("x-kubernetes-embedded-resource"):
                value = dict(value)
                if "metadata" in value:
                    value["metadata"] = self._prune_meta(value["metadata"], (*path, "metadata"), dropped)
            props = node.get("properties")
            additional = node.get("additionalProperties")
            preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
            out = {}
            for key, item in value.items():
                if props and key in props:
                    out[key] = self._prune(item, props[key], (*path, key), dropped)
                elif isinstance(additional, dict):
                    out[key] = self._prune(item, additional, (*path, key), dropped)
                elif additional is True or preserve or (
                        node.get("x-kubernetes-embedded-resource") and key in ("apiVersion", "kind", "metadata")):
                    out[key] = item
                else:
                    dropped.append(render_path((*path, key)))
            return out
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            return [self._prune(item, node["items"], (*path, i), dropped) for i, item in enumerate(value)]
        return value

    # ---------------------------------------------------------------------------------------------- default
    def apply_defaults(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Fill `default`s (and drop nulls that are not nullable, which the server prunes before defaulting)."""
        result = copy.deepcopy(obj)
        self._default(result, self.schema)
        return result

    def _default(self, value: Any, node: dict[str, Any]) -> None:
        if isinstance(value, dict):
            props = node.get("properties") or {}
            for key, sub in props.items():
                if key in value and value[key] is None and not sub.get("nullable") and "default" in sub:
                    del value[key]
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                if key in value:
                    self._default(value[key], sub)
            additional = node.get("additionalProperties")
            if isinstance(additional, dict):
                for key, item in value.items():
                    if key not in props:
                        self._default(item, additional)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for item in value:
                self._default(item, node["items"])

    # --------------------------------------------------------------------------------------------- validate
    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Issue]:
        issues: list[Issue] = []
        props = self.schema.get("properties") or {}
        for key, sub in props.items():
            if key in ("metadata", "apiVersion", "kind"):
                continue
            if key in obj:
                old_value = old.get(key) if isinstance(old, dict) else None
                has_old = isinstance(old, dict) and key in old
                self._validate(obj[key], sub, (key,), old_value, has_old, issues)
        for req in self.schema.get("required") or []:
            if req not in obj:
                issues.append(Issue((req,), FieldCause(req, "FieldValueRequired", "Required value")))
        self._run_rules(obj, self.schema, (), old, old is not None, issues)
        return issues

    def _run_rules(self, value: Any, node: dict[str, Any], path: Path, old: Any, has_old: bool,
                   issues: list[Issue]) -> None:
        rules = self.rules.get(id(node), [])
        unchanged = has_old and bool(rules) and value == old
        for rule in rules:
            if unchanged and not rule.uses_old_self:
                # Validation ratcheting (KEP-4008, GA in Kubernetes 1.30): an update does not fail on a rule over
                # a value it did not change, so it need not be evaluated. Status writes (the operator's most
                # frequent write) leave the spec and its rules alone this way, as on a real API server.
                continue
            passed, message = rule.evaluate(value, old, has_old)
            if passed is None or passed:
                continue
            target = path
            if rule.field_path:
                target = (*path, *[p for p in re.split(r"\.", rule.field_path.lstrip(".")) if p])
            shown = render_path(target) or "<nil>"
            if rule.reason == "FieldValueRequired":
                text = f"Required value: {message}"
            elif rule.reason == "FieldValueForbidden":
                text = f"Forbidden: {message}"
            elif rule.reason == "FieldValueDuplicate":
                text = f'Duplicate value: "{_type_name(value)}": {message}'
            else:
                text = f'Invalid value: "{_type_name(value)}": {message}'
            issues.append(Issue(target, FieldCause(shown if path or rule.field_path else "<nil>", rule.reason, text)))

    def _validate(self, value: Any, node: dict[str, Any], path: Path, old: Any, has_old: bool,
                  issues: list[Issue]) -> None:
        where = render_path(path)
        if value is None:
            if node.get("nullable"):
                return
            expected = node.get("type")
            if expected:
                issues.append(Issue(path, FieldCause(where, "FieldValueTypeInvalid",
                                                     f'Invalid value: "null": {where} in body must be of type '
                                                     f'{expected}: "null"')))
            return
        if not self._type_ok(value, node, path, issues):
            return
        before = len(issues)
        self._value_checks(value, node, path, issues)
        if isinstance(value, dict):
            props = node.get("properties") or {}
            for key, sub in props.items():
                if key in value:
                    old_item = old.get(key) if isinstance(old, dict) else None
                    self._validate(value[key], sub, (*path, key), old_item, isinstance(old, dict) and key in old,
                                   issues)
            for req in node.get("required") or []:
                if req not in value:
                    issues.append(Issue((*path, req), FieldCause(render_path((*path, req)), "FieldValueRequired",
                                                                 "Required value")))
            additional = node.get("additionalProperties")
            if isinstance(additional, dict):
                for key, item in value.items():
                    if key not in props:
                        old_item = old.get(key) if isinstance(old, dict) else None
                        self._validate(item, additional, (*path, key), old_item,
                                       isinstance(old, dict) and key in old, issues)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            items = node["items"]
            old_by_key = self._correlate(node, old)
            for i, item in enumerate(value):
                old_item, has = self._old_item(node, item, old_by_key)
                self._validate(item, items, (*path, i), old_item, has, issues)
        if len(issues) == before:
            self._run_rules(value, node, path, old, has_old, issues)

    @staticmethod
    def _correlate(node: dict[str, Any], old: Any) -> dict[Any, Any] | None:
        if node.get("x-kubernetes-list-type") != "map" or not isinstance(old, list):
            return None
        keys = node.get("x-kubernetes-list-map-keys") or []
        return {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}

    @staticmethod
    def _old_item(node: dict[str, Any], item: Any, old_by_key: dict[Any, Any] | None) -> tuple[Any, bool]:
        if old_by_key is None or not isinstance(item, dict):
            return None, False
        key = tuple(item.get(k) for k in node.get("x-kubernetes-list-map-keys") or [])
        return old_by_key.get(key), key in old_by_key

    def _type_ok(self, value: Any, node: dict[str, Any], path: Path, issues: list[Issue]) -> bool:
        where = render_path(path)
        if node.get("x-kubernetes-int-or-string"):
            ok = isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                issues.append(Issue(path, FieldCause(where, "FieldValueTypeInvalid",
                                                     f'Invalid value: "{_type_name(value)}": {where} in body must '
                                                     f'be of type integer,string: "{_type_name(value)}"')))
            return ok
        expected = node.get("type")
        if expected is None:
            return True
        actual = _type_name(value)
        ok = (actual == expected or (expected == "number" and actual == "integer")
              or (expected == "integer" and isinstance(value, float) and value.is_integer()))
        if not ok:
            issues.append(Issue(path, FieldCause(where, "FieldValueTypeInvalid",
                                                 f'Invalid value: "{actual}": {where} in body must be of type '
                                                 f'{expected}: "{actual}"')))
        return ok

    def _value_checks(self, value: Any, node: dict[str, Any], path: Path, issues: list[Issue]) -> None:
        where = render_path(path)

        def add(reason: str, message: str) -> None:
            issues.append(Issue(path, FieldCause(where, reason, message)))

        if "enum" in node and value not in node["enum"]:
            supported = ", ".join(json.dumps(v) for v in node["enum"])
            add("FieldValueNotSupported", f"Unsupported value: {_show(value)}: supported values: {supported}")
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            minimum, maximum = node.get("minimum"), node.get("maximum")
            if minimum is not None:
                if node.get("exclusiveMinimum") and value <= minimum:
                    add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be greater "
                                             f"than {_num(minimum)}")
                elif value < minimum:
                    add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be greater "
                                             f"than or equal to {_num(minimum)}")
            if maximum is not None:
                if node.get("exclusiveMaximum") and value >= maximum:
                    add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be less "
                                             f"than {_num(maximum)}")
                elif value > maximum:
                    add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be less "
                                             f"than or equal to {_num(maximum)}")
            multiple = node.get("multipleOf")
            if multiple and (value / multiple) != int(value / multiple):
                add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be a multiple "
                                         f"of {_num(multiple)}")
        if isinstance(value, str):
            if "maxLength" in node and len(value) > node["maxLength"]:
                add("FieldValueTooLong", f"Too long: may not be more than {node['maxLength']} bytes")
            if "minLength" in node and len(value) < node["minLength"]:
                add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should be at least "
                                         f"{node['minLength']} chars long")
            pattern = node.get("pattern")
            if pattern and not re.search(pattern, value):
                add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body should match "
                                         f"'{pattern}'")
            fmt = node.get("format")
            if fmt and not _format_ok(fmt, value):
                add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body must be of type "
                                         f"{fmt}: {_show(value)}")
        if isinstance(value, list):
            if "maxItems" in node and len(value) > node["maxItems"]:
                add("FieldValueTooMany", f"Too many: {len(value)}: must have at most {node['maxItems']} items")
            if "minItems" in node and len(value) < node["minItems"]:
                add("FieldValueInvalid", f"Invalid value: {len(value)}: {where} in body should have at least "
                                         f"{node['minItems']} items")
            list_type = node.get("x-kubernetes-list-type")
            if list_type in ("set", "map"):
                keys = node.get("x-kubernetes-list-map-keys") or []
                seen: list[Any] = []
                for i, item in enumerate(value):
                    ident = tuple(item.get(k) for k in keys) if list_type == "map" and isinstance(item, dict) \
                        else item
                    if ident in seen:
                        shown = _show(item) if list_type == "set" else json.dumps(
                            {k: item.get(k) for k in keys}) if isinstance(item, dict) else _show(item)
                        issues.append(Issue((*path, i), FieldCause(render_path((*path, i)), "FieldValueDuplicate",
                                                                   f"Duplicate value: {shown}")))
                    else:
                        seen.append(ident)
        if isinstance(value, dict):
            if "maxProperties" in node and len(value) > node["maxProperties"]:
                add("FieldValueTooMany", f"Too many: {len(value)}: must have at most {node['maxProperties']} items")
            if "minProperties" in node and len(value) < node["minProperties"]:
                add("FieldValueInvalid", f"Invalid value: {len(value)}: {where} in body should have at least "
                                         f"{node['minProperties']} properties")
        for branch in node.get("allOf") or []:
            self._value_checks(value, branch, path, issues)
        if node.get("anyOf") and not any(self._branch_ok(value, b, path) for b in node["anyOf"]):
            add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body must match at least "
                                     "one schema in anyOf")
        if node.get("oneOf"):
            matching = sum(1 for b in node["oneOf"] if self._branch_ok(value, b, path))
            if matching != 1:
                add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body must match exactly one "
                                         "schema in oneOf")
        if isinstance(node.get("not"), dict) and self._branch_ok(value, node["not"], path):
            add("FieldValueInvalid", f"Invalid value: {_show(value)}: {where} in body must not match the schema "
                                     "in not")

    def _branch_ok(self, value: Any, branch: dict[str, Any], path: Path) -> bool:
        scratch: list[Issue] = []
        if not self._type_ok(value, branch, path, scratch):
            return False
        self._value_checks(value, branch, path, scratch)
        if isinstance(value, dict):
            for req in branch.get("required") or []:
                if req not in value:
                    return False
        return not scratch


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _format_ok(fmt: str, value: str) -> bool:
    if fmt == "date-time":
        return bool(_DATE_TIME.match(value))
    if fmt == "date":
        return bool(re.match(r"^\d{4}-\d{2}-\d{2}$", value))
    if fmt == "byte":
        return bool(re.match(r"^[A-Za-z0-9+/]*={0,2}$", value)) and len(value) % 4 == 0
    return True  # other formats are not enforced by the API server either (or only loosely)


def iter_paths(issues: list[Issue]) -> Iterator[Path]:
    for issue in issues:
        yield issue.path
