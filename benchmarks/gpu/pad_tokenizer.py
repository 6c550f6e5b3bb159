#!/usr/bin/env python3
"""Pad a weightless model directory's tokenizer to the model's vocabulary size.

Why: with `--load-format dummy` the random weights sample token ids anywhere in the model's vocabulary (128,256 for
Llama-3.1-8B), but the small locally trained tokenizer knows ~2,000. Ids it does not know decode to nothing, so vLLM's
incremental detokenizer (a `tokenizers` DecodeStream primed with the prompt) never advances and re-decodes the whole
prompt on every step: ~2.8 s of API-server CPU per 512-token answer to a 24k-token prompt, which stalls the front end
and made the first H200 run's long-request numbers API-server-bound (benchmarks/gpu/README.md, "Caveat"). Added
tokens for every missing id make each sampled id decode to text, as a real tokenizer would.

  python benchmarks/gpu/pad_tokenizer.py MODEL_DIR        # rewrites MODEL_DIR/tokenizer.json in place
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import AddedToken, Tokenizer


def pad(model_dir: Path) -> tuple[int, int]:
    """Add tokens until the tokenizer covers config.json's vocab_size; returns (size before, size after)."""
    vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    before = tok.get_vocab_size()
    if before > vocab_size:
        raise ValueError(f"tokenizer has {before} tokens, more than config.json vocab_size {vocab_size}")
    tok.add_tokens([AddedToken(f" <pad{i}>", normalized=False, special=False) for i in range(before, vocab_size)])
    tok.save(str(model_dir / "tokenizer.json"))
    return before, tok.get_vocab_size()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: pad_tokenizer.py MODEL_DIR", file=sys.stderr)
        return 2
    try:
        before, after = pad(Path(args[0]))
    except (OSError, KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"padded {args[0]}/tokenizer.json from {before} to {after} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
