"""How fast the simulated API server serves: the substrate's own cost, for later benchmarks to subtract.

Starts the emulator as a standalone process (as `make demo` runs it), then drives it from this process with aiohttp:
GET of one object, merge PATCH of one object (a real change each time, so every request writes and emits a watch
event), LIST of a namespace with `--objects` ConfigMaps, each for `--duration` seconds at each concurrency; and the
wall time for 500 creates while a watcher is attached, measured until the watcher has seen every ADDED event.

    .venv/bin/python benchmarks/emulator/bench.py [--duration 3] [--objects 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

NS = "/api/v1/namespaces/default/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}


async def start_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vllm_operator.sim.apiserver", "--port", "0",
        stdout=asyncio.subprocess.PIPE, env={**os.environ})
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    return proc, line.rsplit(" ", 1)[1].strip()


async def rate(name: str, concurrency: int, duration: float, call: Callable[[int], Awaitable[None]]
               ) -> dict[str, Any]:
    stop_at = time.perf_counter() + duration
    counts = [0] * concurrency

    async def worker(index: int) -> None:
        n = 0
        while time.perf_counter() < stop_at:
            await call(index * 1_000_000 + n)
            n += 1
        counts[index] = n

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    total = sum(counts)
    return {"op": name, "concurrency": concurrency, "requests": total, "seconds": round(elapsed, 3),
            "per_second": round(total / elapsed, 1)}


async def creates_with_watcher(session: aiohttp.ClientSession, url: str, count: int) -> dict[str, Any]:
    namespace = "bench-watch"
    async with session.post(f"{url}/api/v1/namespaces", json={"metadata": {"name": namespace}}) as resp:
        assert resp.status == 201, await resp.text()
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    seen = 0
    all_seen = asyncio.Event()

    async def watch() -> None:
        nonlocal seen
        async with session.get(url + path, params={"watch": "true"},
                               timeout=aiohttp.ClientTimeout(total=None)) as resp:
            async for line in resp.content:
                if line.strip() and json.loads(line)["type"] == "ADDED":
                    seen += 1
                    if seen == count:
                        all_seen.set()
                        return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    started = time.perf_counter()
    for i in range(count):
        async with session.post(url + path, json={"metadata": {"name": f"cm-{i}"}, "data": {"i": str(i)}}) as resp:
            assert resp.status == 201, await resp.text()
    created = time.perf_counter() - started
    await asyncio.wait_for(all_seen.wait(), 120)
    delivered = time.perf_counter() - started
    await watcher
    return {"op": f"{count} creates with a watcher", "creates_seconds": round(created, 3),
            "all_events_seen_seconds": round(delivered, 3), "creates_per_second": round(count / created, 1)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    proc, url = await start_server()
    results: list[dict[str, Any]] = []
    try:
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as session:
            for i in range(args.objects):
                async with session.post(url + NS, json={"metadata": {"name": f"obj-{i:04d}",
                                                                     "labels": {"i": str(i % 10)}},
                                                        "data": {"k": "v" * 64}}) as resp:
                    assert resp.status == 201

            async def get(_: int) -> None:
                async with session.get(f"{url}{NS}/obj-0000") as resp:
                    await resp.read()

            async def patch(n: int) -> None:
                async with session.patch(f"{url}{NS}/obj-{n % args.objects:04d}", json={"data": {"n": str(n)}},
                                         headers=MERGE) as resp:
                    await resp.read()

            async def list_all(_: int) -> None:
                async with session.get(url + NS) as resp:
                    await resp.read()

            async def list_selected(_: int) -> None:
                async with session.get(url + NS, params={"labelSelector": "i=3"}) as resp:
                    await resp.read()

            for concurrency in args.concurrency:
                for name, call in (("get", get), ("patch (merge)", patch), (f"list {args.objects}", list_all),
                                   (f"list {args.objects} labelSelector", list_selected)):
                    results.append(await rate(name, concurrency, args.duration, call))
            results.append(await creates_with_watcher(session, url, 500))
    finally:
        proc.terminate()
        await proc.wait()
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "objects": args.objects,
            "results": results}


def render(report: dict[str, Any]) -> str:
    lines = [f"Python {report['python']}, {report['cpus']} CPUs, {report['objects']} ConfigMaps in the namespace", "",
             "| operation | concurrency | requests/s |", "|---|---:|---:|"]
    for row in report["results"]:
        if "per_second" in row:
            lines.append(f"| {row['op']} | {row['concurrency']} | {row['per_second']} |")
    for row in report["results"]:
        if "creates_seconds" in row:
            lines.append("")
            lines.append(f"{row['op']}: creates done in {row['creates_seconds']} s "
                         f"({row['creates_per_second']}/s), all ADDED events seen after "
                         f"{row['all_events_seen_seconds']} s")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--objects", type=int, default=100, help="ConfigMaps in the listed namespace")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--json", help="also write the raw results to this file")
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    outcome = asyncio.run(main(arguments))
    if arguments.json:
        with open(arguments.json, "w", encoding="utf-8") as handle:
            json.dump(outcome, handle, indent=2)
    print(render(outcome))
