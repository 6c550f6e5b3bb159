"""`vllm-operator fetch`: the engine pods' init container — put a Hub model into the shared weights cache once.

Why: without it every engine pod downloads its weights into its own emptyDir, so the short and the long pool fetch
the same model twice and every pod replacement (a step-down, a stall, a drain, a wake from zero) fetches it again. The
cache is one directory shared by the engine pods of a node (a hostPath) or of a VLLMDeployment (a PVC); the engine
container mounts it read-only and loads the model from the directory this command links to.

Layout under the cache root (`--cache-root`):

    <org>--<name>/<commit>/            a complete model: every file of the commit, verified, and `.complete` (JSON:
                                       repo, commit, files, bytes, when) written last — the only entries ever served
    .staging/<org>--<name>/<commit>/   a fetch in progress; huggingface_hub keeps `.incomplete` files there with their
                                       ETag, so an interrupted fetch resumes with a Range request where it stopped
    .locks/<org>--<name>--<commit>.lock   flock'ed by the pod that fetches; a second pod on the node waits on it, then
                                       finds the entry complete and fetches nothing
    .leases/<org>--<name>--<commit>/<pod-uid>   which pods last used an entry (the last-use time is its mtime)
    .trash/                            entries being deleted by eviction (renamed there first)

The key is the commit the revision resolves to, never the branch name: a branch that moves gets a new entry.

Steps, every start:
1. Resolve the revision with the pod's own token (`HF_TOKEN`) — one metadata call (`model_info`). This is also the
   tenancy check: a gated or private model cached by a pod of another namespace is used only when this pod's token
   may read it too, so the cache never hands weights to a pod that could not fetch them itself.
2. Complete entry present: under its lock, lease it, link it and exit (nothing fetched).
3. Otherwise, under the lock: make room under `--max-bytes` by evicting least-recently-used entries no engine uses
   (`eviction.py`; CacheDiskFull when what is in use leaves no room), fetch every file into the staging directory
   (resumable, `hub_downloader`), verify each file's size and, for LFS files, its SHA-256 against the Hub's metadata,
   write `.complete`, rename the staging directory into place (one rename on one file system: a reader sees the
   whole entry or none), lease it. A corrupt staging file is deleted and fetched again once; then the fetch fails.
4. Link `--link` (in the pod's own emptyDir) to the entry: the engine's model argument.

Progress goes to a JSON file next to the link (`--progress-file`: files and bytes done of total, rate, ETA), to the log,
and to the pod's status port (`--status-port`, the engine wrapper's port, free while init containers run) as the
wrapper's start-up metrics in phase Downloading (bytes and files done and total, the ETA at the average rate since
this fetch began), which the PodMonitor scrapes and the health loop turns into the pool's `startupPhase`,
`startupProgress` and `startupDownload` as for a download the engine makes itself; failures exit with a
distinct code and one JSON line in the termination message, as the engine wrapper's do (`constants.py`: HubUnreachable,
ModelAccessDenied, CacheDiskFull, FetchFailed), so the health loop can say why. A fetch whose bytes stop moving for
`--stall-seconds` is stopped with StartupStalled (phase downloading).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_operator import constants
from vllm_operator.engine import eviction, phases, status
from vllm_operator.engine.eviction import COMPLETE_MARKER, LEASES, LOCKS, STAGING

log = logging.getLogger("vllm_operator.fetch")

__all__ = ["COMPLETE_MARKER", "LEASES", "LOCKS", "STAGING", "fetch", "main"]
HASH_CHUNK = 8 << 20
WRITE_CHUNK = 1 << 20
PART_SUFFIX = ".part"
READ_TIMEOUT_S = 60.0
"""No byte for this long fails one request; the stall limit (minutes) is what stops a fetch."""
PROGRESS_INTERVAL_S = 2.0


class Interrupted(BaseException):
    """SIGTERM: the pod is being deleted, or the stall watcher stopped the fetch."""


def _raise_interrupted(_signum: int, _frame: object) -> None:
    raise Interrupted


class FetchError(Exception):
    """A fetch that cannot succeed as things stand; `reason` is one of the termination reasons."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class RemoteFile:
    """One file of a commit, as the Hub lists it."""

    name: str
    size: int | None
    sha256: str | None
    """The LFS object's SHA-256 (None for a small file kept in git)."""


