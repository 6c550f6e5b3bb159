"""Run at the start of every Python process of vLLM's that the engine wrapper starts (vllm_operator/engine/cgroup.py
says why): make vLLM count the cgroup's memory in use, not the page cache it read, as used; then hand over to the next
`sitecustomize` on the path, if there is one. Standard library only: this runs in vLLM's interpreter."""

import contextlib
import importlib
import os
import sys

with contextlib.suppress(Exception):  # never stop vLLM from starting: it then runs as it would without the wrapper
    import _vllm_operator_working_set  # type: ignore[import-not-found]  # beside this file, on vLLM's path

    _vllm_operator_working_set.install()


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


_chain()
