"""Every rendered built-in object passes `kubernetes-validate --strict` (unknown fields are errors), in one run.

The objects come from every example's real plan and from the hand-built GPU/CPU cases; the Prometheus Operator kinds
(PodMonitor, PrometheusRule) have no schema in kubernetes-validate and are checked by their own tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.paths import EXAMPLE_FILES
from tests.unit.rendering.plans import cpu_case, gpu_case, make_plan, with_spec
from vllm_operator.rendering import cli, render

VALIDATOR = Path(sys.executable).parent / "kubernetes-validate"
CUSTOM = {"monitoring.coreos.com/v1"}


def all_objects() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for example in EXAMPLE_FILES:
        objects += cli.render_documents(cli.load_documents(str(example)))[0]
    for plan, _ in (gpu_case(), cpu_case()):
        objects += render(plan)
    objects += render(with_spec(make_plan(name="n" * 253, long_enabled=False), gpu_case()[1]))
    return objects


def test_rendered_builtin_objects_pass_strict_validation(tmp_path: Path) -> None:
    builtin = [o for o in all_objects() if o["apiVersion"] not in CUSTOM]
    kinds = {o["kind"] for o in builtin}
    assert kinds == {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "NetworkPolicy", "Service",
                     "PodDisruptionBudget", "Deployment"}
    files = []
    for i, obj in enumerate(builtin):
        path = tmp_path / f"{i:03d}-{obj['kind']}-{obj['metadata']['name'][:40]}.yaml"
        path.write_text(cli.manifests_yaml([obj]))
        files.append(str(path))
    result = subprocess.run([str(VALIDATOR), "--strict", "--no-warn", *files], capture_output=True, text=True,
                            timeout=240, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed") == len(builtin), result.stdout
