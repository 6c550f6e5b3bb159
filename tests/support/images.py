"""The images `make images` built (scripts/build-images.sh), and running them with podman as a kubelet would.

Where they are: the build script prints its container store and, per image, the reference (tagged as the operator's
defaults resolve it), the image id and the OCI archive (`scripts/build-images.sh --print`); a test that needs an image
that is not built fails saying to run `make images` (`make test` builds them first).

How they run: `podman run` with runc (crun 1.8 refuses these machines' hybrid cgroup v1), ulimits within the
machines' hard limits, and never podman's default NAT network: `--network none`, or `--network ns:PATH` into a
network namespace the test made, which has no route out (testcluster.netns). `pod_security_flags` turns the
securityContext that the chart or the operator renders for a pod into the podman flags that enforce the same thing,
so each image is started exactly as restricted as its pod would be.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

import pytest

from testcluster import netns
from tests.support.paths import EXAMPLES, ROOT
from vllm_operator.rendering import cli

BUILD_SCRIPT = ROOT / "scripts" / "build-images.sh"
ULIMITS = ("--ulimit=nofile=20000:20000", "--ulimit=nproc=4096:4096")


@dataclass(frozen=True)
class BuiltImage:
    name: str
    ref: str
    image_id: str
    archive: Path


@dataclass(frozen=True)
class Store:
    root: str
    runroot: str
    images: dict[str, BuiltImage]
    missing: str

    def podman(self) -> list[str]:
        return ["podman", "--root", self.root, "--runroot", self.runroot, "--storage-driver", "overlay",
                "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]


@cache
def store() -> Store:
    """What scripts/build-images.sh --print reports: the store, and the images built for this tree's contents."""
    proc = subprocess.run([str(BUILD_SCRIPT), "--print"], capture_output=True, text=True, check=False, timeout=60)
    lines = [line.split() for line in proc.stdout.splitlines()]
    if not lines or lines[0][0] != "store":
        pytest.fail(f"scripts/build-images.sh --print failed (rc={proc.returncode}): {proc.stderr.strip()}")
    (_, root, runroot), *rest = lines
    images = {name: BuiltImage(name, ref, image_id, Path(archive)) for name, ref, image_id, archive in rest}
    return Store(root, runroot, images, proc.stderr.strip())


def image(name: str) -> BuiltImage:
    """A built image; fails the test (never skips) when it is not built for this tree: `make test` builds them."""
    built = store().images.get(name)
    if built is None:
        pytest.fail(f"image {name} is not built for this tree (run `make images`): {store().missing}")
    return built


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*store().podman(), *args], capture_output=True, text=True, check=False, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc


@pytest.fixture
def pod_netns() -> Iterator[netns.Netns]:
    """A network namespace of the test's own with no route out, for a container as a pod (`network=ns:<path>`)."""
    ns = netns.create()
    try:
        yield ns
    finally:
        ns.teardown()


def evict_page_cache(name: str, path: str) -> None:
    """Drop `path` of a built image's files from the page cache (`vmtouch -e`: POSIX_FADV_DONTNEED per file), so a
    container of it starts as on a node that never ran the image: it reads torch and vLLM itself and is charged
    their pages (on cgroup v1 a page is charged to the cgroup that first reads it). vLLM's CPU worker counted those
    pages as memory taken and refused the planned KV cache of cpu-dev's 4 GiB pod ("Available memory on node 0
    (0.88/4.0 GiB) on kv cache allocation is less than requested"); the engine wrapper shows it
    the usage without the page cache no process maps instead
    (vllm_operator/engine/vllm_site/_vllm_operator_working_set.py). Pages mapped by a running process elsewhere stay
    cached."""
    mount = podman("image", "mount", image(name).image_id).stdout.strip()
    try:
        subprocess.run(["vmtouch", "-q", "-e", f"{mount}{path}"], check=True, timeout=600)
    finally:
        podman("image", "unmount", image(name).image_id, check=False)


def image_config(name: str) -> dict[str, Any]:
    """The OCI image config (User, Entrypoint, Cmd, Env, ...) of a built image."""
    out = podman("image", "inspect", image(name).image_id).stdout
    config: dict[str, Any] = json.loads(out)[0]["Config"]
    return config


