"""API errors rendered as the `Status` objects a real API server returns.

Clients branch on `reason` and `code` (the official client raises ApiException with the body, kopf retries on 409 and
gives up on 422, kubectl prints `message`), so every refusal here carries the same reason, code, message wording and
`details` (kind, name, group, causes with field paths) as apimachinery's `errors` package produces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FieldCause:
    """One entry of `details.causes`: `reason` is FieldValueInvalid, FieldValueRequired, FieldValueNotSupported…"""

    field: str
    reason: str
    message: str

    def render(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


@dataclass
class ApiError(Exception):
    """An error the emulator answers with; `body()` is the `Status` object."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def body(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            status["details"] = self.details
        return status


def qualified(plural: str, group: str) -> str:
    """`deployments.apps`, `pods` (the core group has no suffix), as in server messages."""
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(plural, group)} "{name}" not found',
                    {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural})


def no_route() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified(plural, group)} "{name}" already exists',
                    {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural})


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    text = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified(plural, group)} "{name}": {text}',
                    {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural})


def invalid(kind: str, group: str, name: str, causes: Sequence[FieldCause]) -> ApiError:
    rendered = [cause.render() for cause in causes]
    joined = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    qualified_kind = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{qualified_kind} "{name}" is invalid: {joined}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed(message: str = "the server does not allow this method on the requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message, {})


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: "
                    f"{', '.join(accepted)}", {})


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'{qualified(plural, group)} "{name}" is forbidden: {why}',
                    {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural})


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
