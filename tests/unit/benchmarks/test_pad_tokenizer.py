"""pad_tokenizer.py: a weightless model's small tokenizer is padded to the model's vocabulary, so every id that random
weights can sample decodes to text (otherwise vLLM's incremental detokenizer re-decodes the prompt on every step)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from tests.support.loadgen import load_script
from tests.support.paths import ROOT

pt: Any = load_script("pad_tokenizer")


@pytest.fixture(scope="module")
def made_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_model.py's tiny shape, made once (it trains a tokenizer)."""
    spec = importlib.util.spec_from_file_location("make_model_for_pad_test", ROOT / "scripts" / "make_model.py")
    assert spec is not None and spec.loader is not None
    make_model: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_model)
    out = tmp_path_factory.mktemp("made") / "model"
    assert make_model.main(["--shape", "tiny", "--out", str(out)]) == 0
    return out


def model_with_vocab(made: Path, tmp_path: Path, vocab_size: int | None) -> tuple[Path, int]:
    out = tmp_path / "model"
    shutil.copytree(made, out)
    size = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
    config = json.loads((out / "config.json").read_text())
    config["vocab_size"] = vocab_size if vocab_size is not None else size + 500
    (out / "config.json").write_text(json.dumps(config))
    return out, size


def test_pads_to_the_config_vocab_and_every_id_decodes(made_model: Path, tmp_path: Path) -> None:
    model, size = model_with_vocab(made_model, tmp_path, None)
    assert pt.main([str(model)]) == 0
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    assert tok.get_vocab_size() == size + 500
    assert tok.decode([size + 499]) == f" <pad{size + 499}>"
    stream = DecodeStream(skip_special_tokens=True)  # the detokenizer advances on a padded id
    assert stream.step(tok, size + 10)
    assert pt.pad(model) == (size + 500, size + 500)  # idempotent


def test_refuses_a_tokenizer_larger_than_the_model_vocab(
    made_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, size = model_with_vocab(made_model, tmp_path, 100)
    assert pt.main([str(model)]) == 2
    assert f"tokenizer has {size} tokens, more than config.json vocab_size 100" in capsys.readouterr().err
