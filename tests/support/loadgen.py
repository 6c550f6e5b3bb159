"""Loads `benchmarks/gpu/loadgen.py` as a module for its tests.

The load generator is a standalone script (it must be copyable alone onto the GPU machine), not part of the
package, so tests import it from its file. It is registered in sys.modules because its dataclasses look their
module up by name.
"""

import importlib.util
import sys
from types import ModuleType

from tests.support.paths import ROOT

LOADGEN_PATH = ROOT / "benchmarks" / "gpu" / "loadgen.py"


def load_loadgen() -> ModuleType:
    existing = sys.modules.get("gpu_loadgen")
    if existing is not None:
        return existing
    spec = importlib.util.spec_from_file_location("gpu_loadgen", LOADGEN_PATH)
    assert spec is not None and spec.loader is not None, f"cannot load {LOADGEN_PATH}"
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_loadgen"] = module
    spec.loader.exec_module(module)
    return module
