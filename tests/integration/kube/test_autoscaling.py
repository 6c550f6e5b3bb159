"""Autoscaling on the real control plane: KEDA (built from its module), kube-controller-manager's HPA controller, a real
Prometheus, the real router, and the operator run as the chart's ServiceAccount.

Without KEDA's CRD (removed first if an earlier test left it), a pool that asks for autoscaling runs unscaled at its
starting count and the Autoscaling condition says why. Then with KEDA: the operator's ScaledObjects are applied and
the operator never writes the pool Deployments' replicas; the new long pool (minReplicas 0) starts with one replica
and sleeps after idleSeconds; the short pool scales up when its engines report waiting requests and back down after
the stabilization window; a long request sent to the router while the long pool sleeps is held, the held-requests
gauge wakes the pool (0 -> 1), the request is answered, and the pool goes back to 0 when idle — with the operator's
health loop on (reading the same Prometheus), which must neither fight KEDA over replicas nor treat a pool asleep at
zero as failing.

Pods are kwok pods, so their engines are fake vLLMs (tests/support: the project's fake, metrics pinned by the test)
that this test starts for each Running pod, and Prometheus discovers them through file_sd targets with the label
contract's labels (namespace, pod, vllmdeployment, pool) — what the rendered PodMonitor's relabelings give real pods.
The router runs as a process of this test with static endpoints standing in for the pool's EndpointSlices (pod addresses
are unreachable from the host by construction): the long pool's first engine is started on the port the router already
knows, which is what a pod becoming Ready in the EndpointSlice is to the router.

The windows are seconds (stabilization 5 s, idle 10 s, KEDA polling 15 s and the long pool's 3 s, HPA sync 2 s); each
wait is on a condition with an allowance of several wake chains, and the measured times go to the log (the figures in
the issue's note).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fakevllm.engine import ThreadedFakeVllm, run_in_thread
from testcluster import keda
from testcluster.cluster import Cluster
from tests.support.helm import CHART_DIR
from tests.support.kube import add_gpu_nodes, apply, helm, operator_process, unique, wait_for
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.prometheus import Prometheus, Target, running_prometheus
from tests.support.router import MODEL, router_config, router_in_thread, word_counter, words
from vllm_operator import constants, names

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

NAME = "chat"
STABILIZATION_S = 5
IDLE_S = 10
LONG_POLLING_S = 3
"""The long pool's pollingIntervalSeconds (the short pool keeps the default, 15 s): KEDA's poll is a link of the
long pool's wake and sleep."""
AUTOSCALING = {
    "short": {"minReplicas": 1, "maxReplicas": 3, "metric": "num-requests-waiting", "target": 4,
              "scaleDownStabilizationSeconds": STABILIZATION_S},
    "long": {"minReplicas": 0, "maxReplicas": 2, "metric": "num-requests-waiting", "target": 2,
             "scaleDownStabilizationSeconds": STABILIZATION_S, "idleSeconds": IDLE_S,
             "pollingIntervalSeconds": LONG_POLLING_S},
}
# One wake chain here: Prometheus 1 s + KEDA polling 3 s (long) or 15 s (short) + HPA 2 s + scheduling and kwok
# ~1 s, on a loaded 2-core machine; every wait allows several.
CHAIN_S = 120
HEALTH_INTERVAL_S = 2
"""The health loop's pass interval (the chat class's is longer): it runs beside KEDA on every step of the test."""


def spec(namespace: str, node_label: dict[str, str], name: str = NAME) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d]
    doc["metadata"]["namespace"] = namespace
    doc["metadata"]["name"] = name
    doc["spec"]["pools"] = {pool: {"nodeSelector": dict(node_label), "autoscaling": dict(AUTOSCALING[pool])}
                            for pool in ("short", "long")}
    doc["spec"]["remediation"] = {"intervalSeconds": HEALTH_INTERVAL_S}
    return dict(doc)


def deployment(kube: Cluster, namespace: str, name: str) -> dict[str, Any]:  # {} while absent
    out = kube.kubectl("get", "deployment", name, "-n", namespace, "-o", "json", "--show-managed-fields",
                       check=False)
    obj: dict[str, Any] = json.loads(out.stdout) if out.returncode == 0 else {}
    return obj


