"""tests/support/images.pod_security_flags: the podman flags the image tests run each image with are what the
rendered pod spec demands, and a securityContext field it does not know fails instead of going unenforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import images
from vllm_operator.rendering import engine, router

ROUTER_VOLUMES = {"config": Path("/x"), "tokenizer": Path("/x")}


def test_router_pod_maps_to_non_root_read_only_without_capabilities(tmp_path: Path) -> None:
    pod, container = images.rendered_pod("cpu-dev", router.CONTAINER)
    flags = images.pod_security_flags(pod, container, "65532:65532",
                                      volumes={"config": tmp_path, "tokenizer": tmp_path})
    assert {"--user=65532:65532", "--read-only", "--cap-drop=all", "--security-opt=no-new-privileges",
            "--tmpfs=/tmp:rw,mode=1777", f"--volume={tmp_path}:{router.CONFIG_DIR}:ro"} <= set(flags)


def test_engine_pod_maps_to_its_uid_limits_and_shm(tmp_path: Path) -> None:
    pod, container = images.rendered_pod("cpu-dev", engine.CONTAINER)
    flags = images.pod_security_flags(pod, container, "2000:2000", volumes={"models": tmp_path})
    assert {"--user=2000:2000", "--cap-drop=all", "--cpus=1", f"--memory={4096 << 20}", f"--shm-size={1 << 30}",
            f"--volume={tmp_path}:/models:ro"} <= set(flags)
    assert "--read-only" not in flags  # the engine pod's root is writable (HOME, vLLM's caches)


@pytest.mark.parametrize("field", [{"privileged": True}, {"capabilities": {"add": ["NET_ADMIN"]}},
                                   {"procMount": "Unmasked"}], ids=str)
def test_a_field_it_cannot_enforce_fails(field: dict[str, object]) -> None:
    pod, container = images.rendered_pod("cpu-dev", router.CONTAINER)
    container = {**container, "securityContext": {**container["securityContext"], **field}}
    with pytest.raises(AssertionError):
        images.pod_security_flags(pod, container, "65532:65532", volumes=ROUTER_VOLUMES)


def test_run_as_root_is_refused_under_run_as_non_root() -> None:
    pod, container = images.rendered_pod("cpu-dev", router.CONTAINER)
    pod = {**pod, "securityContext": {**pod["securityContext"], "runAsUser": 0}}
    with pytest.raises(AssertionError, match="runAsNonRoot"):
        images.pod_security_flags(pod, container, "65532:65532", volumes=ROUTER_VOLUMES)
