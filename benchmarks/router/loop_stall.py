#!/usr/bin/env python3
"""How long the router's event loop stalls while it counts the tokens of long prompts (issue 28), this checkout
against a baseline checkout in the same run.

Why a heartbeat: every other request on a router waits while its loop is held, so the figure that matters is the
longest time the loop did not get round to a 1 ms timer. Each round starts, for each checkout in turn, a child
process that serves the router in-process (`build_app` + `serve`, uvloop as `vllm-operator router` runs it) with a
heartbeat task beside it, pinned to core 0; a client process on core 1 sends `--requests` chat requests of
`--chars` characters of prose one after another (47,000 characters is the ~24k-token prompt of the GPU run; the
tiny model's tokenizer makes ~20k tokens of it), each of which needs an exact count (its byte bound straddles the
30,000-token threshold). The fake engine (`fakevllm`) answers on core 1. Reported per checkout:
the heartbeat's lateness (how much later than 1 ms it fired) while the long requests ran — max, p99, and the
milliseconds of lateness summed per request — and the same over an equal idle time just before, in the same child
(the machine's own noise). Each request's text starts with its own number, so a prefix pool (`--strategy prefix`)
names a new text every time. A benchmark, not a test: nothing asserts a time.

  mkdir -p /tmp/router-base && git archive facb007 operator | tar -x -C /tmp/router-base
  .venv/bin/python benchmarks/router/loop_stall.py --baseline /tmp/router-base --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from bench import MODEL, VENV_PY, free_port, make_tokenizer, prose, router_config  # noqa: E402

CLIENT = """
import http.client, json, sys, time
port, body_file, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
body = open(body_file, 'rb').read()
conn = http.client.HTTPConnection('127.0.0.1', port, timeout=60)
methods = set()
for i in range(n):
    conn.request('POST', '/v1/chat/completions', body.replace(b'NONCE', str(i).encode()),
                 {'Content-Type': 'application/json'})
    r = conn.getresponse(); r.read()
    assert r.status == 200, r.status
    methods.add(r.getheader('x-vllm-operator-prompt-tokens-method'))
    time.sleep(0.02)
print(json.dumps(sorted(methods)))
"""


def child(args: argparse.Namespace) -> None:
    """One router with a heartbeat; prints one JSON line of lateness figures."""
    sys.path.insert(0, args.operator)
    import asyncio

    import uvloop

    from vllm_operator.api.router_config import RouterConfig
    from vllm_operator.router.app import build_app, serve
    from vllm_operator.router.tokens import load_counter

    config = RouterConfig.model_validate(json.loads(Path(args.config).read_text()))
    counter = load_counter(config.tokenizer)
    devnull = open(os.devnull, "w")  # noqa: SIM115 (the access log's stream for the child's life)

    async def main() -> dict[str, Any]:
        late: list[float] = []
        stop = False

        async def heartbeat() -> None:
            clock = time.perf_counter  # uvloop's loop.time() counts whole milliseconds
            while not stop:
                t0 = clock()
                await asyncio.sleep(0.001)
                late.append(max(0.0, clock() - t0 - 0.001))

        async with serve(build_app(config, counter, access_stream=devnull), port=0) as url:
            beat = asyncio.create_task(heartbeat())
            port = int(url.rsplit(":", 1)[1])
            client = await asyncio.create_subprocess_exec(
                "taskset", "-c", args.client_core, sys.executable, "-c", CLIENT, str(port), args.body,
                str(args.requests), stdout=asyncio.subprocess.PIPE)
            t0 = time.perf_counter()
            out, _ = await client.communicate()
            busy_s = time.perf_counter() - t0
            busy = list(late)
            late.clear()
            await asyncio.sleep(busy_s)  # the same time idle: the machine's own noise for this child
            idle = list(late)
            stop = True
            await beat
        assert client.returncode == 0, "the client failed"

        def summary(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            return {"max_ms": xs[-1] * 1e3, "p99_ms": xs[int(0.99 * (len(xs) - 1))] * 1e3,
                    "sum_ms_per_request": sum(xs) * 1e3 / args.requests, "beats": len(xs)}

        return {"busy": summary(busy), "idle": summary(idle), "seconds": busy_s,
                "methods": json.loads(out), "loadavg": os.getloadavg()[0]}

    uvloop.install()
    print(json.dumps(asyncio.run(main())), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", help="a checkout's root (with operator/) to measure in the same rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--chars", type=int, default=47_000)
    p.add_argument("--strategy", default="least-outstanding", choices=["least-outstanding", "prefix"],
                   help="both pools' routing strategy (prefix: each request's new text is also named in blocks)")
    p.add_argument("--long-max-model-len", type=int, default=262144,
                   help="the long pool's maxModelLen (just above the prompt's count: the whole prompt must be counted)")
    p.add_argument("--json", type=Path, help="write every round's figures here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--operator", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--body", help=argparse.SUPPRESS)
    p.add_argument("--client-core", default="1", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="router-loop-stall-"))
    tokens_dir = make_tokenizer(Path("/tmp/vllm-operator-router-bench"))
    up_port = free_port()
    fake = subprocess.Popen(["taskset", "-c", "1", str(VENV_PY), "-m", "fakevllm", "--port",
                             str(up_port), "--no-record", "--max-model-len", "262144", "--tokens", "16",
                             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        config = work / "router.json"
        wire = router_config(f"http://127.0.0.1:{up_port}", tokens_dir, 8080, strategy=args.strategy)
        wire["pools"]["long"]["maxModelLen"] = args.long_max_model_len
        config.write_text(json.dumps(wire))
        body = work / "body.json"
        text = "NONCE " + prose(args.chars, 7)
        body.write_text(json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}],
                                    "max_tokens": 16, "ignore_eos": True}))
        variants = {"router": str(REPO / "operator")}
        if args.baseline:
            variants["baseline"] = str(Path(args.baseline) / "operator")
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            result: dict[str, Any] = {}
            for name in order:
                done = subprocess.run(
                    ["taskset", "-c", "0", str(VENV_PY), str(Path(__file__).resolve()), "--child", "--operator",
                     variants[name], "--config", str(config), "--body", str(body), "--requests", str(args.requests)],
                    capture_output=True, text=True, check=True, cwd=str(REPO))
                result[name] = json.loads(done.stdout.strip().splitlines()[-1])
                b, i = result[name]["busy"], result[name]["idle"]
                print(f"round {r + 1} {name:8s} busy max {b['max_ms']:6.1f} ms p99 {b['p99_ms']:5.1f} ms "
                      f"late/request {b['sum_ms_per_request']:6.1f} ms | idle max {i['max_ms']:5.1f} p99 "
                      f"{i['p99_ms']:4.1f} | methods {result[name]['methods']} load {result[name]['loadavg']:.1f}",
                      flush=True)
            rounds.append(result)
        print("median over rounds:")
        for name in variants:
            for key in ("max_ms", "p99_ms", "sum_ms_per_request"):
                busy = statistics.median(x[name]["busy"][key] for x in rounds)
                idle = statistics.median(x[name]["idle"][key] for x in rounds)
                line = f"  {name:8s} {key:20s} busy {busy:7.2f}  idle {idle:6.2f}"
                if name == "router" and "baseline" in variants:
                    ratios = [x["router"]["busy"][key] / x["baseline"]["busy"][key] for x in rounds]
                    line += (f"  router/baseline (same round) {statistics.median(ratios):.2f} "
                             f"({min(ratios):.2f}…{max(ratios):.2f})")
                print(line)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds},
                                            indent=1))
    finally:
        fake.terminate()
        fake.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
