"""`k8s.ClientKubeApi` (kubernetes_asyncio) and `k8s.list_watch` against a scripted API server on loopback, over TLS
with a CA of the test's own: the credentials reach the Authorization header (a router once sent none and was
system:anonymous in a real cluster), an error answer becomes a KubeError with the Status object's reason, and a
list-watch resumes from a bookmark without listing again but lists again after 410 Gone.

What the real kube-apiserver does with the same requests is tests/integration/kube/test_kubeapi_contract.py's."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from testcluster.pki import Authority
from vllm_operator.k8s import ENDPOINT_SLICES, ClientKubeApi, KubeError, list_watch

PATH = "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"


def slice_(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class Scripted:
    """An API server that answers lists and watches from a script and records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        self.lists: list[dict[str, Any]] = []
        self.watches: list[list[dict[str, Any]]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"authorization": request.headers.get("Authorization", ""), **request.query})
        if request.query.get("watch") != "true":
            if not self.lists:
                return web.json_response({"kind": "Status", "reason": "Forbidden", "code": 403,
                                          "message": "endpointslices is forbidden"}, status=403)
            return web.json_response(self.lists.pop(0))
        response = web.StreamResponse()
        await response.prepare(request)
        for event in self.watches.pop(0) if self.watches else []:
            await response.write(json.dumps(event).encode() + b"\n")
        if not self.watches:
            await asyncio.sleep(3600)  # the last watch stays open, like a real one
        return response


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Scripted, str, Path]]:
    ca = Authority(tmp_path, "ca")
    serving = ca.issue("serving", "apiserver", server=True, ips=("127.0.0.1",))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(serving.cert, serving.key)
    scripted = Scripted()
    app = web.Application()
    app.router.add_get(PATH, scripted.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield scripted, f"https://127.0.0.1:{port}", ca.pair.cert
    finally:
        await runner.cleanup()


def kubeconfig(tmp_path: Path, server: str, ca: Path) -> str:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "pod",
              "clusters": [{"name": "pod", "cluster": {"server": server, "certificate-authority": str(ca)}}],
              "users": [{"name": "pod", "user": {"token": "abc.def"}}],
              "contexts": [{"name": "pod", "context": {"cluster": "pod", "user": "pod"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return str(path)


async def test_a_list_watch_resumes_from_bookmarks_and_lists_again_only_after_410(
        server: tuple[Scripted, str, Path], tmp_path: Path) -> None:
    scripted, url, ca = server
    scripted.lists = [{"metadata": {"resourceVersion": "10"}, "items": [slice_("a", "9")]},
                      {"metadata": {"resourceVersion": "30"}, "items": [slice_("c", "29")]}]
    scripted.watches = [
        [{"type": "ADDED", "object": slice_("b", "11")},
         {"type": "BOOKMARK", "object": {"kind": "EndpointSlice", "metadata": {"resourceVersion": "15"}}}],
        [{"type": "DELETED", "object": slice_("a", "16")},
         {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}],
        [{"type": "MODIFIED", "object": slice_("c", "31")}],
    ]
    kube = await ClientKubeApi.from_environment(kubeconfig=kubeconfig(tmp_path, url, ca))
    snapshots: list[list[str]] = []
    try:
        async with asyncio.timeout(10):
            async for objects in list_watch(kube, ENDPOINT_SLICES, "ns", label_selector="svc=x",
                                            timeout_seconds=5):
                snapshots.append(sorted(objects))
                if len(snapshots) == 5:
                    break
    finally:
        await kube.close()
    assert snapshots == [["ns/a"], ["ns/a", "ns/b"], ["ns/b"], ["ns/c"], ["ns/c"]]
    asked = [(r.get("watch", "list"), r.get("resourceVersion", "")) for r in scripted.requests]
    # list; watch from the list; watch again from the bookmark (no list); 410 -> list; watch from that list
    assert asked == [("list", ""), ("true", "10"), ("true", "15"), ("list", ""), ("true", "30")]
    assert {r["authorization"] for r in scripted.requests} == {"Bearer abc.def"}
    assert {r["labelSelector"] for r in scripted.requests} == {"svc=x"}
    assert all(r["allowWatchBookmarks"] == "true" for r in scripted.requests if r.get("watch"))


async def test_an_error_answer_is_a_kube_error_with_the_status_reason(
        server: tuple[Scripted, str, Path], tmp_path: Path) -> None:
    _, url, ca = server
    kube = await ClientKubeApi.from_environment(kubeconfig=kubeconfig(tmp_path, url, ca))
    try:
        with pytest.raises(KubeError) as caught:
            await kube.list(ENDPOINT_SLICES, "ns")
    finally:
        await kube.close()
    assert (caught.value.status, caught.value.reason, caught.value.message) == (
        403, "Forbidden", "endpointslices is forbidden")


async def test_an_unreachable_server_is_status_zero(tmp_path: Path) -> None:
    ca = Authority(tmp_path, "ca").pair.cert
    kube = await ClientKubeApi.from_environment(kubeconfig=kubeconfig(tmp_path, "https://127.0.0.1:9", ca))
    try:
        with pytest.raises(KubeError) as caught:
            await kube.list(ENDPOINT_SLICES, "ns")
    finally:
        await kube.close()
    assert caught.value.status == 0


async def test_the_in_cluster_token_and_ca_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kubernetes_asyncio.config.incluster_config as incluster

    (tmp_path / "token").write_text("in.cluster")
    ca = Authority(tmp_path, "ca").pair.cert
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "172.29.0.2")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    kube = await ClientKubeApi.from_environment()
    try:
        connection = await kube.connection()
    finally:
        await kube.close()
    assert (connection.server, connection.token, connection.ca_path) == ("https://172.29.0.2:6443", "in.cluster",
                                                                         str(ca))


EXEC_PLUGIN = """import datetime, json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=float(sys.argv[2]))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                  "status": {"token": f"t-{n}", "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}))
"""


@pytest.mark.parametrize(("lifetime_s", "expected"), [(3600, ["Bearer t-1", "Bearer t-1"]),
                                                       (1, ["Bearer t-2", "Bearer t-3"])])
async def test_an_exec_plugin_token_is_renewed_before_it_expires(
        server: tuple[Scripted, str, Path], tmp_path: Path, lifetime_s: int, expected: list[str]) -> None:
    """The kubeconfig's exec plugin (EKS, GKE and AKS log in this way) runs again once its token is within the
    loader's margin of expiring, before the request; a token far from expiry is reused."""
    scripted, url, ca = server
    scripted.lists = [{"metadata": {"resourceVersion": "1"}, "items": []}] * 2
    plugin = tmp_path / "plugin.py"
    plugin.write_text(EXEC_PLUGIN)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority": str(ca)}}],
              "users": [{"name": "u", "user": {"exec": {
                  "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                  "args": [str(plugin), str(tmp_path / "count"), str(lifetime_s)]}}}],
              "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(json.dumps(config))
    kube = await ClientKubeApi.from_environment(kubeconfig=str(tmp_path / "kubeconfig"))
    try:
        await kube.list(ENDPOINT_SLICES, "ns")
        await kube.list(ENDPOINT_SLICES, "ns")
    finally:
        await kube.close()
    assert [r["authorization"] for r in scripted.requests] == expected