@dataclass(frozen=True)
class Resolved:
    repo: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)


def repo_key(repo: str) -> str:
    """`org/name` -> `org--name` (the Hub's own cache spelling; `/` cannot be in a directory name)."""
    return repo.replace("/", "--")


def entry_dir(root: Path, repo: str, commit: str) -> Path:
    return root / repo_key(repo) / commit


def is_complete(entry: Path) -> bool:
    return (entry / COMPLETE_MARKER).is_file()


# --- the Hub -------------------------------------------------------------------------------------------------------


def _classify_hub_error(err: Exception, repo: str, revision: str | None, token: bool) -> FetchError:
    """The termination reason of a failed Hub call: no answer at all, or an answer that refuses this token."""
    from huggingface_hub import errors as hf_errors

    where = f"{repo}@{revision or 'main'}"
    if isinstance(err, hf_errors.GatedRepoError):
        hint = "the token's account has not been granted access" if token else "no token given (source.huggingFace." \
                                                                                 "tokenSecretRef)"
        return FetchError(constants.REASON_MODEL_ACCESS_DENIED, f"{where} is gated: {hint}")
    if isinstance(err, hf_errors.RevisionNotFoundError):
        return FetchError(constants.REASON_MODEL_ACCESS_DENIED, f"revision {revision!r} of {repo} does not exist")
    if isinstance(err, hf_errors.RepositoryNotFoundError):
        hint = "or the token may not read it" if token else "or it is private/gated and no token was given " \
                                                            "(source.huggingFace.tokenSecretRef)"
        return FetchError(constants.REASON_MODEL_ACCESS_DENIED, f"{where}: repository not found, {hint}")
    if isinstance(err, hf_errors.HfHubHTTPError):
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status in (401, 403):
            return FetchError(constants.REASON_MODEL_ACCESS_DENIED, f"{where}: the Hub refused the token (HTTP "
                                                                     f"{status})")
        if status is not None and status >= 500:
            return FetchError(constants.REASON_HUB_UNREACHABLE, f"{where}: the Hub answered HTTP {status}")
        return FetchError(constants.REASON_FETCH_FAILED, f"{where}: {str(err).splitlines()[0][:300]}")
    if isinstance(err, OSError | TimeoutError) or type(err).__module__.startswith(("httpx", "httpcore")):
        return FetchError(constants.REASON_HUB_UNREACHABLE, f"{where}: the Hub did not answer ({type(err).__name__}: "
                                                             f"{str(err)[:200]})")
    return FetchError(constants.REASON_FETCH_FAILED, f"{where}: {type(err).__name__}: {str(err)[:300]}")