def replicas(kube: Cluster, namespace: str, pool: str) -> int | None:
    dep = deployment(kube, namespace, names.pool(NAME, pool))
    return dep.get("spec", {}).get("replicas") if dep else None


def vllmd(kube: Cluster, namespace: str, name: str = NAME) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(kube.kubectl("get", "vllmd", name, "-n", namespace, "-o", "json").stdout)
    return obj


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c["type"] == type_), None)


def operator_owns_replicas(dep: dict[str, Any]) -> bool:
    for entry in dep["metadata"].get("managedFields") or []:
        if entry.get("manager") == "vllm-operator" and "f:replicas" in (entry.get("fieldsV1", {}).get("f:spec") or {}):
            return True
    return False


def assert_clean_log(path: Path) -> None:
    """No ERROR and no traceback in the operator's log, except kopf's retried watch of a CRD whose watch cache the
    API server is still initialising (429 "storage is (re)initializing", a moment after the chart created it)."""
    lines = [line for line in path.read_text().splitlines()
             if ("ERROR" in line or "Traceback" in line) and "storage is (re)initializing" not in line]
    assert not lines, "\n".join(lines[-20:])


@dataclass
class Engines:
    """A fake vLLM per Ready engine pod, with Prometheus targets carrying the label contract; the test pins each
    pool's total of waiting requests, split evenly over its pods. A long pod gets `first_long_port` (the router's
    static endpoint for the pool) whenever no other long pod holds it."""

    kube: Cluster
    namespace: str
    prometheus: Prometheus
    router_target: Target
    first_long_port: int
    waiting: dict[str, float] = field(default_factory=lambda: {"short": 0.0, "long": 0.0})
    fakes: dict[str, tuple[str, ThreadedFakeVllm]] = field(default_factory=dict)
    _stacks: dict[str, ExitStack] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def pods(self) -> dict[str, str]:
        out = self.kube.kubectl("get", "pods", "-n", self.namespace, "-l", constants.LABEL_POOL, "-o", "json",
                                check=False)
        if out.returncode != 0:
            return {}
        running = {}
        for pod in json.loads(out.stdout)["items"]:
            ready = any(c["type"] == "Ready" and c["status"] == "True"
                        for c in pod.get("status", {}).get("conditions") or [])
            if ready and not pod["metadata"].get("deletionTimestamp"):
                running[pod["metadata"]["name"]] = pod["metadata"]["labels"][constants.LABEL_POOL]
        return running

    def sync(self) -> None:
        pods = self.pods()
        for gone in [p for p in self.fakes if p not in pods]:
            self.fakes.pop(gone)
            self._stacks.pop(gone).close()
        for pod, pool in pods.items():
            if pod in self.fakes:
                continue
            port = 0
            taken = any(f.url.endswith(f":{self.first_long_port}") for p, f in self.fakes.values() if p == "long")
            if pool == "long" and not taken:
                port = self.first_long_port  # the address the router knows for the pool
            stack = ExitStack()
            fake = stack.enter_context(run_in_thread(model=MODEL, max_model_len=1000, natural_tokens=5, port=port))
            self.fakes[pod], self._stacks[pod] = (pool, fake), stack
            log.info("Started a fake vLLM at %s for pod %s (pool %s)", fake.url, pod, pool)
        for pool in ("short", "long"):
            mine = [f for p, f in self.fakes.values() if p == pool]
            for fake in mine:
                fake.set_metric("vllm:num_requests_waiting", self.waiting[pool] / len(mine))
        targets = [Target(fake.url.removeprefix("http://"),
                          {"namespace": self.namespace, "pod": pod, "vllmdeployment": NAME, "pool": pool})
                   for pod, (pool, fake) in sorted(self.fakes.items())]
        self.prometheus.set_targets([*targets, self.router_target])

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception:  # a kubectl that timed out on a loaded machine: the next round retries
                log.exception("Engine sync failed; retrying")
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        for stack in self._stacks.values():
            stack.close()


@dataclass
class Release:
    name: str
    namespace: str
    watched: str
    service_account: str


