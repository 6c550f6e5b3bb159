"""A pool asleep at zero woken by one request, observed link by link on the e2e stack (tests/support/e2e_stack.py
with KEDA): shared by the e2e test of the wake (tests/e2e/test_autoscaling_vllm.py) and its benchmark
(benchmarks/autoscaling/wake.py), so that the benchmark measures exactly what the test checks.

The request is a streamed completion through the real router with the official `openai` client, long enough for the
long pool. While it is held, this module polls every link of the chain it is waiting on, each time from the request's
send (a poll every `POLL_S`, so each time is late by at most that plus one round of API reads):

held (router gauge) -> Active (ScaledObject) -> scaled (Deployment replicas 1, KEDA's 0 -> 1) -> HPA active ->
pod scheduled -> engine serving (vLLM's /health 200 at the pod's address) -> pod Ready (the kubelet's readiness
probe) -> endpoint published (the pool Service's EndpointSlice) -> routable (the router's healthy-endpoint gauge)
-> first token (the client's first streamed text) -> answered.

At zero KEDA itself scales the Deployment to 1 on activation; the HPA (which KEDA made with minReplicas 1) is
ScalingActive=False while its target has 0 replicas and turns True at its next sync after that (it then owns the
replicas again), so `hpa` follows `scaled` and is bookkeeping rather than a cause of the wake. (Its
status.desiredReplicas is no signal: it keeps 1 from the previous wake while the pool sleeps.) Links seen in the same
poll round as the answer are bounded by it: the router released the request once it saw the endpoint.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import tokenizers

from tests.support.e2e_stack import (
    EXAMPLE,
    NAME,
    NS,
    Stack,
    cond,
    http_status,
    model_name,
    pool_service,
    prompt_of,
    router_metric,
    the_plan,
)
from vllm_operator import constants
from vllm_operator.k8s import ENDPOINT_SLICES, HPAS, SCALED_OBJECTS

log = logging.getLogger(__name__)

POOL = constants.POOL_LONG
IDLE_S = 20
"""The long pool's idleSeconds (KEDA's cooldownPeriod): seconds, not the class default's 600, so that the e2e tier
sees the pool sleep again within its budget, yet long enough for the warm requests right after the wake (KEDA polls
every 15 s, so the pool sleeps 15-30 s after its last activity at a poll)."""
PROMPT_TOKENS = 600
"""Over cpu-dev's promptLengthThreshold (512): the router sends it to the long pool."""
MAX_TOKENS = 8
POLL_S = 0.25
ASLEEP_S = 60.0
"""From the stack Ready with the pool at 0 to the HPA's sync that sees it (every 2 s here), on a loaded machine."""
STEPS = ("held", "active", "scaled", "hpa", "scheduled", "serving", "ready", "published", "routable", "first_token",
         "answered")
STEP_TITLES = {
    "held": "router holds the request",
    "active": "ScaledObject Active",
    "scaled": "Deployment scaled to 1 (KEDA)",
    "hpa": "HPA ScalingActive (owns replicas again)",
    "scheduled": "pod scheduled",
    "serving": "engine serving (/health 200)",
    "ready": "pod Ready",
    "published": "endpoint published (EndpointSlice ready)",
    "routable": "router's endpoint healthy",
    "first_token": "first token",
    "answered": "answered",
}


def autoscaled_example(idle_seconds: int = IDLE_S) -> dict[str, Any]:
    """cpu-dev.yaml with the long pool autoscaled 0..1 on KEDA (the short pool stays at its one replica)."""
    obj = copy.deepcopy(EXAMPLE)
    long = obj["spec"]["pools"][POOL]
    long.pop("replicas", None)
    long["autoscaling"] = {"minReplicas": 0, "maxReplicas": 1, "metric": "num-requests-waiting", "target": 2,
                           "scaleDownStabilizationSeconds": 0, "idleSeconds": idle_seconds}
    return dict(obj)


def wake_budget(example: dict[str, Any]) -> float:
    """How long the router holds a request for the sleeping pool (the planner's wake budget, in router.json)."""
    budget = the_plan(example).router.pools.long.wake_seconds
    assert budget is not None, "the long pool does not sleep in this example"
    return float(budget)


@dataclass
class Streamed:
    """One streamed completion: status (0: no answer), the pool that answered, seconds from send to the first text
    and to the end, and what came back."""

    status: int = 0
    pool: str = ""
    ttft_s: float | None = None
    total_s: float | None = None
    text: str = ""
    error: str = ""


def stream_completion(url: str, prompt: str, *, max_tokens: int = MAX_TOKENS, timeout: float = 300.0) -> Streamed:
    oai = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
    out = Streamed()
    sent = time.monotonic()
    try:
        with oai.completions.with_streaming_response.create(
                model=model_name(), prompt=prompt, max_tokens=max_tokens, stream=True,
                extra_body={"ignore_eos": True}) as response:
            out.status = response.status_code
            out.pool = response.headers.get("x-vllm-operator-pool", "")
            for chunk in response.parse():
                text = chunk.choices[0].text if chunk.choices else ""
                if text and out.ttft_s is None:
                    out.ttft_s = time.monotonic() - sent
                out.text += text or ""
    except openai.APIStatusError as err:
        out.status, out.error = err.status_code, str(err)[:300]
    except openai.APIError as err:
        out.error = str(err)[:300]
    out.total_s = time.monotonic() - sent
    return out


