"""The engine Deployment of one pool: vLLM under the operator's entrypoint wrapper.

The container runs `vllm-operator engine -- vllm serve MODEL` with the plan's engine arguments as `args`, unchanged
and in the plan's order (docs/architecture.md, Plan): the wrapper (`vllm_operator.engine`) starts `vllm serve`, watches
its log, and turns an engine death or a CUDA OOM — which vLLM reports with exit code 0 — into a distinct exit code and
a JSON termination message at the default `terminationMessagePath` (`/dev/termination-log`). `FallbackToLogsOnError`
keeps the log tail as the message when the wrapper itself could not write one. `$(POD_IP)` in the arguments is expanded
by the kubelet from the downward-API variable, which is listed first so later variables may reference it too.

Probes: readiness and liveness are HTTP `GET /health` on vLLM's `http` port (vLLM answers it only after the model is
loaded, so a TCP probe would pass too early). The startup probe asks the wrapper instead, on its own `status` port
(`GET /startup`, see `vllm_operator.engine.status`): the wrapper follows the start as phases (downloading, loading
weights, compiling, profiling memory, KV cache allocated, serving) and answers 200 once vLLM serves. It stops a start
whose phase has not advanced for that phase's limit (`constants.STARTUP_PHASE_LIMITS_S`: no new byte for 10 minutes
while downloading, no shard for 20 minutes while loading weights, ...) and exits with StartupStalled, so a hung start
ends within its phase's limit while a slow one that still moves is never killed for being slow. A kubelet startup probe
ends at its first success — after which liveness on /health begins — so the probe cannot mean "still making progress";
its failure budget is only a backstop for a wrapper that cannot answer at all:

- startup: period 2 s, timeout 5 s, failureThreshold covering every phase's limit put together (6600 s) plus, for
  weights from the Hub, their download at 10 MiB/s (a slow link; the wrapper stops a download that does not move).
  The period is how late the pod turns Ready after the engine can serve, on every start, restart and wake from zero
  (10 s cost up to 10 s of each); the wrapper answers /startup itself, so probing it every 2 s costs nothing.
  The old fixed budget (10 minutes on GPU, 20 on CPU) killed cold starts that were merely slow: a 70B download, a
  torch.compile without cache, a restart that re-reads torch from a slow disk. Liveness and readiness do not run until
  the startup probe has passed, so none of this delays detection later on.
- readiness: period 5 s, timeout 3 s, failureThreshold 3: an engine whose /health fails for 15 s leaves the headless
  Service (and so the router's EndpointSlice view) quickly; it comes back after one success.
- liveness: period 15 s, timeout 5 s, failureThreshold 4: a restart only after a full minute of failed checks. A restart
  throws away every in-flight request and minutes of warm-up, and a busy engine (a 32K-token prefill, a burst of
  detokenisation) can answer /health late without being broken; readiness already takes such a pod out of rotation. A
  dead engine core makes vLLM exit by itself within seconds (the kubelet restarts it); liveness is only for a hung
  API server, so it is laxer than readiness on purpose.

Strategy: GPU pools roll with `maxSurge: 0, maxUnavailable: 1` — there is no spare GPU for a surge pod, and a surge
pod would sit Pending until the rollout deadline. CPU pools surge one pod first (`maxSurge: 1, maxUnavailable: 0`):
memory is usually there, and capacity never dips — except a CPU pool the health loop has moved on its ladder (a
step-down after OOM, a KV rung after KVCacheTooSmall), which rolls like a GPU pool: its pods are crash-looping, so
there is no capacity to keep, and the node's room is what ran out. A surge pod beside the failing one can find no
node (seen on real kubelets: the next rung's pod Pending while `maxUnavailable: 0` kept the OOMKilled pod, until the
rollout deadline); without the surge the Deployment controller removes the failing pod first. It keeps rolling so
once it has moved, back to rung 0 included (a reset, a step back up): its node has shown it has no room to spare, and
the rung-0 pod needs more than the rung's pod it replaces (seen on real kubelets: after a reset the rung-0 surge pod
stayed Pending beside the healthy rung-1 pod and the router, and `maxUnavailable: 0` held the roll-out there for good).
`progressDeadlineSeconds` covers the longest startup probe window, so a slow but healthy model load is not reported as
a failed rollout.

Security context: every engine container drops all capabilities and may not gain privileges, and every engine pod runs
under the runtime's default seccomp profile; vLLM needs none of what those take away (NCCL between the GPUs of one pod
uses shared memory and CUDA IPC, not capabilities). The project's images (the default, from whichever repository
`--image-repository` names) run as uid/gid 2000 with `runAsNonRoot` (the plan's `runAsUser`), the user their
Dockerfiles create with a writable HOME for vLLM's compile caches. An image the spec names itself keeps its own user:
the official `vllm/vllm-openai` image runs as root with HOME=/root, so forcing a uid there breaks its caches and
`runAsNonRoot` would refuse to start it. No fsGroup: the emptyDirs are world-writable already, and a recursive
ownership change of a large model PVC on every mount would delay each start (a PVC must be readable by uid 2000, as
0644 files are). The root filesystem stays writable: vLLM, torch and Triton write caches under HOME and /tmp.

Resources: CPU pools get the planned memory as request and limit (the KV math sized it); GPU pools the GPUs plus CPU
and host-memory requests from the plan, reasoned in `planning/host_resources.py`.

Volumes: `/dev/shm` is a memory-backed emptyDir (PyTorch and NCCL use shared memory between vLLM's processes; the
container runtime's 64 MiB default is too small), sized 2 GiB per GPU (1 GiB on CPU, where it counts against the pod's
memory limit). The model lives under `/models`: a PersistentVolumeClaim mounted read-only when `model.source.pvc` is
set (the plan's `modelClaim`), otherwise an emptyDir holding the Hugging Face cache (the plan sets `HF_HOME` under
/models then), which a restarted container reuses, so a crash does not mean a second download. The emptyDir has no
size limit on purpose: exceeding one evicts the pod, and a checkpoint's size on disk is not known exactly before the
download.

Weights cache (a Hub model with the plan's `weightsCache`; docs/weights-cache.md): the cache — the node's hostPath
(`DirectoryOrCreate`) or the deployment's claim — is mounted at /weights-cache, read-write in the init containers and
read-only in the engine. Two init containers of the engine image run first: `weights-cache-owner` hands the cache's
top directory (only it, not recursively) to the engine's uid when the image runs as one (the kubelet creates a
hostPath root-owned; it runs as root with CHOWN as its only capability), and `fetch-weights` runs `vllm-operator
fetch` with the pod's own token: it resolves the revision to a commit, fetches the model once per cache under a lock,
evicts least-recently-used entries no engine uses to stay under the cache's limit, and links
/run/vllm-operator/weights/model (a per-pod emptyDir) to the complete entry, which is the engine's model argument
(vLLM runs with HF_HUB_OFFLINE). The engine wrapper holds a shared lock on the entry's `.complete` marker for its
lifetime (`--hold-weights`) and renews its pod's lease at every start and every minute (`--weights-leases`: the
cache's `.leases`, the only part of the cache the engine mounts read-write; its pod's uid comes from the downward
API): that is what "in use" means to eviction, also between two restarts of a crash-looping engine. The fetch gets
the engine container's environment (HF_ENDPOINT, proxies, the token) less HF_HUB_OFFLINE, plus its pod's uid for
the lease, and the engine's resources without accelerators (a pod's effective request is the larger of its init and
app containers', so this costs no scheduling room). The download happens before the engine starts, so the engine's
startup backstop counts no download; the Deployment's progress deadline still covers one (a cold node).
"""

