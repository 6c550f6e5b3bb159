"""Time to first token of a request that wakes the long pool from zero, link by link, against warm requests of the
same run (issue 22).

Starts the e2e stack with KEDA once (tests/support/e2e_stack.py: the real control plane, real nodes running real
vLLM CPU engines from the engine-cpu image, the real router, Prometheus and KEDA; cpu-dev.yaml with the long pool
autoscaled 0..1, idleSeconds 20 s: tests/support/wake_chain.py, the same wake the e2e test checks), then for each
run: waits for the long pool to be asleep at 0, sends one long prompt through the router (streamed, official
`openai` client) and records the seconds from its send to each link of the wake chain, then sends `--warm` requests
like it while the pool is awake.

    flock /tmp/vllm-e2e.lock .venv/bin/python benchmarks/autoscaling/wake.py [--runs 3] [--warm 5] \\
        [--json benchmarks/autoscaling/results-DATE.json]

Prints a Markdown table of medians. Measurements, not assertions: the machine is shared and noisy, so the cold TTFT
is reported as a ratio to the warm TTFT of the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import tokenizers

from tests.support import vllm_cpu, wake_chain
from tests.support.e2e_stack import Stack, running_stack
from tests.support.vllm_fixtures import TINY_MODEL_NAME

SLEEP_TIMEOUT_S = 180.0


def one_run(stack: Stack, tokenizer: tokenizers.Tokenizer, index: int, warm_count: int,
            budget: float) -> dict[str, Any]:
    stack.wait(lambda: wake_chain.asleep(stack), SLEEP_TIMEOUT_S, interval=1.0, what="the long pool asleep at 0")
    load = os.getloadavg()[0]
    salt = index * (warm_count + 1)
    woke = wake_chain.wake(stack, tokenizer, salt=salt, timeout=budget + 60)
    if woke.cold.status != 200:
        raise SystemExit(f"run {index}: the waking request was not answered: {woke.cold}")
    warm = wake_chain.warm(stack, tokenizer, warm_count, first_salt=salt + 1)
    bad = [w for w in warm if w.status != 200 or w.ttft_s is None]
    if bad:
        raise SystemExit(f"run {index}: warm requests failed: {bad}")
    last = time.monotonic()
    stack.wait(lambda: wake_chain.asleep(stack), SLEEP_TIMEOUT_S, interval=0.5, what="the long pool back at 0")
    warm_ttfts = [w.ttft_s for w in warm if w.ttft_s is not None]
    warm_median = statistics.median(warm_ttfts)
    cold_ttft = woke.steps["first_token"]
    return {"run": index, "load_average_1m": round(load, 2),
            "steps_s": {k: round(v, 3) for k, v in woke.steps.items()}, "missing": woke.missing(),
            "warm_ttft_s": [round(t, 4) for t in warm_ttfts], "warm_ttft_median_s": round(warm_median, 4),
            "cold_over_warm_ttft": round(cold_ttft / warm_median, 1),
            "asleep_after_last_request_s": round(time.monotonic() - last, 1)}


def table(runs: list[dict[str, Any]]) -> str:
    rows = ["| link (seconds from the request's send) | median s | runs (s) |", "|---|---:|---|"]
    for step in wake_chain.STEPS:
        values = [r["steps_s"][step] for r in runs if step in r["steps_s"]]
        if values:
            rows.append(f"| {wake_chain.STEP_TITLES[step]} | {statistics.median(values):.1f} | "
                        f"{', '.join(f'{v:.1f}' for v in values)} |")
    warm = [r["warm_ttft_median_s"] for r in runs]
    rows.append(f"| warm TTFT (median of each run's warm requests) | {statistics.median(warm):.3f} | "
                f"{', '.join(f'{v:.3f}' for v in warm)} |")
    ratio = [r["cold_over_warm_ttft"] for r in runs]
    rows.append(f"| cold TTFT / warm TTFT | {statistics.median(ratio):.0f}x | "
                f"{', '.join(f'{v:.0f}x' for v in ratio)} |")
    asleep = [r["asleep_after_last_request_s"] for r in runs]
    rows.append(f"| back at 0 after the last request (idle {wake_chain.IDLE_S} s) | {statistics.median(asleep):.1f} | "
                f"{', '.join(f'{v:.1f}' for v in asleep)} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5, help="warm requests after each wake")
    parser.add_argument("--json", type=Path, help="write the runs here")
    args = parser.parse_args()
    example = wake_chain.autoscaled_example()
    budget = wake_chain.wake_budget(example)
    with tempfile.TemporaryDirectory(prefix="wake-bench-") as tmp:
        root = Path(tmp)
        model_dir = vllm_cpu.make_model("tiny", root / "models" / TINY_MODEL_NAME)
        tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        started = time.monotonic()
        with running_stack(root / "stack", model_dir, example, keda=True, sleeping=(wake_chain.POOL,)) as stack:
            stack_s = time.monotonic() - started
            runs = [one_run(stack, tokenizer, i, args.warm, budget) for i in range(args.runs)]
    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "wake_budget_s": budget,
              "idle_seconds": wake_chain.IDLE_S, "prompt_tokens": wake_chain.PROMPT_TOKENS,
              "max_tokens": wake_chain.MAX_TOKENS, "poll_s": wake_chain.POLL_S, "stack_ready_s": round(stack_s, 1),
              "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
