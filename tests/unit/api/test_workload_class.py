"""VLLMWorkloadClass: the generated CRD and built-ins do not drift, the built-ins are today's profiles, the CEL rules
and the pydantic validators refuse the same classes, and `plan -f --class` resolves a class offline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tests.support.paths import ROOT
from vllm_operator import constants
from vllm_operator.api import crdgen, remediation
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.api.spec import RemediationSpec
from vllm_operator.api.workload_class import VLLMWorkloadClassSpec
from vllm_operator.planning import RemediationState, classfile, plan, profiles, resolve_class
from vllm_operator.planning import cli as plan_cli
from vllm_operator.rendering import render

CLASS_CRD = ROOT / "crds" / "vllm-operator.dev_vllmworkloadclasses.yaml"
CHART_CLASS_CRD = ROOT / "charts" / "vllm-operator" / "crds" / "vllm-operator.dev_vllmworkloadclasses.yaml"
BUILTINS = ROOT / "charts" / "vllm-operator" / "templates" / "workloadclasses.yaml"
AGENT = ROOT / "examples" / "classes" / "agent.yaml"
CHAT = ROOT / "examples" / "chat.yaml"


def test_generated_files_do_not_drift() -> None:
    assert CLASS_CRD.read_text() == crdgen.class_crd_yaml(), "run `make crds`"
    assert CHART_CLASS_CRD.read_text() == CLASS_CRD.read_text(), "run `make crds`"
    assert BUILTINS.read_text() == classfile.builtin_classes_yaml(), "run `make crds`"


def test_cli_prints_each_generated_file() -> None:
    for flag, text in (("--workload-class", crdgen.class_crd_yaml()), ("--builtin-classes", BUILTINS.read_text())):
        out = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "crd", flag], capture_output=True, text=True,
                             check=True)
        assert out.stdout == text
    bad = subprocess.run([sys.executable, "-m", "vllm_operator.cli", "crd", "--nope"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2 and "unexpected arguments" in bad.stderr


def builtin_docs() -> list[dict[str, Any]]:
    body = "\n".join(line for line in BUILTINS.read_text().splitlines() if not line.startswith("{{"))
    return [d for d in yaml.safe_load_all(body) if d]


def test_builtins_equal_the_profiles_table() -> None:
    docs = builtin_docs()
    assert [d["metadata"]["name"] for d in docs] == ["chat", "multi-turn", "rag", "long-doc"]
    for doc in docs:
        parsed = profiles.parse_class(doc)
        assert parsed.spec == profiles.builtin(doc["metadata"]["name"]).spec
    long_doc = next(d for d in docs if d["metadata"]["name"] == "long-doc")["spec"]
    assert long_doc["pools"]["long"]["kvCachePolicy"] == "fp8-if-native"
    assert long_doc["pools"]["long"]["maxModelLen"] == 32768 and long_doc["pools"]["long"]["maxTokens"] == 4096


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_builtin_class_object_plans_exactly_like_the_table(path: Path) -> None:
    resource = parse_resource(yaml.safe_load(path.read_text()))
    assert resource.spec.workload_class is not None
    from_object = {d["metadata"]["name"]: profiles.parse_class(d) for d in builtin_docs()}
    args = dict(name=resource.metadata.name, namespace=resource.metadata.namespace)
    with_table = plan(resource.spec, None, RemediationState(), **args)  # type: ignore[arg-type]
    with_object = plan(resource.spec, None, RemediationState(), **args,  # type: ignore[arg-type]
                       workload_class=resolve_class(resource.spec, from_object))
    assert with_object.hash == with_table.hash


def test_crd_is_cluster_scoped_with_key_number_columns() -> None:
    crd = crdgen.class_crd()
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["shortNames"] == [constants.CLASS_SHORT_NAME]
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Short-Len"] == ".spec.pools.short.maxModelLen"
    assert columns["Long-Max"] == ".spec.pools.long.maxTokens"
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [v["rule"] for v in spec["x-kubernetes-validations"]]
    assert "self.promptLengthThreshold <= self.pools.short.maxModelLen" in rules


def agent_spec(**patch: Any) -> dict[str, Any]:
    doc = yaml.safe_load(AGENT.read_text())
    spec: dict[str, Any] = doc["spec"]
    for path, value in patch.items():
        node = spec
        *head, last = path.split(".")
        for part in head:
            node = node[part]
        node[last] = value
    return spec


@pytest.mark.parametrize(("patch", "text"), [
    ({"pools.short.maxTokens": 12288}, "maxTokens (12288) must be below maxModelLen (12288)"),
    ({"pools.short.maxModelLen": 65536, "promptLengthThreshold": 100}, "short.maxModelLen (65536) must not exceed"),
    ({"promptLengthThreshold": 20000}, "promptLengthThreshold (20000) exceeds pools.short.maxModelLen (12288)"),
    ({"pools.long.kvCachePolicy": "fp4"}, "kvCachePolicy"),
])
def test_pydantic_refuses_what_cel_refuses(patch: dict[str, Any], text: str) -> None:
    with pytest.raises(ValidationError, match=None) as err:
        VLLMWorkloadClassSpec.model_validate(agent_spec(**{k.replace("__", "."): v for k, v in patch.items()}))
    assert text in str(err.value)


def test_resolution_default_missing_and_two_defaults() -> None:
    agent = profiles.parse_class(yaml.safe_load(AGENT.read_text()))
    spec = parse_resource(yaml.safe_load(CHAT.read_text())).spec
    unnamed = spec.model_copy(update={"workload_class": None})
    with pytest.raises(SpecError, match="no VLLMWorkloadClass is marked default"):
        resolve_class(unnamed, {"agent": agent})
    marked = profiles.NamedClass(agent.name, agent.spec.model_copy(update={"default": True}))
    assert resolve_class(unnamed, {"agent": marked}).name == "agent"
    other = profiles.NamedClass("batch", marked.spec)
    with pytest.raises(SpecError, match=r"2 VLLMWorkloadClasses are marked default \(agent, batch\)"):
        resolve_class(unnamed, {"agent": marked, "batch": other})
    with pytest.raises(SpecError, match="'batch' does not exist"):
        resolve_class(spec.model_copy(update={"workload_class": "batch"}), {"agent": agent})
    assert resolve_class(spec, {}).name == "chat"  # a built-in name needs no object


def chat_as(tmp_path: Path, klass: str) -> Path:
    doc = yaml.safe_load(CHAT.read_text())
    doc["spec"]["workloadClass"] = klass
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_plan_offline_with_a_class_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = chat_as(tmp_path, "agent")
    assert plan_cli.main(["-f", str(spec), "--class", str(AGENT)]) == 0
    out = capsys.readouterr().out
    assert "class agent" in out and "--max-model-len=12288" in out and "threshold 11264" in out
    both = tmp_path / "both.yaml"
    both.write_text(AGENT.read_text() + "\n---\n" + spec.read_text())
    assert plan_cli.main(["-f", str(both)]) == 0
    assert "class agent" in capsys.readouterr().out
    assert plan_cli.main(["-f", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "spec.workloadClass" in err and "'agent' does not exist" in err and "Traceback" not in err


def test_plan_offline_refuses_a_bad_class_file_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(AGENT.read_text())
    doc["spec"]["pools"]["short"]["maxTokens"] = 99999
    bad.write_text(yaml.safe_dump(doc))
    assert plan_cli.main(["-f", str(chat_as(tmp_path, "agent")), "--class", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "VLLMWorkloadClass agent" in err and "maxTokens (99999)" in err


def test_class_tiers_apply_when_the_spec_lists_none(tmp_path: Path) -> None:
    agent = profiles.parse_class(yaml.safe_load(AGENT.read_text()))
    resource = parse_resource(yaml.safe_load(chat_as(tmp_path, "agent").read_text()))
    spec = resource.spec.model_copy(update={"routing": None})
    p = plan(spec, None, RemediationState(), name="c", namespace="n", workload_class=agent)
    assert [(t.name, t.default_max_tokens, t.max_tokens) for t in p.router.tiers] == [("default", 1024, 2048)]


def test_class_thresholds_reach_the_plan_the_alerts_and_the_health_loop(tmp_path: Path) -> None:
    """A class's remediationThresholds apply to its deployments; the deployment's own win field by field; the alert
    rules and the health loop's settings read the same merged numbers from the plan."""
    agent = profiles.parse_class(yaml.safe_load(AGENT.read_text()))
    resource = parse_resource(yaml.safe_load(chat_as(tmp_path, "agent").read_text()))
    bare = resource.spec.model_copy(update={"remediation": None})
    p = plan(bare, None, RemediationState(), name="c", namespace="n", workload_class=agent)
    assert p.thresholds is not None and (p.thresholds.stall_seconds, p.thresholds.window_seconds) == (60, 300)
    settings = remediation.resolve(bare.remediation, thresholds=p.thresholds)
    assert (settings.stall_s, settings.window_s, settings.oom_count) == (60, 300, constants.DEFAULT_OOM_COUNT)
    rule = next(o for o in render(p) if o["kind"] == "PrometheusRule")
    assert "[1m]" in yaml.safe_dump(rule) and "[2m]" not in yaml.safe_dump(rule)

    own = bare.model_copy(update={"remediation": RemediationSpec.model_validate({"thresholds": {"stallSeconds": 30}})})
    q = plan(own, None, RemediationState(), name="c", namespace="n", workload_class=agent)
    assert q.thresholds is not None and (q.thresholds.stall_seconds, q.thresholds.window_seconds) == (30, 300)


def test_builtins_state_the_operator_default_thresholds() -> None:
    for obj in profiles.builtin_classes():
        t = obj["spec"]["remediationThresholds"]
        assert t == remediation.default_thresholds().to_wire(), obj["metadata"]["name"]
    assert remediation.resolve(None, thresholds=remediation.default_thresholds()) == remediation.resolve(None)
