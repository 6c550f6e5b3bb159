"""Fault injection: a hook that can answer a request with an error or a delay before the emulator serves it.

Controllers must survive what real API servers do under load: 409 conflicts, 500s, 429s and timeouts. The hook is
a plain callable `(RequestRecord) -> Fault | None`, so a test can script exact failures (fail the 3rd PATCH of a
Deployment) or use `RandomFaults` for a seeded fraction of requests. A fault can also strike after the write was
committed (`after_commit=True`): the client sees an error or a timeout although the change happened, which is the
hardest case for idempotent reconcilers.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

from vllm_operator.sim.requestlog import WRITE_VERBS, RequestRecord

_REASONS = {
    400: ("BadRequest", "the server rejected our request for an unknown reason"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", "forbidden"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: ("Conflict", "the object has been modified; please apply your changes to the latest version and try again"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "an error on the server (\"injected fault\") has prevented the request from succeeding"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


@dataclass(frozen=True)
class Fault:
    """What to do to one request: wait `delay` seconds, then answer `status` (None: serve it normally).

    With `after_commit`, the request is served (the write happens) and only then delayed and/or answered with
    `status`, as when a response is lost on the way back. Without it, a delay models a hung server: a client that
    gave up meanwhile leaves the request unserved.
    """

    status: int | None = None
    delay: float = 0.0
    after_commit: bool = False
    message: str = ""
    retry_after: int | None = None
    reason_override: str | None = None

    @property
    def reason(self) -> str:
        if self.reason_override:
            return self.reason_override
        return _REASONS.get(self.status or 0, ("InternalError" if (self.status or 500) >= 500 else "BadRequest",
                                                ""))[0]

    @property
    def text(self) -> str:
        return self.message or _REASONS.get(self.status or 0, ("", "injected fault"))[1]

    def describe(self) -> str:
        parts = []
        if self.delay:
            parts.append(f"delay={self.delay:g}s")
        if self.status:
            parts.append(f"status={self.status}")
        if self.after_commit:
            parts.append("after-commit")
        return ",".join(parts) or "none"


FaultHook = Callable[[RequestRecord], "Fault | None"]


class RandomFaults:
    """A seeded fraction of matching requests gets a fault drawn from `faults` (equal odds).

    Defaults: 10% of writes, answered with 409, 500, or a 5 s delay (a client timeout when the client's request
    timeout is below that). Watches are never faulted by default (a real server closes them instead, which
    `watch_close_after` in the server options simulates).
    """

    def __init__(self, rate: float = 0.1, *, seed: int = 0, faults: Collection[Fault] | None = None,
                 verbs: Collection[str] = WRITE_VERBS, resources: Collection[str] | None = None,
                 user_agent: str | None = None) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be within [0, 1], got {rate}")
        self.rate = rate
        self.random = random.Random(seed)
        self.faults = list(faults) if faults is not None else [Fault(status=409), Fault(status=500),
                                                                Fault(delay=5.0)]
        self.verbs = frozenset(verbs)
        self.resources = frozenset(resources) if resources is not None else None
        self.user_agent = user_agent
        self.injected: list[tuple[RequestRecord, Fault]] = []

    def __call__(self, record: RequestRecord) -> Fault | None:
        if record.verb not in self.verbs or not record.resource:
            return None
        if self.resources is not None and record.resource not in self.resources:
            return None
        if self.user_agent is not None and self.user_agent not in record.user_agent:
            return None
        if self.random.random() >= self.rate:
            return None
        fault = self.random.choice(self.faults)
        self.injected.append((record, fault))
        return fault