@pytest.fixture(scope="module")
def release(kube: Cluster) -> Iterator[Release]:
    rel = Release(name=unique("vo"), namespace=unique("vo-sys"), watched=unique("scale"), service_account="")
    rel.service_account = f"{rel.name}-vllm-operator"
    kube.kubectl("create", "namespace", rel.watched)
    helm(kube, "install", rel.name, str(CHART_DIR), "--namespace", rel.namespace, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{rel.watched}}}",
         "--set", "workloadClasses.builtins=false")
    # The operator starts right after: let the API server's watch caches of the new CRDs finish initialising (a
    # watch before that is a 429 "storage is (re)initializing", which kopf logs as an ERROR and retries).
    for crd, kind in ((constants.CRD_NAME, "vllmd"), (constants.CLASS_CRD_NAME, "vllmwc")):
        kube.wait_established(crd)
        wait_for(f"{kind} to be listable", lambda k=kind: kube.kubectl("get", k, "-A", "--watch-only=false",
                                                                      check=False).returncode == 0, timeout=30)
    yield rel
    helm(kube, "uninstall", rel.name, "--namespace", rel.namespace, check=False)
    kube.kubectl("delete", "namespace", rel.watched, rel.namespace, "--wait=false", check=False)


@pytest.fixture
def without_keda(kube: Cluster) -> None:
    """The session's cluster without KEDA's CRDs, whatever ran before (`with_keda` leaves them, as `keda.uninstall`
    does on a shared cluster): removed here, so this module's tests pass in any order and after any other module."""
    for path in keda.crd_files(keda.locate()):
        crd = yaml.safe_load(path.read_text())["metadata"]["name"]
        kube.kubectl("delete", "crd", crd, "--ignore-not-found", "--wait=true", "--timeout=60s", timeout=70)
    crds = kube.kubectl("get", "crd", "scaledobjects.keda.sh", check=False)
    assert crds.returncode != 0, f"KEDA's CRD is still served: {crds.stdout}"


@pytest.mark.usefixtures("without_keda")
def test_without_keda_the_pool_runs_unscaled_and_the_condition_says_so(kube: Cluster, release: Release,
                                                                       tmp_path: Path) -> None:
    name = "nokeda"
    token = kube.token_kubeconfig(release.namespace, release.service_account, tmp_path / "operator.kubeconfig")
    label = {"vllm-operator.dev/test-node": release.watched}
    with operator_process(kube, token, tmp_path / "operator.log", f"--namespace={release.watched}", "--no-health",
                          "--prometheus-url=http://prometheus.invalid:9090"):
        apply(kube, spec(release.watched, label, name))

        def said() -> dict[str, Any] | None:
            cond = condition(vllmd(kube, release.watched, name), constants.COND_AUTOSCALING)
            return cond if cond and cond["reason"] == "KEDANotInstalled" else None

        cond = wait_for("Autoscaling=False (KEDANotInstalled)", said, timeout=60)
        assert cond["status"] == "False" and "scaledobjects.keda.sh" in cond["message"], cond
        for pool in ("short", "long"):
            dep_name = names.pool(name, pool)
            dep = wait_for(f"the {pool} Deployment", lambda n=dep_name: deployment(kube, release.watched, n),
                           timeout=30)
            assert dep["spec"]["replicas"] == 1 and operator_owns_replicas(dep), "the starting count, written"
        kube.kubectl("delete", "vllmd", name, "-n", release.watched, "--timeout=30s", timeout=40)
    assert_clean_log(tmp_path / "operator.log")


@pytest.fixture
def with_keda(kube: Cluster) -> Iterator[keda.Keda]:
    with keda.running(kube) as running:
        yield running


