"""The operator at scale on the real control plane: N VLLMDeployments applied at once on kwok GPU nodes.

One control plane (testcluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) for the whole
run; the chart installed once per phase (namespaced, its own namespace) and the operator as its own process with
that release's ServiceAccount token (the chart's RBAC), health loop on unless `--no-health`. Phases run one after
another, e.g. `--crs 1,100,500`; the first is the baseline the others are divided by. Per phase:

- **time**: from the first create to every VLLMDeployment having its three Deployments (children), and to every one
  being Ready=True with Progressing=False (kwok runs the pods; the real scheduler binds them);
- **requests per VLLMDeployment** from kube-apiserver's audit log (Metadata level, one line per request), those of
  the operator's ServiceAccount in the phase's window, by verb; writes apart; kopf's own watches apart;
- **first checks**: once all are Ready, until every one has had its first health check (the health loop's
  MetricsAvailable condition is in its status): that check's status write and event are news, not churn;
- **a settled window**: after that, `--settle-seconds` more with nothing applied: the operator's requests and writes
  in it (a settled operator writes nothing) and any Ready flapping back to False;
- **CPU seconds** of the operator, kube-apiserver, etcd and kube-controller-manager over the phase (/proc), and
  the operator's peak RSS (VmHWM) and RSS at the end;
- **cleanup**: the phase's namespaces are deleted and waited for before the next phase starts (`cleanup_seconds`).

    flock /work/bench.lock env PYTHONPATH=. .venv/bin/python benchmarks/scale/bench.py --crs 1,100,500 \
        --json benchmarks/scale/results/<date>.json
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import yaml

from testcluster import cluster, nodes
from testcluster.cluster import Cluster
from tests.support.helm import CHART_DIR
from tests.support.kube import helm, operator_process, unique
from vllm_operator import constants

ROOT = Path(__file__).resolve().parents[2]
(TEMPLATE,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
GPUS_PER_NODE = 128
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"VmHWM", "VmRSS"}:
            out[key] = int(value.split()[0])
    return out


def condition(obj: dict[str, Any], type_: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def spec(name: str, namespace: str, label: dict[str, str]) -> dict[str, Any]:
    obj = copy.deepcopy(TEMPLATE)
    obj["metadata"] = {"name": name, "namespace": namespace}
    obj["spec"]["pools"] = {"short": {"replicas": 1, "nodeSelector": dict(label)},
                            "long": {"replicas": 1, "nodeSelector": dict(label)}}
    obj["spec"]["router"] = {"replicas": 1}
    return dict(obj)


def stamp(s: str) -> float:
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def audit_counts(kube: Cluster, user: str, since: float, until: float) -> dict[str, Any]:
    verbs: collections.Counter[str] = collections.Counter()
    by: collections.Counter[str] = collections.Counter()
    codes: collections.Counter[int] = collections.Counter()
    for path in kube.audit_files():
        with path.open() as fh:
            for line in fh:
                if user not in line:
                    continue
                event = json.loads(line)
                if event["user"].get("username") != user:
                    continue
                t = stamp(event["requestReceivedTimestamp"])
                if not since <= t < until:
                    continue
                ref = event.get("objectRef") or {}
                verbs[event["verb"]] += 1
                by[f"{event['verb']} {ref.get('resource', event.get('requestURI', '?').split('?')[0])}"
                   f"{'/' + ref['subresource'] if ref.get('subresource') else ''}"] += 1
                codes[int(event["responseStatus"].get("code", 0))] += 1
    requests = sum(n for v, n in verbs.items() if v != "watch")
    return {"requests": requests, "writes": sum(verbs[v] for v in WRITES), "watches": verbs["watch"],
            "by_verb": dict(verbs), "by_request": dict(by.most_common()),
            "codes": {str(k): v for k, v in codes.items()}}


def phase(kube: Cluster, api: kubernetes.client.CustomObjectsApi, count: int, workdir: Path,
          args: argparse.Namespace, source: Path | None = None) -> dict[str, Any]:
    """One phase of `count` VLLMDeployments; `source`: another checkout whose operator runs (the baseline)."""
    release, system, watched = unique("scale"), unique("scale-sys"), unique(f"scale{count}")
    kube.kubectl("create", "namespace", watched)
    helm(kube, "install", release, str(CHART_DIR), "--namespace", system, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}",
         "--set", "workloadClasses.builtins=false")
    label = {"vllm-operator.dev/bench": watched}
    node_count = max(1, -(-2 * count // GPUS_PER_NODE))
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([
        nodes.node(f"{watched}-{i}", labels=label, gpus=GPUS_PER_NODE, gpu_product="NVIDIA-L4", gpu_memory_mib=23034,
                   cpu="1024", memory="8Ti", pods=3 * GPUS_PER_NODE) for i in range(node_count)]))
    account = f"{release}-vllm-operator"
    user = f"system:serviceaccount:{system}:{account}"
    token = kube.token_kubeconfig(system, account, workdir / f"operator-{count}.kubeconfig")
    pids = {name: kube.state.pids[name] for name in ("kube-apiserver", "etcd", "kube-controller-manager")}
    health = ["--no-health"] if args.no_health else []
    result: dict[str, Any] = {"crs": count, "nodes": node_count, "health_loop": not args.no_health,
                              "operator": "this" if source is None else f"baseline {source}"}
    log = workdir / f"operator-{watched}.log"
    with operator_process(kube, token, log, f"--namespace={watched}", *health, *args.operator_arg,
                          source=source) as proc:
        pids["operator"] = proc.pid
        time.sleep(args.startup_seconds)  # kopf's initial lists and watches, outside the measured window
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(lambda i: api.create_namespaced_custom_object(
                constants.GROUP, constants.VERSION, watched, constants.PLURAL,
                spec(f"chat-{i:04d}", watched, label)), range(count)))
        created = time.time()
        apps = kubernetes.client.AppsV1Api(api.api_client)
        children_at = ready_at = None
        deadline = started + args.timeout
        progress: list[tuple[float, int, int]] = []
        while time.time() < deadline:
            items = api.list_namespaced_custom_object(constants.GROUP, constants.VERSION, watched,
                                                      constants.PLURAL)["items"]
            ready = sum(1 for o in items if condition(o, constants.COND_READY) == "True"
                        and condition(o, constants.COND_PROGRESSING) == "False"
                        and (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"])
            if children_at is None:
                deployments = apps.list_namespaced_deployment(watched, _preload_content=False)
                if len(json.loads(deployments.data)["items"]) >= 3 * count:
                    children_at = time.time()
            progress.append((round(time.time() - started, 1), ready, len(items)))
            if ready == count and children_at is not None:
                ready_at = time.time()
                break
            time.sleep(args.poll_seconds)
        converged = time.time()
        cpu_converged = {name: cpu_seconds(pid) for name, pid in pids.items()}
        # Every object's first health check writes status (the health loop's conditions appear) and posts an event:
        # that is news, not churn, so the settled window starts after the last of them.
        checked_at = None
        while ready_at and not args.no_health and time.time() < converged + args.timeout:
            items = api.list_namespaced_custom_object(constants.GROUP, constants.VERSION, watched,
                                                      constants.PLURAL)["items"]
            if all(condition(o, constants.COND_METRICS_AVAILABLE) is not None for o in items):
                checked_at = time.time()
                time.sleep(args.poll_seconds)  # the event a first check posts after its status write
                break
            time.sleep(args.poll_seconds)
        window = time.time()
        cpu_window = {name: cpu_seconds(pid) for name, pid in pids.items()}
        # The settled window: nothing applied; a converged operator writes nothing and nothing flaps.
        flaps: set[str] = set()
        settle_end = window + (args.settle_seconds if ready_at else 0)
        while time.time() < settle_end:
            for o in api.list_namespaced_custom_object(constants.GROUP, constants.VERSION, watched,
                                                       constants.PLURAL)["items"]:
                if condition(o, constants.COND_READY) != "True":
                    flaps.add(o["metadata"]["name"])
            time.sleep(args.poll_seconds)
        settled = time.time()
        memory = memory_kib(proc.pid)
        cpu_after = {name: cpu_seconds(pid) for name, pid in pids.items()}
        # Cleanup, after the measured windows and while the operator still runs: kopf puts a finalizer on every
        # VLLMDeployment for its health timer and removes it when the object is deleted, so they go first (with
        # the operator gone, or its namespaced Role deleted with the namespace, they stay Terminating). The next
        # phase starts once the objects are gone: their deletions (the namespace controller's, the garbage
        # collector's) ran into the next phase and charged its time and the control plane's CPU (2026-12-03: 3-5
        # CPU s of kube-controller-manager in the second operator's settled window, 0.5 in the first's). The nodes
        # go last: kwok confirms the pods' graceful deletion.
        cleanup = time.monotonic()
        kube.kubectl("delete", "vllmd", "--all", "-n", watched, "--timeout=600s", check=False, timeout=660)
        kube.kubectl("delete", "namespace", watched, "--wait=false", check=False)
        kube.kubectl("wait", "--for=delete", f"namespace/{watched}", "--timeout=900s", check=False, timeout=960)
    time.sleep(2)  # the audit log is written as requests complete
    converge = audit_counts(kube, user, started - 1, converged)
    first_checks = audit_counts(kube, user, converged, window)
    settle = audit_counts(kube, user, window, settled)
    result.update({
        "create_seconds": round(created - started, 2),
        "children_seconds": round(children_at - started, 1) if children_at else None,
        "ready_seconds": round(ready_at - started, 1) if ready_at else None,
        "ready_count": progress[-1][1] if progress else 0,
        "progress": progress[:: max(1, len(progress) // 20)] + progress[-1:],
        "requests_per_cr": round(converge["requests"] / count, 1),
        "writes_per_cr": round(converge["writes"] / count, 1),
        "converge_requests": converge,
        "first_checks_seconds": round(checked_at - converged, 1) if checked_at else None,
        "first_checks_requests": first_checks,
        "settle_seconds": round(settled - window, 1),
        "settle_requests": settle,
        "settle_writes": settle["writes"],
        "flapped_to_not_ready": sorted(flaps),
        "cpu_seconds_to_ready": {k: round(cpu_converged[k] - cpu_before[k], 1) for k in pids},
        "cpu_seconds_settled": {k: round(cpu_after[k] - cpu_window[k], 1) for k in pids},
        "operator_memory_mib": {"peak": round(memory["VmHWM"] / 1024, 1), "end": round(memory["VmRSS"] / 1024, 1)},
        "operator_log_errors": [line[:300] for line in log.read_text().splitlines() if " ERROR " in line][:10],
    })
    helm(kube, "uninstall", release, "--namespace", system, check=False)
    kube.kubectl("delete", "namespace", system, "--wait=false", check=False)
    kube.kubectl("wait", "--for=delete", f"namespace/{system}", "--timeout=300s", check=False, timeout=360)
    result["cleanup_seconds"] = round(time.monotonic() - cleanup, 1)
    kube.kubectl("delete", "nodes", "-l", f"vllm-operator.dev/bench={watched}", "--wait=false", check=False)
    return result


def ratios(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    def per_cr(r: dict[str, Any], key: str) -> float | None:
        return r[key] / r["crs"] if r.get(key) else None

    out: dict[str, Any] = {"crs": other["crs"], "baseline_crs": base["crs"]}
    for key in ("ready_seconds", "children_seconds"):
        b, o = per_cr(base, key), per_cr(other, key)
        out[f"{key}_per_cr_ratio"] = round(o / b, 3) if b and o else None
    out["requests_per_cr_ratio"] = round(other["requests_per_cr"] / base["requests_per_cr"], 3)
    out["writes_per_cr_ratio"] = round(other["writes_per_cr"] / base["writes_per_cr"], 3)
    out["operator_peak_mib_ratio"] = round(other["operator_memory_mib"]["peak"] / base["operator_memory_mib"]["peak"],
                                           3)
    extra = other["operator_memory_mib"]["peak"] - base["operator_memory_mib"]["peak"]
    out["operator_peak_kib_per_extra_cr"] = round(1024 * extra / (other["crs"] - base["crs"]), 1) \
        if other["crs"] > base["crs"] else None
    cpu_b = base["cpu_seconds_to_ready"]["operator"] / base["crs"]
    cpu_o = other["cpu_seconds_to_ready"]["operator"] / other["crs"]
    out["operator_cpu_per_cr_ratio"] = round(cpu_o / cpu_b, 3) if cpu_b else None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crs", default="1,100,500", help="comma-separated phase sizes; the first is the baseline")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a phase may take to be all Ready")
    parser.add_argument("--settle-seconds", type=float, default=60)
    parser.add_argument("--startup-seconds", type=float, default=10)
    parser.add_argument("--poll-seconds", type=float, default=2)
    parser.add_argument("--no-health", action="store_true", help="run the operator without its health loop")
    parser.add_argument("--operator-arg", action="append", default=[], help="passed to `vllm-operator run`")
    parser.add_argument("--baseline-source", type=Path,
                        help="another checkout: each phase runs its operator first, then this one's, and the ratios "
                        "are this one's figures over the baseline's at the same size")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [int(n) for n in args.crs.split(",")]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="scalebench-") as tmp, cluster.running(Path(tmp) / "kube") as kube:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 32
        api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))
        phases = []
        pairs = []
        for count in sizes:
            for source in ([args.baseline_source.resolve()] if args.baseline_source else []) + [None]:
                phases.append(phase(kube, api, count, Path(tmp), args, source))
                print(json.dumps({k: v for k, v in phases[-1].items()
                                  if k not in {"converge_requests", "first_checks_requests", "progress"}}),
                      flush=True)
            if args.baseline_source:
                pairs.append(ratios(phases[-2], phases[-1]))
        result = {"phases": phases, "load_average": {"start": load_start, "end": os.getloadavg()},
                  "ratios": pairs if args.baseline_source else [ratios(phases[0], p) for p in phases[1:]]}
    print(json.dumps(result["ratios"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