from __future__ import annotations

import math
from typing import Any

from vllm_operator import constants, names
from vllm_operator.api.plan import Plan, PoolPlan
from vllm_operator.rendering import adapters, common

CONTAINER = "engine"
PORT_NAME = "http"
STATUS_PORT_NAME = constants.ENGINE_STATUS_PORT_NAME
HEALTH_PATH = "/health"
STARTUP_PATH = "/startup"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
ENGINE_COMMAND = ("vllm-operator", "engine", "--", "vllm", "serve")

SHM_VOLUME = "dshm"
MODEL_VOLUME = "models"
ADAPTERS_VOLUME = "adapters"
ADAPTER_HUB_VOLUME = "adapter-hub"
SHM_GIB_PER_GPU = 2
SHM_GIB_CPU = 1

# Probe timings; the module docstring says why.
STARTUP_PERIOD_S = 2
STARTUP_TIMEOUT_S = 5
STARTUP_BACKSTOP_S = sum(constants.STARTUP_PHASE_LIMITS_S.values())
"""Every phase at its limit, one after the other: a start longer than that without the wrapper stopping it means the
wrapper itself is not answering."""
DOWNLOAD_BYTES_PER_S = constants.WEIGHTS_DOWNLOAD_BYTES_PER_S
CACHE_VOLUME = "weights-cache"
LINK_VOLUME = "weights-link"
POD_UID_ENV = {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.uid"}}}
READINESS = {"periodSeconds": 5, "timeoutSeconds": 3, "failureThreshold": 3, "successThreshold": 1}
LIVENESS = {"periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 4, "successThreshold": 1}
PROGRESS_DEADLINE_MARGIN_S = 600

CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def download_seconds(plan: Plan, pool: PoolPlan) -> float:
    """A cold download of the pool's Hub weights at a slow link's rate (0 for a model on the user's claim)."""
    if pool.model_claim is not None:
        return 0.0
    weights = pool.kv.breakdown.weights_bytes * (plan.accelerator.count if plan.accelerator.is_gpu else 1)
    return weights / DOWNLOAD_BYTES_PER_S


def startup_failure_threshold(plan: Plan, pool: PoolPlan) -> int:
    """The startup probe's backstop in periods (module docstring): all phase limits, plus a slow Hub download when
    the engine downloads itself (with the weights cache the init container has fetched before the engine starts)."""
    seconds = STARTUP_BACKSTOP_S
    if pool.weights_cache is None:
        seconds += download_seconds(plan, pool)
    return math.ceil(seconds / STARTUP_PERIOD_S)


def progress_deadline(plan: Plan, pool: PoolPlan) -> int:
    """The Deployment's progress deadline: the startup backstop, any download (in the engine or its init
    container: a cold node), and a margin."""
    seconds = STARTUP_BACKSTOP_S + download_seconds(plan, pool) + PROGRESS_DEADLINE_MARGIN_S
    return STARTUP_PERIOD_S * math.ceil(seconds / STARTUP_PERIOD_S)


def http_probe(timing: dict[str, int], path: str = HEALTH_PATH, port: str = PORT_NAME) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port, "scheme": "HTTP"}, **timing}


