"""Loads the standalone GPU benchmark scripts (`benchmarks/gpu/*.py`) as modules for their tests.

Those scripts must be copyable alone onto the GPU machine, so they are not part of the package; tests import them
from their files. Each is registered in sys.modules because dataclasses look their module up by name.
"""

import importlib.util
import sys
from types import ModuleType

from tests.support.paths import ROOT

GPU_BENCH = ROOT / "benchmarks" / "gpu"
LOADGEN_PATH = GPU_BENCH / "loadgen.py"
ENGINE_CMD_PATH = GPU_BENCH / "engine_cmd.py"


def load_script(stem: str) -> ModuleType:
    name = f"gpu_bench_{stem}"
    existing = sys.modules.get(name)
    if existing is not None:
        return existing
    path = GPU_BENCH / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_loadgen() -> ModuleType:
    return load_script("loadgen")
