"""`vllm-operator fetch` (the engine pods' weights-cache init container) as real processes with the real
`huggingface_hub`, against a local server that speaks the Hub's API (tests/support/hubserver.py) on loopback.

Two fetches of one model on one cache fetch once (the second waits on the lock, then finds the entry); a fetch killed
halfway is resumed with a Range request and never served before it is complete; a gated model fetched with one
token is not handed to a pod whose token may not read it; an unreachable Hub, a refused token and a full disk each
exit with their own code and a JSON termination message, leaving no entry behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hubserver import COMMIT, HubServer, HubState, Repo
from tests.support.net import free_port
from vllm_operator import constants
from vllm_operator.engine import fetch

pytestmark = pytest.mark.integration
REPO = "test-org/tiny"
WEIGHTS = os.urandom(6 << 20)
FILES = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}" * 600,
         "model.safetensors": WEIGHTS}


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer(HubState(repos={REPO: Repo(dict(FILES))})) as server:
        yield server


def start(hub_url: str, root: Path, pod: Path, *, token: str | None = None, repo: str = REPO,
          extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub_url, HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(pod / "hf-home"),
               HF_HUB_DISABLE_XET="1", HF_HUB_ETAG_TIMEOUT="5")
    if token is not None:
        env["HF_TOKEN"] = token
    pod.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "vllm_operator.cli", "fetch", f"--cache-root={root}",
                             f"--repo={repo}", f"--link={pod / 'model'}", f"--pod-uid={pod.name}",
                             f"--termination-message-path={pod / 'termination'}",
                             *(() if any(e.startswith("--status-port") for e in extra) else ("--status-port=0",)),
                             *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen[bytes], timeout: float = 60) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(errors="replace")


def message(pod: Path) -> dict[str, object]:
    parsed: dict[str, object] = json.loads((pod / "termination").read_text())
    return parsed


def entry(root: Path) -> Path:
    return fetch.entry_dir(root, REPO, COMMIT)


def test_two_pods_on_one_node_fetch_once_and_a_restart_fetches_nothing(hub: HubServer, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    hub.state.throttle_bytes_per_s = 8 << 20  # long enough that the second pod finds the first one fetching
    first = start(hub.url, root, tmp_path / "pod-a")
    time.sleep(0.3)
    second = start(hub.url, root, tmp_path / "pod-b")
    (code_a, out_a), (code_b, out_b) = finish(first), finish(second)
    assert code_a == 0 and code_b == 0, out_a + out_b
    assert hub.state.bytes_sent == sum(len(b) for b in FILES.values()), hub.state.requests
    assert hub.state.requests["get"] == len(FILES)
    for pod in ("pod-a", "pod-b"):
        link = tmp_path / pod / "model"
        assert link.resolve() == entry(root).resolve()
        assert (link / "model.safetensors").read_bytes() == WEIGHTS
        assert (root / fetch.LEASES / f"test-org--tiny--{COMMIT}" / pod).is_file()
    assert "already cached, fetched nothing" in out_a + out_b
    progress = json.loads((tmp_path / "pod-a" / "fetch-progress.json").read_text())
    assert progress["filesDone"] == progress["filesTotal"] == 3
    assert progress["bytesDone"] == progress["bytesTotal"] == sum(len(b) for b in FILES.values())
    hub.state.reset_counts()
    hub.state.throttle_bytes_per_s = None
    code, out = finish(start(hub.url, root, tmp_path / "pod-a"))  # the init container of a restarted pod
    assert code == 0, out
    assert hub.state.bytes_sent == 0 and hub.state.requests == {"info": 1}


def test_a_fetch_killed_halfway_is_resumed_and_never_served_before(hub: HubServer, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    hub.state.throttle_bytes_per_s = 2 << 20
    proc = start(hub.url, root, tmp_path / "pod-a")
    staging = root / fetch.STAGING / "test-org--tiny" / COMMIT
    deadline = time.monotonic() + 30
    while fetch._bytes_on_disk(staging) < len(WEIGHTS) // 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    staged = fetch._bytes_on_disk(staging)
    assert 0 < staged < sum(len(b) for b in FILES.values())
    assert not entry(root).exists(), "a half-fetched model must not be in place"
    hub.state.reset_counts()
    hub.state.throttle_bytes_per_s = None
    code, out = finish(start(hub.url, root, tmp_path / "pod-b"))
    assert code == 0, out
    assert hub.state.requests["range"] >= 1, hub.state.requests
    assert hub.state.bytes_sent < len(WEIGHTS), "the resumed fetch sent the staged bytes again"
    assert (tmp_path / "pod-b" / "model" / "model.safetensors").read_bytes() == WEIGHTS
    assert not staging.exists()


def test_a_gated_model_is_not_served_to_a_pod_whose_token_cannot_read_it(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    state = HubState(repos={REPO: Repo(dict(FILES), allowed_tokens={"token-of-team-a"})})
    with HubServer(state) as hub:
        code, out = finish(start(hub.url, root, tmp_path / "pod-a", token="token-of-team-a"))
        assert code == 0, out
        assert entry(root).is_dir()
        for pod, token in (("pod-b", "token-of-team-b"), ("pod-c", None)):
            code, out = finish(start(hub.url, root, tmp_path / pod, token=token))
            assert code == constants.EXIT_MODEL_ACCESS_DENIED, out
            body = message(tmp_path / pod)
            assert body["reason"] == constants.REASON_MODEL_ACCESS_DENIED and "gated" in str(body["detail"])
            assert not (tmp_path / pod / "model").exists()


def test_an_unreachable_hub_is_reported_and_leaves_no_entry(tmp_path: Path) -> None:
    pod = tmp_path / "pod-a"
    code, out = finish(start(f"http://127.0.0.1:{free_port()}", tmp_path / "cache", pod))
    assert code == constants.EXIT_HUB_UNREACHABLE, out
    assert message(pod)["reason"] == constants.REASON_HUB_UNREACHABLE
    assert "Traceback" not in out
    assert not (tmp_path / "cache" / "test-org--tiny").exists()


def test_a_hub_error_is_reported_as_unreachable(hub: HubServer, tmp_path: Path) -> None:
    hub.state.fail_with = 503
    pod = tmp_path / "pod-a"
    code, out = finish(start(hub.url, tmp_path / "cache", pod))
    assert code == constants.EXIT_HUB_UNREACHABLE, out
    assert "503" in str(message(pod)["detail"])


def test_an_unknown_repo_is_access_denied(hub: HubServer, tmp_path: Path) -> None:
    pod = tmp_path / "pod-a"
    code, out = finish(start(hub.url, tmp_path / "cache", pod, repo="test-org/missing"))
    assert code == constants.EXIT_MODEL_ACCESS_DENIED, out
    assert "not found" in str(message(pod)["detail"])


def test_a_fetch_that_stops_moving_is_stalled(hub: HubServer, tmp_path: Path) -> None:
    hub.state.throttle_bytes_per_s = 10  # 1 byte per 0.1 s: the bytes on disk look still between samples
    pod = tmp_path / "pod-a"
    # huggingface_hub writes in chunks of 10 MiB, so a trickle never reaches the disk: a stall as the watcher sees it
    code, out = finish(start(hub.url, tmp_path / "cache", pod, extra=("--stall-seconds=3",)), timeout=60)
    assert code == constants.EXIT_STARTUP_STALLED, out
    body = message(pod)
    assert body["reason"] == constants.REASON_STARTUP_STALLED and body["phase"] == "Downloading"
    assert not entry(tmp_path / "cache").exists()


def test_a_full_disk_is_reported_and_the_partial_fetch_removed(hub: HubServer, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], capture_output=True,
                             check=False)
    assert mounted.returncode == 0, mounted.stderr  # the test tier runs as root (real kubelet, netns)
    try:
        pod = tmp_path / "pod-a"
        code, out = finish(start(hub.url, small, pod))
        assert code == constants.EXIT_CACHE_DISK_FULL, out
        assert message(pod)["reason"] == constants.REASON_CACHE_DISK_FULL
        assert not (small / fetch.STAGING / "test-org--tiny" / COMMIT).exists()
        assert not (small / "test-org--tiny").exists()
    finally:
        subprocess.run(["umount", str(small)], check=False)


def hold_like_an_engine(link: Path, log: Path) -> subprocess.Popen[bytes]:
    """The engine container's wrapper with --hold-weights, as rendered (its child a stand-in for vLLM)."""
    return subprocess.Popen([sys.executable, "-m", "vllm_operator.cli", "engine", "--preflight=off", "--status-port=0",
                             f"--hold-weights={link}/{fetch.COMPLETE_MARKER}",
                             f"--termination-message-path={log.parent / 'engine-termination'}", "--",
                             sys.executable, "-c", "import time; time.sleep(120)"],
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def test_filling_the_cache_while_a_model_is_in_use_evicts_only_what_no_engine_uses(tmp_path: Path) -> None:
    """Limit for one model: a second model is refused (CacheDiskFull naming the model in use) while an engine holds
    the first, and fetched, evicting the first, once that engine is gone and its lease is old."""
    other, commit_b = "test-org/other", "fedcba9876543210fedcba9876543210fedcba98"
    other_files = {"config.json": b'{"model_type": "llama"}', "model.safetensors": os.urandom(6 << 20)}
    state = HubState(repos={REPO: Repo(dict(FILES)), other: Repo(dict(other_files), commit=commit_b)})
    root, size = tmp_path / "cache", sum(len(b) for b in FILES.values())
    limit = ("--max-bytes", str(int(size * 1.5)))
    with HubServer(state) as hub:
        code, out = finish(start(hub.url, root, tmp_path / "pod-a", extra=limit))
        assert code == 0, out
        a = entry(root)
        lease = root / fetch.LEASES / f"test-org--tiny--{COMMIT}" / "pod-a"
        os.utime(lease, (time.time() - 2 * constants.WEIGHTS_LEASE_GRACE_S,) * 2)  # long after pod-a started
        engine = hold_like_an_engine(tmp_path / "pod-a" / "model", tmp_path / "pod-a" / "engine.log")
        try:
            deadline = time.monotonic() + 30
            while b"Holding the weights cache entry" not in (tmp_path / "pod-a" / "engine.log").read_bytes():
                assert engine.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "pod-a" / "engine.log").read_text()
                time.sleep(0.1)
            hub.state.reset_counts()
            code, out = finish(start(hub.url, root, tmp_path / "pod-b", repo=other, extra=limit))
            assert code == constants.EXIT_CACHE_DISK_FULL, out
            body = message(tmp_path / "pod-b")
            assert body["reason"] == constants.REASON_CACHE_DISK_FULL
            assert f"test-org--tiny--{COMMIT} ({size} bytes, an engine holds it)" in str(body["detail"]), body
            assert a.is_dir() and (tmp_path / "pod-a" / "model" / "model.safetensors").read_bytes() == WEIGHTS
            assert hub.state.bytes_sent == 0, "refused before fetching a byte"
            assert not fetch.entry_dir(root, other, commit_b).exists()
            assert not (root / fetch.STAGING / "test-org--other").exists(), "nothing half-written left"
        finally:
            engine.terminate()
            engine.wait(timeout=30)
        code, out = finish(start(hub.url, root, tmp_path / "pod-c", repo=other, extra=limit))
        assert code == 0, out
        assert f"evicted test-org--tiny--{COMMIT}" in out
        assert not a.exists() and fetch.entry_dir(root, other, commit_b).is_dir()
        assert hub.state.bytes_sent == sum(len(b) for b in other_files.values())


