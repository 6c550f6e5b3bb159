"""What clients asked the emulator, in RBAC terms (verb, group, resource, subresource, namespace, name).

Tests count writes with it (e.g. "a steady-state reconcile makes no PATCH"), and the RBAC check compares the
operator's ClusterRole with the verbs and resources it really used. Verbs follow the API server's request-info
mapping, so `list` and `watch` and `deletecollection` are told apart exactly as an authorizer would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass
class RequestRecord:
    """One request, as an authorizer would see it, plus the status it got."""

    seq: int
    method: str
    path: str
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    user_agent: str
    content_type: str = ""
    field_manager: str = ""
    query: str = ""
    status: int = 0
    fault: str = ""
    started: float = field(default_factory=time.time)

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["is_write"] = self.is_write
        return data


def request_verb(method: str, has_name: bool, query: dict[str, str]) -> str:
    """Map an HTTP method on a resource URL to the RBAC verb the real server's authorizer uses."""
    method = method.upper()
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if has_name else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if has_name else "deletecollection"
    return method.lower()


class RequestLog:
    """An append-only, bounded list of request records with a few filters for assertions."""

    def __init__(self, max_records: int = 200_000) -> None:
        self._records: list[RequestRecord] = []
        self._dropped = 0
        self.max_records = max_records

    def append(self, record: RequestRecord) -> None:
        self._records.append(record)
        if len(self._records) > self.max_records:
            cut = len(self._records) - self.max_records
            del self._records[:cut]
            self._dropped += cut

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def since(self, seq: int) -> list[RequestRecord]:
        """Records with a sequence number of at least `seq` (a cursor that survives trimming)."""
        return [r for r in self._records if r.seq >= seq]

    def filter(self, *, verb: str | None = None, resource: str | None = None, group: str | None = None,
               namespace: str | None = None, name: str | None = None, subresource: str | None = None,
               user_agent: str | None = None, writes_only: bool = False) -> list[RequestRecord]:
        """Records that match every given criterion (None = any; user_agent matches as a substring)."""
        out = []
        for r in self._records:
            if verb is not None and r.verb != verb:
                continue
            if resource is not None and r.resource != resource:
                continue
            if group is not None and r.group != group:
                continue
            if namespace is not None and r.namespace != namespace:
                continue
            if name is not None and r.name != name:
                continue
            if subresource is not None and r.subresource != subresource:
                continue
            if user_agent is not None and user_agent not in r.user_agent:
                continue
            if writes_only and not r.is_write:
                continue
            out.append(r)
        return out

    def writes(self, **criteria: Any) -> list[RequestRecord]:
        return self.filter(writes_only=True, **criteria)

    def clear(self) -> None:
        self._records.clear()

    @property
    def next_seq(self) -> int:
        return (self._records[-1].seq + 1) if self._records else self._dropped
