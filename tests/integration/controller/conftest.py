"""Fixtures for the controller tier on the session's real control plane (tests/support/kube.py).

The operator runs in the test's process (`running_operator`: its own thread and event loop, so a test can read its
log records and stop it at any point) but authenticates exactly as the chart's pod would: with a TokenRequest token
of a ServiceAccount bound to the RBAC `helm template` renders for namespaced mode (the tenant's namespace gets the
chart's Role), so anything outside the chart's rules is a real 403. Only the RBAC objects of the rendering are
applied, not the chart's operator Deployment.

The cluster is shared by the whole session, so every test gets a `Tenant`: a namespace of its own, kwok nodes with
a label of its own (one 8-GPU node per GPU type the examples name, plus a CPU node), and the examples rewritten into
that namespace with their pools pinned to those nodes. The operator watches only the tenant's namespace.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster import nodes
from testcluster.cluster import Cluster
from tests.support import inprocess
from tests.support.helm import render
from tests.support.kube import apply, unique, wait_for
from tests.support.paths import CLASS_CRD_FILE, CRD_FILE, EXAMPLE_FILES
from vllm_operator import constants
from vllm_operator.api.resource import parse_resource
from vllm_operator.k8s import ClientKubeApi
from vllm_operator.planning import catalog

EXAMPLES: dict[str, dict[str, Any]] = {p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLE_FILES}
GPUS_PER_NODE = 8
NODE_LABEL = "vllm-operator.dev/test-node"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def gpu_node(name: str, gpu_type: str, label: dict[str, str], *, gpus: int = GPUS_PER_NODE,
             extra: dict[str, str] | None = None, product: str | None = None) -> dict[str, Any]:
    """A kwok Node with the GPU feature discovery labels of a catalog GPU type."""
    gpu = catalog.gpu_type(gpu_type)
    major, minor = gpu.compute_capability
    labels = {**label, constants.GFD_COMPUTE_MAJOR: str(major), constants.GFD_COMPUTE_MINOR: str(minor),
              **(extra or {})}
    return nodes.node(name, labels=labels, gpus=gpus, gpu_product=product or gpu.products[0],
                      gpu_memory_mib=gpu.usable_bytes // 2**20)


@dataclass
class Account:
    """The chart's operator ServiceAccount in namespaced mode, a kubeconfig holding its token, and the Role and
    RoleBinding the chart renders for each watched namespace (applied per tenant by `grant`)."""

    kube: Cluster
    namespace: str
    name: str
    kubeconfig: Path
    per_namespace: list[dict[str, Any]]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def grant(self, namespace: str) -> None:
        """What `helm install --set watch.namespaces={…,namespace}` would add: the Role and its binding there."""
        docs = copy.deepcopy(self.per_namespace)
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
        apply(self.kube, *docs)


def install_crds(kube: Cluster) -> None:
    for crd in (CRD_FILE, CLASS_CRD_FILE):
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    for name in (constants.CRD_NAME, constants.CLASS_CRD_NAME):
        kube.wait_established(name)
    # Established comes before the API server's storage for the new resource is ready: until then a list is a 429
    # ("storage is (re)initializing"), which kopf logs as an ERROR and retries.
    wait_for("the CRDs' storage", lambda: kube.kubectl("get", f"{constants.PLURAL},{constants.CLASS_PLURAL}",
                                                        "-A", check=False).returncode == 0, timeout=60)


PLACEHOLDER = "watched-namespace"


def chart_account(kube: Cluster, workdir: Path, values: dict[str, Any] | None = None) -> Account:
    """Apply the cluster-scoped RBAC objects the chart renders in namespaced mode for `values` (webhook and
    built-in classes off: no webhook runs here, and the built-in classes are cluster-scoped objects another
    module's release owns) and its ServiceAccount, with a token. The operator of a tenant watches only the
    tenant's namespace (a cluster-wide one would reconcile every other test's objects)."""
    release, system = unique("voctl"), unique("voctl-sys")
    docs = render(workdir, {"webhook": {"enabled": False}, "workloadClasses": {"builtins": False},
                            "watch": {"mode": "namespaced", "namespaces": [PLACEHOLDER]}, **(values or {})},
                  release=release, namespace=system)
    kube.kubectl("create", "namespace", system)
    rbac = [d for d in docs if d["kind"] in RBAC_KINDS]
    per_namespace = [d for d in rbac if d["metadata"].get("namespace") == PLACEHOLDER]
    apply(kube, *(d for d in rbac if d not in per_namespace))
    (account,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    return Account(kube, system, account, kube.token_kubeconfig(system, account, workdir / "operator.kubeconfig"),
                   per_namespace)


@pytest.fixture(scope="session")
def operator_account(kube: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Account:
    install_crds(kube)
    return chart_account(kube, tmp_path_factory.mktemp("controller-account"))


@dataclass
class Tenant:
    """One test's share of the cluster: its namespace, its nodes' label, the operator's account."""

    kube: Cluster
    namespace: str
    account: Account
    nodes: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    @property
    def label(self) -> dict[str, str]:
        return {NODE_LABEL: self.namespace}

    def add_nodes(self, *bodies: dict[str, Any]) -> None:
        apply(self.kube, *bodies)
        self.nodes += [b["metadata"]["name"] for b in bodies]

    def add_example_nodes(self) -> None:
        """One 8-GPU node per GPU type the examples name, and a CPU node, all with the tenant's label."""
        types = sorted({e["spec"]["accelerator"]["type"] for e in EXAMPLES.values()} - {"cpu", "auto"})
        self.add_nodes(*(gpu_node(f"{self.namespace}-{t}", t, self.label) for t in types),
                       nodes.node(f"{self.namespace}-cpu", labels=self.label, cpu="64"))

    def model_volume(self, claim: str) -> None:
        """A PersistentVolume and a claim bound to it: the real scheduler places no pod whose claim is unbound."""
        pv = f"{self.namespace}-{claim}"
        if pv in self.volumes:
            return
        apply(self.kube,
              {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv},
               "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadOnlyMany"], "storageClassName": "",
                        "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/models/{claim}"},
                        "claimRef": {"namespace": self.namespace, "name": claim}}},
              {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": claim, "namespace": self.namespace},
               "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": pv,
                        "resources": {"requests": {"storage": "1Gi"}}}})
        self.volumes.append(pv)

    def example(self, name: str) -> dict[str, Any]:
        """An example in the tenant's namespace, its pools pinned to the tenant's nodes (and its model's claim
        made, when it loads the model from one)."""
        obj = copy.deepcopy(EXAMPLES[name])
        obj["metadata"]["namespace"] = self.namespace
        claim = ((obj["spec"]["model"].get("source") or {}).get("pvc") or {}).get("claimName")
        if claim:
            self.model_volume(claim)
        spec = parse_resource(obj).spec
        for pool_name, pool in obj["spec"].setdefault("pools", {}).items():
            if pool is not None and getattr(spec.pools, pool_name) is not None:
                pool["nodeSelector"] = {**(pool.get("nodeSelector") or {}), **self.label}
        return obj