def resolve(repo: str, revision: str | None, token: str | None) -> Resolved:
    """The commit `revision` names and its files with sizes and LFS hashes — with this pod's token (module docstring,
    step 1)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(token=token or False).model_info(repo, revision=revision, files_metadata=True)
    except Exception as err:  # huggingface_hub raises its own hierarchy plus the HTTP client's
        raise _classify_hub_error(err, repo, revision, token is not None) from err
    if not info.sha:
        raise FetchError(constants.REASON_FETCH_FAILED, f"the Hub named no commit for {repo}@{revision or 'main'}")
    files = tuple(RemoteFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs is not None else None)
                  for s in (info.siblings or []))
    return Resolved(repo=repo, commit=info.sha, files=files)


# --- progress ------------------------------------------------------------------------------------------------------


def eta_seconds(bytes_done: int, bytes_total: int, bytes_per_s: float) -> float | None:
    """Seconds left at `bytes_per_s`: None until bytes have moved (no rate, no estimate), 0 when done."""
    if bytes_total <= 0 or bytes_done >= bytes_total:
        return 0.0 if bytes_total > 0 else None
    if bytes_per_s <= 0:
        return None
    return (bytes_total - bytes_done) / bytes_per_s


@dataclass
class Progress:
    """Counts from the fetch itself: files and bytes done of total, the rate and the ETA (written to `path`, and
    served as the start-up metrics the pool's `startupProgress` and `startupDownload` come from)."""

    total_files: int
    total_bytes: int
    path: Path | None = None
    now: Callable[[], float] = time.monotonic
    start_bytes: int = 0
    """Bytes already staged when this fetch began (an interrupted fetch resumed): on disk, but not this fetch's
    rate."""
    files_done: int = 0
    bytes_done: int = 0
    """Bytes of finished files plus those on disk of the file in flight."""
    fetched_bytes: int = 0
    """Bytes this process received (resumed bytes excluded)."""
    started: float = field(default=0.0)
    last_moved: float = field(default=0.0)
    _last_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.started = self.last_moved = self.now()
        self.bytes_done = self._last_bytes = self.start_bytes

    def update(self, bytes_done: int) -> None:
        with self._lock:
            if bytes_done != self._last_bytes:
                self.last_moved = self.now()
                self._last_bytes = bytes_done
            self.bytes_done = bytes_done

    def view(self) -> dict[str, Any]:
        with self._lock:
            elapsed = max(self.now() - self.started, 1e-6)
            moved = max(self.bytes_done - self.start_bytes, 0)
            rate = moved / elapsed
            eta = eta_seconds(self.bytes_done, self.total_bytes, rate)
            return {"filesDone": self.files_done, "filesTotal": self.total_files, "bytesDone": self.bytes_done,
                    "bytesTotal": self.total_bytes, "bytesFetched": self.fetched_bytes,
                    "bytesPerSecond": round(rate, 1), "etaSeconds": round(eta, 1) if eta is not None else None,
                    "secondsSinceProgress": round(self.now() - self.last_moved, 1)}

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.view(), sort_keys=True))
            os.replace(tmp, self.path)


def _bytes_on_disk(staging: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(staging):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


# --- the fetch -----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def locked(root: Path, repo: str, commit: str) -> Iterator[None]:
    """An exclusive flock per (repo, commit) on the cache's file system; released when the process dies, so a
    killed fetch never leaves the entry locked."""
    locks = root / LOCKS
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{repo_key(repo)}--{commit}.lock", "a+b") as fh:
        if not _try_lock(fh.fileno()):
            log.info("waited for another pod's fetch of %s@%s on this cache", repo, commit)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, remote: RemoteFile) -> str | None:
    """Why a fetched file is not the Hub's (None: it is)."""
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        return f"{remote.name}: {size} bytes on disk, the Hub lists {remote.size}"
    if remote.sha256 is not None and sha256_of(path) != remote.sha256:
        return f"{remote.name}: SHA-256 differs from the Hub's"
    return None


Downloader = Callable[[str, str, str, Path, str | None], None]
"""(repo, filename, commit, local_dir, token): puts the file at local_dir/filename, resuming a partial one."""