@dataclass
class Wake:
    """The cold request and the seconds from its send to each link of the chain (absent: not observed)."""

    cold: Streamed
    steps: dict[str, float] = field(default_factory=dict)
    lag_s: float = 0.0
    """The longest polling round (its probes and the pause): a polled link's time is when a probe saw it, up to
    this much after it happened; `first_token` and `answered` are the client's own, exact."""

    def missing(self) -> list[str]:
        return [s for s in STEPS if s not in self.steps]

    def table(self) -> str:
        return ", ".join(f"{s} {self.steps[s]:.1f} s" for s in STEPS if s in self.steps)


def _probes(stack: Stack, pool: str) -> dict[str, Callable[[], bool]]:
    service = pool_service(pool)

    def pods() -> list[dict[str, Any]]:
        return stack.pods(pool)

    def active() -> bool:
        so = stack.call(lambda k: k.get(SCALED_OBJECTS, NS, service))
        return cond(so, "Active").get("status") == "True"

    def hpa() -> bool:
        found = stack.call(lambda k: k.get(HPAS, NS, f"keda-hpa-{service}"))
        return cond(found, "ScalingActive").get("status") == "True"

    def serving() -> bool:
        ips = [p["status"]["podIP"] for p in pods() if (p.get("status") or {}).get("podIP")]
        return any(http_status(f"http://{ip}:{constants.ENGINE_PORT}/health", timeout=1.0) == 200 for ip in ips)

    def published() -> bool:
        slices = stack.call(lambda k: k.list(ENDPOINT_SLICES, NS, f"kubernetes.io/service-name={service}"))
        return any((e.get("conditions") or {}).get("ready") for s in slices for e in s.get("endpoints") or [])

    return {
        "held": lambda: router_metric(stack, "vllm_operator_router_held_requests", pool=pool) >= 1,
        "active": active,
        "scaled": lambda: (stack.replicas(pool) or 0) >= 1,
        "hpa": hpa,
        "scheduled": lambda: any(p["spec"].get("nodeName") for p in pods()),
        "serving": serving,
        "ready": lambda: any(cond(p, "Ready").get("status") == "True" for p in pods()),
        "published": published,
        "routable": lambda: router_metric(stack, "vllm_operator_router_endpoints", pool=pool, state="healthy") >= 1,
    }


def asleep(stack: Stack, pool: str = POOL) -> bool:
    """The pool at 0 as every party sees it: the Deployment at 0 replicas, no pod left (a terminating one's engine
    still runs on the node), and KEDA's HPA no longer ScalingActive (its sync after the scale to 0; the `hpa` link
    of the next wake is its turn back to True)."""
    if stack.replicas(pool) != 0 or stack.pods(pool, terminating=True):
        return False
    hpa = stack.call(lambda k: k.get(HPAS, NS, f"keda-hpa-{pool_service(pool)}"))
    return cond(hpa, "ScalingActive").get("status") != "True"


def wake(stack: Stack, tokenizer: tokenizers.Tokenizer, *, salt: int = 0, pool: str = POOL,
         timeout: float = 300.0, settle_s: float = 30.0) -> Wake:
    """Once `pool` is asleep (`asleep`), send one request for it, observe the chain until it is answered, then up to
    `settle_s` more for links not seen yet (the HPA's sync may lag the answer)."""
    stack.wait(lambda: asleep(stack, pool), ASLEEP_S, what=f"pool {pool} asleep at 0 before the wake")
    url = stack.router_url()
    prompt = prompt_of(tokenizer, PROMPT_TOKENS, salt)
    result: list[Streamed] = []
    sender = threading.Thread(target=lambda: result.append(stream_completion(url, prompt, timeout=timeout)),
                              name="cold-request", daemon=True)
    probes = _probes(stack, pool)
    steps: dict[str, float] = {}
    t0 = time.monotonic()
    sender.start()
    done_at: float | None = None
    lag_s = 0.0
    while time.monotonic() - t0 < timeout + settle_s:
        round_start = time.monotonic()
        for name, probe in probes.items():
            if name in steps:
                continue
            try:
                seen = probe()
            except Exception as err:  # an API read that timed out on a loaded machine: the next round retries
                log.info("Probe %s of the %s wake failed (%s); retrying", name, pool, err)
                continue
            if seen:
                steps[name] = time.monotonic() - t0
        if done_at is None and not sender.is_alive():
            done_at = time.monotonic()
        if done_at is not None and (len(steps) == len(probes) or time.monotonic() - done_at > settle_s):
            break
        time.sleep(POLL_S)
        lag_s = max(lag_s, time.monotonic() - round_start)
    sender.join(timeout=5)
    cold = result[0] if result else Streamed(error="the request did not finish")
    if cold.ttft_s is not None:
        steps["first_token"] = cold.ttft_s
    if cold.status == 200 and cold.total_s is not None:
        steps["answered"] = cold.total_s
    outcome = Wake(cold, steps, lag_s)
    log.warning("Wake of pool %s/%s: %s (missing: %s)", NAME, pool, outcome.table(), outcome.missing())
    return outcome


def warm(stack: Stack, tokenizer: tokenizers.Tokenizer, count: int, *, first_salt: int = 1) -> list[Streamed]:
    """`count` requests like the cold one, one after another, while the pool is awake (prompts with no shared
    prefix, so none is a cache hit of another)."""
    url = stack.router_url()
    return [stream_completion(url, prompt_of(tokenizer, PROMPT_TOKENS, first_salt + i), timeout=120.0)
            for i in range(count)]


__all__ = ["IDLE_S", "POOL", "STEPS", "STEP_TITLES", "Streamed", "Wake", "asleep", "autoscaled_example",
           "stream_completion", "wake", "wake_budget", "warm"]
