"""vLLM serving a Hugging Face model from the weights cache on a real node: the engine-cpu image under the wrapper,
exactly as the operator renders a Hub-sourced CPU pool (the `weights-cache-owner` and `fetch-weights` init
containers, the cache as a hostPath of this module's own cluster, the link, `vllm serve /run/vllm-operator/weights/
model` with HF_HUB_OFFLINE=1, `--hold-weights`, `--weights-leases`, probes and resources), on a real kubelet
(tests/support/weights_node.py). The Hub is tests/support/hubserver.py serving the tiny model of
`scripts/make_model.py` (config and tokenizer; vLLM loads random weights, `--load-format=dummy`, as cpu-dev does).

A cold pod fetches the model once and serves it; its replacement (what a restart of the pod, a step-down rung, a
roll-out or a wake from zero is on this node) fetches nothing — one metadata call, the tenancy check — and serves
from the cache. Time to Serving (the pod's Ready: the kubelet's startup probe passed and vLLM's /health answers) is
recorded for both, in the same run, with the bytes the Hub sent (benchmarks/weights-cache/README.md).
"""

from __future__ import annotations

import copy
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from testcluster.netns import entered
from tests.support import vllm_cpu, waiting, weights_node
from tests.support.hubserver import HubState, Repo
from tests.support.weights_node import HUB_PORT, NS, Stack, get_pod, rendered
from vllm_operator import constants

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]  # two real vLLM starts on 2 shared cores

REPO = "test-org/tiny-llama"
SERVING_TIMEOUT_S = 600.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("weights-vllm")
    model = vllm_cpu.make_model("tiny", root / "tiny-llama")
    files = {p.name: p.read_bytes() for p in sorted(model.iterdir()) if p.is_file()}
    with weights_node.running(root, HubState(repos={REPO: Repo(dict(files))})) as s:
        yield s, files


def spec_doc() -> dict[str, Any]:
    """One CPU pool of the tiny model from the Hub (at the cluster's address), as cpu-dev's pools run it."""
    env = [{"name": "HF_ENDPOINT", "value": f"http://{{address}}:{HUB_PORT}"}, {"name": "HF_HUB_DISABLE_XET",
                                                                             "value": "1"}]
    model = {"name": REPO, "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
             "facts": {"numLayers": 2, "numKVHeads": 2, "numAttentionHeads": 4, "headDim": 64,
                       "maxContextLength": 65536, "weightsGiB": 0.05}}
    pool = {"replicas": 1, "maxModelLen": 1024, "maxTokens": 128, "env": env,
            "extraArgs": ["--load-format=dummy", "--enforce-eager"]}
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMDeployment",
            "metadata": {"name": "cached", "namespace": NS},
            "spec": {"model": model, "workloadClass": "chat",
                     "accelerator": {"type": "cpu", "memoryGiB": 4, "cpuCores": 1},
                     "engine": {"cpu": {"version": "0.32.0"}, "imagePullPolicy": "Never"},
                     "pools": {"short": {**pool, "enabled": False}, "long": pool},
                     "routing": {"promptLengthThreshold": 512}}}


def engine_pod(s: Stack, objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The pool Deployment's pod template as rendered, as a pod on node-a."""
    (deployment,) = [d for d in objects if d["kind"] == "Deployment" and constants.LABEL_POOL in
                     d["metadata"]["labels"]]
    template = copy.deepcopy(deployment["spec"]["template"])
    template["spec"]["nodeSelector"] = {"kubernetes.io/hostname": s.node.name}
    return {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
            "metadata": {"name": name, "namespace": NS, "labels": template["metadata"]["labels"]}}


def serve(s: Stack, pod: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Create the pod; seconds until it is Ready (vLLM serving), and its object then."""
    name = pod["metadata"]["name"]
    began = time.monotonic()
    s.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def ready() -> dict[str, Any] | None:
        obj = get_pod(s, name)
        conditions = (obj.get("status") or {}).get("conditions") or []
        statuses = (obj.get("status") or {}).get("containerStatuses") or [{}]
        assert not (statuses[0].get("lastState") or {}).get("terminated"), \
            (statuses[0], s.kube.kubectl("logs", "-n", NS, name, "-c", "engine", "--previous", check=False).stdout)
        return obj if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    try:
        obj: dict[str, Any] = waiting.wait_for(f"{name} serving", ready, timeout=SERVING_TIMEOUT_S, every=1.0)
    except AssertionError as err:
        log = s.kube.kubectl("logs", "-n", NS, name, "-c", "engine", "--tail=40", check=False).stdout
        raise AssertionError(f"{err}\n{log}") from None
    return time.monotonic() - began, obj


def models(s: Stack, pod: dict[str, Any]) -> list[str]:
    """The model ids vLLM serves, asked at the pod's address from the cluster's network namespace."""
    with entered(s.kube.netns.pin_name):
        url = f"http://{pod['status']['podIP']}:{constants.ENGINE_PORT}/v1/models"
        with urllib.request.urlopen(url, timeout=30) as resp:
            return [m["id"] for m in json.load(resp)["data"]]


def delete(s: Stack, name: str) -> None:
    s.kube.kubectl("delete", "pod", "-n", NS, name, "--grace-period=1", "--wait=true")


def test_vllm_serves_from_the_cache_and_a_replacement_fetches_nothing(served: tuple[Stack, dict[str, bytes]]
                                                                       ) -> None:
    s, files = served
    objects = rendered(s, spec_doc())
    cold = engine_pod(s, objects, "cached-long-cold")
    main = cold["spec"]["containers"][0]
    assert main["command"][-1] == constants.WEIGHTS_LINK and "--load-format=dummy" in main["args"]
    s.hub.state.reset_counts()
    cold_s, obj = serve(s, cold)
    assert s.hub.state.bytes_sent == sum(len(b) for b in files.values()), s.hub.state.requests
    assert s.hub.state.requests.get("get") == len(files), s.hub.state.requests
    assert REPO in models(s, obj), "vLLM serves the model it loaded from the cache"
    cold_counts, cold_bytes = dict(s.hub.state.requests), s.hub.state.bytes_sent
    delete(s, "cached-long-cold")

    s.hub.state.reset_counts()
    warm_s, obj = serve(s, engine_pod(s, objects, "cached-long-warm"))
    assert s.hub.state.bytes_sent == 0 and s.hub.state.requests == {"info": 1}, s.hub.state.requests
    assert REPO in models(s, obj)
    delete(s, "cached-long-warm")
    print(f"\n[weights-cache vLLM] cold: {cold_s:.1f} s to Serving, hub {cold_counts}, {cold_bytes} bytes; "
          f"cached: {warm_s:.1f} s to Serving, hub {dict(s.hub.state.requests)}, 0 bytes")
