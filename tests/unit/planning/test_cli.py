"""`vllm-operator plan`: exit 0 with a readable plan, exit 2 with one line on stderr, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import EXAMPLE_FILES, ROOT
from vllm_operator.planning import cli

CHAT = ROOT / "examples" / "chat.yaml"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vllm_operator.cli", "plan", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def chat_doc(**spec_patch: object) -> str:
    doc = yaml.safe_load(CHAT.read_text())
    doc["spec"].update(spec_patch)
    return yaml.safe_dump(doc)


def test_example_plans_as_table_in_a_subprocess() -> None:
    res = run("-f", str(CHAT))
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for text in ("pool short", "pool long", "--max-model-len=4096", "KV budget: 22.00 GiB x 0.9", "capacity:",
                 "warning: pools.short:", "threshold 3584"):
        assert text in out
    assert res.stderr == ""


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_every_example_plans_in_process(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("KV cache:") == 2 and "Traceback" not in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(CHAT), "-o", "json", "--engine-version", "0.26"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engineVersion"] == "0.26" and set(data["pools"]) == {"short", "long"}
    assert data["pools"]["short"]["kv"]["plannedTokens"] > 0 and len(data["hash"]) == 64


def test_gpu_override_and_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auto = write(tmp_path, "auto.yaml", chat_doc(accelerator={"type": "auto"}))
    assert cli.main(["-f", auto, "--gpu", "nvidia-h100-80gb"]) == 0
    assert "nvidia-h100-80gb x1" in capsys.readouterr().out


def test_model_config_for_a_model_outside_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "hidden_size": 2048,
              "max_position_embeddings": 32768, "intermediate_size": 5632, "vocab_size": 32000}
    cfg = write(tmp_path, "config.json", json.dumps(config))
    spec = write(tmp_path, "d.yaml", chat_doc(model={"name": "acme/small-2b"}))
    assert cli.main(["-f", spec, "--model-config", cfg, "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["pools"]["short"]["kv"]["bytesPerToken"] == 2 * 24 * 4 * 128 * 2


def test_several_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = write(tmp_path, "two.yaml", CHAT.read_text() + "\n---\n" + (ROOT / "examples" / "rag.yaml").read_text())
    assert cli.main(["-f", both, "-o", "json"]) == 0
    assert [d["name"] for d in json.loads(capsys.readouterr().out)] == ["chat", "rag"]


REFUSALS = [
    pytest.param(lambda t: write(t, "a10g.yaml", chat_doc(accelerator={"type": "nvidia-a10g-24gb"}, pools={
        "long": {"maxModelLen": 131072}})), (), "needs 16.0 GiB of KV cache for one 131072-token sequence",
        id="refused-a10g-131072"),
    pytest.param(lambda t: write(t, "broken.yaml", "spec: [unclosed\n"), (), "is not valid YAML at line",
                 id="broken-yaml"),
    pytest.param(lambda t: write(t, "empty.yaml", ""), (), "is empty", id="empty-file"),
    pytest.param(lambda t: write(t, "comments.yaml", "# nothing\n---\n"), (), "is empty", id="only-comments"),
    pytest.param(lambda t: write(t, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"), (),
                 "kind: expected VLLMDeployment, got 'ConfigMap'", id="wrong-kind"),
    pytest.param(lambda t: write(t, "list.yaml", "- a\n- b\n"), (), "expected a VLLMDeployment mapping",
                 id="not-a-mapping"),
    pytest.param(lambda t: str(t / "missing.yaml"), (), "cannot read", id="missing-file"),
    pytest.param(str, (), "cannot read", id="directory"),
    pytest.param(lambda t: write(t, "auto.yaml", chat_doc(accelerator={"type": "auto"})), (),
                 "auto must be resolved from node labels (offline: --gpu TYPE)", id="auto-without-gpu"),
    pytest.param(lambda t: str(CHAT), ("--gpu", "nvidia-b200"), "--gpu: unknown GPU type", id="unknown-gpu"),
    pytest.param(lambda t: str(CHAT), ("--gpu", "cpu"), "--gpu: expects a GPU type", id="gpu-cpu"),
    pytest.param(lambda t: str(CHAT), ("--engine-version", "0.1"), "older than every version", id="old-engine"),
    pytest.param(lambda t: str(CHAT), ("--model-config", "/nonexistent.json"), "cannot read",
                 id="missing-model-config"),
    pytest.param(lambda t: str(CHAT), ("-o", "yaml"), "invalid choice", id="bad-output-format"),
    pytest.param(lambda t: write(t, "bad.yaml", chat_doc(workloadClass="batch")), (), "spec.workloadClass",
                 id="invalid-spec-field"),
]


@pytest.mark.parametrize(("make_file", "extra", "message"), REFUSALS)
def test_refusals_exit_2_with_one_line(tmp_path: Path, make_file: object, extra: tuple[str, ...],
                                       message: str) -> None:
    path = make_file(tmp_path)  # type: ignore[operator]
    res = run("-f", path, *extra)
    assert res.returncode == 2
    assert res.stdout == ""
    assert "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("vllm-operator plan: ")
    assert message in res.stderr


def test_missing_file_argument_exits_2() -> None:
    res = run()
    assert res.returncode == 2 and "-f/--file" in res.stderr and "Traceback" not in res.stderr


def test_positional_file_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(CHAT), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "chat"
    assert cli.main([str(CHAT), "-f", str(ROOT / "examples" / "rag.yaml")]) == 2
    assert "two files given" in capsys.readouterr().err


SMALL_CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 24, "num_attention_heads": 16,
                "num_key_value_heads": 4, "hidden_size": 2048,
                "max_position_embeddings": 32768, "intermediate_size": 5632, "vocab_size": 32000}


def test_model_config_prints_the_facts_block_the_cluster_needs(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The operator has no --model-config: `plan` prints the spec.model.facts block, and a spec carrying it plans
    exactly as the flag did (same plan hash)."""
    cfg = write(tmp_path, "config.json", json.dumps(SMALL_CONFIG))
    spec = write(tmp_path, "d.yaml", chat_doc(model={"name": "acme/small-2b"}))
    assert cli.main(["-f", spec, "--model-config", cfg, "--weights-gib", "4.5"]) == 0
    out = capsys.readouterr().out
    head, _, block = out.partition("model facts: ")
    assert "does not carry them" in block
    facts = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()[1:]))["spec"]["model"]["facts"]
    assert "pool short" in head
    assert {k: facts[k] for k in ("numLayers", "headDim", "maxContextLength", "weightsGiB")} == {
        "numLayers": 24, "headDim": 128, "maxContextLength": 32768, "weightsGiB": 4.5}
    assert cli.main(["-f", spec, "--model-config", cfg, "--weights-gib", "4.5", "-o", "json"]) == 0
    captured = capsys.readouterr()
    flag_hash = json.loads(captured.out)["hash"]
    assert "spec.model.facts" in captured.err and captured.err.count("\n") == 1
    doc = yaml.safe_load(Path(spec).read_text())
    doc["spec"]["model"]["facts"] = facts
    with_facts = write(tmp_path, "with-facts.yaml", yaml.safe_dump(doc))
    assert cli.main(["-f", with_facts, "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["hash"] == flag_hash and captured.err == ""
    assert cli.main(["-f", with_facts, "--model-config", cfg, "--weights-gib", "4.5"]) == 0
    assert "model facts:" not in capsys.readouterr().out  # the spec already carries them


def test_stdin_like_kubectl() -> None:
    """`plan -f -` (and a positional `-`) read the VLLMDeployment from stdin; errors name stdin."""
    for argv in (["-f", "-", "-o", "json"], ["-", "-o", "json"]):
        res = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "plan", *argv], cwd=ROOT,
                             input=CHAT.read_text(), capture_output=True, text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["name"] == "chat"
    res = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "plan", "-f", "-"], cwd=ROOT,
                         input="spec: [unclosed\n", capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert res.stderr.startswith("vllm-operator plan: stdin: stdin is not valid YAML at line"), res.stderr


def test_weights_gib_without_model_config_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-f", str(CHAT), "--weights-gib", "3"]) == 2
    assert "--weights-gib only applies with --model-config" in capsys.readouterr().err