def rendered_pod(example: str, container_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the Deployment whose container is `container_name`, as the operator renders it."""
    objects, _ = cli.render_documents(cli.load_documents(str(EXAMPLES / f"{example}.yaml")))
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        pod: dict[str, Any] = obj["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if container["name"] == container_name:
                return pod, container
    raise AssertionError(f"{example}: no Deployment with a {container_name!r} container")


def pod_security_flags(pod_spec: Mapping[str, Any], container: Mapping[str, Any], image_user: str,
                       volumes: Mapping[str, Path] | None = None) -> list[str]:
    """podman flags enforcing what a kubelet would for this container of this pod spec.

    runAsUser/runAsGroup (container over pod) -> --user; runAsNonRoot -> the uid that runs must not be 0 (checked
    here, as the kubelet checks it before starting); readOnlyRootFilesystem -> --read-only; allowPrivilegeEscalation
    false -> no-new-privileges; capabilities.drop ALL -> --cap-drop=all; memory/cpu limits -> --memory/--cpus;
    emptyDir volumes -> tmpfs at their mount paths; other volumes must be given as host directories in `volumes`
    (by volume name) and are bind-mounted read-only where the spec says readOnly. Anything else in a securityContext
    this does not know fails the test, so a new field the renderer adds cannot go unenforced.
    """
    known_pod = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}
    known_container = {"runAsNonRoot", "runAsUser", "runAsGroup", "readOnlyRootFilesystem",
                       "allowPrivilegeEscalation", "capabilities", "seccompProfile"}
    pod_sc = dict(pod_spec.get("securityContext") or {})
    sc = dict(container.get("securityContext") or {})
    assert set(pod_sc) <= known_pod, f"pod securityContext fields not enforced here: {set(pod_sc) - known_pod}"
    assert set(sc) <= known_container, f"container securityContext not enforced here: {set(sc) - known_container}"
    merged = {**pod_sc, **sc}
    image_uid, _, image_gid = image_user.partition(":")
    uid = str(merged.get("runAsUser", image_uid))
    gid = str(merged.get("runAsGroup", image_gid or uid))
    if merged.get("runAsNonRoot"):
        assert uid.isdigit() and uid != "0", f"runAsNonRoot, but the container would run as {uid!r}"
    flags = [f"--user={uid}:{gid}"]
    if "fsGroup" in pod_sc:
        flags.append(f"--group-add={pod_sc['fsGroup']}")
    for profile in (pod_sc.get("seccompProfile"), sc.get("seccompProfile")):
        assert profile in (None, {"type": "RuntimeDefault"}), profile  # podman's default profile is the runtime's
    if sc.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    caps = sc.get("capabilities") or {}
    assert set(caps) <= {"drop"} and caps.get("drop", ["ALL"]) == ["ALL"], f"capabilities not enforced here: {caps}"
    if caps:
        flags.append("--cap-drop=all")
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        flags.append(f"--memory={_bytes(str(limits['memory']))}")
    if "cpu" in limits:
        flags.append(f"--cpus={_cpus(str(limits['cpu']))}")
    by_name = {v["name"]: v for v in pod_spec.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        volume = by_name[mount["name"]]
        if "emptyDir" in volume and mount["mountPath"] == "/dev/shm":
            size = volume["emptyDir"].get("sizeLimit")  # podman mounts a tmpfs there already: size it
            flags.append(f"--shm-size={_bytes(size) if size else 64 << 20}")
            continue
        if "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit")
            flags.append(f"--tmpfs={mount['mountPath']}:rw,mode=1777" + (f",size={_bytes(size)}" if size else ""))
            continue
        host = (volumes or {}).get(mount["name"])
        assert host is not None, f"volume {mount['name']} ({sorted(volume)}) needs a host directory in this test"
        flags.append(f"--volume={host}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}")
    return flags


def _bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 1000, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def _cpus(quantity: str) -> str:
    return str(int(quantity[:-1]) / 1000) if quantity.endswith("m") else quantity


@dataclass
class Container:
    name: str
    log_path: Path

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def running(self) -> bool:
        proc = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False)
        return proc.stdout.strip() == "true"

    def exit_code(self) -> int | None:
        proc = podman("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", self.name, check=False)
        running, _, code = proc.stdout.strip().partition(" ")
        return None if running != "false" else int(code)


@contextlib.contextmanager
def running(name: str, flags: Sequence[str], argv: Sequence[str], log_path: Path, *,
            network: str = "none", entrypoint: Sequence[str] | None = None) -> Iterator[Container]:
    """`podman run -d` of a built image; removed (with its logs copied to `log_path`) when the block exits.

    `network`: "none" or "ns:/run/netns/<pin>" (`Netns.path` of testcluster.netns: a namespace with no route out,
    entered by its claimant's pin, never by the slot's name); anything else is refused.
    `entrypoint`: the pod's `command` (replaces the image's ENTRYPOINT, as Kubernetes does); `argv` its args.
    """
    assert network == "none" or network.startswith("ns:/run/netns/"), f"refusing network {network!r}"
    container = f"vllmop-test-{name}-{time.monotonic_ns()}"
    cmd = ["run", "-d", "--name", container, f"--network={network}", *ULIMITS, *flags]
    if entrypoint is not None:
        cmd.append(f"--entrypoint={json.dumps(list(entrypoint))}")
    podman(*cmd, image(name).image_id, *argv)
    handle = Container(container, log_path)
    try:
        yield handle
    finally:
        log_path.write_text(podman("logs", container, check=False).stdout
                            + podman("logs", container, check=False).stderr)
        podman("rm", "-f", "-t", "5", container, check=False, timeout=60)


def archive_layers(archive: Path) -> Iterator[tuple[str, tarfile.TarFile]]:
    """(layer digest, open tar) for each layer of the image in an OCI archive, in order."""
    with tarfile.open(archive) as outer:
        def blob(digest: str) -> IO[bytes]:
            member = outer.extractfile(f"blobs/{digest.replace(':', '/')}")
            assert member is not None, digest
            return member

        index = json.load(blob_index(outer))
        (desc,) = index["manifests"]
        manifest = json.load(blob(desc["digest"]))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r:*") as tar:
                yield layer["digest"], tar


def blob_index(outer: tarfile.TarFile) -> IO[bytes]:
    member = outer.extractfile("index.json")
    assert member is not None
    return member
