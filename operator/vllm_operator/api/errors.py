"""SpecError: the one error type for "this VLLMDeployment cannot be served", raised by parsing and planning.

It carries the field path and a message that names the numbers, so the CLI (exit 2), the operator (SpecValid=False
and a Warning event) and tests all show the same text.
"""

from __future__ import annotations

from pydantic import ValidationError


class SpecError(ValueError):
    """A VLLMDeployment that is invalid or cannot be planned; `field` is the spec path (e.g. spec.pools.long)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _loc(loc: tuple[int | str, ...], prefix: str) -> str:
    parts = [prefix] if prefix else []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(str(item))
    return ".".join(parts)


def from_validation_error(err: ValidationError, prefix: str = "spec") -> SpecError:
    """Turn pydantic's error list into one SpecError whose message lists every problem with its field path."""
    problems = []
    first_field = ""
    for e in err.errors(include_url=False):
        field = _loc(tuple(e["loc"]), prefix)
        first_field = first_field or field
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in {"enum", "literal_error"}:
            msg = f"{msg} (got {e.get('input')!r})"
        problems.append(f"{field}: {msg}")
    if len(problems) == 1:  # the field goes in `field` only: str() is "field: message", never the path twice
        return SpecError(first_field, problems[0].removeprefix(f"{first_field}: "))
    return SpecError("", "; ".join(problems))
