"""The weights cache on a real kubelet (testcluster.node: kubelet + containerd + runc), with the engine-cpu image the
operator's default CPU engine is (imported from its OCI archive; it carries the wrapper and huggingface_hub).

The engine pods are the operator's own rendering of a Hub-sourced CPU VLLMDeployment (`vllm-operator render` with a
node cache directory of this module's own cluster, never the default host path): the `weights-cache-owner` and
`fetch-weights` init containers, the cache as a hostPath (or the claim form's PersistentVolumeClaim on a static
PersistentVolume), the link directory, the security contexts and the pod's token Secret, all as rendered. One thing
differs: the engine container's child is a reader of the cached model (its `config.json` through the link), not
vLLM — the engine container keeps its image, mounts, `--hold-weights` and `--weights-leases`; vLLM serving from
the cache is the e2e tier's (tests/e2e/test_weights_cache_vllm.py). The stack (tests/support/weights_node.py): the
Hub is tests/support/hubserver.py, listening in the cluster's network namespace, which the pods reach as they reach
the API server (no route out anywhere).

Each scenario prints one line: hub requests and bytes sent, and seconds from creating the pods to their
`fetch-weights` init container finishing (cold and cached in the same run).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support import waiting, weights_node
from tests.support.hubserver import HubState, Repo
from tests.support.weights_node import HUB_PORT, NS, Stack, get_pod, rendered
from vllm_operator import constants
from vllm_operator.api.remediation import HealthSettings
from vllm_operator.engine import eviction
from vllm_operator.health.diagnose import State, diagnose
from vllm_operator.health.snapshot import PoolFacts, Snapshot, pod_facts

pytestmark = pytest.mark.integration

REPO = "test-org/tiny-llama"
GATED = "test-org/gated-llama"
WEIGHTS = os.urandom(24 << 20)
"""A checkpoint big enough for a throttled fetch to be caught halfway; never loaded (the engine's child only reads
config.json)."""
READER = ("import json, time; c = json.load(open('/run/vllm-operator/weights/model/config.json')); "
          "print('read config.json of the cached model:', sorted(c)[:3], flush=True); time.sleep(100000)")
CRASHER = ("import json, sys; c = json.load(open('/run/vllm-operator/weights/model/config.json')); "
           "print('read config.json of the cached model, then crashed:', sorted(c)[:3], flush=True); sys.exit(3)")
"""An engine that crash-loops: the kubelet restarts it, and only it (init containers run once per pod)."""


def hub_files() -> dict[str, bytes]:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256, "head_dim": 64}
    return {"config.json": json.dumps(config).encode(), "tokenizer.json": b'{"version": "1.0"}' * 40,
            "tokenizer_config.json": b"{}", "model.safetensors": WEIGHTS}

BINDING = ("import os, time; print('binding:', os.environ.get('VLLM_CPU_OMP_THREADS_BIND'), "
           "os.environ.get('OMP_NUM_THREADS'), flush=True); time.sleep(100000)")
"""An engine child that prints the OpenMP variables the wrapper (engine/cpubind.py) started it with."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = HubState(repos={REPO: Repo(hub_files()), GATED: Repo(hub_files(), allowed_tokens={"someone-else"})})
    with weights_node.running(tmp_path_factory.mktemp("weights-node"), state) as s:
        yield s


