"""Admission webhook under load: the apply latency it adds while the operator converges N VLLMDeployments.

The webhook shares the operator's event loop with reconcile, so its answers wait behind reconcile work. On the real
control plane (testcluster: kube-apiserver, controllers, scheduler, kwok) with the chart installed (namespaced,
failurePolicy Ignore, timeoutSeconds 5) and the operator as its own process with the chart's ServiceAccount token:

1. N clones of examples/cpu-dev.yaml are created at once from a thread pool (the bulk load; each create goes
   through the webhook) and the operator converges them;
2. meanwhile a prober sends `--dry-run=server`-equivalent creates (dryRun=All) back to back, alternating between
   the watched namespace (the webhook is called) and a namespace the webhook's namespaceSelector leaves out (the
   same API server and load, no webhook): the baseline of the same run;
3. from the API server's own /metrics: apiserver_admission_webhook_fail_open_count (under Ignore, a call that failed
   or timed out is let in silently and counted here) and the webhook's admission duration histogram.

    .venv/bin/python benchmarks/webhook/bench.py --crs 500 --json benchmarks/webhook/results/<date>.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import json
import re
import socket
import statistics
import tempfile
import threading
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
TEMPLATE = next(d for d in yaml.safe_load_all((ROOT / "examples" / "cpu-dev.yaml").read_text()) if d)
WEBHOOK = "validate.vllmdeployments.vllm-operator.dev"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cr(name: str, namespace: str) -> dict[str, Any]:
    obj = copy.deepcopy(TEMPLATE)
    obj["metadata"] = {"name": name, "namespace": namespace}
    return dict(obj)


def free_port(host: str) -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def apiserver_metrics(kube: Cluster) -> dict[str, float]:
    """The webhook series of kube-apiserver's /metrics, summed per (name, labels without le) line."""
    text = kube.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or WEBHOOK not in line:
            continue
        key, _, value = line.rpartition(" ")
        if re.match(r"apiserver_admission_webhook_(fail_open_count|admission_duration_seconds_(sum|count)|"
                    r"rejection_count|request_total)", key):
            out[key] = out.get(key, 0.0) + float(value)
    return out


