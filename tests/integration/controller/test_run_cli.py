"""`vllm-operator run` as a real process: logs in from a kubeconfig, reconciles, serves /healthz and /metrics, and
stops cleanly on SIGTERM. (The other tests run the operator in their own process; this one catches what only a
process started like the chart starts it can show — kopf's default login handlers are not on our registry.) It
logs in with the chart's ServiceAccount token against the real API server, watching the test's namespace."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import aiohttp

from tests.integration.controller.conftest import Tenant
from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.waiting import eventually
from vllm_operator import __version__, constants
from vllm_operator.k8s import DEPLOYMENTS, VLLM_DEPLOYMENTS, ClientKubeApi
from vllm_operator.planning import engine_args

MIRROR = "registry.example:5000/mirror/vllm-operator"


async def test_run_command_reconciles_and_serves_health_and_metrics(examples_tenant: Tenant) -> None:
    tenant = examples_tenant
    port = free_port()
    # The mirror comes from the environment (the chart's operator.env can set it; the chart's value is the flag).
    env = {**os.environ, "KUBECONFIG": str(tenant.account.kubeconfig), "VLLM_OPERATOR_IMAGE_REPOSITORY": MIRROR}
    proc = await asyncio.create_subprocess_exec(
        str(ROOT / ".venv/bin/vllm-operator"), "run", "--no-health", "--port", str(port),
        f"--namespace={tenant.namespace}", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    client = await ClientKubeApi.from_environment(kubeconfig=str(tenant.kube.kubeconfig))
    try:
        obj = tenant.example("cpu-dev")
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        await client.create(VLLM_DEPLOYMENTS, ns, obj)

        async def deployments() -> int:
            items = await client.list(DEPLOYMENTS, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
            return len(items) if len(items) == 3 else 0

        await eventually(deployments, timeout=60)
        items = await client.list(DEPLOYMENTS, ns, f"{constants.LABEL_DEPLOYMENT}={name}")
        images = sorted(c["image"] for d in items for c in d["spec"]["template"]["spec"]["containers"])
        cpu = engine_args.DEFAULT_CPU_VERSION
        assert images == [f"{MIRROR}/engine-cpu:{cpu}", f"{MIRROR}/engine-cpu:{cpu}", f"{MIRROR}/router:{__version__}"]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200

            async def reconciled() -> str | None:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    text = await resp.text()
                return text if 'vllm_operator_reconciles_total{result="changed"} 1.0' in text else None

            text = await eventually(reconciled, timeout=30)
        assert 'vllm_operator_child_writes_total{kind="Deployment",verb="create"} 3.0' in text
    finally:
        await client.close()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert b"LoginError" not in stderr
