"""The weights cache's size limit: least-recently-used eviction of entries no engine uses (docs/weights-cache.md).

Run by the fetch init container before it fetches a model that is not cached, so the cache needs no daemon of its
own: the pod about to add an entry makes room for it. The limit is the plan's (`--max-bytes`: the chart's per-node
size, or ~95 % of the claim's); the file system's free space is honoured too (a node disk shared with other things).

"In use" is known on the node itself, without the API server:

* the engine wrapper of every engine pod holds a shared flock on its entry's `.complete` marker for its lifetime
  (`vllm-operator engine --hold-weights`); eviction takes the exclusive lock without waiting and skips the entry when
  it cannot (the kernel drops a dead process's locks, so a crashed engine never pins an entry);
* a fetch touches the entry's lease (`.leases/<entry>/<pod uid>`) under the entry's lock when it links a pod to it,
  and the engine wrapper renews that lease when it starts and every `LEASE_RENEW_S` while it runs
  (`--weights-leases`, the cache's `.leases` mounted read-write into the engine); an entry leased within
  `WEIGHTS_LEASE_GRACE_S` is in use too. That covers the minutes between the init container's end and the engine's
  start, and an engine the kubelet keeps restarting however long: a crash loop's back-off is at most 5 minutes, and
  every restart renews the lease, so the entry of a pod that still exists is not evicted under it (the fetch
  container, which alone could fetch it again, runs only when the pod is created);
* an entry whose fetch lock is held (being fetched, leased or evicted by another pod) is skipped.

Last use is the newest lease's mtime (else the marker's). Eviction renames the entry into `.trash` under its lock
(a reader sees the whole entry or none) and then deletes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_operator import constants

log = logging.getLogger("vllm_operator.fetch")

COMPLETE_MARKER = ".complete"
LOCKS = ".locks"
LEASES = constants.WEIGHTS_LEASES_DIR
STAGING = ".staging"
TRASH = ".trash"
LEASE_RENEW_S = 60.0
"""How often a running engine renews its pod's lease: well within `WEIGHTS_LEASE_GRACE_S`."""


@dataclass(frozen=True)
class Entry:
    """One complete model in the cache."""

    key: str
    """`<org>--<name>--<commit>`: the lock's and the lease directory's name."""
    path: Path
    size: int
    last_used: float
    in_use: str | None = None
    """Why it may not be evicted (None: it may)."""


def entry_key(path: Path) -> str:
    return f"{path.parent.name}--{path.name}"


def lease_dir(root: Path, key: str) -> Path:
    return root / LEASES / key


def lock_path(root: Path, key: str) -> Path:
    return root / LOCKS / f"{key}.lock"