def hub_downloader(repo: str, filename: str, commit: str, local_dir: Path, token: str | None) -> None:
    """One file from `resolve/<commit>/<file>` into `<file>.part`, continued with a Range request from the bytes a
    killed fetch left there, then renamed into place. Our own loop because huggingface_hub (2.x) writes each
    download to a process-unique temporary file and so never resumes what another process began; its session,
    headers (token, user agent) and error mapping are used as they are."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers
    from huggingface_hub.utils._http import get_session, hf_raise_for_status

    target = local_dir / filename
    part = target.with_name(target.name + PART_SUFFIX)
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    headers = build_hf_headers(token=token or False)
    headers["Accept-Encoding"] = "identity"
    if have:
        headers["Range"] = f"bytes={have}-"
    url = hf_hub_url(repo, filename, revision=commit)
    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=READ_TIMEOUT_S) as resp:
        if resp.status_code == 416 and have:  # the part is whole already (killed between the last byte and rename)
            os.replace(part, target)
            return
        if resp.status_code >= 400:
            resp.read()
            hf_raise_for_status(resp)
        if have and resp.status_code == 206:
            log.info("resumed %s of %s@%s at byte %d", filename, repo, commit, have)
        with open(part, "ab" if have and resp.status_code == 206 else "wb") as fh:
            for chunk in resp.iter_bytes(WRITE_CHUNK):
                fh.write(chunk)
    os.replace(part, target)


def _fetch_into(staging: Path, resolved: Resolved, token: str | None, download: Downloader,
                progress: Progress) -> None:
    done_bytes = 0
    for remote in resolved.files:
        target = staging / remote.name
        for attempt in (1, 2):
            before = _bytes_on_disk(staging)
            if not target.is_file():
                try:
                    download(resolved.repo, remote.name, resolved.commit, staging, token)
                except Exception as err:
                    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
                        raise
                    raise _classify_hub_error(err, resolved.repo, resolved.commit, token is not None) from err
            progress.fetched_bytes += max(_bytes_on_disk(staging) - before, 0)
            problem = verify(target, remote)
            if problem is None:
                break
            target.unlink()
            log.warning("deleted %s from the staging of %s@%s (%s); fetching it again", remote.name,
                        resolved.repo, resolved.commit, problem)
            if attempt == 2:
                raise FetchError(constants.REASON_FETCH_FAILED, f"{resolved.repo}@{resolved.commit}: {problem} "
                                                                 "after a second fetch")
        done_bytes += remote.size or target.stat().st_size
        progress.files_done += 1
        progress.update(done_bytes)
        progress.write()


def fetch(root: Path, resolved: Resolved, token: str | None, *, download: Downloader = hub_downloader,
          progress: Progress | None = None, pod_uid: str | None = None,
          max_bytes: int | None = None) -> tuple[Path, int]:
    """The complete entry of `resolved` under `root` and the bytes this call fetched (0 when it was there); the
    entry is leased to `pod_uid` under its lock, so eviction cannot take it between this and the engine's start."""
    entry = entry_dir(root, resolved.repo, resolved.commit)
    progress = progress or Progress(len(resolved.files), resolved.total_bytes)
    with locked(root, resolved.repo, resolved.commit):
        if is_complete(entry):  # cached, or another pod fetched it while this one waited
            lease(root, resolved, pod_uid)
            return entry, 0
        staging = root / STAGING / repo_key(resolved.repo) / resolved.commit
        resumed = _bytes_on_disk(staging)
        if max_bytes is not None:
            need = max(resolved.total_bytes - resumed, 0)
            _evicted, why = eviction.make_room(root, need, max_bytes, keep=entry)
            if why is not None:
                raise FetchError(constants.REASON_CACHE_DISK_FULL, f"{resolved.repo}@{resolved.commit} {why}")
        staging.mkdir(parents=True, exist_ok=True)
        if resumed:
            log.info("resumed the fetch of %s@%s with %d bytes already staged", resolved.repo, resolved.commit,
                     resumed)
        try:
            _fetch_into(staging, resolved, token, download, progress)
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
            shutil.rmtree(staging, ignore_errors=True)  # useless while the disk is full; frees what it held
            raise FetchError(constants.REASON_CACHE_DISK_FULL,
                             f"{resolved.repo}@{resolved.commit} needs {resolved.total_bytes} bytes; the cache's file "
                             f"system ran out of space (free {shutil.disk_usage(root).free} bytes); the partial "
                             "fetch was removed") from err
        marker = {"repo": resolved.repo, "commit": resolved.commit, "files": len(resolved.files),
                  "bytes": resolved.total_bytes, "fetchedAt": time.time()}
        (staging / COMPLETE_MARKER).write_text(json.dumps(marker, sort_keys=True))
        _fsync_tree(staging)
        entry.parent.mkdir(parents=True, exist_ok=True)
        if entry.exists():  # an incomplete leftover of an older layout: never served, replaced
            shutil.rmtree(entry)
        os.rename(staging, entry)
        _fsync_dir(entry.parent)
        lease(root, resolved, pod_uid)
        return entry, progress.fetched_bytes


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(top: Path) -> None:
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def lease(root: Path, resolved: Resolved, pod_uid: str | None) -> None:
    """Record that this pod uses the entry (its mtime is the entry's last use: least-recently-used eviction)."""
    if not pod_uid:
        return
    eviction.renew(eviction.lease_dir(root, f"{repo_key(resolved.repo)}--{resolved.commit}") / pod_uid)


