#!/usr/bin/env python3
"""Make a LoRA adapter directory for a model made by scripts/make_model.py, with peft (random, non-zero weights).

Why: the e2e tier shows vLLM serving LoRA adapters on CPU, and no adapter can be downloaded here. peft writes the
exact files vLLM reads (`adapter_config.json` and `adapter_model.safetensors`), for the model's own module names, so
the adapter is what a real fine-tune would produce, only with random weights. peft initialises `lora_B` to zeros (an
adapter that changes nothing); the B matrices are filled with small random values, seeded, so that an adapter's
output differs from the base model's and from another seed's.

Runs in the vLLM venv's interpreter (torch and transformers come from there) with peft and accelerate on PYTHONPATH
(`scripts/install-test-deps.sh` installs them into `.venv-peft` with `--no-deps`, so the vLLM venv stays exactly its
lock):

  PYTHONPATH=.venv-peft .venv-vllm/bin/python scripts/make_adapter.py --model DIR --out DIR --rank 8 [--seed N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SCALE = 1.0
"""Standard deviation of the random lora_B values (see the module docstring)."""

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
"""Every linear layer of a Llama decoder block: what vLLM wraps with LoRA (qkv and gate/up merged) by default."""


def make_adapter(model_dir: Path, out: Path, rank: int, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGET_MODULES, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lora)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, SCALE)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    # vLLM checks the base model's name loosely; point it at the directory the adapter was made for.
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = str(model_dir)
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a directory made by scripts/make_model.py")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    make_adapter(args.model, args.out, args.rank, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
