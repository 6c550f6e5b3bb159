"""The monitoring objects we ship, proven by the operator that reads them in a user's cluster: prometheus-operator
(built from its module, testcluster.prometheus_operator) turns the PodMonitor and PrometheusRule that
`vllm-operator render` produces for examples/chat.yaml, and the chart's ServiceMonitor and PrometheusRule, into
Prometheus configuration and rule files; the Prometheus we build (v3, with Kubernetes discovery) runs on exactly that
configuration and those files, discovers an engine pod from the API server and scrapes it.

The engine pod carries the rendered short pool's pod labels and its engine container's ports (names and numbers, as
rendered); it runs on a real node (tests/support/realnode.py), so it has an address of its own that Prometheus
reaches inside the cluster's network namespace, and its processes are fake vLLMs (one per rendered port) instead of
vLLM, which would need a GPU: the router image's Python (it has aiohttp, all fakevllm needs) running `fakevllm` from
the clone, mounted read-only by a hostPath volume.

Two things of the generated configuration are changed before Prometheus runs, both because Prometheus is a process
here and not a pod of the `Prometheus` object's StatefulSet (`replicas: 0`, so nothing tries to run its image): each
kubernetes_sd_config gets the API server's address, CA and a ServiceAccount token (in a pod it would use the
in-cluster ones), and `rule_files` points at the directory the rule ConfigMaps were written to instead of the
StatefulSet's mount. And `$(SHARD)` and `$(POD_NAME)` are substituted as the config reloader beside Prometheus in that
pod would. Everything else (jobs, relabelings, intervals, rule groups) runs as generated.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import binaries, prometheus_operator
from testcluster.cluster import Cluster, stop_processes
from testcluster.node import Node
from testcluster.prometheus_operator import PrometheusOperator
from tests.support import helm, images
from tests.support.e2e_stack import podmonitor_scrape_config
from tests.support.kube import apply, unique, wait_for
from tests.support.paths import EXAMPLES, ROOT
from tests.support.realnode import NODE_LABEL, running_node
from vllm_operator import constants
from vllm_operator.health import queries

pytestmark = pytest.mark.integration

NODE_INDEX = 1  # test_operator_pod's real node takes 0
TAINT = {"key": "vllm-operator.dev/real-node", "value": "prometheus-operator", "effect": "NoSchedule"}
PROMETHEUS = "vllm"
PROMETHEUS_PORT = 19091
"""Prometheus' port on the namespace's address (clear of KEDA's, prometheus-operator's and pods')."""
SCRAPE_S = 1
RELEASE_LABEL = {"release": "promop"}
"""What the `Prometheus` object selects on, given to our objects through spec.monitoring.labels and the chart's
metrics.*.labels, as a user of kube-prometheus-stack would."""


def rendered(namespace: str) -> list[dict[str, Any]]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / "chat.yaml").read_text()) if d]
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["monitoring"] = {"labels": dict(RELEASE_LABEL)}
    proc = subprocess.run([str(Path(sys.executable).parent / "vllm-operator"), "render", "-f", "-", "-o", "json"],
                          input=json.dumps(doc), capture_output=True, text=True, check=True)
    items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
    return items


def only(items: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in items if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


def chart_monitoring(tmp_path: Path, namespace: str) -> list[dict[str, Any]]:
    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": dict(RELEASE_LABEL)},
                          "prometheusRule": {"enabled": True, "labels": dict(RELEASE_LABEL)}}}
    return [d for d in helm.render(tmp_path, values, namespace=namespace)
            if d["kind"] in ("ServiceMonitor", "PrometheusRule")]


def prometheus_object(namespace: str) -> dict[str, Any]:
    selector = {"matchLabels": dict(RELEASE_LABEL)}
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
            "metadata": {"name": PROMETHEUS, "namespace": namespace},
            "spec": {"replicas": 0, "scrapeInterval": f"{SCRAPE_S}s", "evaluationInterval": f"{SCRAPE_S}s",
                     "podMonitorSelector": selector, "serviceMonitorSelector": selector, "ruleSelector": selector}}


SERVE_PORTS = """
import subprocess, sys
from fakevllm.engine import main
host, first, *others = sys.argv[1:]
children = [subprocess.Popen([sys.executable, "-m", "fakevllm", "--host", host, "--port", p]) for p in others]
sys.exit(main(["--host", host, "--port", first]))
"""
"""One fake vLLM per port in one container: the first in the container's main process, the others as its
children."""
FAKEVLLM_MOUNT = "/opt/test-src"


