"""Engine pods as a real cluster needs them (issue 21 item 10): GPU pods request the CPU and host memory vLLM uses
(Burstable, not BestEffort), every engine pod runs with RuntimeDefault seccomp and no capabilities, and the project's
images run as their non-root user while an image the spec names keeps its own."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLES
from vllm_operator.planning import host_resources
from vllm_operator.rendering import cli

GIB = 2**30


def engine_pods(doc: dict[str, Any]) -> list[dict[str, Any]]:
    objects, _ = cli.render_documents([doc])
    return [o["spec"]["template"]["spec"] for o in objects
            if o["kind"] == "Deployment" and o["metadata"]["labels"].get("vllm-operator.dev/pool")]


def example(name: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    doc["spec"].update(spec)
    return dict(doc)


def test_request_figures() -> None:
    """The numbers host_resources.py reasons: 2 cores + 1 per GPU under TP; 2 GiB + 3 GiB per GPU + one shard."""
    assert [host_resources.gpu_pod_cpus(n) for n in (1, 2, 4, 8)] == [2, 4, 6, 10]
    assert host_resources.gpu_pod_memory_gib(1, 15 * GIB) == 10  # Llama-3.1-8B bf16 on one GPU
    assert host_resources.gpu_pod_memory_gib(8, 131 * GIB) == 31  # 70B on eight
    assert host_resources.gpu_pod_memory_gib(1, GIB // 2) == 6  # a checkpoint smaller than a shard


@pytest.mark.parametrize(("count", "model", "cpu", "memory"), [
    (1, "meta-llama/Llama-3.1-8B-Instruct", "2", "10Gi"),
    (8, "meta-llama/Llama-3.1-70B-Instruct", "10", "31Gi"),
])
def test_gpu_pods_request_cpu_and_host_memory(count: int, model: str, cpu: str, memory: str) -> None:
    doc = example("long-doc", accelerator={"type": "nvidia-h100-80gb", "count": count})
    doc["spec"]["model"] = {"name": model}
    for pod in engine_pods(doc):
        (container,) = pod["containers"]
        assert container["resources"] == {"requests": {"cpu": cpu, "memory": memory},
                                          "limits": {"nvidia.com/gpu": str(count)}}


def test_spec_resources_win_and_a_lone_limit_is_not_contradicted() -> None:
    doc = example("chat", pools={"short": {"resources": {"requests": {"memory": "20Gi"}, "limits": {"cpu": "3"}}},
                                 "long": {"replicas": 1}})
    short, long = engine_pods(doc)[1], engine_pods(doc)[0]
    assert short["containers"][0]["resources"] == {"requests": {"memory": "20Gi"},  # cpu: Kubernetes uses the limit
                                                   "limits": {"cpu": "3", "nvidia.com/gpu": "1"}}
    assert long["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "10Gi"}


@pytest.mark.parametrize("name", ["chat", "cpu-dev"])
def test_project_images_run_non_root_without_capabilities(name: str) -> None:
    for pod in engine_pods(example(name)):
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 2000,
                                          "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["securityContext"] == {"allowPrivilegeEscalation": False,
                                                           "capabilities": {"drop": ["ALL"]}}


def test_an_image_the_spec_names_keeps_its_user() -> None:
    """The official vLLM image runs as root (HOME=/root): no uid is forced and runAsNonRoot would refuse it, but
    capabilities, privilege escalation and seccomp are still locked down."""
    for pod in engine_pods(example("chat", engine={"gpu": {"image": "vllm/vllm-openai:v0.33.0"}})):
        assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["image"] == "vllm/vllm-openai:v0.33.0"
        assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("dockerfile", ["engine-gpu.Dockerfile", "engine-cpu.Dockerfile"])
def test_the_uid_is_the_one_the_engine_images_create(dockerfile: str) -> None:
    from tests.support.paths import ROOT
    from vllm_operator.images import PROJECT_IMAGE_USER as IMAGE_USER

    text = (ROOT / "images" / dockerfile).read_text()
    assert f"USER {IMAGE_USER}:{IMAGE_USER}" in text and f"--uid {IMAGE_USER}" in text
