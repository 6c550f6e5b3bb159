"""The admission webhook on a real control plane: kube-apiserver calls the operator, which runs the planner.

The chart is installed (namespaced to one watched namespace) and the operator runs as a host process with the
chart's ServiceAccount token, listening on the host end of the cluster's veth. The test cluster has no kube-proxy,
so the API server (aggregator routing) dials the webhook Service's endpoints: the test points the Service at that
address with an EndpointSlice of its own (in a real cluster the Service selects the operator's pod). The certificate
is the operator's own, for `<service>.<namespace>.svc`, trusted through the caBundle the operator wrote.

What is shown: `kubectl apply` and `--dry-run=server` refuse the examples' impossible neighbours with the planner's
message and print its warnings; an impossible edit of a running deployment is refused and the stored spec stays;
with the operator stopped, applies go through (failurePolicy Ignore) and reconcile refuses them in status once it is
back; and with failurePolicy Fail, serving certificates and the CA rotate under continuous dry runs without one
failed call.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.cluster import Cluster
from tests.support.helm import CHART_DIR
from tests.support.kube import helm, operator_process, unique, wait_for
from tests.support.paths import ROOT
from vllm_operator import certs, constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_resource
from vllm_operator.planning import RemediationState, plan

pytestmark = pytest.mark.integration

CHAT = next(d for d in yaml.safe_load_all((ROOT / "examples" / "chat.yaml").read_text()) if d)
WEBHOOK = "validate.vllmdeployments.vllm-operator.dev"


@dataclass
class Release:
    name: str
    namespace: str
    watched: str
    service: str
    configuration: str
    ca_secret: str
    port: int
    host: str

    def operator_args(self, *extra: str) -> list[str]:
        return [f"--namespace={self.watched}", "--no-health", f"--webhook-port={self.port}",
                f"--webhook-host={self.host}", f"--webhook-service={self.service}",
                f"--webhook-namespace={self.namespace}", f"--webhook-ca-secret={self.ca_secret}",
                f"--webhook-configuration={self.configuration}", *extra]


def _free_port(host: str) -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _route_service_to_host(kube: Cluster, rel: Release) -> None:
    """The Service without a selector, its endpoints the host address where the operator process listens."""
    kube.kubectl("patch", "service", rel.service, "-n", rel.namespace, "--type=json",
                 "-p", '[{"op": "remove", "path": "/spec/selector"}]')
    slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
              "metadata": {"name": f"{rel.service}-host", "namespace": rel.namespace,
                           "labels": {"kubernetes.io/service-name": rel.service}},
              "addressType": "IPv4", "endpoints": [{"addresses": [rel.host], "conditions": {"ready": True}}],
              "ports": [{"name": "webhook", "port": rel.port, "protocol": "TCP"}]}
    kube.kubectl("apply", "-f", "-", input=json.dumps(slice_))


def install(kube: Cluster, prefix: str, *sets: str) -> Release:
    """`helm install` namespaced to a watched namespace of its own, the webhook Service routed to the host.

    Without the built-in VLLMWorkloadClass objects: they are cluster-scoped and owned by whichever release installed
    them first, so a second release in the shared test cluster could not be installed with them (the webhook plans
    the built-in class names from the table either way)."""
    name, namespace = unique(prefix), unique(f"{prefix}-sys")
    full = f"{name}-vllm-operator"
    host = kube.netns.host_address
    rel = Release(name=name, namespace=namespace, watched=unique(f"{prefix}-team"), service=f"{full}-webhook",
                  configuration=f"{full}-{namespace}", ca_secret=f"{full}-webhook-ca", port=_free_port(host),
                  host=host)
    kube.kubectl("create", "namespace", rel.watched)
    helm(kube, "install", rel.name, str(CHART_DIR), "--namespace", rel.namespace, "--create-namespace",
         "--set", "watch.mode=namespaced", "--set", f"watch.namespaces={{{rel.watched}}}",
         "--set", "workloadClasses.builtins=false", *sets)
    _route_service_to_host(kube, rel)
    return rel


def uninstall(kube: Cluster, rel: Release) -> None:
    helm(kube, "uninstall", rel.name, "--namespace", rel.namespace, check=False)
    kube.kubectl("delete", "namespace", rel.watched, rel.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def release(kube: Cluster) -> Iterator[Release]:
    rel = install(kube, "wh")
    yield rel
    uninstall(kube, rel)


def chat(namespace: str, name: str = "chat", **spec: Any) -> dict[str, Any]:
    obj = copy.deepcopy(CHAT)
    obj["metadata"] = {"name": name, "namespace": namespace}
    obj["spec"].update(spec)
    return obj


def impossible(namespace: str) -> dict[str, dict[str, Any]]:
    """The examples' impossible neighbours: each refused by the planner (checked offline first)."""
    return {
        "128k-on-l4": chat(namespace, "chat-128k", pools={"short": {"replicas": 2},
                                                          "long": {"replicas": 1, "maxModelLen": 131072}}),
        "70b-on-one-l4": chat(namespace, "chat-70b", model={**CHAT["spec"]["model"],
                                                            "name": "meta-llama/Llama-3.1-70B-Instruct"}),
        "tp-not-dividing-heads": chat(namespace, "chat-tp3", accelerator={"type": "nvidia-l4-24gb", "count": 3}),
        "tier-cap-above-long": chat(namespace, "chat-tier", routing={**CHAT["spec"]["routing"], "tiers": [
            {"name": "free", "defaultMaxTokens": 256, "maxTokens": 10_000_000}]}),
    }


