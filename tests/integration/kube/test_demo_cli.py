"""`python -m testcluster.demo --examples DIR` (`make demo`) on a user's directory: a missing directory or one with
nothing usable is one line and exit 2 before any cluster starts; bad files are skipped with a line each naming the
file; `accelerator.type: auto` is resolved by the operator from the demo's kwok nodes on the real control plane; a
spec the planner refuses is shown with its SpecValid message, not a crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testcluster.examples import PROG
from tests.support.paths import EXAMPLES, ROOT

pytestmark = pytest.mark.integration


def demo(directory: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testcluster.demo", "--examples", str(directory),
                           "--timeout", "90"], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def chat(name: str, **spec: object) -> str:
    doc = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(spec)
    return yaml.safe_dump(doc)


def test_missing_directory_is_one_line(tmp_path: Path) -> None:
    res = demo(tmp_path / "nope")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr == f"{PROG}: examples directory {tmp_path / 'nope'} does not exist\n"
    res = demo(tmp_path)
    assert res.returncode == 2 and res.stderr == f"{PROG}: examples directory {tmp_path} has no *.yaml " \
                                                 "files\n"


def test_nothing_usable_names_each_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("spec: [\n")
    (tmp_path / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    res = demo(tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.splitlines() == [
        f"{PROG}: skipped {tmp_path / 'bad.yaml'}: {tmp_path / 'bad.yaml'} is not valid YAML at line 2, "
        "column 1: expected the node content, but found '<stream end>'",
        f"{PROG}: skipped {tmp_path / 'cm.yaml'}: kind: expected VLLMDeployment, got 'ConfigMap'",
        f"{PROG}: no usable VLLMDeployment in {tmp_path} (each file's problem is above)"]


def test_auto_refused_and_bad_files_together(tmp_path: Path) -> None:
    (tmp_path / "a-auto.yaml").write_text(chat("chat-auto", accelerator={"type": "auto"}))
    (tmp_path / "b-refused.yaml").write_text(chat("chat-refused", pools={"long": {"maxModelLen": 262144}}))
    (tmp_path / "c-bad.yaml").write_text("kind: [\n")
    (tmp_path / "d-invalid.yaml").write_text(chat("chat-invalid", workloadClass="Batch_1"))
    res = demo(tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    skipped = [line for line in res.stderr.splitlines() if line.startswith(f"{PROG}: skipped ")]
    assert [line.split(":")[1].split()[-1] for line in skipped] == [str(tmp_path / "c-bad.yaml"),
                                                                     str(tmp_path / "d-invalid.yaml")]
    assert "spec.workloadClass" in skipped[1]
    out = res.stdout
    assert "kwok nodes: cpu-0, nvidia-l4-24gb-0" in out  # auto alone: the demo gives it a GPU node to resolve to
    assert "1 VLLMDeployments Ready" in out and "1 refused by the planner:" in out
    assert ("ml/chat-refused: SpecValid=False (SpecInvalid): spec.pools.long.maxModelLen: 262144 exceeds the native "
            "context") in out
    after_edit = out.split("Bad edit refused by the operator: ml/chat-auto")[1]
    assert "ml/chat-auto:" in out and "SpecValid=False" in after_edit
    assert "pods before and after: identical" in out
