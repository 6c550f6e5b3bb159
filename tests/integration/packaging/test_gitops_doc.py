"""docs/gitops.md says what works: its pipeline snippet renders and gates for real, and both ways it gives to install
the Argo CD health check carry exactly charts/vllm-operator/argocd/health.lua."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.helm import CHART_DIR
from tests.support.paths import EXAMPLE_FILES, ROOT

DOC = ROOT / "docs" / "gitops.md"
HEALTH_KEY = "resource.customizations.health.vllm-operator.dev_VLLMDeployment"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def pipeline_snippet() -> str:
    (snippet,) = [b for b in blocks("sh") if "vllm-operator render" in b]
    return snippet


def run_pipeline(workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", pipeline_snippet()], cwd=workdir, capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def test_pipeline_snippet_renders_every_example(tmp_path: Path) -> None:
    (tmp_path / "deploy" / "vllm").mkdir(parents=True)
    for example in EXAMPLE_FILES:
        shutil.copy(example, tmp_path / "deploy" / "vllm" / example.name)
    proc = run_pipeline(tmp_path)
    assert proc.returncode == 0, proc.stderr
    for example in EXAMPLE_FILES:
        docs = [d for d in yaml.safe_load_all((tmp_path / "rendered" / example.name).read_text()) if d]
        assert {"Deployment", "Service", "ConfigMap", "Role"} <= {d["kind"] for d in docs}, example.name


def test_pipeline_snippet_fails_on_a_spec_the_operator_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "deploy" / "vllm").mkdir(parents=True)
    bad = yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())
    bad["spec"]["pools"]["long"]["maxModelLen"] = 1_000_000
    (tmp_path / "deploy" / "vllm" / "chat.yaml").write_text(yaml.safe_dump(bad))
    proc = run_pipeline(tmp_path)
    assert proc.returncode == 1
    assert "maxModelLen" in proc.stderr and "1000000" in proc.stderr


def test_argocd_cm_snippet_carries_the_health_script() -> None:
    (configmap,) = [yaml.safe_load(b) for b in blocks("yaml") if "argocd-cm" in b]
    assert configmap["data"][HEALTH_KEY] == (CHART_DIR / "argocd" / "health.lua").read_text()


def test_kubectl_patch_snippet_builds_the_same_patch() -> None:
    (snippet,) = [b for b in blocks("sh") if "patch configmap argocd-cm" in b]
    code = re.search(r"python3 -c '(.*?)' (\S+)\)\"", snippet, flags=re.S)
    assert code, snippet
    proc = subprocess.run([sys.executable, "-c", code.group(1), code.group(2)], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    patch = json.loads(proc.stdout)
    assert patch == {"data": {HEALTH_KEY: (CHART_DIR / "argocd" / "health.lua").read_text()}}