def test_a_fetch_shows_its_progress_as_the_wrappers_startup_metrics(hub: HubServer, tmp_path: Path) -> None:
    """On the pod's status port, in phase Downloading with bytes and files done and total and the ETA: what the
    PodMonitor scrapes and the health loop reads as the pool's startupPhase, startupProgress and startupDownload."""
    import urllib.request

    port = free_port()
    hub.state.throttle_bytes_per_s = 1 << 20  # ~6 s: the fetch's 2 s samples catch it halfway
    proc = start(hub.url, tmp_path / "cache", tmp_path / "pod-a",
                 extra=(f"--status-port={port}", "--status-host=127.0.0.1"))
    names = {constants.METRIC_STARTUP_DOWNLOAD_TOTAL: "total", constants.METRIC_STARTUP_DOWNLOAD: "done",
             constants.METRIC_STARTUP_DOWNLOAD_FILES: "files", constants.METRIC_STARTUP_DOWNLOAD_TOTAL_FILES:
             "total_files", constants.METRIC_STARTUP_DOWNLOAD_ETA: "eta",
             'vllm_operator_engine_startup_phase{phase="Downloading"}': "downloading"}
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and not (0 < seen.get("done", 0) < seen.get("total", 0) and "eta" in seen):
            time.sleep(0.2)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
            seen = {names[line.split()[0]]: float(line.split()[-1]) for line in text.splitlines()
                    if line.split() and line.split()[0] in names}
    finally:
        code, out = finish(proc)
    assert code == 0, out
    assert seen.get("downloading") == 1.0, seen
    assert seen["total_files"] == len(FILES) and 0 <= seen["files"] < len(FILES), seen
    assert seen["eta"] > 0, seen
    assert seen["total"] == sum(len(b) for b in FILES.values()) and 0 < seen["done"] < seen["total"], seen
