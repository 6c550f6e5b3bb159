#!/usr/bin/env python3
"""Make a weightless model directory that vLLM can serve with `--load-format dummy` (random weights).

Why: the end-to-end tests run real vLLM on CPU and the GPU benchmarks run real vLLM on an H200, but no model weights
can be downloaded here. vLLM only needs a `config.json` (the shape: it sizes weights, KV cache and activations from
it) and a tokenizer (to serve text); `--load-format dummy` fills the weights with random values. The tokenizer is a
small byte-level BPE trained here on a built-in corpus, so every byte string round-trips and the output is the same
bytes on every run (same `tokenizers` version).

Shapes:
  tiny         a 2-layer Llama (head_dim 64, which CPU attention accepts) with a 64k context; starts in seconds on CPU.
               It matches the model facts in examples/cpu-dev.yaml.
  llama-3.1-8b the real Llama-3.1-8B config values (32 layers, 8 KV heads, vocab 128256, rope llama3, bf16), so vLLM's
               weight and KV sizes match the real model's.

Usage:
  python scripts/make_model.py --shape tiny --out DIR [--tokenizer-from DIR]

Only the standard library and `tokenizers` are used, and `tokenizers` only when no `--tokenizer-from` is given (the GPU
machine has a bare Python where it may be absent: copy the tokenizer made here).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

TOKENIZER_VOCAB_SIZE = 2048
"""Byte-level BPE vocabulary, special tokens included: small enough to train in about a second."""

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
"""Llama-3's chat markers, ids 0-4 in this tokenizer."""

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] | trim }}"
    "{%- else %}{%- for part in message['content'] %}{%- if part['type'] == 'text' %}{{- part['text'] | trim }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
"""Llama-3's layout without tools or date lines: header, content, <|eot_id|> per message."""

TINY_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 65536,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": None,  # the tokenizer's size, so that every id a random model samples decodes to text
}

LLAMA_31_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

SHAPES: dict[str, dict[str, Any]] = {"tiny": TINY_CONFIG, "llama-3.1-8b": LLAMA_31_8B_CONFIG}

_WORD_TEXT = """
the of and to in is was for that on with as by at from it this be are or an have not which but his they were had
one all their has been if more when will would who so no there can out other into than its about them only time
some could these may first then do any like my now over such our man me even most made after also did many before
must through back years where much your way well down should because each just those people how too little state
good very make world still own see men work long get here between both life being under never day same another know
while last might us great old year off come since against go came right used take three model token tokens prompt
request server engine cache memory length pool short long router health metric queue batch sequence context window
kubernetes operator deployment pod node service replica container image volume label annotation status condition
answer question summary document chapter paragraph sentence word letter number value table list field record file
"""
_WORDS = _WORD_TEXT.split()
_PUNCT = [".", ",", ";", ":", "?", "!", " -", "'s", "(", ")"]


def corpus_lines(seed: int = 20261129, lines: int = 6000) -> list[str]:
    """Deterministic English-like text with digits, punctuation, casing and a little code and JSON."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        kind = i % 10
        if kind == 8:
            key, val = rng.choice(_WORDS), rng.randrange(100000)
            out.append(f'{{"{key}": {val}, "id": "{rng.choice(_WORDS)}-{rng.randrange(1000)}", "ok": true}}')
            continue
        if kind == 9:
            name, arg = rng.choice(_WORDS), rng.choice(_WORDS)
            out.append(f"def {name}_{arg}({arg}: int) -> int:\n    return {arg} * {rng.randrange(1, 99)} + 1")
            continue
        words = [rng.choice(_WORDS) for _ in range(rng.randrange(6, 24))]
        words[0] = words[0].capitalize()
        text = " ".join(words)
        if rng.random() < 0.3:
            text += f" {rng.randrange(1, 100000)}"
        out.append(text + rng.choice([*_PUNCT[:3], "?", "!"]))
    return out


def train_tokenizer_json() -> str:
    """A byte-level BPE (GPT-2/Llama-3 style pre-tokenizer and decoder) with the special tokens first; as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)])
    # Round-trip through json with sorted keys: the same bytes whatever order the library writes keys in.
    return json.dumps(json.loads(tok.to_str()), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def tokenizer_files(tokenizer_json: str, max_len: int) -> dict[str, str]:
    """tokenizer.json plus the transformers wrappers that make it a PreTrainedTokenizerFast with a chat template."""
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_len,
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    special = {"bos_token": BOS, "eos_token": "<|eot_id|>", "pad_token": EOS}
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": _dump(config),
            "special_tokens_map.json": _dump(special)}


def _tokenizer_vocab_size(tokenizer_json: str) -> int:
    data = json.loads(tokenizer_json)
    ids = set(data["model"]["vocab"].values()) | {t["id"] for t in data.get("added_tokens", [])}
    return int(max(ids)) + 1


def _special_id(tokenizer_json: str, token: str) -> int:
    data = json.loads(tokenizer_json)
    for added in data.get("added_tokens", []):
        if added["content"] == token:
            return int(added["id"])
    raise SystemExit(f"tokenizer has no special token {token!r}")


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def make_model(shape: str, out: Path, tokenizer_from: Path | None = None) -> None:
    """Write config.json, generation_config.json and the tokenizer files of `shape` into `out`."""
    if shape not in SHAPES:
        raise SystemExit(f"--shape {shape!r} is not known (known: {', '.join(SHAPES)})")
    if tokenizer_from is not None:
        source = tokenizer_from / "tokenizer.json"
        if not source.is_file():
            raise SystemExit(f"--tokenizer-from {tokenizer_from}: no tokenizer.json there")
        tokenizer_json = source.read_text(encoding="utf-8")
    else:
        tokenizer_json = train_tokenizer_json()
    config = dict(SHAPES[shape])
    vocab = _tokenizer_vocab_size(tokenizer_json)
    if config["vocab_size"] is None:
        config["vocab_size"] = vocab
    if vocab > config["vocab_size"]:
        raise SystemExit(f"tokenizer has {vocab} tokens, more than the {shape} vocab_size {config['vocab_size']}")
    bos, eot, eos = (_special_id(tokenizer_json, t) for t in (BOS, "<|eot_id|>", EOS))
    config.update(bos_token_id=bos, eos_token_id=[eos, eot], transformers_version="4.57.0")
    generation = {"bos_token_id": bos, "eos_token_id": [eos, eot], "transformers_version": "4.57.0"}
    files = {"config.json": _dump(config), "generation_config.json": _dump(generation)}
    files.update(tokenizer_files(tokenizer_json, max_len=config["max_position_embeddings"]))
    out.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(files.items()):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES), help="model shape to write")
    ap.add_argument("--out", required=True, type=Path, help="directory to write (created if missing)")
    ap.add_argument("--tokenizer-from", type=Path, default=None,
                    help="copy tokenizer.json from this model directory instead of training one (no `tokenizers`)")
    args = ap.parse_args(argv)
    make_model(args.shape, args.out, args.tokenizer_from)
    print(f"wrote {args.shape} model to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
