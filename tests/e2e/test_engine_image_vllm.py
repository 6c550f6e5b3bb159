"""The engine-cpu image serves a request with real vLLM, run as the operator renders a CPU pool's pod.

The pod spec is the short pool's of examples/cpu-dev.yaml (the engine wrapper `vllm-operator engine -- vllm serve
/models/tiny-llama …`, --load-format=dummy, its env, uid 2000 with no capabilities and no privilege escalation, 1 CPU
and 4 GiB, a 1 GiB /dev/shm); /models holds the tiny model of scripts/make_model.py. The container runs inside a
network namespace of the test's own with no route out; $(POD_IP) is that namespace's address, as a kubelet would
substitute the pod's IP. The request goes from the host through the namespace's veth.

Cold: the image's /opt/vllm is dropped from the page cache first, as on a node that never ran it, so the container
is charged the torch and vLLM pages it reads; vLLM's CPU worker then has to be shown the working set (the engine
wrapper's vllm_operator/engine/vllm_site/_vllm_operator_working_set.py) or it refuses the planned KV cache.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testcluster import netns
from tests.support import images, vllm_cpu
from tests.support.health_harness import record_timing
from tests.support.kube import wait_for
from vllm_operator import constants
from vllm_operator.rendering import engine as engine_rendering

pytestmark = pytest.mark.e2e

MODEL = "vllm-operator/tiny-llama"  # --served-model-name of examples/cpu-dev.yaml


def test_engine_cpu_image_serves_a_completion_under_the_wrapper(tmp_path: Path, pod_netns: netns.Netns) -> None:
    pod, container = images.rendered_pod("cpu-dev", engine_rendering.CONTAINER)
    assert container["command"][:5] == ["vllm-operator", "engine", "--", "vllm", "serve"]
    model_path = Path(container["command"][5])
    models = tmp_path / "models"
    models.mkdir(mode=0o755)
    vllm_cpu.make_model("tiny", models / model_path.name)
    for path in [models, *models.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    flags = images.pod_security_flags(pod, container, images.image_config("engine-cpu")["User"],
                                      volumes={"models": models})
    assert "--cap-drop=all" in flags and "--user=2000:2000" in flags
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", item
            env[item["name"]] = pod_netns.address
    flags += [f"--env={k}={v}" for k, v in env.items()]
    # the kubelet's $(VAR) expansion of args
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
    port = next(int(a.split("=", 1)[1]) for a in args if a.startswith("--port="))
    base = f"http://{pod_netns.address}:{port}"
    images.evict_page_cache("engine-cpu", "/opt/vllm")  # cold, as on a fresh node (images.evict_page_cache says why)
    started = time.monotonic()
    with images.running("engine-cpu", flags, args, tmp_path / "engine.log",
                        network=f"ns:{pod_netns.path}", entrypoint=container["command"]) as engine:

        def ready() -> bool:
            assert engine.running(), f"engine container exited: {images.podman('logs', engine.name).stderr[-3000:]}"
            try:
                with urllib.request.urlopen(f"{base}/v1/models", timeout=2) as resp:
                    return MODEL in resp.read().decode()
            except OSError:
                return False

        wait_for("vLLM in the engine-cpu container", ready, timeout=400, interval=1)
        serving = time.monotonic() - started
        stat = images.podman("exec", engine.name, "cat", "/sys/fs/cgroup/memory/memory.stat", check=False).stdout
        memory = {k: int(v) for k, v in (line.split() for line in stat.splitlines() if line.count(" ") == 1)
                  if k in ("total_rss", "total_cache", "total_shmem", "total_active_file", "total_inactive_file")}
        record_timing("engine-cpu image, cold page cache -> serving", serving, tier="engine-cpu image",
                      memory_stat_mib={k: round(v / 2**20) for k, v in memory.items()})
        body = {"model": MODEL, "prompt": "hello world", "max_tokens": 4, "temperature": 0}
        request = urllib.request.Request(f"{base}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as resp:
            answer = json.loads(resp.read())
        assert answer["usage"]["completion_tokens"] == 4, answer
        # the wrapper's status endpoint saw vLLM through to serving
        status_url = f"http://{pod_netns.address}:{constants.ENGINE_STATUS_PORT}{engine_rendering.STARTUP_PATH}"
        try:
            with urllib.request.urlopen(status_url, timeout=5) as resp:
                assert resp.status == 200
        except urllib.error.HTTPError as err:
            raise AssertionError(f"the wrapper's {engine_rendering.STARTUP_PATH} answered {err.code}") from err
        assert images.podman("exec", engine.name, "id", "-u").stdout.strip() == "2000"