def tree_bytes(top: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _entry_size(path: Path) -> int:
    with contextlib.suppress(OSError, ValueError):
        marker = json.loads((path / COMPLETE_MARKER).read_text())
        if isinstance(marker.get("bytes"), int) and marker["bytes"] > 0:
            return int(marker["bytes"])
    return tree_bytes(path)


def last_used(root: Path, path: Path) -> float:
    """The newest lease's mtime, else the marker's."""
    times = []
    with contextlib.suppress(OSError):
        times = [p.stat().st_mtime for p in lease_dir(root, entry_key(path)).iterdir()]
    if times:
        return max(times)
    try:
        return (path / COMPLETE_MARKER).stat().st_mtime
    except OSError:
        return 0.0


def engine_holds(path: Path) -> bool:
    """Whether an engine wrapper holds its shared lock on the entry's marker."""
    try:
        fd = os.open(path / COMPLETE_MARKER, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock taken just now
    return False


def scan(root: Path, now: float, grace_s: float = constants.WEIGHTS_LEASE_GRACE_S) -> list[Entry]:
    """Every complete entry under `root` with its size, last use and whether it is in use (module docstring)."""
    out = []
    for repo_dir in sorted(root.iterdir()) if root.is_dir() else []:
        if repo_dir.name.startswith(".") or not repo_dir.is_dir():
            continue
        for path in sorted(repo_dir.iterdir()):
            if not (path / COMPLETE_MARKER).is_file():
                continue
            used = last_used(root, path)
            why = ("an engine holds it" if engine_holds(path) else
                   f"leased {now - used:.0f} s ago (within {grace_s:.0f} s)"
                   if now - used < grace_s and (lease_dir(root, entry_key(path))).is_dir() else None)
            out.append(Entry(key=entry_key(path), path=path, size=_entry_size(path), last_used=used, in_use=why))
    return out


def choose(entries: Sequence[Entry], used: int, need: int, limit: int, free: int | None = None) -> list[Entry]:
    """The entries to evict, least recently used first, skipping those in use, until `used - evicted + need` is
    within `limit` and (given `free`) `free + evicted` covers `need`. Pure: the policy the tests pin. Returns what
    it can even when that is not enough (the caller then reports the cache full)."""
    chosen: list[Entry] = []
    freed = 0
    for e in sorted((e for e in entries if e.in_use is None), key=lambda e: (e.last_used, e.key)):
        if used - freed + need <= limit and (free is None or free + freed >= need):
            break
        chosen.append(e)
        freed += e.size
    return chosen


def fits(used: int, need: int, limit: int, free: int | None = None) -> bool:
    return used + need <= limit and (free is None or free >= need)


@contextlib.contextmanager
def try_locked(root: Path, key: str) -> Iterator[bool]:
    """The entry's fetch lock without waiting: yields whether it was taken."""
    path = lock_path(root, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def evict(root: Path, entry: Entry, now: float, grace_s: float) -> bool:
    """Remove one entry when it is still not in use (checked again under its lock); whether it was removed."""
    with try_locked(root, entry.key) as taken:
        if not taken:
            return False
        fresh = next((e for e in scan_one(root, entry.path, now, grace_s)), None)
        if fresh is None or fresh.in_use is not None:
            return False
        trash = root / TRASH / f"{entry.key}.{os.getpid()}"
        try:
            trash.parent.mkdir(parents=True, exist_ok=True)
            os.rename(entry.path, trash)
        except OSError as err:  # e.g. an entry another uid's image wrote into a directory this one cannot change
            log.warning("could not evict %s from the weights cache: %s", entry.key, err)
            return False
        shutil.rmtree(lease_dir(root, entry.key), ignore_errors=True)
    shutil.rmtree(trash, ignore_errors=True)
    with contextlib.suppress(OSError):
        entry.path.parent.rmdir()  # the repository's directory, when this was its last commit
    return True


def scan_one(root: Path, path: Path, now: float, grace_s: float) -> list[Entry]:
    return [e for e in scan(root, now, grace_s) if e.path == path]


def cache_bytes(root: Path) -> int:
    """What the cache holds: complete entries and every staging directory (fetches in progress or interrupted)."""
    total = sum(e.size for e in scan(root, time.time(), 0))
    return total + tree_bytes(root / STAGING)


def make_room(root: Path, need: int, limit: int, *, keep: Path | None = None,
              grace_s: float = constants.WEIGHTS_LEASE_GRACE_S,
              now: float | None = None) -> tuple[list[Entry], str | None]:
    """Evict until `need` more bytes fit (module docstring); (evicted, None) or (evicted, why it still does not fit).
    `keep`: the entry being fetched (never a candidate)."""
    when = time.time() if now is None else now
    entries = [e for e in scan(root, when, grace_s) if e.path != keep]
    used = sum(e.size for e in entries) + tree_bytes(root / STAGING)
    free = shutil.disk_usage(root).free
    if fits(used, need, limit, free):
        return [], None
    evicted = []
    for e in choose(entries, used, need, limit, free):
        if evict(root, e, when, grace_s):
            log.info("evicted %s (%d bytes, last used %.0f s ago) from the weights cache to fit %d bytes",
                     e.key, e.size, when - e.last_used, need)
            evicted.append(e)
            used -= e.size
    free = shutil.disk_usage(root).free
    if fits(used, need, limit, free):
        return evicted, None
    busy = [e for e in scan(root, when, grace_s) if e.in_use is not None and e.path != keep]
    why = (f"needs {need} bytes; the cache holds {used} of its {limit}-byte limit and its file system has {free} "
           f"bytes free; in use and not evictable: "
           + (", ".join(f"{e.key} ({e.size} bytes, {e.in_use})" for e in busy) or "nothing"))
    return evicted, why


def hold(path: Path) -> int:
    """Take the shared lock an engine keeps on its entry's marker for its lifetime (the fd stays open, never
    inherited by children); OSError when the marker is missing (the entry is not complete)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def pod_lease(leases: Path, marker: Path, pod_uid: str) -> Path:
    """This pod's lease of the entry `marker` belongs to: `<leases>/<entry key>/<pod uid>`. The marker is read
    through the pod's link, so the key is that of the entry the fetch linked."""
    return leases / entry_key(marker.resolve().parent) / pod_uid


def renew(lease: Path) -> None:
    """Touch the lease (its mtime is the entry's last use); OSError when the lease directory cannot be written."""
    lease.parent.mkdir(parents=True, exist_ok=True)
    lease.touch()


def keep_renewing(lease: Path, stop: threading.Event, every_s: float = LEASE_RENEW_S) -> threading.Thread:
    """Renew `lease` now, then every `every_s` until `stop` is set, on a daemon thread (it ends with the process).
    A failed renewal is logged and tried again: the engine's shared lock still protects the entry while it runs."""
    first = threading.Event()

    def loop() -> None:
        failing = False
        while True:
            try:
                renew(lease)
                failing = False
            except OSError as err:
                if not failing:
                    log.warning("could not renew the weights cache lease %s (%s); the engine's lock still holds "
                                "the entry while it runs", lease, err)
                failing = True
            first.set()
            if stop.wait(every_s):
                return

    thread = threading.Thread(target=loop, name="weights-lease", daemon=True)
    thread.start()
    first.wait()  # renewed (or tried) before the engine starts
    return thread
