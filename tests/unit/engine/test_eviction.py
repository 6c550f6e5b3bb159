"""The weights cache's eviction: the pure policy (least recently used first, never an entry in use) and what "in use"
means on a real file system (an engine's shared flock on the marker, a recent lease, a held fetch lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_operator import constants
from vllm_operator.engine import eviction
from vllm_operator.engine.eviction import Entry, choose, make_room

NOW = 1_800_000_000.0
GRACE = 900.0


def entry(key: str, size: int, last_used: float, in_use: str | None = None) -> Entry:
    return Entry(key=key, path=Path("/c") / key, size=size, last_used=last_used, in_use=in_use)


def test_choose_takes_the_least_recently_used_first_and_stops_when_it_fits() -> None:
    entries = [entry("new", 40, 300), entry("old", 40, 100), entry("mid", 40, 200)]
    assert [e.key for e in choose(entries, used=120, need=30, limit=120)] == ["old"]
    assert [e.key for e in choose(entries, used=120, need=70, limit=120)] == ["old", "mid"]
    assert choose(entries, used=120, need=0, limit=120) == []


def test_choose_never_takes_an_entry_in_use() -> None:
    entries = [entry("old", 40, 100, "an engine holds it"), entry("mid", 40, 200), entry("new", 40, 300)]
    assert [e.key for e in choose(entries, used=120, need=70, limit=120)] == ["mid", "new"]
    assert [e.key for e in choose(entries, used=120, need=200, limit=120)] == ["mid", "new"], \
        "all it can; the caller reports the cache full"


def test_choose_also_frees_the_file_system() -> None:
    entries = [entry("old", 40, 100), entry("new", 40, 300)]
    assert [e.key for e in choose(entries, used=80, need=30, limit=1000, free=10)] == ["old"]


def put(root: Path, repo: str, commit: str, size: int, *, lease_age: float | None = None) -> Path:
    path = root / repo / commit
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * size)
    (path / eviction.COMPLETE_MARKER).write_text(json.dumps({"bytes": size}))
    if lease_age is not None:
        leases = eviction.lease_dir(root, eviction.entry_key(path))
        leases.mkdir(parents=True)
        (leases / "pod").touch()
        os.utime(leases / "pod", (NOW - lease_age, NOW - lease_age))
    return path


def test_make_room_evicts_idle_entries_oldest_first(tmp_path: Path) -> None:
    old = put(tmp_path, "o--old", "c1", 1000, lease_age=5000)
    mid = put(tmp_path, "o--mid", "c2", 1000, lease_age=4000)
    new = put(tmp_path, "o--new", "c3", 1000, lease_age=3000)
    evicted, why = make_room(tmp_path, need=1500, limit=3000, grace_s=GRACE, now=NOW)
    assert why is None and [e.path for e in evicted] == [old, mid]
    assert not old.exists() and not mid.exists() and new.exists()
    assert not (tmp_path / "o--old").exists(), "the repository's directory goes with its last commit"
    assert not eviction.lease_dir(tmp_path, "o--old--c1").exists()
    assert list((tmp_path / eviction.TRASH).iterdir()) == []


def test_an_entry_an_engine_holds_is_never_evicted(tmp_path: Path) -> None:
    held = put(tmp_path, "o--held", "c1", 1000, lease_age=5000)
    idle = put(tmp_path, "o--idle", "c2", 1000, lease_age=4000)
    fd = eviction.hold(held / eviction.COMPLETE_MARKER)  # what `vllm-operator engine --hold-weights` does
    try:
        evicted, why = make_room(tmp_path, need=1000, limit=2000, grace_s=GRACE, now=NOW)
        assert why is None and [e.path for e in evicted] == [idle] and held.exists()
        evicted, why = make_room(tmp_path, need=1500, limit=2000, grace_s=GRACE, now=NOW)
        assert evicted == [] and why is not None and held.exists()
        assert "o--held--c1 (1000 bytes, an engine holds it)" in why and "2000-byte limit" in why
    finally:
        os.close(fd)
    evicted, why = make_room(tmp_path, need=1500, limit=2000, grace_s=GRACE, now=NOW)
    assert why is None and [e.path for e in evicted] == [held], "the lock went with the engine"


def test_a_recent_lease_covers_the_gap_before_the_engine_starts(tmp_path: Path) -> None:
    fresh = put(tmp_path, "o--fresh", "c1", 1000, lease_age=60)
    evicted, why = make_room(tmp_path, need=1500, limit=2000, grace_s=GRACE, now=NOW)
    assert evicted == [] and why is not None and fresh.exists() and "leased 60 s ago" in why
    evicted, why = make_room(tmp_path, need=1500, limit=2000, grace_s=GRACE, now=NOW + GRACE)
    assert why is None and [e.path for e in evicted] == [fresh]


def test_an_entry_being_fetched_or_leased_is_skipped(tmp_path: Path) -> None:
    busy = put(tmp_path, "o--busy", "c1", 1000, lease_age=5000)
    with eviction.try_locked(tmp_path, "o--busy--c1") as taken:
        assert taken
        assert not eviction.evict(tmp_path, eviction.scan(tmp_path, NOW, GRACE)[0], NOW, GRACE)
    assert busy.exists()


def test_staging_counts_against_the_limit(tmp_path: Path) -> None:
    put(tmp_path, "o--idle", "c1", 1000, lease_age=5000)
    staged = tmp_path / eviction.STAGING / "o--other" / "c9"
    staged.mkdir(parents=True)
    (staged / "part").write_bytes(b"\0" * 900)
    evicted, why = make_room(tmp_path, need=500, limit=2000, grace_s=GRACE, now=NOW)
    assert why is None and len(evicted) == 1, "1000 + 900 staged + 500 > 2000"


def test_hold_refuses_a_missing_marker(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        eviction.hold(tmp_path / "gone" / eviction.COMPLETE_MARKER)


def test_pod_lease_is_named_by_the_linked_entry_and_the_pod(tmp_path: Path) -> None:
    path = put(tmp_path / "cache", "o--m", "c1", 10)
    link = tmp_path / "pod" / "model"
    link.parent.mkdir()
    link.symlink_to(path)
    lease = eviction.pod_lease(tmp_path / "leases", link / eviction.COMPLETE_MARKER, "uid-1")
    assert lease == tmp_path / "leases" / "o--m--c1" / "uid-1"


def test_keep_renewing_touches_the_lease_until_stopped(tmp_path: Path) -> None:
    lease = tmp_path / "leases" / "o--m--c1" / "uid-1"
    stop = threading.Event()
    thread = eviction.keep_renewing(lease, stop, every_s=0.01)
    try:
        assert lease.is_file(), "renewed before keep_renewing returns (before the engine starts)"
        os.utime(lease, (1.0, 1.0))
        deadline = time.monotonic() + 30
        while lease.stat().st_mtime == 1.0:
            assert time.monotonic() < deadline, "never renewed again"
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_lease_that_cannot_be_written_is_logged_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "leases").write_text("a file where the directory should be")
    stop = threading.Event()
    thread = eviction.keep_renewing(tmp_path / "leases" / "k" / "uid", stop, every_s=0.01)
    stop.set()
    thread.join(timeout=30)
    assert "could not renew the weights cache lease" in caplog.text


def run_engine_once(link: Path, leases: Path, pod_uid: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """One start of the engine container as rendered (rendering/engine.py: --hold-weights, --weights-leases, the
    pod's uid), whose child — vLLM's stand-in — fails at once: one turn of a crash loop."""
    return subprocess.run([sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=off", "--status-port=0",
                           f"--hold-weights={link}/{eviction.COMPLETE_MARKER}", f"--weights-leases={leases}",
                           f"--pod-uid={pod_uid}", f"--termination-message-path={tmp / 'termination'}", "--",
                           sys.executable, "-c", "raise SystemExit(3)"],
                          capture_output=True, text=True, timeout=120, check=False)


def test_an_engine_that_keeps_restarting_keeps_its_entry_past_the_lease_grace(tmp_path: Path) -> None:
    """The bug: the fetch leased the entry when the pod was created; an engine crash-looping for longer than the
    grace held its lock only while each attempt ran, so between two restarts the entry was evictable — and once
    evicted, every restart of that pod failed (its fetch container never runs again). Each start now renews the
    pod's lease."""
    root = tmp_path / "cache"
    path = root / "o--m" / "c1"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 1000)
    (path / eviction.COMPLETE_MARKER).write_text(json.dumps({"bytes": 1000}))
    fetched_at = time.time() - 2 * constants.WEIGHTS_LEASE_GRACE_S  # the pod was created (and fetched) long ago
    lease = eviction.lease_dir(root, "o--m--c1") / "uid-a"
    lease.parent.mkdir(parents=True)
    lease.touch()
    os.utime(lease, (fetched_at, fetched_at))
    link = tmp_path / "pod-a" / "model"
    link.parent.mkdir()
    link.symlink_to(path)

    done = run_engine_once(link, root / eviction.LEASES, "uid-a", tmp_path)  # the kubelet's latest restart
    assert done.returncode not in (0, constants.EXIT_WEIGHTS_GONE), done.stderr  # the child's failure, classified
    assert "Holding the weights cache entry" in done.stderr, done.stderr

    # Between two restarts (no engine holds the lock), another model needs the room.
    evicted, why = make_room(root, need=1500, limit=2000)
    assert evicted == [] and path.is_dir(), "the entry of a pod whose engine keeps restarting stays"
    assert why is not None and "o--m--c1 (1000 bytes, leased" in why
    # Once the pod is gone, nothing renews the lease: after the grace the entry goes.
    evicted, why = make_room(root, need=1500, limit=2000, now=time.time() + constants.WEIGHTS_LEASE_GRACE_S + 1)
    assert why is None and [e.path for e in evicted] == [path]


def test_an_engine_whose_entry_is_gone_exits_weights_gone_and_leases_nothing(tmp_path: Path) -> None:
    """Its own reason, so the health loop replaces the pod (a restart never fetches: diagnose's WeightsGone)."""
    root = tmp_path / "cache"
    link = tmp_path / "pod-a" / "model"
    link.parent.mkdir()
    link.symlink_to(root / "o--m" / "c1")
    done = run_engine_once(link, root / eviction.LEASES, "uid-a", tmp_path)
    assert done.returncode == constants.EXIT_WEIGHTS_GONE, done.stderr
    body = json.loads((tmp_path / "termination").read_text())
    assert body["reason"] == constants.REASON_WEIGHTS_GONE and "entry is gone" in body["detail"]
    assert not (root / eviction.LEASES).exists()