def env_map(pool: PoolPlan) -> dict[str, dict[str, Any]]:
    """The plan's literals and Secret keys, name -> EnvVar body."""
    merged: dict[str, dict[str, Any]] = {k: {"value": v} for k, v in pool.env.items()}
    merged.update({k: {"valueFrom": {"secretKeyRef": ref.to_wire()}} for k, ref in pool.secret_env.items()})
    return merged


def env(pool: PoolPlan) -> list[dict[str, Any]]:
    """The plan's literals and Secret keys; POD_IP always comes from the downward API, first, because
    `--host=$(POD_IP)` depends on it."""
    merged = env_map(pool)
    merged["POD_IP"] = {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}
    if pool.weights_cache is not None:
        merged["POD_UID"] = POD_UID_ENV
    return common.env_list(merged, first=("POD_IP",))


def resources(pool: PoolPlan) -> dict[str, dict[str, str]]:
    return {k: dict(v) for k, v in (("requests", pool.resources.requests), ("limits", pool.resources.limits)) if v}


def adapter_volumes(plan: Plan, pool: PoolPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) for a pool with LoRA on: the adapters ConfigMap as a directory (no subPath, so the
    kubelet updates it in place and the wrapper sees adapters come and go), an emptyDir the wrapper downloads Hub
    adapters into, and each PVC the pool's adapters live on, once, read-only at /adapters/<claim>."""
    if not adapters.lora_enabled(pool):
        return [], []
    vols: list[dict[str, Any]] = [{"name": ADAPTERS_VOLUME, "configMap": {"name": names.adapters(plan.name)}}]
    mounts: list[dict[str, Any]] = [{"name": ADAPTERS_VOLUME, "mountPath": constants.ADAPTERS_MOUNT,
                                     "readOnly": True}]
    vols.append({"name": ADAPTER_HUB_VOLUME, "emptyDir": {}})
    mounts.append({"name": ADAPTER_HUB_VOLUME, "mountPath": constants.ADAPTERS_HUB_CACHE})
    claims = sorted({a.claim_name for a in plan.adapters if a.name in pool.adapters and a.claim_name})
    for claim in claims:
        volume = names.dns_label("adapter", claim.replace(".", "-"))
        vols.append({"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": volume, "mountPath": f"{constants.ADAPTERS_PVC_ROOT}/{claim}", "readOnly": True})
    return vols, mounts


def command(pool: PoolPlan) -> list[str]:
    """`vllm-operator engine [--adapters-file F] [--hold-weights M] -- vllm serve MODEL`."""
    wrapper, launch = list(ENGINE_COMMAND[:2]), list(ENGINE_COMMAND[2:])
    if adapters.lora_enabled(pool):
        wrapper += [f"--adapters-file={constants.ADAPTERS_MOUNT}/{adapters.file_name(pool.name)}",
                    f"--adapters-hub-cache={constants.ADAPTERS_HUB_CACHE}"]
    if pool.weights_cache is not None:
        wrapper += [f"--hold-weights={constants.WEIGHTS_LINK}/.complete",
                    f"--weights-leases={constants.WEIGHTS_LEASES_MOUNT}"]
    return [*wrapper, *launch, pool.model]


