"""The process runtime's pure parts: kubelet-style `$(VAR)` expansion, container -> host path mapping, the image
table's lookup, CPU quantities and probe parsing (processnode/processes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from processnode.processes import (
    IMAGE_TABLE,
    LaunchContext,
    Probe,
    expand,
    image_repository,
    map_paths,
    quantity_cores,
)

ENV = {"POD_IP": "127.10.0.2", "PORT": "8000"}


@pytest.mark.parametrize(("text", "expected"), [
    ("--host=$(POD_IP)", "--host=127.10.0.2"),
    ("$(POD_IP):$(PORT)", "127.10.0.2:8000"),
    ("$$(POD_IP)", "$(POD_IP)"),
    ("$(UNKNOWN)", "$(UNKNOWN)"),
    ("$POD_IP", "$POD_IP"),
    ("no refs", "no refs"),
], ids=["flag", "two", "escaped", "unknown-stays", "shell-form-untouched", "plain"])
def test_expand_like_the_kubelet(text: str, expected: str) -> None:
    assert expand(text, ENV) == expected


MOUNTS = [("/etc/vllm-operator/router", Path("/tmp/pod/volumes/config")), ("/tmp", Path("/tmp/pod/volumes/tmp")),
          ("/models", Path("/data/models"))]


@pytest.mark.parametrize(("text", "expected"), [
    ("/etc/vllm-operator/router/router.json", "/tmp/pod/volumes/config/router.json"),
    ("--model=/models/tiny-llama", "--model=/data/models/tiny-llama"),
    ("HF_HOME=/tmp/hf-home", "HF_HOME=/tmp/pod/volumes/tmp/hf-home"),
    ('{"path": "/models/tiny-llama"}', '{"path": "/data/models/tiny-llama"}'),
    ("/modelsX/a", "/modelsX/a"),
    ("/models", "/data/models"),
    ("relative/models/a", "relative/models/a"),
], ids=["mount-prefix", "after-equals", "host-path-under-another-mount-not-remapped", "in-json", "longer-name",
        "exact", "not-at-a-boundary"])
def test_map_paths_rewrites_container_paths_once(text: str, expected: str) -> None:
    assert map_paths(text, MOUNTS) == expected


@pytest.mark.parametrize(("image", "repo"), [
    ("ghcr.io/vllm-operator/engine-cpu:0.32.0", "ghcr.io/vllm-operator/engine-cpu"),
    ("localhost:5000/router", "localhost:5000/router"),
    ("localhost:5000/router:1.0@sha256:abc", "localhost:5000/router"),
], ids=["tag", "registry-port-no-tag", "tag-and-digest"])
def test_image_repository(image: str, repo: str) -> None:
    assert image_repository(image) == repo


@pytest.mark.parametrize(("value", "cores"), [("1", 1), ("1500m", 2), (2, 2), ("250m", 1)],
                         ids=["one", "millis-up", "int", "at-least-one"])
def test_quantity_cores(value: Any, cores: int) -> None:
    assert quantity_cores(value) == cores


def test_engine_image_runs_the_wrapper_with_the_cpu_launcher(tmp_path: Path) -> None:
    ctx = LaunchContext(pod_ip="127.10.0.2", termination_file=tmp_path / "t", kubeconfig=None,
                        vllm_python=Path("/v/bin/python"))
    launch = IMAGE_TABLE["ghcr.io/vllm-operator/engine-cpu"](
        ["vllm-operator", "engine", "--", "vllm", "serve", "/m", "--port=8000"], ctx)
    assert launch.argv[1:] == ["engine", "--launcher=api-server", "--python=/v/bin/python",
                               f"--termination-message-path={tmp_path / 't'}", "--preflight=off", "--", "vllm",
                               "serve", "/m", "--port=8000"]
    router = IMAGE_TABLE["ghcr.io/vllm-operator/router"](["vllm-operator", "router", "--config", "/c"], ctx)
    assert router.argv[1:] == ["router", "--host=127.10.0.2", "--config", "/c"]
    with pytest.raises(ValueError, match=r"expected command `vllm-operator engine \.\.\.`"):
        IMAGE_TABLE["ghcr.io/vllm-operator/engine-cpu"](["vllm", "serve"], ctx)


def test_probe_resolves_named_ports_and_defaults() -> None:
    container = {"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}
    probe = Probe.from_spec({"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5}, container)
    assert probe == Probe(path="/health", port=8000, initial_delay_s=0, period_s=5, timeout_s=1, failure_threshold=3,
                          success_threshold=1)
    assert Probe.from_spec({"tcpSocket": {"port": 8000}}, container) is None
    with pytest.raises(ValueError, match="probe port 'metrics' names no port of container 'engine'"):
        Probe.from_spec({"httpGet": {"port": "metrics"}}, container)
