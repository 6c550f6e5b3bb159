"""The router image, run as the operator renders the router pod, serves a chat request to a fake vLLM.

The pod spec comes from rendering examples/cpu-dev.yaml (the router Deployment's command, securityContext,
read-only root, emptyDir /tmp, ConfigMap mount); the container runs with podman inside a network namespace of the
test's own with no route out (testcluster.netns), the fake engine beside it in the same namespace. The request goes
from the host through the namespace's veth to the router inside the container, and on to the fake engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from testcluster import netns
from tests.support import images
from tests.support.kube import wait_for
from tests.support.paths import ROOT
from tests.support.router import MODEL, router_config, write_word_tokenizer
from vllm_operator.rendering import router as router_rendering

pytestmark = pytest.mark.integration

FAKE_PORT = 8001


def test_router_image_serves_a_chat_request_to_a_fake_vllm(tmp_path: Path, pod_netns: netns.Netns) -> None:
    pod, container = images.rendered_pod("cpu-dev", router_rendering.CONTAINER)
    # the rendered pod mounts a tokenizer ConfigMap: the word-counting tokenizer of the router tests goes there
    (tokenizer_mount,) = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "tokenizer"]
    tokenizer_dir = write_word_tokenizer(tmp_path / "tokenizer")
    config = router_config(short=[f"http://127.0.0.1:{FAKE_PORT}"], long=[f"http://127.0.0.1:{FAKE_PORT}"],
                           **{"tokenizer.path": tokenizer_mount})
    config_dir = tmp_path / "config"
    config_dir.mkdir(mode=0o755)
    config_file = config_dir / Path(router_rendering.CONFIG_PATH).name
    config_file.write_text(json.dumps(config.model_dump(mode="json", by_alias=True, exclude_none=True)))
    for path in (config_file, *tokenizer_dir.iterdir()):
        path.chmod(0o644)
    tokenizer_dir.chmod(0o755)
    flags = images.pod_security_flags(pod, container, images.image_config("router")["User"],
                                      volumes={"config": config_dir, "tokenizer": tokenizer_dir})
    assert "--read-only" in flags and "--cap-drop=all" in flags  # what the operator renders for the router
    fake_log = (tmp_path / "fake.log").open("wb")
    fake = subprocess.Popen([*pod_netns.exec_prefix(), sys.executable, "-m", "fakevllm", "--host", "127.0.0.1",
                             "--port", str(FAKE_PORT), "--model", MODEL, "--tokens", "5"], cwd=ROOT,
                            stdout=fake_log, stderr=subprocess.STDOUT)
    try:
        with images.running("router", flags, container.get("args", []), tmp_path / "router.log",
                            network=f"ns:{pod_netns.path}", entrypoint=container["command"]) as router:
            base = f"http://{pod_netns.address}:{config.port}"

            def healthy() -> bool:
                assert router.running(), f"router container exited: {images.podman('logs', router.name).stderr}"
                try:
                    with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                        return resp.status == 200
                except OSError:
                    return False

            wait_for("the router container's /health", healthy, timeout=60)
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 5}
            request = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=20) as resp:
                answer = json.loads(resp.read())
            assert answer["choices"][0]["message"]["content"], answer
            assert answer["usage"]["completion_tokens"] == 5, answer
            uid = images.podman("exec", router.name, "id", "-u", check=False)
            assert uid.stdout.strip() == str(router_rendering.RUN_AS), uid
    finally:
        fake.terminate()
        fake.wait(timeout=10)
        fake_log.close()
