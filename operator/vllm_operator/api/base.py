"""The base every API model shares: camelCase on the wire, snake_case in Python, unknown fields refused.

Kubernetes objects are camelCase; Python code reads better in snake_case. One alias function maps between them and
spells the project's acronyms the way Kubernetes users expect (`numKVHeads`, `weightsGiB`), so no field needs a
hand-written alias.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

# Parts of a snake_case name that keep their own capitalisation in camelCase.
_SPECIAL_PARTS = {"kv": "KV", "gib": "GiB", "mib": "MiB", "oom": "OOM", "ttft": "TTFT"}


def to_camel(name: str) -> str:
    """`num_kv_heads` -> `numKVHeads`; `weights_gib` -> `weightsGiB`; `max_model_len` -> `maxModelLen`."""
    first, *rest = name.split("_")
    return first + "".join(_SPECIAL_PARTS.get(part, part[:1].upper() + part[1:]) for part in rest)


class ApiModel(BaseModel):
    """Strict camelCase model: extra fields are an error, not silently dropped (a real API server with
    `fieldValidation=Strict` refuses them too)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
        use_enum_values=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in Kubernetes / JSON: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