def volumes(plan: Plan, pool: PoolPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) for /dev/shm and /models."""
    shm_gib = SHM_GIB_PER_GPU * plan.accelerator.count if plan.accelerator.is_gpu else SHM_GIB_CPU
    vols: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gib}Gi"}}]
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    if pool.model_claim is not None:
        vols.append({"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": pool.model_claim,
                                                                     "readOnly": True}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": constants.MODELS_MOUNT, "readOnly": True})
    elif pool.weights_cache is not None:
        vols += cache_volumes(pool)
        mounts += [{"name": CACHE_VOLUME, "mountPath": constants.WEIGHTS_CACHE_MOUNT, "readOnly": True},
                   {"name": LINK_VOLUME, "mountPath": constants.WEIGHTS_LINK_DIR, "readOnly": True},
                   {"name": CACHE_VOLUME, "mountPath": constants.WEIGHTS_LEASES_MOUNT,
                    "subPath": constants.WEIGHTS_LEASES_DIR}]
    else:
        vols.append({"name": MODEL_VOLUME, "emptyDir": {}})
        mounts.append({"name": MODEL_VOLUME, "mountPath": constants.MODELS_MOUNT})
    return vols, mounts


def cache_volumes(pool: PoolPlan) -> list[dict[str, Any]]:
    """The weights cache (the node's directory or the deployment's claim) and the pod's link directory."""
    cache = pool.weights_cache
    assert cache is not None
    source: dict[str, Any] = ({"persistentVolumeClaim": {"claimName": cache.claim_name}} if cache.claim_name else
                              {"hostPath": {"path": cache.host_path, "type": "DirectoryOrCreate"}})
    return [{"name": CACHE_VOLUME, **source}, {"name": LINK_VOLUME, "emptyDir": {}}]


def init_containers(pool: PoolPlan) -> list[dict[str, Any]]:
    """The weights cache's init containers (module docstring); none without the cache."""
    cache = pool.weights_cache
    if cache is None:
        return []
    mounts = [{"name": CACHE_VOLUME, "mountPath": constants.WEIGHTS_CACHE_MOUNT},
              {"name": LINK_VOLUME, "mountPath": constants.WEIGHTS_LINK_DIR}]
    base = {k: v for k, v in env_map(pool).items() if k != "HF_HUB_OFFLINE"}
    base["POD_UID"] = POD_UID_ENV
    fetch_command = ["vllm-operator", "fetch", f"--cache-root={constants.WEIGHTS_CACHE_MOUNT}", f"--repo={cache.repo}",
                     f"--link={constants.WEIGHTS_LINK}", f"--max-bytes={cache.max_bytes}"]
    if cache.revision:
        fetch_command.append(f"--revision={cache.revision}")
    own = {k: {r: q for r, q in v.items() if r in ("cpu", "memory", "ephemeral-storage")}
           for k, v in resources(pool).items()}
    fetch: dict[str, Any] = {
        "name": constants.FETCH_CONTAINER,
        "image": pool.image,
        "command": fetch_command,
        "env": common.env_list(base, first=("POD_UID",)),
        "resources": {k: v for k, v in own.items() if v},
        "volumeMounts": mounts,
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": dict(CONTAINER_SECURITY),
    }
    out = [fetch]
    if pool.run_as_user is not None:
        uid = pool.run_as_user
        out.insert(0, {
            "name": constants.CACHE_OWNER_CONTAINER,
            "image": pool.image,
            "command": ["chown", f"{uid}:{uid}", constants.WEIGHTS_CACHE_MOUNT],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
            "volumeMounts": mounts[:1],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                                "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0},
        })
    if pool.image_pull_policy is not None:
        for c in out:
            c["imagePullPolicy"] = pool.image_pull_policy
    return out


def claim(plan: Plan) -> common.Manifest | None:
    """The weights cache's PersistentVolumeClaim of the claim form (model.cache.claim)."""
    c = plan.weights_claim
    if c is None:
        return None
    spec: dict[str, Any] = {"accessModes": [c.access_mode], "resources": {"requests": {"storage": c.size}}}
    if c.storage_class_name is not None:
        spec["storageClassName"] = c.storage_class_name
    if c.volume_name is not None:
        spec["volumeName"] = c.volume_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": common.metadata(plan, c.name, common.base_labels(plan, constants.COMPONENT_ENGINE)),
            "spec": spec}


