"""One containerd image store per set of images, shared by every real node that runs them.

The engine-cpu image is a 2.7 GB archive that unpacks to 5.2 GB; each node has a containerd of its own
(testcluster.node), and importing the archive into each of them costs that disk and minutes per node, per stack. So
the archives are imported once, by a containerd of this module's own with nothing else running, into a containerd
root cached outside the clone (`${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/node-stores/<key>/root`, the key over
the images' names and OCI indexes, which name their manifests by digest, and containerd's binary), and each node
starts its containerd on a copy of that root made of hard links (`cp -al`): no byte of an image is copied, and every
node's containers read the same inodes, so the page cache holds one copy of torch for all of them (and pinning it,
tests/support/vllm_cpu, pins it for every node).

Why hard links are safe here: containerd never writes into an unpacked layer (overlayfs writes go to a container's own
upper directory, a new snapshot) nor into a content blob; the only files it changes in place are its bolt databases,
which each copy gets as files of its own. A cache on another filesystem than the node's directory falls back to a
full copy (`cp -a`), said in the node's log directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from testcluster import binaries, images

RECIPE = 1  # bump when the way a store is made changes
OWN_FILES = ("*.db",)
"""What each node's copy gets as files of its own: containerd's metadata and snapshotter bolt databases."""


class ImageStoreError(RuntimeError):
    """The store could not be made; the message names the step and containerd's or ctr's output."""


def _cache_root() -> Path:
    return Path(os.environ.get("VLLM_OPERATOR_CACHE", Path.home() / ".cache" / "vllm-operator")) / "node-stores"


def key(archives: Sequence[images.Archive]) -> str:
    digest = hashlib.sha256(f"recipe={RECIPE}".encode())
    for binary in (binaries.CONTAINERD, binaries.CTR):
        st = os.stat(binary)
        digest.update(f"{binary} {st.st_size} {st.st_mtime_ns}".encode())
    for archive in sorted(archives, key=lambda a: a.name):
        digest.update(f"{archive.name} ".encode() + _index(archive.path))
    return digest.hexdigest()[:16]


def _index(path: Path) -> bytes:
    """The archive's OCI index.json: it names the manifest by digest, so it is the same for the same image however
    often the archive is saved again (scripts/build-images.sh re-saves an image's archive when another clone's build
    of that image name replaced it), and differs for any other image. Found by reading the tar's headers only."""
    with tarfile.open(path) as tar:
        member = tar.getmember("index.json")
        index = tar.extractfile(member)
        if index is None:
            raise ImageStoreError(f"{path}: index.json is not a file: not an OCI archive")
        return index.read()


def store(archives: Sequence[images.Archive]) -> Path:
    """The containerd root holding `archives` (import them first if no cached store has them); concurrent callers
    for the same archives wait for one import."""
    root = _cache_root()
    root.mkdir(parents=True, exist_ok=True)
    name = key(archives)
    final = root / name
    if (final / ".complete").exists():
        (final / ".used").touch()  # kept from other callers' pruning for STALE_S
        return final / "root"
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            (final / ".used").touch()
            return final / "root"
        shutil.rmtree(final, ignore_errors=True)
        work = root / f".{name}.{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            _import(work, archives)
            os.replace(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        (final / "archives").write_text("".join(f"{a.name} {a.path}\n" for a in archives))
        (final / ".complete").touch()
    _prune(root, keep=name)
    return final / "root"


STALE_S = 3 * 3600
"""A store no caller asked for in this long is removed when another is imported. Each holds an engine image (~8 GB
unpacked); with a day's grace, a machine where clones at several commits ran the real-node tests filled its disk (four
stores, 31 GB). Nodes started from a removed store keep running: their roots are hard links of their own."""


def _prune(root: Path, keep: str, now: float | None = None) -> list[str]:
    """Remove stores of older archives that nobody is importing (their lock is free) and nobody asked for in STALE_S
    (`.used`, touched by `store`, else `.complete`). Returns the names removed."""
    now = time.time() if now is None else now
    removed = []
    for old in root.iterdir():
        if old.name.startswith(".") or old.name == keep or not (old / ".complete").exists():
            continue
        with (root / f".{old.name}.lock").open("w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            last = max((old / marker).stat().st_mtime for marker in (".complete", ".used") if (old / marker).exists())
            if now - last > STALE_S:
                shutil.rmtree(old, ignore_errors=True)
                removed.append(old.name)
    return removed


def _import(work: Path, archives: Sequence[images.Archive]) -> None:
    """Import `archives` into `work/root` with a containerd of its own (CRI off, in a private mount namespace, so
    the temporary mounts of unpacking never show on the host), then stop it."""
    socket = work / "c.sock"
    config = work / "containerd.toml"
    config.write_text(f"""version = 2
root = "{work / 'root'}"
state = "{work / 'state'}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[metrics]
  address = ""
""")
    log = (work / "containerd.log").open("wb")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation=private", binaries.CONTAINERD,
                             f"--config={config}"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    try:
        deadline = time.monotonic() + 30
        while subprocess.run([binaries.CTR, f"--address={socket}", "version"], capture_output=True,
                             check=False).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ImageStoreError(f"containerd for the image store did not start: "
                                      f"{(work / 'containerd.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        for archive in archives:
            done = subprocess.run([binaries.CTR, f"--address={socket}", "--namespace=k8s.io", "images", "import",
                                   str(archive.path)], capture_output=True, text=True, check=False, timeout=1800)
            if done.returncode != 0:
                raise ImageStoreError(f"ctr images import {archive.path} ({archive.name}) failed "
                                      f"(rc={done.returncode}): {done.stderr.strip()}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def copy(store_root: Path, target: Path) -> str:
    """Make `target` a containerd root with the store's images: hard links, each bolt database a file of its own.
    Returns how ("hard links" or "copy")."""
    if target.exists():
        raise ImageStoreError(f"{target} exists: a node's containerd root is made once, from the store")
    target.parent.mkdir(parents=True, exist_ok=True)
    same_fs = os.stat(store_root).st_dev == os.stat(target.parent).st_dev
    done = subprocess.run(["cp", "-a" + ("l" if same_fs else ""), str(store_root), str(target)],
                          capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise ImageStoreError(f"copying the image store {store_root} to {target} failed: {done.stderr.strip()}")
    if same_fs:
        for pattern in OWN_FILES:
            for db in target.rglob(pattern):
                own = db.with_name(f".{db.name}.own")
                shutil.copy2(db, own)
                os.replace(own, db)
    return "hard links" if same_fs else "copy"
