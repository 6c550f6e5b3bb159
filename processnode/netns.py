"""Enter a named network namespace from this thread (threads and processes it starts afterwards inherit it).

Why: the pod addresses live only inside the cluster's network namespace (the host blackholes them), so a test that
talks to pods — the end-to-end tier's clients, the node agent's probes, Prometheus — runs there. `setns(2)` moves the
calling thread only; entering before starting any thread keeps the whole test stack inside, and leaving restores the
thread's own namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """This thread in `/run/netns/<name>` until the block exits."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)
