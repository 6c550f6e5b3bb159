"""Run at the start of every Python process of vLLM's that the engine wrapper starts (vllm_operator/engine/childsite.py
puts this directory first on its PYTHONPATH): where the wrapper found AMX tiles, ask Linux for the tile state so that
vLLM's AMX attention kernel does not die of SIGILL (engine/amx.py says why); make vLLM count the cgroup's memory in
use, not the page cache it read, as used (_vllm_operator_working_set.py beside this says why); then hand over to
the next `sitecustomize` on the path, if there is one. Standard library only: this runs in vLLM's interpreter."""

import contextlib
import ctypes
import importlib
import os
import platform
import sys

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _request_amx_tile() -> None:
    if os.environ.get("VLLM_OPERATOR_AMX_TILE") != "1" or platform.machine() not in ("x86_64", "AMD64"):
        return
    # No libc syscall(): nothing to ask with, and vLLM runs as it would without the wrapper.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)


def _chain() -> None:
    """Import the `sitecustomize` this one shadows (an image's own), with this directory off the path meanwhile."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.modules.pop(__name__, None)
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as err:
        if err.name != "sitecustomize":
            raise
    finally:
        sys.path[:] = saved


_request_amx_tile()
with contextlib.suppress(Exception):  # never stop vLLM from starting: it then runs as it would without the wrapper
    import _vllm_operator_working_set  # type: ignore[import-not-found]  # beside this file, on vLLM's path

    _vllm_operator_working_set.install()
_chain()
