"""Engine pods with the weights cache: the fetch init container, the cache mounted read-write for it and read-only
for the engine, vLLM pointed at the cached snapshot, and the claim form's PersistentVolumeClaim."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.paths import EXAMPLES
from vllm_operator import constants
from vllm_operator.planning import cli_inputs
from vllm_operator.planning.weights_cache import NodeCache
from vllm_operator.rendering import cli, engine

CHAT = yaml.safe_load((EXAMPLES / "chat.yaml").read_text())


def rendered(doc: dict[str, Any], node_cache: NodeCache | None = None) -> list[dict[str, Any]]:
    planned = cli_inputs.plan_documents([doc], node_cache=node_cache) if node_cache else \
        cli_inputs.plan_documents([doc])
    objects, _ = cli.render_planned(planned, None)
    return objects


def pods_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][constants.LABEL_POOL]: o for o in objects
            if o["kind"] == "Deployment" and constants.LABEL_POOL in o["metadata"]["labels"]}


def with_model(**model: Any) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(CHAT))
    doc["spec"]["model"].update(model)
    return dict(doc)


def mounts(container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {m["name"]: (m["mountPath"], bool(m.get("readOnly"))) for m in container["volumeMounts"]}


def test_both_pools_fetch_into_the_node_cache_and_the_engine_reads_it_read_only() -> None:
    deployments = pods_of(rendered(CHAT))
    assert set(deployments) == {"short", "long"}
    fetch_commands = set()
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        owner, fetch = pod["initContainers"]
        (main,) = pod["containers"]
        assert owner["name"] == constants.CACHE_OWNER_CONTAINER and fetch["name"] == constants.FETCH_CONTAINER
        assert owner["command"] == ["chown", "2000:2000", constants.WEIGHTS_CACHE_MOUNT], "the top directory only"
        assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert fetch["image"] == main["image"], "the engine image carries the wrapper and huggingface_hub"
        assert fetch["command"][:2] == ["vllm-operator", "fetch"]
        fetch_commands.add(tuple(fetch["command"]))
        assert "--repo=meta-llama/Llama-3.1-8B-Instruct" in fetch["command"]
        assert "--revision=0e9e39f249a16976918f6564b8830bc894c89659" in fetch["command"]
        assert f"--max-bytes={constants.DEFAULT_WEIGHTS_CACHE_MAX_BYTES}" in fetch["command"]
        fetch_env = {e["name"]: e for e in fetch["env"]}
        assert fetch_env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}, \
            "the pod's own token: also the tenancy check"
        assert fetch_env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
        assert "HF_HUB_OFFLINE" not in fetch_env
        assert fetch["terminationMessagePath"] == "/dev/termination-log"
        assert mounts(fetch) == {engine.CACHE_VOLUME: (constants.WEIGHTS_CACHE_MOUNT, False),
                                 engine.LINK_VOLUME: (constants.WEIGHTS_LINK_DIR, False)}
        by_path = {m["mountPath"]: m for m in main["volumeMounts"]}
        assert by_path[constants.WEIGHTS_CACHE_MOUNT] == {"name": engine.CACHE_VOLUME, "readOnly": True,
                                                          "mountPath": constants.WEIGHTS_CACHE_MOUNT}
        assert by_path[constants.WEIGHTS_LINK_DIR]["name"] == engine.LINK_VOLUME
        assert by_path[constants.WEIGHTS_LINK_DIR]["readOnly"] is True
        assert by_path[constants.WEIGHTS_LEASES_MOUNT] == {
            "name": engine.CACHE_VOLUME, "mountPath": constants.WEIGHTS_LEASES_MOUNT, "subPath": ".leases"}, \
            "the only part of the cache the engine writes: its lease, renewed while it (re)starts"
        assert f"--weights-leases={constants.WEIGHTS_LEASES_MOUNT}" in main["command"]
        main_env = {e["name"]: e for e in main["env"]}
        assert main_env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid", "the lease's name"
        assert engine.MODEL_VOLUME not in mounts(main), "no per-pod download directory"
        assert main["command"][-1] == constants.WEIGHTS_LINK
        assert f"--hold-weights={constants.WEIGHTS_LINK}/.complete" in main["command"]
        assert not any(a.startswith("--revision") for a in main["args"])
        assert {e["name"]: e.get("value") for e in main["env"]}["HF_HUB_OFFLINE"] == "1"
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[engine.CACHE_VOLUME]["hostPath"] == {"path": constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH,
                                                            "type": "DirectoryOrCreate"}
        assert volumes[engine.LINK_VOLUME] == {"name": engine.LINK_VOLUME, "emptyDir": {}}
    assert len(fetch_commands) == 1, "both pools fetch the same entry"


def test_the_engine_startup_budget_counts_no_download_but_the_rollout_deadline_does() -> None:
    cached = pods_of(rendered(CHAT))["long"]
    uncached = pods_of(rendered(with_model(cache={"enabled": False})))["long"]
    probe = cached["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"]
    probe_uncached = uncached["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["failureThreshold"]
    assert probe == engine.STARTUP_BACKSTOP_S // engine.STARTUP_PERIOD_S < probe_uncached
    assert cached["spec"]["progressDeadlineSeconds"] == uncached["spec"]["progressDeadlineSeconds"] > \
        engine.STARTUP_BACKSTOP_S + engine.PROGRESS_DEADLINE_MARGIN_S, "a cold node still downloads"


def test_cache_off_keeps_the_per_pod_download() -> None:
    pod = pods_of(rendered(with_model(cache={"enabled": False})))["short"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert {v["name"]: v for v in pod["volumes"]}[engine.MODEL_VOLUME] == {"name": engine.MODEL_VOLUME, "emptyDir": {}}
    assert pod["containers"][0]["command"][-1] == "meta-llama/Llama-3.1-8B-Instruct"


def test_the_operators_host_path_and_limit_are_rendered() -> None:
    objects = rendered(CHAT, NodeCache(host_path="/mnt/nvme/models", max_bytes=123_456))
    pod = pods_of(objects)["short"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}[engine.CACHE_VOLUME]["hostPath"]["path"] == "/mnt/nvme/models"
    assert "--max-bytes=123456" in pod["initContainers"][-1]["command"]


def test_the_claim_form_renders_its_claim_and_mounts_it() -> None:
    doc = with_model(cache={"claim": {"size": "300Gi", "storageClassName": "", "accessMode": "ReadWriteOnce",
                                      "volumeName": "models-pv"}})
    objects = rendered(doc)
    claims = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert objects[0] is claims[0], "created first: the pods that mount it follow"
    (claim,) = claims
    assert claim["metadata"]["name"] == "chat-weights" and claim["metadata"]["namespace"] == "ml"
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "300Gi"}},
                             "storageClassName": "", "volumeName": "models-pv"}
    for deployment in pods_of(objects).values():
        pod = deployment["spec"]["template"]["spec"]
        volume = {v["name"]: v for v in pod["volumes"]}[engine.CACHE_VOLUME]
        assert volume == {"name": engine.CACHE_VOLUME, "persistentVolumeClaim": {"claimName": "chat-weights"}}
        assert f"--max-bytes={int(300 * 2**30 * 0.95)}" in pod["initContainers"][-1]["command"]


def test_an_image_with_its_own_user_gets_no_owner_container() -> None:
    doc = with_model()
    doc["spec"]["engine"] = {"gpu": {"image": "vllm/vllm-openai:v0.33.0"}, "imagePullPolicy": "IfNotPresent"}
    pod = pods_of(rendered(doc))["short"]["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["name"] == constants.FETCH_CONTAINER and fetch["imagePullPolicy"] == "IfNotPresent"
    assert fetch["image"] == "vllm/vllm-openai:v0.33.0"