def link(link_path: Path, entry: Path) -> None:
    """Point `link_path` at the entry, replacing an older link of a restarted init container."""
    link_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = link_path.with_name(link_path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(entry, tmp)
    os.replace(tmp, link_path)


# --- the command ---------------------------------------------------------------------------------------------------


def _watch_stall(progress: Progress, staging: Path, stall_s: float, stop: threading.Event,
                 stalled: threading.Event, monitor: status.Monitor | None = None) -> None:
    """Samples the staged bytes for the progress file and the status port; a fetch that does not move for
    `stall_s` is stalled."""
    base = progress.bytes_done
    while not stop.wait(PROGRESS_INTERVAL_S):
        progress.update(max(base, _bytes_on_disk(staging)))
        progress.write()
        view = progress.view()
        if monitor is not None:
            monitor.observe_download(view["bytesDone"], total=view["bytesTotal"],
                                     files=(view["filesDone"], view["filesTotal"]), eta_s=view["etaSeconds"])
        log.info("fetched %d of %d bytes (%d of %d files), ETA %s s", view["bytesDone"], view["bytesTotal"],
                 view["filesDone"], view["filesTotal"], view["etaSeconds"])
        if view["secondsSinceProgress"] >= stall_s:
            stalled.set()
            os.kill(os.getpid(), signal.SIGTERM)
            return


def termination(reason: str, message: str, extra: Mapping[str, object] | None = None) -> str:
    body: dict[str, object] = {"reason": reason, "exitCode": constants.EXIT_CODES[reason], "detail": message,
                               "phase": constants.StartupPhase.DOWNLOADING.value}
    body.update(extra or {})
    return json.dumps(body, sort_keys=True)[:constants.TERMINATION_MESSAGE_MAX_BYTES]


def _write(path: str, text: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).write_text(text + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm-operator fetch", description=__doc__.split("\n\n")[0] if __doc__ else "")
    p.add_argument("--cache-root", required=True, help="the weights cache (hostPath or PVC), mounted read-write")
    p.add_argument("--repo", required=True, help="Hub repository id")
    p.add_argument("--revision", default=None, help="branch, tag or commit (default main)")
    p.add_argument("--link", required=True, help="symlink to create to the cached model (the engine's model path)")
    p.add_argument("--progress-file", default=None, help="JSON progress file (default next to --link)")
    p.add_argument("--pod-uid", default=os.environ.get("POD_UID"), help="this pod's UID, for the lease")
    p.add_argument("--stall-seconds", type=float,
                   default=constants.STARTUP_PHASE_LIMITS_S[constants.StartupPhase.DOWNLOADING],
                   help="stop a fetch whose bytes have not moved for this long (StartupStalled)")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="the cache's size limit: least-recently-used entries no engine uses are evicted to fit")
    p.add_argument("--status-host", default=os.environ.get("POD_IP", ""),
                   help="address of the start-up status endpoint (default: env POD_IP, else all addresses)")
    p.add_argument("--status-port", type=int, default=constants.ENGINE_STATUS_PORT,
                   help="port of the start-up status endpoint (the engine's, free until it starts; 0 turns it off)")
    p.add_argument("--termination-message-path", default="/dev/termination-log")
    return p


def _serve_status(host: str, port: int) -> status.Monitor | None:
    """The wrapper's start-up endpoint in phase Downloading (module docstring); None when off or the port is
    taken (the fetch goes on without it)."""
    if not port:
        return None
    monitor = status.Monitor(phases.Tracker(started_at=time.time(), phase=phases.Phase.DOWNLOADING))
    try:
        status.serve(monitor, host, port)
    except OSError as err:
        log.warning("could not serve the fetch's progress on port %d (%s); fetching without it", port, err)
        return None
    return monitor


def main(argv: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(list(argv))
    root = Path(args.cache_root)
    token = os.environ.get("HF_TOKEN") or None
    link_path = Path(args.link)
    progress_path = Path(args.progress_file) if args.progress_file else link_path.with_name("fetch-progress.json")
    stop, stalled = threading.Event(), threading.Event()
    progress: Progress | None = None
    signal.signal(signal.SIGTERM, _raise_interrupted)
    monitor = _serve_status(args.status_host, args.status_port)
    try:
        resolved = resolve(args.repo, args.revision, token)
        log.info("resolved %s@%s to commit %s (%d files, %d bytes)", args.repo, args.revision or "main",
                 resolved.commit, len(resolved.files), resolved.total_bytes)
        staging = root / STAGING / repo_key(resolved.repo) / resolved.commit
        staged = _bytes_on_disk(staging)
        progress = Progress(len(resolved.files), resolved.total_bytes, path=progress_path, start_bytes=staged)
        if monitor is not None:
            monitor.observe_download(staged, total=resolved.total_bytes, files=(0, len(resolved.files)))
        watcher = threading.Thread(target=_watch_stall, args=(progress, staging, args.stall_seconds, stop, stalled,
                                                              monitor), daemon=True)
        watcher.start()
        entry, fetched = fetch(root, resolved, token, progress=progress, pod_uid=args.pod_uid,
                               max_bytes=args.max_bytes)
        stop.set()
        link(link_path, entry)
        progress.update(resolved.total_bytes)
        progress.files_done = len(resolved.files)
        progress.write()
        log.info("linked %s to %s (%s)", link_path, entry, f"fetched {fetched} bytes" if fetched else
                 "already cached, fetched nothing")
        return 0
    except FetchError as err:
        log.error("fetch failed (%s): %s", err.reason, err.message)
        _write(args.termination_message_path, termination(err.reason, err.message))
        return constants.EXIT_CODES[err.reason]
    except Interrupted:
        if stalled.is_set():
            return _stalled(args, progress)
        log.info("stopped the fetch of %s on SIGTERM; the staged bytes stay for the next start", args.repo)
        return 128 + signal.SIGTERM
    except Exception as err:
        log.exception("fetch failed unexpectedly")
        _write(args.termination_message_path, termination(constants.REASON_FETCH_FAILED,
                                                          f"{type(err).__name__}: {str(err)[:500]}"))
        return constants.EXIT_CODES[constants.REASON_FETCH_FAILED]
    finally:
        stop.set()


def _stalled(args: argparse.Namespace, progress: Progress | None) -> int:
    view = progress.view() if progress else {}
    message = (f"no new byte of {args.repo} for {args.stall_seconds:.0f} s (phase downloading's limit); "
               f"{view.get('bytesDone', 0)} of {view.get('bytesTotal', 0)} bytes staged, resumed by the next start")
    _write(args.termination_message_path, termination(constants.REASON_STARTUP_STALLED, message, {"limitSeconds":
                                                                                                   args.stall_seconds}))
    return constants.EXIT_STARTUP_STALLED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
