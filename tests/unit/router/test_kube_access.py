"""The router's API-server credentials come from the official client's loaders: a ServiceAccount token (from a
kubeconfig or the in-cluster files) must reach the Authorization header (the kubernetes client stores it as
"BearerToken"; the router read "authorization" and sent none, so it was system:anonymous in a real cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_operator.router.upstreams import kube_access


def test_a_token_kubeconfig_authenticates_with_its_token(tmp_path: Path) -> None:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "pod",
              "clusters": [{"name": "pod", "cluster": {"server": "https://172.29.0.2:6443",
                                                       "insecure-skip-tls-verify": True}}],
              "users": [{"name": "pod", "user": {"token": "abc.def"}}],
              "contexts": [{"name": "pod", "context": {"cluster": "pod", "user": "pod"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    access = kube_access(str(path))
    assert access.host == "https://172.29.0.2:6443"
    assert access.headers() == {"Authorization": "Bearer abc.def"}


def test_the_in_cluster_token_is_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubernetes.config.incluster_config as incluster

    (tmp_path / "token").write_text("in.cluster")
    (tmp_path / "ca.crt").write_text("(a CA; not parsed: the SSL context is stubbed)")
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "172.29.0.2")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    monkeypatch.setattr("ssl.create_default_context", lambda **_: None)
    access = kube_access()
    assert access.headers() == {"Authorization": "bearer in.cluster"}  # the in-cluster loader's spelling
