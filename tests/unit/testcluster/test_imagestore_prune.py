"""testcluster/imagestore.py removes node image stores nobody asked for lately, and only those.

Each store holds an unpacked engine image (~8 GB); with a day's grace a development machine on which clones at
several commits ran the real-node tests filled its disk (four stores, 31 GB) and image builds failed with "no space
left on device".
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from testcluster import imagestore

NOW = 1_000_000_000.0


def _store(root: Path, name: str, complete_age: float | None, used_age: float | None = None) -> Path:
    path = root / name
    (path / "root").mkdir(parents=True)
    for marker, age in ((".complete", complete_age), (".used", used_age)):
        if age is not None:
            (path / marker).touch()
            os.utime(path / marker, (NOW - age, NOW - age))
    return path


def test_only_stores_nobody_asked_for_within_the_grace_are_removed(tmp_path: Path) -> None:
    hours = 3600.0
    _store(tmp_path, "current", complete_age=10 * hours)
    _store(tmp_path, "stale", complete_age=4 * hours)
    _store(tmp_path, "stale-but-used", complete_age=30 * hours, used_age=1 * hours)
    _store(tmp_path, "new", complete_age=1 * hours)
    _store(tmp_path, "importing", complete_age=None)  # no .complete yet: another process is importing it
    assert imagestore._prune(tmp_path, keep="current", now=NOW) == ["stale"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["current", "importing", "new", "stale-but-used"]


def test_a_store_being_imported_elsewhere_is_left_alone(tmp_path: Path) -> None:
    _store(tmp_path, "old", complete_age=48 * 3600.0)
    with (tmp_path / ".old.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert imagestore._prune(tmp_path, keep="other", now=NOW) == []
    assert imagestore._prune(tmp_path, keep="other", now=NOW) == ["old"]


def test_handing_out_a_cached_store_marks_it_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_OPERATOR_CACHE", str(tmp_path))
    monkeypatch.setattr(imagestore, "key", lambda archives: "cached")
    cached = _store(tmp_path / "node-stores", "cached", complete_age=30 * 3600.0)
    before = time.time()
    assert imagestore.store([]) == cached / "root"
    assert (cached / ".used").stat().st_mtime >= before - 1
