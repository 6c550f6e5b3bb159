"""kopf logs in with the operator's own client's credentials, not from $KUBECONFIG: kopf's authenticator may run after
the operator reported ready, and an embedder (the in-process test operator) that set KUBECONFIG only around the start
had kopf fail with "Ran out of valid credentials" (CI, test_restart_at_random_points_converges[seed2])."""

from __future__ import annotations

import os
from pathlib import Path

import kopf
import pytest
from kopf._core.intents.causes import Activity

from testcluster.pki import Authority
from vllm_operator.handlers.config import OperatorConfig
from vllm_operator.handlers.run import build_registry
from vllm_operator.k8s import ClientKubeApi

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", certificate-authority: CA}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {token: the-token}}]
current-context: c
"""


def login_handlers(registry: kopf.OperatorRegistry) -> list[kopf.ActivityFn]:
    return [h.fn for h in registry._activities.get_handlers(activity=Activity.AUTHENTICATION)]


async def test_kopf_logs_in_as_the_operators_own_client_with_no_kubeconfig_in_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = Authority(tmp_path, "ca").pair.cert  # a real one: the client builds its TLS context from it
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG.replace("CA", str(ca)))
    api = await ClientKubeApi.from_environment(kubeconfig=str(path))
    try:
        monkeypatch.delenv("KUBECONFIG", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
        [login] = login_handlers(build_registry(OperatorConfig(http_port=0), api.connection))
        info = await login()
        assert isinstance(info, kopf.ConnectionInfo)
        assert (info.server, info.scheme, info.token, info.insecure) == ("https://127.0.0.1:6443", "Bearer",
                                                                           "the-token", False)
        assert os.fspath(info.ca_path or "") == str(ca)
        assert info.as_http_headers() == {"Authorization": "Bearer the-token"}
    finally:
        await api.close()


def test_without_a_client_kopf_logs_in_from_the_environment() -> None:
    [login] = login_handlers(build_registry(OperatorConfig(http_port=0)))
    assert login.__name__ == "_login_from_environment"