def gpu_affinity(pool: PoolPlan) -> dict[str, Any] | None:
    """Required node affinity for a GPU pool: a node whose `nvidia.com/gpu.product` is any variant of the planned
    type (a plain nodeSelector pins one string, and an A100 PCIe node never matched the SXM4 string), and whose GPUs
    are not time-sliced — `nvidia.com/gpu.replicas` absent or 1 (the `-SHARED` product strings are never in the
    list either). Two terms because the label may be missing on nodes GFD labelled before it knew sharing."""
    if not pool.gpu_products:
        return None
    product = {"key": constants.GFD_PRODUCT, "operator": "In", "values": list(pool.gpu_products)}
    terms = [{"matchExpressions": [product, {"key": constants.GFD_REPLICAS, "operator": "DoesNotExist"}]},
             {"matchExpressions": [product, {"key": constants.GFD_REPLICAS, "operator": "In", "values": ["1"]}]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def plan_summary(plan: Plan, pool: PoolPlan) -> str:
    """A one-line JSON summary of the pool's plan for `kubectl get -o yaml` readers."""
    return common.canonical_json({
        "engineVersion": plan.engine_version,
        "kvCacheDtype": pool.kv_cache_dtype,
        "kvLevel": pool.kv_level,
        "maxModelLen": pool.max_model_len,
        "maxNumBatchedTokens": pool.max_num_batched_tokens,
        "maxNumSeqs": pool.max_num_seqs,
        "maxTokens": pool.max_tokens,
        "plannedKVTokens": pool.kv.planned_tokens,
        "stepDownLevel": pool.step_down_level,
    })


def pod_labels(plan: Plan, pool: PoolPlan) -> dict[str, str]:
    low, high = pool.prompt_range
    return {**common.pool_labels(plan, pool.name), constants.LABEL_CONTEXT_RANGE: f"{low}-{high}"}


def deployment(plan: Plan, pool: PoolPlan) -> common.Manifest:
    """The engine Deployment of one (enabled) pool."""
    gpu = plan.accelerator.is_gpu
    vols, mounts = volumes(plan, pool)
    lora_vols, lora_mounts = adapter_volumes(plan, pool)
    vols, mounts = vols + lora_vols, mounts + lora_mounts
    failures = startup_failure_threshold(plan, pool)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pool.image,
        "command": command(pool),
        "args": list(pool.engine_args),
        "env": env(pool),
        "ports": [{"name": PORT_NAME, "containerPort": constants.ENGINE_PORT, "protocol": "TCP"},
                  {"name": STATUS_PORT_NAME, "containerPort": constants.ENGINE_STATUS_PORT, "protocol": "TCP"}],
        "resources": resources(pool),
        "volumeMounts": mounts,
        "startupProbe": http_probe({"periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": STARTUP_TIMEOUT_S,
                                    "failureThreshold": failures, "successThreshold": 1}, STARTUP_PATH,
                                   STATUS_PORT_NAME),
        "readinessProbe": http_probe(READINESS),
        "livenessProbe": http_probe(LIVENESS),
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": dict(CONTAINER_SECURITY),
    }
    if pool.image_pull_policy is not None:
        container["imagePullPolicy"] = pool.image_pull_policy
    security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if pool.run_as_user is not None:
        security.update(runAsNonRoot=True, runAsUser=pool.run_as_user, runAsGroup=pool.run_as_user)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        **({"initContainers": inits} if (inits := init_containers(pool)) else {}),
        "enableServiceLinks": False,
        "securityContext": security,
        "volumes": vols,
    }
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    affinity = gpu_affinity(pool)
    if affinity is not None:
        pod_spec["affinity"] = affinity
    if pool.tolerations:
        pod_spec["tolerations"] = [t.to_wire() for t in pool.tolerations]
    if pool.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in pool.image_pull_secrets]
    replace_first = gpu or pool.step_down_level > 0 or pool.kv_level > 0 or pool.ladder_moved
    strategy = {"maxSurge": 0, "maxUnavailable": 1} if replace_first else {"maxSurge": 1, "maxUnavailable": 0}
    name = names.pool(plan.name, pool.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": common.metadata(plan, name, common.pool_labels(plan, pool.name),
                                    {constants.ANNOTATION_PLAN_SUMMARY: plan_summary(plan, pool)}),
        "spec": {
            "replicas": pool.replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": progress_deadline(plan, pool),
            "selector": {"matchLabels": common.engine_selector(plan, pool.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy},
            "template": {
                "metadata": {
                    "labels": pod_labels(plan, pool),
                    "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER},
                },
                "spec": pod_spec,
            },
        },
    }