def spec_doc(name: str, repo: str = REPO, *, cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """A CPU VLLMDeployment of a Hub model, its Hub at the cluster's address (the pools' HF_ENDPOINT)."""
    endpoint = f"http://{{address}}:{HUB_PORT}"
    env = [{"name": "HF_ENDPOINT", "value": endpoint}, {"name": "HF_HUB_DISABLE_XET", "value": "1"}]
    model: dict[str, Any] = {
        "name": repo, "source": {"huggingFace": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
        "facts": {"numLayers": 2, "numKVHeads": 2, "numAttentionHeads": 4, "headDim": 64,
                  "maxContextLength": 4096, "weightsGiB": 0.05}}
    if cache is not None:
        model["cache"] = cache
    pool = {"replicas": 1, "maxModelLen": 1024, "maxTokens": 128, "env": env}
    return {"apiVersion": "vllm-operator.dev/v1alpha1", "kind": "VLLMDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"model": model, "workloadClass": "chat",
                     "accelerator": {"type": "cpu", "memoryGiB": 4, "cpuCores": 1},
                     "engine": {"cpu": {"version": "0.32.0"}, "imagePullPolicy": "Never"},
                     "pools": {"short": dict(pool), "long": {**pool, "maxModelLen": 2048}},
                     "routing": {"promptLengthThreshold": 512}}}


def engine_pods(s: Stack, objects: list[dict[str, Any]], suffix: str, child: str = READER) -> list[dict[str, Any]]:
    """Pods of the rendered pool Deployments' templates, on node-a, the engine's child a reader (module docstring);
    resources lowered to fit two on this machine (the KV math is not under test here)."""
    pods = []
    for d in objects:
        if d["kind"] != "Deployment" or constants.LABEL_POOL not in d["metadata"]["labels"]:
            continue
        template = copy.deepcopy(d["spec"]["template"])
        spec = template["spec"]
        main = spec["containers"][0]
        wrapper = main["command"][:main["command"].index("--")]
        main["command"] = [*wrapper, "--preflight=off", "--", "python", "-c", child]
        main["args"] = []
        for c in [main, *spec.get("initContainers", [])]:
            c["resources"] = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
        spec["nodeSelector"] = {"kubernetes.io/hostname": s.node.name}
        spec["terminationGracePeriodSeconds"] = 1
        pods.append({"apiVersion": "v1", "kind": "Pod", "spec": spec,
                     "metadata": {"name": f"{d['metadata']['name']}-{suffix}", "namespace": NS,
                                  "labels": template["metadata"]["labels"]}})
    return pods


def engine_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine container of the (one) pool Deployment among `objects`, as rendered."""
    (container,) = [d["spec"]["template"]["spec"]["containers"][0] for d in objects if d["kind"] == "Deployment"
                    and constants.LABEL_POOL in d["metadata"]["labels"]]
    return dict(container)


def fetch_status(pod: dict[str, Any]) -> dict[str, Any]:
    inits = (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((c for c in inits if c["name"] == constants.FETCH_CONTAINER), {})


def fetched(pod: dict[str, Any]) -> bool:
    done = (fetch_status(pod).get("state") or {}).get("terminated") or {}
    return done.get("exitCode") == 0


wait_for = functools.partial(waiting.wait_for, timeout=300, every=0.2)
"""The fetch and the engines take longer than a busybox pod: a longer wait, polled more often."""


def start(s: Stack, pods: list[dict[str, Any]]) -> float:
    s.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(pods))
    return time.monotonic()


def until_fetched(s: Stack, pods: list[dict[str, Any]], since: float) -> dict[str, float]:
    """Seconds from creating each pod to its fetch-weights init container exiting 0 (polled every 0.2 s)."""
    took: dict[str, float] = {}

    def all_done() -> bool:
        for p in pods:
            name = p["metadata"]["name"]
            if name not in took and fetched(get_pod(s, name)):
                took[name] = time.monotonic() - since
        return len(took) == len(pods)

    try:
        wait_for("the weights fetched", all_done)
    except AssertionError as err:
        states = {p["metadata"]["name"]: fetch_status(get_pod(s, p["metadata"]["name"])) for p in pods}
        raise AssertionError(f"{err}: {states}") from None
    return took


def engine_log(s: Stack, name: str) -> str:
    return s.kube.kubectl("logs", "-n", NS, name, "-c", "engine", check=False).stdout


def delete(s: Stack, pods: list[dict[str, Any]]) -> None:
    for p in pods:
        s.kube.kubectl("delete", "pod", "-n", NS, p["metadata"]["name"], "--grace-period=1", "--wait=true")


def report(scenario: str, s: Stack, **figures: Any) -> None:
    counts = dict(s.hub.state.requests)
    print(f"\n[weights-cache] {scenario}: hub requests {counts}, bytes sent {s.hub.state.bytes_sent}, "
          + ", ".join(f"{k} {v}" for k, v in figures.items()))


def test_two_pools_on_one_node_fetch_once_and_a_replacement_fetches_nothing(stack: Stack) -> None:
    s = stack
    total = sum(len(b) for b in hub_files().values())
    s.hub.state.reset_counts()
    cold = engine_pods(s, rendered(s, spec_doc("chat")), "cold")
    assert len(cold) == 2, "both pools"
    cold_s = until_fetched(s, cold, start(s, cold))
    assert s.hub.state.bytes_sent == total, s.hub.state.requests
    assert s.hub.state.requests["get"] == len(hub_files()), "each file once for the two pools"
    report("two pools, cold node", s, seconds_to_init_complete=cold_s)
    for p in cold:
        name = p["metadata"]["name"]
        wait_for("the engine reading the cached model", lambda n=name: "read config.json" in engine_log(s, n))
        running = get_pod(s, name)["status"]["containerStatuses"][0]
        assert "running" in running["state"], running
    entry = s.cache / "test-org--tiny-llama"
    (commit,) = [p.name for p in entry.iterdir()]
    assert (entry / commit / "model.safetensors").read_bytes() == WEIGHTS
    assert (entry / commit / ".complete").is_file()
    assert os.stat(s.cache).st_uid == 2000, "weights-cache-owner handed the top directory to the engine's uid"
    assert not list((s.cache / ".staging").rglob("*.part"))
    delete(s, cold)
    s.hub.state.reset_counts()
    warm = engine_pods(s, rendered(s, spec_doc("chat")), "warm")
    warm_s = until_fetched(s, warm, start(s, warm))
    assert s.hub.state.bytes_sent == 0 and s.hub.state.requests == {"info": 2}, s.hub.state.requests
    report("two pools, replaced on the same node (restart, step-down, wake from zero)", s,
           seconds_to_init_complete=warm_s)
    delete(s, warm)


def test_a_crash_looping_engine_renews_its_lease_and_a_step_down_fetches_nothing(stack: Stack) -> None:
    """The kubelet's restarts of an engine fetch nothing and renew the pod's lease through the `.leases` subPath the
    engine mounts read-write (so an engine down between restarts for longer than the lease grace keeps its entry);
    a step-down rung (a new pod template, rolled out as new pods) fetches nothing either."""
    s = stack
    repo, commit = "test-org/restart-llama", "3" * 40
    s.hub.state.repos[repo] = Repo(hub_files(), commit=commit)
    doc = spec_doc("restart", repo)
    doc["spec"]["pools"]["short"]["enabled"] = False
    s.hub.state.reset_counts()
    objects = rendered(s, doc)
    first = engine_pods(s, objects, "crashing", child=CRASHER)
    cold_s = until_fetched(s, first, start(s, first))
    assert s.hub.state.bytes_sent == sum(len(b) for b in hub_files().values()), s.hub.state.requests
    report("one pool, cold", s, seconds_to_init_complete=cold_s)
    name = first[0]["metadata"]["name"]
    uid = get_pod(s, name)["metadata"]["uid"]
    lease = s.cache / ".leases" / f"test-org--restart-llama--{commit}" / uid

    def restarts() -> int:
        statuses = (get_pod(s, name).get("status") or {}).get("containerStatuses") or [{}]
        return int(statuses[0].get("restartCount", 0))

    wait_for("the engine's first crash", lambda: restarts() >= 1)
    old = time.time() - 2 * constants.WEIGHTS_LEASE_GRACE_S
    os.utime(lease, (old, old))  # as if the pod had been created, and its engine last started, long ago
    s.hub.state.reset_counts()
    seen = restarts()
    wait_for("the kubelet restarting the engine", lambda: restarts() > seen)
    wait_for("the restarted engine renewing its lease", lambda: lease.stat().st_mtime > old + 60)
    (entry,) = [e for e in eviction.scan(s.cache, time.time()) if e.key == f"test-org--restart-llama--{commit}"]
    assert entry.in_use is not None, "between two restarts, the crash-looping pod's entry stays in use"
    # Between two restarts of a crash-looping container the current one may not have printed yet (CI saw an empty
    # log once): each start renews, so the line is in the current log or, failing that, the previous one.
    wait_for("the restart's log naming the renewal", lambda: any(
        "Renewing the weights cache lease" in s.kube.kubectl("logs", "-n", NS, name, "-c", "engine", *flag,
                                                             check=False).stdout
        for flag in ((), ("--previous",))))
    assert s.hub.state.requests == {} and s.hub.state.bytes_sent == 0, "a container restart fetches nothing"
    report("one pool, engine container restarted by the kubelet", s, restarts=restarts())
    delete(s, first)

    doc["status"] = {"pools": {"long": {"stepDown": {"level": 1}}}}
    stepped_objects = rendered(s, doc)
    assert engine_container(stepped_objects) != engine_container(objects), "rung 1 is another pod template"
    stepped = engine_pods(s, stepped_objects, "stepped")
    s.hub.state.reset_counts()
    took = until_fetched(s, stepped, start(s, stepped))
    assert s.hub.state.bytes_sent == 0 and s.hub.state.requests == {"info": 1}, s.hub.state.requests
    report("one pool, stepped down a rung (new pods)", s, seconds_to_init_complete=took)
    delete(s, stepped)


def test_an_engine_limited_below_its_nodes_cores_leaves_openmp_threads_to_the_kernel(stack: Stack) -> None:
    """engine/cpubind.py under a real kubelet. This module's node runs its pods on every core of the machine, and the
    kubelet's default CPU manager policy holds a 1-CPU container to its limit by the CFS quota, not a cpuset: the
    wrapper reads the quota from the container's own cgroup and starts its child with `nobind` and one OpenMP thread
    (vLLM's own binding would pin every engine of the node to the node's first core). On a node of one core (the e2e
    stack's) the wrapper keeps vLLM's binding: tests/e2e/test_operator_vllm.py."""
    s = stack
    doc = spec_doc("binding")
    doc["spec"]["pools"]["short"]["enabled"] = False
    (pod,) = engine_pods(s, rendered(s, doc), "binding", child=BINDING)
    engine = pod["spec"]["containers"][0]
    engine["resources"] = {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    name = pod["metadata"]["name"]
    until_fetched(s, [pod], start(s, [pod]))
    printed = wait_for("the child's OpenMP variables", lambda: next(
        (line.split()[1:] for line in engine_log(s, name).splitlines() if line.startswith("binding:")), None))
    if len(os.sched_getaffinity(0)) > 1:
        assert printed == ["nobind", "1"], engine_log(s, name)
        assert "under a quota of 1 (no cores of its own)" in engine_log(s, name)
    else:  # one CPU: the quota covers every CPU the container may run on, vLLM's binding is kept
        assert printed == ["None", "None"], engine_log(s, name)
    delete(s, [pod])


def test_a_fetch_killed_halfway_is_resumed(stack: Stack) -> None:
    s = stack
    doc = spec_doc("resume", cache=None)
    doc["spec"]["model"]["source"]["huggingFace"]["revision"] = "main"
    doc["spec"]["pools"]["short"]["enabled"] = False
    # a second repository, so this test starts from an empty entry
    s.hub.state.repos["test-org/resume-llama"] = Repo(hub_files(), commit="1" * 40)
    doc["spec"]["model"]["name"] = "test-org/resume-llama"
    s.hub.state.reset_counts()
    s.hub.state.throttle_bytes_per_s = 2 << 20
    first = engine_pods(s, rendered(s, doc), "killed")
    start(s, first)
    staging = s.cache / ".staging" / "test-org--resume-llama" / ("1" * 40)

    def staged() -> int:
        return sum(f.stat().st_size for f in staging.rglob("*") if f.is_file()) if staging.exists() else 0

    wait_for("a third of the weights staged", lambda: staged() > len(WEIGHTS) // 3, timeout=120, every=0.1)
    s.kube.kubectl("delete", "pod", "-n", NS, first[0]["metadata"]["name"], "--grace-period=0", "--force",
                   "--wait=true")
    half = staged()
    assert 0 < half < len(WEIGHTS)
    assert not (s.cache / "test-org--resume-llama").exists(), "nothing served before it is complete"
    s.hub.state.reset_counts()
    s.hub.state.throttle_bytes_per_s = None
    again = engine_pods(s, rendered(s, doc), "resumed")
    took = until_fetched(s, again, start(s, again))
    assert s.hub.state.requests["range"] >= 1, s.hub.state.requests
    assert s.hub.state.bytes_sent <= sum(len(b) for b in hub_files().values()) - half + (8 << 20), \
        "the resumed fetch sent the staged bytes again"
    report("a fetch killed halfway, resumed", s, staged_before_kill=half, seconds_to_init_complete=took)
    delete(s, again)


def failed_fetch(s: Stack, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The fetch container's first termination, and the health loop's diagnosis of the real pod status."""
    name = pods[0]["metadata"]["name"]

    def terminated() -> dict[str, Any] | None:
        c = fetch_status(get_pod(s, name))
        term = (c.get("state") or {}).get("terminated") or (c.get("lastState") or {}).get("terminated")
        return dict(term) if term and term.get("exitCode") else None

    term: dict[str, Any] = wait_for(f"{name}'s fetch failing", terminated, timeout=180)
    pod = get_pod(s, name)
    facts = pod_facts(pod)
    snap = Snapshot(namespace=NS, deployment="x", taken_at=time.time(),
                    pools={facts.pool: PoolFacts(facts.pool, 1, 1)}, pods=(facts,), metrics=None)
    settings = HealthSettings(stall_s=60, window_s=120, oom_window_s=900, interval_s=2)
    return {"term": term, "message": json.loads(term["message"]), "diagnosis": diagnose(snap, settings)}


@pytest.mark.parametrize(("case", "reason"), [("unreachable", constants.REASON_HUB_UNREACHABLE),
                                              ("gated", constants.REASON_MODEL_ACCESS_DENIED),
                                              ("full", constants.REASON_CACHE_DISK_FULL),
                                              ("hub-503", constants.REASON_HUB_UNREACHABLE)])
def test_each_failure_is_a_reason_the_health_loop_reads_off_the_real_pod(stack: Stack, case: str,
                                                                         reason: str) -> None:
    s = stack
    repo = {"gated": GATED, "full": "test-org/other-llama"}.get(case, REPO)
    doc = spec_doc(f"fail-{case}", repo)
    doc["spec"]["pools"]["short"]["enabled"] = False
    if case == "unreachable":
        for pool in doc["spec"]["pools"].values():
            pool["env"][0]["value"] = f"http://{{address}}:{HUB_PORT + 1}"  # nothing listens there
    objects = rendered(s, doc, max_bytes=1 << 20 if case == "full" else 1 << 30)
    # full: a second model that cannot fit a 1 MiB cache, whose other entry was leased moments ago (in use)
    s.hub.state.repos["test-org/other-llama"] = Repo(hub_files(), commit="2" * 40)
    s.hub.state.fail_with = 503 if case == "hub-503" else None
    pods = engine_pods(s, objects, case)
    try:
        start(s, pods)
        got = failed_fetch(s, pods)
    finally:
        s.hub.state.fail_with = None
    assert got["term"]["exitCode"] == constants.EXIT_CODES[reason], got
    assert got["message"]["reason"] == reason, got
    pool = got["diagnosis"].pools["long"]
    assert pool.state is State(reason), pool
    assert reason in pool.pods[0].message and got["message"]["detail"][:40] in pool.pods[0].message
    print(f"\n[weights-cache] failure {case}: {pool.pods[0].message}")
    assert not (s.cache / ".staging" / "test-org--gated-llama").exists() or case != "gated"
    delete(s, pods)


def test_the_claim_form_on_a_static_persistent_volume(stack: Stack) -> None:
    s = stack
    volume = s.root / "static-pv"
    volume.mkdir()
    s.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "weights-static"},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(volume)},
                  "claimRef": {"namespace": NS, "name": "claimed-weights"}}}))
    objects = rendered(s, spec_doc("claimed", cache={"claim": {"size": "1Gi", "storageClassName": "",
                                                               "accessMode": "ReadWriteOnce",
                                                               "volumeName": "weights-static"}}))
    (claim,) = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    s.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(claim))
    wait_for("the claim bound", lambda: s.kube.kubectl("get", "pvc", "-n", NS, "claimed-weights", "-o",
                                                       "jsonpath={.status.phase}").stdout == "Bound", timeout=60)
    s.hub.state.reset_counts()
    pods = engine_pods(s, objects, "claim")
    took = until_fetched(s, pods, start(s, pods))
    assert s.hub.state.bytes_sent == sum(len(b) for b in hub_files().values()), "both pools, one fetch"
    (commit,) = [p.name for p in (volume / "test-org--tiny-llama").iterdir()]
    assert (volume / "test-org--tiny-llama" / commit / ".complete").is_file()
    for p in pods:
        name = p["metadata"]["name"]
        wait_for("the engine reading the cached model", lambda n=name: "read config.json" in engine_log(s, n))
    report("claim form on a static PersistentVolume", s, seconds_to_init_complete=took)
    delete(s, pods)
