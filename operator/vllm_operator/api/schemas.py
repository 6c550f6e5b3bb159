"""JSON Schemas of the Plan and RouterConfig, written next to this module for tools outside Python.

The GPU benchmark, the e2e harness and anyone scripting around `vllm-operator plan -o json` read these shapes; the
files are generated (`make schemas`) and a unit test fails when they drift from the models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vllm_operator.api.plan import Plan
from vllm_operator.api.router_config import RouterConfig

SCHEMA_DIR = Path(__file__).parent / "schemas"
MODELS: dict[str, type[BaseModel]] = {"plan.schema.json": Plan, "router-config.schema.json": RouterConfig}


def render(model: type[BaseModel]) -> str:
    schema: dict[str, Any] = model.model_json_schema(by_alias=True, mode="serialization")
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in MODELS.items():
        path = directory / filename
        path.write_text(render(model))
        written.append(path)
    return written


if __name__ == "__main__":
    for p in write(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR):
        print(f"wrote {p}")