def planner_refusal(obj: dict[str, Any]) -> str:
    resource = parse_resource(obj)
    try:
        plan(resource.spec, None, RemediationState.from_status(None), name=resource.metadata.name,
             namespace=resource.metadata.namespace)
    except SpecError as err:
        return str(err)
    raise AssertionError(f"{resource.metadata.name}: the planner accepts it")


def kubectl_apply(kube: Cluster, obj: dict[str, Any], *flags: str) -> Any:
    return kube.kubectl("apply", *flags, "-f", "-", input=json.dumps(obj), check=False)


def wait_webhook_answers(kube: Cluster, rel: Release) -> None:
    """Until the API server reaches the webhook (listening, caBundle written and seen by the API server)."""
    probe = impossible(rel.watched)["128k-on-l4"]
    wait_for("the webhook to refuse a dry run", lambda: "denied the request" in kubectl_apply(
        kube, probe, "--dry-run=server").stderr, timeout=60, interval=0.5)


@pytest.fixture(scope="module")
def operator(kube: Cluster, release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("webhook-operator")
    token = kube.token_kubeconfig(release.namespace, f"{release.name}-vllm-operator", tmp / "operator.kubeconfig")
    log = tmp / "operator.log"
    with operator_process(kube, token, log, *release.operator_args()):
        wait_webhook_answers(kube, release)
        yield log
    text = log.read_text()
    assert "ERROR" not in text and "Traceback" not in text, text[-4000:]


def test_impossible_specs_are_refused_by_apply_and_server_dry_run(kube: Cluster, release: Release,
                                                                  operator: Path) -> None:
    for case, obj in impossible(release.watched).items():
        message = planner_refusal(obj)
        for flags in (("--dry-run=server",), ()):
            proc = kubectl_apply(kube, obj, *flags)
            assert proc.returncode != 0, f"{case} {flags}: accepted: {proc.stdout}"
            assert f'admission webhook "{WEBHOOK}" denied the request: {message}' in proc.stderr, (case, proc.stderr)
        got = kube.kubectl("get", "vllmd", obj["metadata"]["name"], "-n", release.watched, check=False)
        assert got.returncode != 0 and "NotFound" in got.stderr, f"{case}: stored anyway"
    assert "Refused create of VLLMDeployment" in operator.read_text()


def test_warnings_are_printed_on_apply_and_a_bad_edit_keeps_the_running_spec(kube: Cluster, release: Release,
                                                                             operator: Path) -> None:
    tiers = [{"name": "free", "defaultMaxTokens": 1024, "maxTokens": 1024}]
    warned = chat(release.watched, "chat-warned", routing={**CHAT["spec"]["routing"], "tiers": tiers})
    proc = kubectl_apply(kube, warned)
    assert proc.returncode == 0, proc.stderr
    assert "Warning: " in proc.stderr and "free" in proc.stderr, proc.stderr
    bad = copy.deepcopy(warned)
    bad["spec"]["pools"]["long"]["maxModelLen"] = 131072
    proc = kubectl_apply(kube, bad)
    assert proc.returncode != 0 and "denied the request: spec.pools.long" in proc.stderr, proc.stderr
    stored = json.loads(kube.kubectl("get", "vllmd", "chat-warned", "-n", release.watched, "-o", "json").stdout)
    assert "maxModelLen" not in stored["spec"]["pools"]["long"], "the refused edit was stored"
    # An unchanged spec (a label edit) never reaches the webhook (matchConditions), so it is allowed even if the
    # stored spec were one the planner now refuses.
    kube.kubectl("label", "vllmd", "chat-warned", "-n", release.watched, "team=a")


def test_with_the_operator_stopped_applies_work_and_are_refused_in_status_when_it_returns(
        kube: Cluster, release: Release, operator: Path, tmp_path: Path) -> None:
    # The module's operator keeps running in its process; a second release would be a second operator: instead,
    # point the Service at a port nobody listens on (the operator "down"), then back.
    _set_endpoint_port(kube, release, _free_port(release.host))
    obj = impossible(release.watched)["128k-on-l4"]
    obj["metadata"]["name"] = "chat-while-down"
    try:
        proc = wait_for("an apply to pass while the webhook is unreachable (Ignore)",
                        lambda: (p := kubectl_apply(kube, obj)).returncode == 0 and p, timeout=30, interval=0.5)
        assert "denied" not in proc.stderr
    finally:
        _set_endpoint_port(kube, release, release.port)

    def refused_in_status() -> bool:
        got = json.loads(kube.kubectl("get", "vllmd", "chat-while-down", "-n", release.watched, "-o",
                                      "json").stdout)
        conds = {c["type"]: c for c in got.get("status", {}).get("conditions", [])}
        return conds.get(constants.COND_SPEC_VALID, {}).get("status") == "False"

    wait_for("reconcile to refuse it in status", refused_in_status, timeout=60)
    wait_webhook_answers(kube, release)


def _ca_bundle(kube: Cluster, rel: Release) -> list[bytes]:
    got = json.loads(kube.kubectl("get", "validatingwebhookconfiguration", rel.configuration, "-o", "json").stdout)
    encoded = got["webhooks"][0]["clientConfig"].get("caBundle", "")
    return certs.split_bundle(base64.b64decode(encoded)) if encoded else []


def _set_endpoint_port(kube: Cluster, rel: Release, port: int) -> None:
    kube.kubectl("patch", "endpointslice", f"{rel.service}-host", "-n", rel.namespace, "--type=json", "-p",
                 json.dumps([{"op": "replace", "path": "/ports/0/port", "value": port}]))


def test_certificates_rotate_with_failure_policy_fail_without_a_failed_call(kube: Cluster, tmp_path: Path) -> None:
    """A release of its own (its own CA Secret and configuration) with failurePolicy Fail and short lifetimes:
    serving certificates are reissued every ~8 s and the CA every ~25 s while dry runs run back to back."""
    rel = install(kube, "rot", "--set", "webhook.failurePolicy=Fail")
    try:
        token = kube.token_kubeconfig(rel.namespace, f"{rel.name}-vllm-operator", tmp_path / "op.kubeconfig")
        log = tmp_path / "rotating.log"
        args = rel.operator_args("--webhook-check-interval=1", "--webhook-serving-lifetime=20",
                                 "--webhook-serving-renew-before=12", "--webhook-ca-lifetime=45",
                                 "--webhook-ca-renew-before=20", "--webhook-bundle-settle=3")
        good = chat(rel.watched, "chat-rotation")
        bad = impossible(rel.watched)["128k-on-l4"]
        failures: list[str] = []
        bundles: set[int] = set()
        calls = 0
        with operator_process(kube, token, log, *args):
            wait_webhook_answers(kube, rel)
            stop = threading.Event()

            def watch_bundle() -> None:
                while not stop.is_set():
                    bundles.add(len(_ca_bundle(kube, rel)))
                    time.sleep(1)

            watcher = threading.Thread(target=watch_bundle, daemon=True)
            watcher.start()
            deadline = time.monotonic() + 60
            try:
                while time.monotonic() < deadline:
                    ok = kubectl_apply(kube, good, "--dry-run=server")
                    refused = kubectl_apply(kube, bad, "--dry-run=server")
                    calls += 2
                    if ok.returncode != 0:
                        failures.append(ok.stderr.strip())
                    if "denied the request: spec.pools.long" not in refused.stderr:
                        failures.append(refused.stderr.strip())
            finally:
                stop.set()
                watcher.join()
            # Fail means Fail: with nothing listening, the API server refuses the apply.
            _set_endpoint_port(kube, rel, _free_port(rel.host))
            down = wait_for("an apply to fail while the webhook is unreachable (Fail)",
                            lambda: (p := kubectl_apply(kube, good, "--dry-run=server")).returncode != 0 and p,
                            timeout=30, interval=0.5)
            assert "failed calling webhook" in down.stderr, down.stderr
        text = log.read_text()
        served = text.count("Loaded a webhook serving certificate")
        renewed = text.count("Renewed the webhook CA")
        print(f"rotation: {calls} dry runs, {len(failures)} failed, {served} serving certificates, "
              f"{renewed} CA renewals, caBundle sizes {sorted(bundles)}")
        assert not failures, f"{len(failures)} of {calls} calls failed during rotation: {failures[:3]}"
        assert served >= 4 and renewed >= 1, (served, renewed, text[-3000:])
        assert 2 in bundles, f"old and new CA were never both in the caBundle: sizes seen {sorted(bundles)}"
        assert "ERROR" not in text and "Traceback" not in text, text[-4000:]
    finally:
        uninstall(kube, rel)
