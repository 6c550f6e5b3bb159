"""scripts/build-images.sh keeps another clone's archives while that clone may still read them.

Seen: two clones at different commits on one machine; the second's build of an image deleted the first's archive of
the same image name between the first's `--print` and its import into a node store, and the first's e2e tier failed.
Now `--print` marks each archive it hands out as in use (its mtime), and a build deletes other builds' archives only
once none was asked for in ARCHIVE_KEEP_MINUTES. Run against a cache of the test's own (VLLM_OPERATOR_CACHE), with
podman never called: `--print` only hashes the tree and reads the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "build-images.sh"


def _print(cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "--print"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "VLLM_OPERATOR_CACHE": str(cache)})


def test_print_marks_the_archives_it_hands_out_as_in_use(tmp_path: Path) -> None:
    missing = _print(tmp_path)
    assert missing.returncode == 1
    dirs = [Path(d) for d in re.findall(r"\((\S+)\) is not built", missing.stderr)]
    assert [d.name.split("-")[0] for d in dirs] == ["operator", "router", "engine"]
    hour_ago = time.time() - 3600
    for d in dirs:
        d.mkdir(parents=True)
        (d / ".complete").touch()
        (d / "image-id").write_text("0" * 64 + "\n")
        archive = d / f"{d.name.rsplit('-', 1)[0]}.oci.tar"
        archive.write_bytes(b"")
        os.utime(archive, (hour_ago, hour_ago))
    printed = _print(tmp_path)
    assert printed.returncode == 0, printed.stderr
    archives = [Path(line.split()[-1]) for line in printed.stdout.splitlines()[1:]]
    assert len(archives) == 3
    assert all(a.stat().st_mtime > time.time() - 60 for a in archives), "an archive handed out was not marked in use"

