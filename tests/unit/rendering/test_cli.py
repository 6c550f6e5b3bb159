"""`vllm-operator render`: multi-document YAML on success, exit 2 with one line on stderr for bad input — never a
traceback (also through the real console script)."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import EXAMPLES
from vllm_operator.planning import cli as plan_cli
from vllm_operator.rendering import cli

CHAT = EXAMPLES / "chat.yaml"
VLLM_OPERATOR = Path(sys.executable).parent / "vllm-operator"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_renders_multi_document_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["-f", str(CHAT)], capsys)
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs][:4] == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap"]
    assert len(docs) == 16 and all(d["metadata"]["namespace"] == "ml" for d in docs)
    assert "router.json: |" in out  # the router config is a readable literal block
    assert all(line.startswith("vllm-operator render: warning: ") for line in err.splitlines())


def test_several_documents_render_in_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.yaml"
    both.write_text(CHAT.read_text() + "\n---\n" + (EXAMPLES / "rag.yaml").read_text())
    rc, out, _ = run(["-f", str(both)], capsys)
    assert rc == 0
    assert {d["metadata"]["labels"]["vllm-operator.dev/deployment"] for d in yaml.safe_load_all(out)} == {"chat",
                                                                                                         "rag"}


def test_scraper_options(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["-f", str(CHAT), "--scraper-pod-labels", "app=vmagent",
                      "--scraper-namespace-labels", "kubernetes.io/metadata.name=monitoring"], capsys)
    assert rc == 0
    policy = next(d for d in yaml.safe_load_all(out) if d["kind"] == "NetworkPolicy")
    assert policy["spec"]["ingress"][1]["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app": "vmagent"}}}]


def test_gpu_flag_resolves_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    auto = tmp_path / "auto.yaml"
    auto.write_text(CHAT.read_text().replace("type: nvidia-l4-24gb", "type: auto"))
    rc, _, err = run(["-f", str(auto)], capsys)
    assert rc == 2 and "auto" in err and "--gpu" in err
    rc, out, _ = run(["-f", str(auto), "--gpu", "nvidia-h100-80gb"], capsys)
    assert rc == 0
    dep = next(d for d in yaml.safe_load_all(out)
               if d["kind"] == "Deployment" and d["metadata"]["name"] == "chat-short")
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert "NVIDIA-H100-PCIe" in terms[0]["matchExpressions"][0]["values"]


CASES = {
    "missing-file": ("no/such/file.yaml", None, "cannot read no/such/file.yaml"),
    "broken-yaml": ("f.yaml", "spec: [unclosed\n", "is not valid YAML at line"),
    "empty-file": ("f.yaml", "# only a comment\n", "is empty"),
    "wrong-kind": ("f.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "expected VLLMDeployment"),
    "not-a-mapping": ("f.yaml", "- a\n- b\n", "expected a VLLMDeployment mapping"),
    "refused-plan": ("f.yaml", CHAT.read_text().replace("long: {replicas: 1}", "long: {maxModelLen: 262144}"),
                     "spec.pools.long"),
    "invalid-spec": ("f.yaml", CHAT.read_text().replace("type: nvidia-l4-24gb", "type: cpu"), "memoryGiB"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_exits_2_with_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, content, expected = CASES[case]
    path = name
    if content is not None:
        (tmp_path / name).write_text(content)
        path = str(tmp_path / name)
    rc, out, err = run(["-f", path], capsys)
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("vllm-operator render: ") and expected in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [pytest.param([], id="no-file"), pytest.param(["-f", str(CHAT), "--nope"],
                                                                                  id="unknown-flag"),
                                  pytest.param(["-f", str(CHAT), "--gpu", "nvidia-k80"], id="unknown-gpu"),
                                  pytest.param(["-f", str(CHAT), "--gpu", "cpu"], id="gpu-cpu"),
                                  pytest.param(["-f", str(CHAT), "--scraper-pod-labels", "novalue"],
                                               id="bad-labels")])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(argv, capsys)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_console_script(tmp_path: Path) -> None:
    ok = subprocess.run([str(VLLM_OPERATOR), "render", "-f", str(EXAMPLES / "cpu-dev.yaml")], capture_output=True,
                        text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert len(list(yaml.safe_load_all(ok.stdout))) == 16
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [")
    failed = subprocess.run([str(VLLM_OPERATOR), "render", "-f", str(bad)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert failed.returncode == 2 and failed.stdout == ""
    assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in (a.option_strings or [a.dest])}


def test_render_takes_every_flag_plan_takes() -> None:
    """The README promises render has plan's flags: every plan option exists on render with the same meaning
    (only -o differs in its formats)."""
    plan_opts, render_opts = _options(plan_cli._parser()), _options(cli._parser())
    for name, action in plan_opts.items():
        if name in {"-h", "--help"}:
            continue
        assert name in render_opts, f"render lacks plan's {name}"
        other = render_opts[name]
        if name not in {"-o", "--output"}:
            assert (other.dest, other.nargs, other.type, other.metavar) == (
                action.dest, action.nargs, action.type, action.metavar), name


def test_positional_path_stdin_json_and_model_config(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rc, positional, _ = run([str(CHAT)], capsys)
    assert rc == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(CHAT.read_text()))
    rc, from_stdin, _ = run(["-f", "-"], capsys)
    assert rc == 0 and from_stdin == positional
    rc, as_json, _ = run([str(CHAT), "-o", "json"], capsys)
    listed = json.loads(as_json)
    assert rc == 0 and listed["kind"] == "List" and listed["items"] == list(yaml.safe_load_all(positional))
    config = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 24, "num_attention_heads": 16,
              "num_key_value_heads": 4, "hidden_size": 2048,
              "max_position_embeddings": 32768, "intermediate_size": 5632, "vocab_size": 32000}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = yaml.safe_load(CHAT.read_text())
    spec["spec"]["model"] = {"name": "acme/small-2b"}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(spec))
    rc, _, err = run([str(tmp_path / "d.yaml")], capsys)
    assert rc == 2 and "acme/small-2b" in err
    rc, out, err = run([str(tmp_path / "d.yaml"), "--model-config", str(tmp_path / "config.json"),
                        "--weights-gib", "4.5"], capsys)
    assert rc == 0, err
    engine = next(d for d in yaml.safe_load_all(out) if d["metadata"]["name"] == "chat-short"
                  and d["kind"] == "Deployment")
    pod = engine["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"][-1] == "/run/vllm-operator/weights/model", "the cached model's link"
    assert "--repo=acme/small-2b" in pod["initContainers"][-1]["command"]
    assert "add spec.model.facts" in err and '"weightsGiB": 4.5' in err


MIRROR = "registry.example:5000/mirror/vllm-operator"


def test_image_repository_moves_every_default_image(capsys: pytest.CaptureFixture[str]) -> None:
    """--image-repository (the operator's flag) on render and plan: every default image comes from the mirror,
    with the same names and tags; an image the spec names itself stays as written."""
    rc, default, _ = run([str(CHAT)], capsys)
    rc2, mirrored, _ = run([str(CHAT), "--image-repository", MIRROR], capsys)
    assert rc == rc2 == 0

    def images(text: str) -> list[str]:
        return [c["image"] for d in yaml.safe_load_all(text) if d["kind"] == "Deployment"
                for c in d["spec"]["template"]["spec"]["containers"]]

    assert [i.replace("ghcr.io/vllm-operator", MIRROR) for i in images(default)] == images(mirrored)
    assert len(set(images(mirrored))) == 2
    doc = yaml.safe_load(CHAT.read_text())
    doc["spec"]["router"] = {"image": "quay.example/team/router:7"}
    doc["spec"]["engine"] = {"gpu": {"image": "vllm/vllm-openai:v0.33.0"}}
    named = yaml.safe_dump(doc)
    from vllm_operator.images import ImageDefaults
    objects, _ = cli.render_documents([yaml.safe_load(named)], images=ImageDefaults(MIRROR))
    assert sorted({c["image"] for o in objects if o["kind"] == "Deployment"
                   for c in o["spec"]["template"]["spec"]["containers"]}) == ["quay.example/team/router:7",
                                                                              "vllm/vllm-openai:v0.33.0"]
    assert plan_cli.main([str(CHAT), "--image-repository", MIRROR]) == 0
    assert f"image  {MIRROR}/engine-gpu:" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "problem"), [("mirror.example/x:1.0", "must not carry a tag"),
                                                ("mirror.example/", "must not end with '/'"),
                                                ("Mirror/x", "is not a registry/repository prefix")])
def test_bad_image_repository_is_one_line(value: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    for main in (cli.main, plan_cli.main):
        assert main([str(CHAT), "--image-repository", value]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and problem in err and "--image-repository" in err, err


def test_operator_wide_pull_secrets_follow_the_spec_own(capsys: pytest.CaptureFixture[str]) -> None:
    """--image-pull-secret (the operator's flag): every engine and router pod pulls with it, after the spec's own
    imagePullSecrets and without repeating one; none given = the pods are as before."""
    doc = yaml.safe_load(CHAT.read_text())
    doc["spec"]["engine"] = {"imagePullSecrets": [{"name": "team-pull"}, {"name": "mirror-pull"}]}
    from vllm_operator.images import ImageDefaults
    objects, _ = cli.render_documents([doc], images=ImageDefaults(MIRROR, pull_secrets=("mirror-pull", "other-pull")))
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    assert len(deployments) == 3
    for dep in deployments:
        assert dep["spec"]["template"]["spec"]["imagePullSecrets"] == [
            {"name": "team-pull"}, {"name": "mirror-pull"}, {"name": "other-pull"}]
    rc, out, _ = run([str(CHAT), "--image-pull-secret", "mirror-pull", "--image-pull-secret", "b"], capsys)
    assert rc == 0
    assert {str(d["spec"]["template"]["spec"].get("imagePullSecrets")) for d in yaml.safe_load_all(out)
            if d["kind"] == "Deployment"} == {str([{"name": "mirror-pull"}, {"name": "b"}])}
    rc, out, _ = run([str(CHAT)], capsys)
    assert not any("imagePullSecrets" in d["spec"]["template"]["spec"] for d in yaml.safe_load_all(out)
                   if d["kind"] == "Deployment")
    rc, out, err = run([str(CHAT), "--image-pull-secret", "Bad_Name"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "'Bad_Name' is not a Secret name" in err
    # `plan` takes the flag too and shows the pull secrets the pods get: the plan names everything rendered.
    assert plan_cli.main([str(CHAT), "-o", "json", "--image-pull-secret", "b"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["pools"]["short"]["imagePullSecrets"] == planned["routerPod"]["imagePullSecrets"] == ["b"]
    assert plan_cli.main([str(CHAT), "--image-pull-secret", "Bad_Name"]) == 2
    assert "'Bad_Name' is not a Secret name" in capsys.readouterr().err


def test_run_takes_pull_secrets_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_operator.handlers.run import parse_args

    assert parse_args(["--image-pull-secret", "a"]).images.pull_secrets == ("a",)
    monkeypatch.setenv("VLLM_OPERATOR_IMAGE_PULL_SECRETS", "x, y")
    monkeypatch.setenv("VLLM_OPERATOR_IMAGE_REPOSITORY", MIRROR)
    config = parse_args([])
    assert config.images.pull_secrets == ("x", "y") and config.images.repository == MIRROR
    assert parse_args(["--image-pull-secret", "z"]).images.pull_secrets == ("z",)  # the flag replaces the env