def test_keda_scales_up_down_to_zero_and_back(kube: Cluster, release: Release, with_keda: keda.Keda,
                                              tmp_path: Path) -> None:
    ns = release.watched
    label = {"vllm-operator.dev/test-node": ns}
    nodes = add_gpu_nodes(kube, ns, 2, label=label, gpus=4)
    times: dict[str, float] = {}
    with ExitStack() as stack:
        prom = stack.enter_context(running_prometheus(host=kube.netns.host_address))
        short_fake = stack.enter_context(run_in_thread(model=MODEL, max_model_len=200, natural_tokens=5))
        long_port = free_port()
        config = router_config([short_fake.url], [f"http://127.0.0.1:{long_port}"],
                               **{"pools.long.wakeSeconds": float(CHAIN_S), "timeouts.totalSeconds": CHAIN_S + 30.0,
                                  "health.intervalSeconds": 0.5})
        router_url, _ = stack.enter_context(router_in_thread(config, word_counter(tmp_path / "tokenizer")))
        router_target = Target(router_url.removeprefix("http://"),
                               {"namespace": ns, "pod": "router-0", "vllmdeployment": NAME, "component": "router"})
        engines = Engines(kube, ns, prom, router_target, long_port)
        syncer = threading.Thread(target=engines.run, name="engines", daemon=True)
        syncer.start()
        stack.callback(engines.stop)
        token = kube.token_kubeconfig(release.namespace, release.service_account, tmp_path / "operator.kubeconfig")
        stack.enter_context(operator_process(kube, token, tmp_path / "operator.log", f"--namespace={ns}",
                                             f"--prometheus-url={prom.url}"))
        # KEDA resolves the scale target's container env when it builds its scalers, secretKeyRef included: without
        # the Secret the engine's HF_TOKEN names, it creates no HPA ("error resolving secrets for ScaleTarget").
        kube.kubectl("create", "secret", "generic", "hf-token", "-n", ns, "--from-literal=token=unused", check=False)
        t0 = time.monotonic()
        apply(kube, spec(ns, label))

        def applied() -> bool:
            cond = condition(vllmd(kube, ns), constants.COND_AUTOSCALING)
            return bool(cond and cond["status"] == "True")

        wait_for("Autoscaling=True", applied, timeout=60)
        for pool in ("short", "long"):
            so = json.loads(kube.kubectl("get", "scaledobject", names.pool(NAME, pool), "-n", ns, "-o",
                                         "json").stdout)
            assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == prom.url
            assert so["spec"]["pollingInterval"] == (LONG_POLLING_S if pool == "long" else
                                                     constants.KEDA_POLLING_INTERVAL_S)
        hpa = f"keda-hpa-{names.pool(NAME, 'short')}"
        wait_for("KEDA's HPA for the short pool", lambda: kube.kubectl("get", "hpa", hpa, "-n", ns,
                                                                       check=False).returncode == 0, timeout=CHAIN_S)

        # A new minReplicas-0 pool starts with one replica and sleeps once idle for idleSeconds.
        wait_for("the long pool to sleep at 0", lambda: replicas(kube, ns, "long") == 0, timeout=CHAIN_S)
        times["long pool asleep after create"] = time.monotonic() - t0
        assert condition(vllmd(kube, ns), constants.COND_READY) is not None

        # Scale up on waiting requests: 10 waiting against a target of 4 per replica is 3 replicas.
        engines.waiting["short"] = 10
        t = time.monotonic()
        wait_for("the short pool at 3", lambda: replicas(kube, ns, "short") == 3, timeout=CHAIN_S)
        times["short 1 -> 3 under load"] = time.monotonic() - t
        engines.waiting["short"] = 0
        t = time.monotonic()
        wait_for("the short pool back at 1", lambda: replicas(kube, ns, "short") == 1, timeout=CHAIN_S)
        times["short 3 -> 1 after the load"] = time.monotonic() - t
        assert times["short 3 -> 1 after the load"] >= STABILIZATION_S, "not before the stabilization window"

        # Wake: a long request is held by the router, its gauge wakes the pool, the request is answered.
        answer: dict[str, Any] = {}

        def send() -> None:
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": words(80)}]}).encode()
            req = urllib.request.Request(router_url + "/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            start = time.monotonic()
            try:
                with urllib.request.urlopen(req, timeout=CHAIN_S + 60) as resp:
                    answer.update(status=resp.status, pool=resp.headers["x-vllm-operator-pool"],
                                  seconds=time.monotonic() - start)
            except urllib.error.HTTPError as err:
                answer.update(status=err.code, body=err.read().decode(errors="replace"),
                              seconds=time.monotonic() - start)

        sender = threading.Thread(target=send, name="long-request")
        t = time.monotonic()
        sender.start()
        wait_for("the long pool to wake to 1", lambda: replicas(kube, ns, "long") == 1, timeout=CHAIN_S)
        times["long 0 -> 1 (request held)"] = time.monotonic() - t
        sender.join(CHAIN_S + 60)
        assert answer.get("status") == 200 and answer.get("pool") == "long", answer
        times["held long request answered"] = answer["seconds"]
        t = time.monotonic()
        wait_for("the long pool back at 0", lambda: replicas(kube, ns, "long") == 0, timeout=CHAIN_S)
        times["long 1 -> 0 when idle"] = time.monotonic() - t

        for pool in ("short", "long"):
            dep = deployment(kube, ns, names.pool(NAME, pool))
            assert not operator_owns_replicas(dep), f"the operator never applies the {pool} pool's replicas"

        # Status: the sleeping pool's desired count and KEDA's decision; the wake as two events.
        def asleep() -> dict[str, Any] | None:
            long = (vllmd(kube, ns).get("status", {}).get("pools") or {}).get("long") or {}
            scaler = long.get("autoscaler") or {}
            return long if long.get("desiredReplicas") == 0 and scaler.get("active") is False else None

        long_status = wait_for("status.pools.long asleep", asleep, timeout=CHAIN_S)
        assert long_status["autoscaler"]["decision"].startswith("asleep at 0"), long_status
        ready = condition(vllmd(kube, ns), constants.COND_READY)
        assert ready is not None and ready["status"] == "True", f"a sleeping pool is not a failing one: {ready}"
        # The health loop ran beside KEDA (it read the engines' signals from the same Prometheus) and saw nothing to
        # heal: not Degraded, and it deleted no pod (KEDA's scale-downs are the ReplicaSet controller's deletes).
        # (A pod just woken is Ready before Prometheus has scraped it, so MetricsAvailable may be False for a pass.)
        def metrics_available() -> dict[str, Any] | None:
            cond = condition(vllmd(kube, ns), constants.COND_METRICS_AVAILABLE)
            return cond if cond and cond["status"] == "True" else None

        wait_for("MetricsAvailable=True from the health loop", metrics_available, timeout=60)
        degraded = condition(vllmd(kube, ns), constants.COND_DEGRADED)
        assert degraded is None or degraded["status"] != "True", degraded
        events = json.loads(kube.kubectl("get", "events", "-n", ns, "--field-selector",
                                         f"involvedObject.name={NAME},involvedObject.kind={constants.KIND}",
                                         "-o", "json").stdout)["items"]
        reasons = {e["reason"]: e["message"] for e in events}
        assert "PoolWoke" in reasons, sorted(reasons)
        assert reasons["PoolWoke"].startswith("Pool long woke: its first replica is Ready"), reasons["PoolWoke"]
        log.warning("Wake events: %s", {r: m for r, m in reasons.items() if r.startswith("Pool")})
        described = kube.kubectl("describe", "vllmd", NAME, "-n", ns).stdout
        assert "Autoscaler" in described and "Desired Replicas" in described, described
        kube.kubectl("delete", "vllmd", NAME, "-n", ns, "--timeout=30s", timeout=40)
    kube.kubectl("delete", "node", *nodes, "--wait=false", check=False)
    log.warning("Autoscaling times on the real control plane: %s",
                ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
    (tmp_path / "times.json").write_text(json.dumps(times, indent=1))
    assert_clean_log(tmp_path / "operator.log")
    forbidden = [e for e in kube.audit_events()
                 if e.get("user", {}).get("username", "").endswith(f":{release.service_account}")
                 and e.get("responseStatus", {}).get("code") == 403]
    assert not forbidden, [(e["verb"], e["requestURI"]) for e in forbidden]
    healed = [e["requestURI"] for e in kube.audit_events()
              if e.get("user", {}).get("username", "").endswith(f":{release.service_account}")
              and e.get("verb") == "delete" and (e.get("objectRef") or {}).get("resource") == "pods"]
    assert not healed, f"the health loop deleted pods of a healthy autoscaled deployment: {healed}"