def summed(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def run(args: argparse.Namespace, kube: Cluster, workdir: Path) -> dict[str, Any]:
    name, namespace, watched, other = unique("whb"), unique("whb-sys"), unique("whb-team"), unique("whb-other")
    full = f"{name}-vllm-operator"
    host = kube.netns.host_address
    port = free_port(host)
    for ns in (watched, other):
        kube.kubectl("create", "namespace", ns)
    helm(kube, "install", name, str(CHART_DIR), "--namespace", namespace, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{watched}}}")
    service = f"{full}-webhook"
    kube.kubectl("patch", "service", service, "-n", namespace, "--type=json",
                 "-p", '[{"op": "remove", "path": "/spec/selector"}]')
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-host", "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        "ports": [{"name": "webhook", "port": port, "protocol": "TCP"}]}))
    label = {"vllm-operator.dev/bench": watched}
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(
        [nodes.node(f"{watched}-{i}", labels=label, cpu="256", memory="2Ti", pods=1000) for i in range(2)]))
    token = kube.token_kubeconfig(namespace, full, workdir / "operator.kubeconfig")
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kube.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 32
    api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))

    def create(obj: dict[str, Any], dry: bool = False) -> float:
        started = time.perf_counter()
        kwargs = {"dry_run": "All"} if dry else {}
        api.create_namespaced_custom_object(constants.GROUP, constants.VERSION, obj["metadata"]["namespace"],
                                            constants.PLURAL, obj, **kwargs)
        return time.perf_counter() - started

    log = workdir / "operator.log"
    result: dict[str, Any] = {"crs": args.crs}
    with operator_process(kube, token, log, f"--namespace={watched}", "--no-health", f"--webhook-port={port}",
                          f"--webhook-host={host}", f"--webhook-service={service}",
                          f"--webhook-namespace={namespace}", f"--webhook-ca-secret={full}-webhook-ca",
                          f"--webhook-configuration={full}-{namespace}"):
        bad = cr("probe-bad", watched)
        bad["spec"]["pools"] = {"short": {"replicas": 1}, "long": {"replicas": 1, "maxModelLen": 10_000_000}}
        deadline = time.monotonic() + 90
        while True:  # until the API server reaches the webhook (listening, caBundle written)
            try:
                create(bad, dry=True)
            except kubernetes.client.ApiException as err:
                if "denied the request" in str(err.body):
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the webhook did not answer within 90 s")
            time.sleep(0.5)
        create(cr("warmup", watched))  # kopf fully started (its observers fall back after RBAC denials)
        deadline = time.monotonic() + 180
        while not (api.get_namespaced_custom_object(constants.GROUP, constants.VERSION, watched, constants.PLURAL,
                                                    "warmup").get("status") or {}).get("observedGeneration"):
            if time.monotonic() > deadline:
                raise SystemExit("the operator did not reconcile the warm-up VLLMDeployment within 180 s")
            time.sleep(1)
        before = apiserver_metrics(kube)
        probes: dict[str, list[float]] = {"webhook": [], "baseline": []}
        stop = threading.Event()

        def prober() -> None:
            i = 0
            while not stop.is_set():
                for kind, ns in (("webhook", watched), ("baseline", other)):
                    probes[kind].append(create(cr(f"probe-{i}", ns), dry=True))
                i += 1

        quiet: dict[str, list[float]] = {"webhook": [], "baseline": []}
        for i in range(args.idle_probes):  # the same probes with the operator idle
            for kind, ns in (("webhook", watched), ("baseline", other)):
                quiet[kind].append(create(cr(f"idle-{i}", ns), dry=True))
        thread = threading.Thread(target=prober, daemon=True)
        thread.start()
        bulk_started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.threads) as pool:
            bulk = list(pool.map(lambda i: create(cr(f"cpu-{i:04d}", watched)), range(args.crs)))
        bulk_seconds = time.monotonic() - bulk_started

        def reconciled() -> int:
            items = api.list_namespaced_custom_object(constants.GROUP, constants.VERSION, watched,
                                                      constants.PLURAL)["items"]
            return sum(1 for o in items if (o.get("status") or {}).get("observedGeneration") ==
                       o["metadata"]["generation"])

        done = 0
        while time.monotonic() - bulk_started < args.load_seconds:
            done = reconciled()
            if done >= args.crs + 1:
                break
            time.sleep(2)
        stop.set()
        thread.join()
        after = apiserver_metrics(kube)
        result.update({
            "bulk_create_seconds": round(bulk_seconds, 2),
            "bulk_create_latency_ms": {"p50": round(1000 * pct(bulk, 0.5), 1), "p95": round(1000 * pct(bulk, 0.95), 1)},
            "reconciled_when_probing_stopped": done,
            "probing_seconds": round(time.monotonic() - bulk_started, 1),
        })
        for label_, data in (("idle", quiet), ("under_load", probes)):
            w, b = data["webhook"], data["baseline"]
            result[f"dry_run_ms_{label_}"] = {
                "n": len(w), "webhook_p50": round(1000 * pct(w, 0.5), 1), "webhook_p95": round(1000 * pct(w, 0.95), 1),
                "baseline_p50": round(1000 * pct(b, 0.5), 1), "baseline_p95": round(1000 * pct(b, 0.95), 1),
                "added_p50": round(1000 * (pct(w, 0.5) - pct(b, 0.5)), 1),
                "ratio_p50": round(pct(w, 0.5) / pct(b, 0.5), 2),
                "mean_ratio": round(statistics.mean(w) / statistics.mean(b), 2)}
        calls = summed(after, "apiserver_admission_webhook_admission_duration_seconds_count") - summed(
            before, "apiserver_admission_webhook_admission_duration_seconds_count")
        seconds = summed(after, "apiserver_admission_webhook_admission_duration_seconds_sum") - summed(
            before, "apiserver_admission_webhook_admission_duration_seconds_sum")
        result["apiserver"] = {
            "webhook_calls": calls,
            "webhook_mean_ms": round(1000 * seconds / calls, 1) if calls else None,
            "fail_open_count": summed(after, "apiserver_admission_webhook_fail_open_count") - summed(
                before, "apiserver_admission_webhook_fail_open_count"),
            "fail_open_count_total": summed(after, "apiserver_admission_webhook_fail_open_count"),
        }
    text = log.read_text()
    result["operator_log_errors"] = text.count(" ERROR ")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crs", type=int, default=500)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--idle-probes", type=int, default=30)
    parser.add_argument("--load-seconds", type=float, default=240, help="probe at most this long after the bulk "
                        "create started (or until every CR is reconciled)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="whbench-") as tmp, cluster.running(Path(tmp) / "kube") as kube:
        result = run(args, kube, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
