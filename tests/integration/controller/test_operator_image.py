"""The operator image, run as the chart renders its pod, reconciles a VLLMDeployment against the real API server.

The container gets what a kubelet would give the chart's pod: the chart's args, env, securityContext (non-root
65532, read-only root, no capabilities, no privilege escalation), its /tmp emptyDir and memory limit, and the
ServiceAccount's credentials where in-cluster config looks for them (a token, the cluster CA, the namespace under
/var/run/secrets/kubernetes.io/serviceaccount, and KUBERNETES_SERVICE_HOST/PORT). It runs in the test cluster's own
network namespace, which has no route off the machine, so it reaches the API server at the address the cluster
advertises.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from testcluster.cluster import API_PORT
from tests.integration.controller.conftest import PLACEHOLDER, Tenant
from tests.support import images
from tests.support.helm import render
from tests.support.waiting import eventually
from vllm_operator import __version__, constants
from vllm_operator.images import DEFAULT_IMAGES
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS, ClientKubeApi
from vllm_operator.planning import engine_args

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def chart_operator_pod(workdir: Path, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, operator container) of the chart's Deployment, in namespaced mode watching `namespace`."""
    docs = render(workdir, {"webhook": {"enabled": False}, "workloadClasses": {"builtins": False},
                            "watch": {"mode": "namespaced", "namespaces": [PLACEHOLDER]},
                            "operator": {"health": False}})
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["args"] = [a.replace(PLACEHOLDER, namespace) for a in container["args"]]
    return pod, container


def service_account_dir(tenant: Tenant, directory: Path) -> Path:
    """What the kubelet projects into the pod: the account's token, the cluster CA and the namespace."""
    kubeconfig = yaml.safe_load(tenant.account.kubeconfig.read_text())
    directory.mkdir(mode=0o755)
    (directory / "token").write_text(kubeconfig["users"][0]["user"]["token"])
    (directory / "ca.crt").write_bytes(Path(tenant.kube.ca_file).read_bytes())
    (directory / "namespace").write_text(tenant.account.namespace)
    for child in directory.iterdir():
        child.chmod(0o644)
    return directory


async def test_operator_image_reconciles_a_vllmdeployment(examples_tenant: Tenant, tmp_path: Path) -> None:
    tenant = examples_tenant
    pod, container = chart_operator_pod(tmp_path, tenant.namespace)
    assert container["image"] == images.image("operator").ref  # the chart's default image is the one built
    flags = images.pod_security_flags(pod, container, images.image_config("operator")["User"])
    assert "--read-only" in flags and "--cap-drop=all" in flags
    flags += [f"--volume={service_account_dir(tenant, tmp_path / 'sa')}:{SA_DIR}:ro",
              f"--env=KUBERNETES_SERVICE_HOST={tenant.kube.netns.address}", f"--env=KUBERNETES_SERVICE_PORT={API_PORT}"]
    for env in container.get("env", []):
        if "value" in env:
            flags.append(f"--env={env['name']}={env['value']}")
        else:  # the downward API, as the kubelet resolves it
            fields = {"metadata.namespace": tenant.account.namespace, "metadata.name": "vllm-operator-0"}
            flags.append(f"--env={env['name']}={fields[env['valueFrom']['fieldRef']['fieldPath']]}")
    port = next(a for a in container["args"] if a.startswith("--port=")).removeprefix("--port=")
    client = await ClientKubeApi.from_environment(kubeconfig=str(tenant.kube.kubeconfig))
    try:
        with images.running("operator", flags, container["args"], tmp_path / "operator.log",
                            network=f"ns:{tenant.kube.netns.path}") as operator:
            obj = tenant.example("cpu-dev")
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            await client.create(VLLM_DEPLOYMENTS, ns, obj)

            async def deployments() -> list[dict[str, Any]] | None:
                assert operator.running(), f"operator container exited: {images.podman('logs', operator.name).stderr}"
                items = await client.list(DEPLOYMENTS, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
                return items if len(items) == 3 else None

            items = await eventually(deployments, timeout=90, interval=0.5)
            found = sorted(c["image"] for d in items for c in d["spec"]["template"]["spec"]["containers"])
            cpu = DEFAULT_IMAGES.engine(gpu=False, version=engine_args.DEFAULT_CPU_VERSION)
            assert found == [cpu, cpu, f"ghcr.io/vllm-operator/router:{__version__}"]
            url = f"http://{tenant.kube.netns.address}:{port}/metrics"
            async with aiohttp.ClientSession() as http, http.get(url) as resp:
                metrics = await resp.text()
            assert 'vllm_operator_child_writes_total{kind="Deployment",verb="create"} 3.0' in metrics
            assert images.podman("exec", operator.name, "id", "-u").stdout.strip() == "65532"
            assert json.loads(images.podman("inspect", "--format", "{{json .HostConfig.ReadonlyRootfs}}",
                                            operator.name).stdout) is True
    finally:
        await client.close()
