"""Container images for a real node, made here: no registry can be reached, so nothing is ever pulled.

Each image is built with buildah from files on this machine and saved as an OCI archive in the cache outside the
clone (`${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/node-images/<name>-<hash>.tar`, the hash over the image's inputs
and its recipe), which a node's containerd imports (`ctr images import`). Two images:

- the pause image every pod sandbox runs, `registry.k8s.io/pause:3.10` (containerd's `sandbox_image`), from the k8s
  module's own build/pause/linux/pause.c compiled statically (scripts/build-kubelet.sh);
- a minimal test image, `localhost/vllmop-busybox:test`: Debian's static busybox and its applets' links, nothing
  else, run as the unprivileged user 65532.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testcluster import binaries

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
BUSYBOX_IMAGE = "localhost/vllmop-busybox:test"
TEST_UID = 65532
RECIPE = 1  # bump when a recipe below changes


class ImageError(RuntimeError):
    """An image could not be built or saved; the message names the step and buildah's error."""


@dataclass(frozen=True)
class Archive:
    """An OCI archive on disk holding one image under `name`."""

    name: str
    path: Path


def _cache_root() -> Path:
    return Path(os.environ.get("VLLM_OPERATOR_CACHE", Path.home() / ".cache" / "vllm-operator")) / "node-images"


def _buildah(*args: str) -> str:
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"`buildah {' '.join(args)}` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def _build(name: str, rootfs: Path, config: list[str]) -> Archive:
    """Build `name` from scratch with the tree `rootfs` and buildah `config` options, saved to its cache archive; a
    no-op when that archive exists. Saved to a temporary file renamed into place, so a concurrent or interrupted
    build never leaves a half archive under the final name."""
    digest = hashlib.sha256(f"{name} {config} recipe={RECIPE}".encode())
    for path in sorted(rootfs.rglob("*")):
        digest.update(f"{path.relative_to(rootfs)} {path.lstat().st_mode:o}".encode())
        if path.is_symlink():
            digest.update(b"-> " + os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    stem = name.rsplit("/", 1)[-1].replace(":", "-")
    archive = _cache_root() / f"{stem}-{digest.hexdigest()[:16]}.tar"
    if archive.exists():
        return Archive(name, archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    container = _buildah("from", "--pull=never", "scratch")
    try:
        _buildah("copy", container, f"{rootfs}/", "/")
        _buildah("config", *config, container)
        image = _buildah("commit", "--quiet", "--rm", container, name)
        container = ""
    finally:
        if container:
            with contextlib.suppress(ImageError):
                _buildah("rm", container)
    tmp = archive.parent / f".{stem}.{os.getpid()}.{os.urandom(4).hex()}.tar"
    try:
        _buildah("push", "--quiet", image, f"oci-archive:{tmp}:{name}")
        os.replace(tmp, archive)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return Archive(name, archive)


def pause() -> Archive:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = root / "pause"
        target.write_bytes((binaries.kubelet_directory() / "pause").read_bytes())
        target.chmod(0o755)
        return _build(PAUSE_IMAGE, root, ["--entrypoint", '["/pause"]', "--user", "65535:65535"])


def busybox() -> Archive:
    """The minimal test image: /bin/busybox, a link in /bin for each of its applets, /tmp, user 65532."""
    source = Path("/bin/busybox")
    if not source.exists():
        raise ImageError("/bin/busybox is missing: scripts/install-test-deps.sh installs busybox-static")
    applets = subprocess.run([str(source), "--list"], capture_output=True, text=True, check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "tmp").mkdir()
        (root / "tmp").chmod(0o1777)  # mkdir's mode is masked by the umask
        (root / "bin" / "busybox").write_bytes(source.read_bytes())
        (root / "bin" / "busybox").chmod(0o755)
        for applet in applets:
            if applet != "busybox":
                (root / "bin" / applet).symlink_to("busybox")
        return _build(BUSYBOX_IMAGE, root, ["--cmd", '["/bin/sh"]', "--user", f"{TEST_UID}:{TEST_UID}",
                                            "--env", "PATH=/bin"])
