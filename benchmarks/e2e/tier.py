"""Wall time and peak memory of the e2e tier (`pytest tests/e2e`), sampled while it runs.

Memory is sampled every 0.5 s two ways: the summed PSS of pytest's whole process tree (vLLM engines, router,
Prometheus and the wrapper processes are all its descendants: what the tier itself costs, shared pages split), and
the machine's used memory (MemTotal - MemAvailable, which includes whatever else runs on a shared machine).

    .venv/bin/python benchmarks/e2e/tier.py [-- PYTEST ARGS]      (default: -q tests/e2e)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    return total


def machine_used() -> int:
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()}
    return info["MemTotal"] - info["MemAvailable"]


def main(argv: list[str]) -> int:
    args = argv[1:] if argv and argv[0] == "--" else (argv or ["-q", "tests/e2e"])
    start = time.monotonic()
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "pytest"), "-p", "no:cacheprovider", *args], cwd=ROOT)
    peaks = {"tree_pss": 0, "machine_used": 0}
    baseline = machine_used()
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peaks["tree_pss"] = max(peaks["tree_pss"], pss(tree(proc.pid)))
            peaks["machine_used"] = max(peaks["machine_used"], machine_used())
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    done.set()
    sampler.join()
    wall = time.monotonic() - start
    print(f"pytest exit code {code}; wall {wall:.0f} s ({wall / 60:.1f} min); peak PSS of the test process tree "
          f"{peaks['tree_pss'] / GIB:.2f} GiB; peak machine used {peaks['machine_used'] / GIB:.2f} GiB "
          f"(before: {baseline / GIB:.2f} GiB); load avg now {os.getloadavg()[0]:.1f}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