@pytest.fixture
def tenant(kube: Cluster, operator_account: Account) -> Iterator[Tenant]:
    ns = unique("ctl")
    kube.kubectl("create", "namespace", ns)
    operator_account.grant(ns)
    t = Tenant(kube, ns, operator_account)
    yield t
    if t.nodes:  # cluster-scoped: no other test's planner may see them
        kube.kubectl("delete", "node", *t.nodes, "--wait=false", check=False)
    if t.volumes:
        kube.kubectl("delete", "pv", *t.volumes, "--wait=false", check=False)
    kube.kubectl("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture
def examples_tenant(tenant: Tenant) -> Tenant:
    """A tenant with nodes for every example."""
    tenant.add_example_nodes()
    return tenant


@contextlib.asynccontextmanager
async def running_operator(tenant: Tenant, *, kubeconfig: Path | None = None, timeout: float = 30.0,
                           **config: Any) -> AsyncIterator[ClientKubeApi]:
    """The operator, as the chart's ServiceAccount and watching the tenant's namespace, until the block exits;
    yields an admin KubeApi of the test's own (its requests are the test's, not the operator's, in the audit log).
    `kubeconfig`: another way in for the operator (a fault-injecting proxy)."""
    async with inprocess.running_operator(kubeconfig or tenant.account.kubeconfig, tenant.kube.kubeconfig,
                                          timeout=timeout, namespaces=(tenant.namespace,), **config) as api:
        yield api
