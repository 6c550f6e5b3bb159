"""The e2e tier's machine-level fixture: vLLM's own files held in the page cache for the whole tier.

These VMs run DAMON with a `pageout` scheme on physical memory (`/sys/kernel/mm/damon/admin/kdamonds/0`: pages idle
for 12 aggregation intervals of 5 s are paged out, up to 128 MiB/s), so the page cache holds only what was touched
in the last minute: on an idle machine it held 0.1-0.5 GiB of 24 GiB, minutes after the 5.5 GB vLLM venv was written.
Every vLLM start then re-reads torch, vLLM and transformers from the disk: `import torch,
vllm.entrypoints.openai.api_server` took 24.4 s with 2,250 major page faults cold against 13.5 s with 6 faults
warm, idle machine, 2026-12-02. A loaded tier run (etcd, Prometheus and the logs writing to the same disk) saw a
restarted vLLM print nothing for 7 minutes (issue 19). A container runtime's image layers sit in the same page
cache, so this is the disk, not the product: the tier pins those packages with `vmtouch -l` (mlock; ~1.8 GiB) and
stops it, by its PID, at the end.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from testcluster.cluster import stop_child
from tests.support.vllm_cpu import VLLM_VENV

PINNED_PACKAGES = ("torch", "vllm", "transformers", "numpy", "numpy.libs", "tokenizers")


@pytest.fixture(scope="session", autouse=True)
def vllm_files_in_page_cache() -> Iterator[None]:
    vmtouch = shutil.which("vmtouch")
    assert vmtouch, "vmtouch is missing: make test-deps installs it (scripts/install-test-deps.sh)"
    site = next((VLLM_VENV / "lib").glob("python3*/site-packages"))
    paths = [str(site / p) for p in PINNED_PACKAGES if (site / p).exists()]
    assert str(site / "torch") in paths and str(site / "vllm") in paths, f"no torch or vllm under {site}"
    proc = subprocess.Popen([vmtouch, "-q", "-l", "-m", "2G", *paths], stdin=subprocess.DEVNULL)
    time.sleep(1.0)
    assert proc.poll() is None, f"vmtouch -l {' '.join(paths)} exited with {proc.returncode}"
    try:
        yield
    finally:
        stop_child(proc, grace=10)
