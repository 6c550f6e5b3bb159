"""The real helm binary (scripts/install-test-deps.sh puts it in .tools/) and chart rendering helpers for tests."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import ROOT

CHART_DIR = ROOT / "charts" / "vllm-operator"
HELM_TOOL = ROOT / ".tools" / "helm"


def helm_binary() -> Path:
    """The helm binary; a clear failure (never a skip) when it is missing."""
    if HELM_TOOL.is_file():
        return HELM_TOOL
    found = shutil.which("helm")
    if found:
        return Path(found)
    raise AssertionError(f"helm not found at {HELM_TOOL} or on PATH: run scripts/install-test-deps.sh")


def run_helm(args: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm_binary()), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def values_file(tmp_path: Path, values: Mapping[str, Any], name: str = "values.json") -> Path:
    """Write values as JSON (valid YAML) so tests state them as Python dicts."""
    path = tmp_path / name
    path.write_text(json.dumps(values))
    return path


def template(tmp_path: Path, values: Mapping[str, Any], *, release: str = "vo", namespace: str = "vllm-system",
             include_crds: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["template", release, str(CHART_DIR), "--namespace", namespace, "-f", str(values_file(tmp_path, values))]
    if include_crds:
        args.append("--include-crds")
    return run_helm(args, check=check)


def render(tmp_path: Path, values: Mapping[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    """The manifests `helm template` renders for `values` (empty documents dropped)."""
    out = template(tmp_path, values, **kwargs).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [d for d in docs if d["kind"] == kind]