def engine_pod(deployment: dict[str, Any], node: str) -> dict[str, Any]:
    """A pod as the rendered pool Deployment's ReplicaSet would make it (its labels, the engine container's ports by
    name and number), run by fake vLLMs on every rendered port, so every endpoint the PodMonitor names answers."""
    template = deployment["spec"]["template"]
    (engine,) = [c for c in template["spec"]["containers"] if c["name"] == "engine"]
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "PYTHONPATH", "value": FAKEVLLM_MOUNT}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}]
    container = {"name": "engine", "image": images.image("router").ref, "env": env,
                 "ports": copy.deepcopy(engine["ports"]),
                 "volumeMounts": [{"name": "fakevllm", "mountPath": f"{FAKEVLLM_MOUNT}/fakevllm", "readOnly": True}],
                 "command": ["/opt/vllm-operator/bin/python", "-c", SERVE_PORTS, "$(POD_IP)",
                             *(str(port["containerPort"]) for port in engine["ports"])]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{deployment['metadata']['name']}-0", "labels": dict(template["metadata"]["labels"])},
            "spec": {"nodeSelector": {NODE_LABEL: node},
                     "tolerations": [{**TAINT, "operator": "Equal"}], "terminationGracePeriodSeconds": 2,
                     "containers": [container],
                     "volumes": [{"name": "fakevllm",
                                  "hostPath": {"path": str(ROOT / "fakevllm"), "type": "Directory"}}]}}


RELOADER_ENV = {"SHARD": "0", "POD_NAME": f"prometheus-{PROMETHEUS}-0"}
"""What the config reloader of the StatefulSet's first pod substitutes for `$(VAR)` in the generated configuration
before Prometheus reads it (the shard's hashmod keep and the replica's external label)."""


def runnable(config: dict[str, Any], kube: Cluster, token: Path, rules_dir: Path) -> dict[str, Any]:
    """The generated configuration as a process outside a pod can run it (see the module docstring)."""
    out = copy.deepcopy(config)
    for job in out.get("scrape_configs") or []:
        for sd in job.get("kubernetes_sd_configs") or []:
            sd.update({"api_server": kube.server, "tls_config": {"ca_file": str(kube.ca_file)},
                       "authorization": {"credentials_file": str(token)}})
    out["rule_files"] = [str(rules_dir / "*.yaml")]
    text = yaml.safe_dump(out)
    for name, value in RELOADER_ENV.items():
        text = text.replace(f"$({name})", value)
    runnable_config: dict[str, Any] = yaml.safe_load(text)
    return runnable_config


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def namespace(kube: Cluster) -> Iterator[str]:
    ns = unique("promop")
    kube.kubectl("create", "namespace", ns)
    yield ns
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(kube: Cluster, namespace: str) -> Iterator[PrometheusOperator]:
    with prometheus_operator.running(kube, namespace) as running:
        yield running


