"""Golden manifests: `vllm-operator render` of every example, compared byte for byte with tests/unit/rendering/golden.

A planner or renderer change that alters a manifest fails here with a diff; review it, then regenerate every golden
file with one command: `make goldens` (= `UPDATE_GOLDENS=1 pytest tests/unit/rendering/test_golden.py`).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from tests.support.paths import EXAMPLE_FILES, ROOT
from vllm_operator.rendering import cli

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDENS") == "1"


def rendered(example: Path) -> str:
    objects, _ = cli.render_documents(cli.load_documents(str(example)))
    header = f"# vllm-operator render -f {example.relative_to(ROOT)}  (golden file: regenerate with `make goldens`)\n"
    return header + cli.manifests_yaml(objects)


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_golden_manifests(example: Path) -> None:
    golden = GOLDEN / f"{example.stem}.yaml"
    text = rendered(example)
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"{golden} is missing: run `make goldens`"
    want = golden.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(golden), "rendered", n=2))
    assert text == want, f"rendered manifests differ from {golden.name} (run `make goldens` if intended):\n{diff}"


def test_every_golden_file_has_an_example() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == sorted(p.stem for p in EXAMPLE_FILES)
