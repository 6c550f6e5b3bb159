"""The weights cache's eviction: the pure policy (least recently used first, never an entry in use) and what "in use"
means on a real file system (an engine's shared flock on the marker, a recent lease, a held fetch lock)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

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