@pytest.fixture(scope="module")
def node(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with running_node(kube, tmp_path_factory.mktemp("promnode"), name=unique("promnode"), index=NODE_INDEX,
                      taint=TAINT, built=["router"]) as started:
        yield started


def scrape_job(config: dict[str, Any], name: str) -> dict[str, Any]:
    jobs = {j["job_name"]: j for j in config.get("scrape_configs") or []}
    assert name in jobs, f"no scrape job {name} in the generated configuration (jobs: {sorted(jobs)})"
    return dict(jobs[name])


def relabel(job: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The job's one relabel rule with these fields (keys as Prometheus writes them)."""
    found = [r for r in job["relabel_configs"] if all(r.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, f"{job['job_name']}: expected one relabeling with {fields}, got {found}:\n" \
                            f"{yaml.safe_dump(job['relabel_configs'])}"
    return dict(found[0])


def test_generated_configuration_scrapes_our_pods_and_prometheus_runs_it(
        kube: Cluster, namespace: str, operator: PrometheusOperator, node: Node, tmp_path: Path) -> None:
    items = rendered(namespace)
    monitor, rule = only(items, "PodMonitor"), only(items, "PrometheusRule")
    chart = chart_monitoring(tmp_path, namespace)
    assert {d["kind"] for d in chart} == {"ServiceMonitor", "PrometheusRule"}
    short = only(items, "Deployment", f"{monitor['metadata']['labels'][constants.LABEL_INSTANCE]}-short")
    pod = engine_pod(short, node.name)
    apply(kube, monitor, rule, *chart, pod, prometheus_object(namespace), namespace=namespace)

    def running() -> dict[str, Any] | None:
        obj = json.loads(kube.kubectl("get", "pod", pod["metadata"]["name"], "-n", namespace, "-o", "json").stdout)
        statuses = obj.get("status", {}).get("containerStatuses") or []
        return obj if obj["status"].get("podIP") and statuses and all(c.get("ready") for c in statuses) else None
    try:
        wait_for("the engine pod's fake vLLMs running on the real node", running, timeout=90)
    except AssertionError as err:
        status = json.loads(kube.kubectl("get", "pod", pod["metadata"]["name"], "-n", namespace, "-o",
                                         "json").stdout)["status"]
        logs = kube.kubectl("logs", "-n", namespace, pod["metadata"]["name"], "--tail=40", check=False)
        raise AssertionError(f"{err}\npodIP {status.get('podIP')!r}, containers "
                             f"{json.dumps(status.get('containerStatuses'))}\nlogs: {logs.stdout}{logs.stderr}"
                             ) from None

    # prometheus-operator may write the configuration before it has seen every monitor (CI saw the PodMonitor's
    # jobs without the chart's ServiceMonitor's): wait for all of them.
    service_monitor = only(chart, "ServiceMonitor")
    wanted = {f"podMonitor/{namespace}/{monitor['metadata']['name']}/{i}"
              for i in range(len(monitor["spec"]["podMetricsEndpoints"]))}
    wanted.add(f"serviceMonitor/{namespace}/{service_monitor['metadata']['name']}/0")
    config = wait_for("prometheus-operator to generate the configuration with our PodMonitor's and ServiceMonitor's "
                      "jobs", lambda: (c := operator.generated_config(PROMETHEUS)) and
                      wanted <= {j["job_name"] for j in c.get("scrape_configs") or []} and c, timeout=90)
    deployment = monitor["metadata"]["name"]
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    for index, endpoint in enumerate(endpoints):
        job = scrape_job(config, f"podMonitor/{namespace}/{deployment}/{index}")
        (sd,) = job["kubernetes_sd_configs"]
        assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace]
        for key, value in monitor["spec"]["selector"]["matchLabels"].items():
            relabel(job, action="keep", regex=f"({value});true",
                    source_labels=[f"__meta_kubernetes_pod_label_{_meta(key)}",
                                   f"__meta_kubernetes_pod_labelpresent_{_meta(key)}"])
        (expr,) = monitor["spec"]["selector"]["matchExpressions"]
        relabel(job, action="keep", regex=f"({'|'.join(expr['values'])});true",
                source_labels=[f"__meta_kubernetes_pod_label_{_meta(expr['key'])}",
                               f"__meta_kubernetes_pod_labelpresent_{_meta(expr['key'])}"])
        relabel(job, action="keep", source_labels=["__meta_kubernetes_pod_container_port_name"],
                regex=endpoint["port"])
        for own in endpoint["relabelings"]:
            relabel(job, action=own["action"], target_label=own["targetLabel"],
                    **({"source_labels": own["sourceLabels"]} if "sourceLabels" in own else {}),
                    **({"replacement": own["replacement"]} if "replacement" in own else {}))
        assert job["metrics_path"] == endpoint["path"] and job["scheme"] == endpoint["scheme"]
    # The e2e tier's Prometheus runs the jobs e2e_stack.podmonitor_scrape_config derives from the same PodMonitor (that
    # stack runs no prometheus-operator): each of its relabelings must be one prometheus-operator generated.
    derived = podmonitor_scrape_config(monitor, api_server=kube.server, ca_file=kube.ca_file,
                                       token_file=tmp_path / "token")
    assert [j["job_name"] for j in derived] == [f"podMonitor/{namespace}/{deployment}/{i}"
                                                for i in range(len(endpoints))]
    for job in derived:
        generated = scrape_job(config, job["job_name"])
        for relabeling in job["relabel_configs"]:
            relabel(generated, **relabeling)
        assert (job["metrics_path"], job["scheme"]) == (generated["metrics_path"], generated["scheme"])
    scrape_job(config, f"serviceMonitor/{namespace}/{service_monitor['metadata']['name']}/0")

    files = wait_for("the rule files ConfigMap", lambda: operator.rule_files(PROMETHEUS), timeout=60)
    assert any(f.startswith(f"{namespace}-{rule['metadata']['name']}-") for f in files), sorted(files)
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    for name, text in files.items():
        (rules_dir / name).write_text(text)

    sa = "prometheus"
    apply(kube, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": sa},
           "rules": [{"apiGroups": [""], "resources": ["pods", "services", "endpoints"],
                      "verbs": ["get", "list", "watch"]},
                     {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                      "verbs": ["get", "list", "watch"]}]},
          {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": sa},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
           "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]}, namespace=namespace)
    token = tmp_path / "token"
    token.write_text(kube.kubectl("create", "token", sa, "-n", namespace, "--duration=1h").stdout.strip())
    config_file = tmp_path / "prometheus.yaml"
    config_file.write_text(yaml.safe_dump(runnable(config, kube, token, rules_dir)))
    url = f"http://{kube.netns.address}:{PROMETHEUS_PORT}"
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*kube.netns.exec_prefix(), str(binaries.prometheus()), f"--config.file={config_file}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address={kube.netns.address}:{PROMETHEUS_PORT}"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        check_prometheus(url, proc, log, namespace, pod["metadata"]["labels"][constants.LABEL_INSTANCE], monitor, pod,
                         rule)
    finally:
        stop_processes([(proc.pid, str(binaries.prometheus()))], grace=10)


def _meta(label: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in label)


def check_prometheus(url: str, proc: subprocess.Popen[bytes], log: Path, namespace: str, vllmd: str,
                     monitor: dict[str, Any], pod: dict[str, Any], rule: dict[str, Any]) -> None:
    """Prometheus runs the generated configuration and rules without an error, scrapes every PodMonitor endpoint of
    the engine pod with the label contract's labels, and the health loop's queries find the pod by (pod, pool)."""
    def ready() -> bool:
        assert proc.poll() is None, f"prometheus exited with {proc.returncode} on the generated configuration:\n" \
                                    f"{log.read_text(errors='replace')[-3000:]}"
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False
    wait_for("Prometheus ready on the generated configuration", ready, timeout=60)
    assert get_json(f"{url}/api/v1/status/config")["status"] == "success"

    groups = get_json(f"{url}/api/v1/rules")["data"]["groups"]
    loaded = {g["name"] for g in groups}
    assert {g["name"] for g in rule["spec"]["groups"]} <= loaded, (loaded, log.read_text(errors="replace")[-2000:])
    assert not [line for line in log.read_text(errors="replace").splitlines() if "level=ERROR" in line], \
        log.read_text(errors="replace")[-3000:]

    name, pool = pod["metadata"]["name"], pod["metadata"]["labels"][constants.LABEL_POOL]
    jobs = {f"podMonitor/{namespace}/{monitor['metadata']['name']}/{i}"
            for i in range(len(monitor["spec"]["podMetricsEndpoints"]))}

    def targets_up() -> list[dict[str, Any]]:
        active = get_json(f"{url}/api/v1/targets?state=active")["data"]["activeTargets"]
        ours = [t for t in active if t["scrapePool"] in jobs]
        return ours if len(ours) == len(jobs) and all(t["health"] == "up" for t in ours) else []
    try:
        ours = wait_for("a target up per PodMonitor endpoint on the engine pod", targets_up, timeout=120)
    except AssertionError as err:
        active = get_json(f"{url}/api/v1/targets?state=any")["data"]
        raise AssertionError(f"{err}\ntargets: {json.dumps(active)[:3000]}") from None
    for target in ours:
        labels = target["labels"]
        assert {k: labels.get(k) for k in ("namespace", "pod", "pool", "vllmdeployment", "component")} == {
            "namespace": namespace, "pod": name, "pool": pool, "vllmdeployment": vllmd,
            "component": constants.COMPONENT_ENGINE}, target

    health = queries.for_deployment(namespace, vllmd, stall_s=30, window_s=60)

    def query(promql: str) -> list[dict[str, Any]]:
        body = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        result: list[dict[str, Any]] = body["data"]["result"]
        return result
    for what, promql in (("up", health["up"]), ("running", health["running"]), ("kv_usage", health["kv_usage"])):
        result = wait_for(f"the health loop's {what} query to see the pod", lambda q=promql: query(q), timeout=30)
        assert [r["metric"] for r in result] == [{"pod": name, "pool": pool}], (what, promql, result)
    assert query(health["up"])[0]["value"][1] == "1"
