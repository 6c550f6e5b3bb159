"""A long request wakes the sleeping long pool, with real vLLM on CPU and real KEDA on the real control plane.

cpu-dev.yaml with the long pool autoscaled 0..1 (idleSeconds 20 s: tests/support/wake_chain.py) runs on the e2e stack
with KEDA (its operator and metrics server built from its module; kube-controller-manager's HPA controller): the long
pool starts with one replica and sleeps at 0 once idle. A long prompt sent through the real router with the official
`openai` client is held by the router; its held-requests gauge, scraped by the real Prometheus, makes KEDA activate
the ScaledObject and scale the Deployment to 1; kube-scheduler binds the pod to a real node, whose kubelet runs the
real vLLM CPU engine from the engine-cpu image; once the pod is Ready the endpointslice controller publishes it, the
router discovers it and releases the held request, which is answered by the long pool. Then warm requests are
answered, and the pool goes back to 0 when idle.

Allowances, each waited on as a condition: the stack Ready (one engine and the router, the long pool asleep) within
READY_TIMEOUT_S; the held request within the router's own wake budget (the planner's 180 s on CPU: Prometheus, KEDA's
15 s polling, the HPA, scheduling and a cold vLLM start: 50-150 s measured on this 2-core machine at load averages
7-14, benchmarks/autoscaling/README.md), failing with the router's 503 past it; back at 0 within idleSeconds + two
KEDA polls + the pod's grace + margin (SLEEP_S), and not sooner than idleSeconds less one KEDA poll after the last
answer. Every link's time goes to the log; the benchmark (benchmarks/autoscaling/wake.py) records them.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tokenizers

from tests.support import wake_chain
from tests.support.e2e_stack import NAME, Stack, router_metric, running_stack
from vllm_operator import constants

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
log = logging.getLogger(__name__)

EXAMPLE = wake_chain.autoscaled_example()
WAKE_BUDGET_S = wake_chain.wake_budget(EXAMPLE)
SLEEP_S = wake_chain.IDLE_S + 2 * constants.KEDA_POLLING_INTERVAL_S + 10 + 60
"""idleSeconds, up to two KEDA polls, the engine pod's 10 s grace, and a margin for a loaded machine."""
WARM = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("wake"), tiny_model_dir, EXAMPLE, keda=True,
                       sleeping=(wake_chain.POOL,)) as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def test_a_long_request_wakes_the_sleeping_long_pool_is_answered_and_the_pool_sleeps_again(
        stack: Stack, tokenizer: tokenizers.Tokenizer, tmp_path: Path) -> None:
    woke = wake_chain.wake(stack, tokenizer, timeout=WAKE_BUDGET_S + 60)
    cold = woke.cold
    assert cold.status == 200, f"the held request was not answered: {cold}; {stack.diagnostics()}"
    assert cold.pool == wake_chain.POOL and cold.text, cold
    assert cold.total_s is not None and cold.total_s < WAKE_BUDGET_S + 60
    # Every link was seen, the first in the router while the pool had no engine at all.
    assert woke.missing() == [], f"links of the chain not observed: {woke.missing()} ({woke.table()})"
    assert woke.steps["held"] < woke.steps["scheduled"] < woke.steps["first_token"], woke.table()
    # The engine served before the first token; "serving" is polled, so it may be seen up to a round late (CI-like
    # run, 2026-12-03: seen 0.06 s after the first token, with a round of 0.4 s).
    assert woke.steps["serving"] - woke.lag_s < woke.steps["first_token"], (woke.table(), woke.lag_s)

    warm = wake_chain.warm(stack, tokenizer, WARM)
    assert [(w.status, w.pool) for w in warm] == [(200, wake_chain.POOL)] * WARM, warm
    assert all(w.ttft_s is not None for w in warm), warm
    answered = time.monotonic()
    assert router_metric(stack, "vllm_operator_router_held_requests", pool=wake_chain.POOL) == 0

    stack.wait(lambda: wake_chain.asleep(stack), SLEEP_S, interval=1.0, what="the long pool back at 0 when idle")
    asleep_after = time.monotonic() - answered
    # KEDA last saw the pool busy at a poll before the last answer (it polls every 15 s) and lets it sleep
    # idleSeconds after that poll: never sooner than idleSeconds - 15 s after the answer.
    assert asleep_after >= wake_chain.IDLE_S - constants.KEDA_POLLING_INTERVAL_S, \
        f"slept {asleep_after:.1f} s after the last request"
    stack.wait(stack.ready, 60, what="the stack Ready with the long pool asleep")

    reasons = {e.get("reason"): e.get("message") for e in stack.events()
               if (e.get("involvedObject") or {}).get("name") == NAME}
    assert str(reasons.get("PoolWoke", "")).startswith("Pool long woke"), sorted(r for r in reasons if r)

    warm_ttft = statistics.median(w.ttft_s for w in warm if w.ttft_s is not None)
    figures = {**{f"{k}_s": round(v, 2) for k, v in woke.steps.items()},
               "warm_ttft_median_s": round(warm_ttft, 3), "asleep_after_last_request_s": round(asleep_after, 1)}
    (tmp_path / "wake.json").write_text(json.dumps(figures, indent=1))
    log.warning("Wake of the long pool on real vLLM: %s; warm TTFT median %.3f s; asleep %.1f s after the last "
                "request", woke.table(), warm_ttft, asleep_after)
