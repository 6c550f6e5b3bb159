"""The weights fetch's own counts (engine/fetch.py `Progress`): files and bytes done of total, the rate of this
fetch (bytes a killed fetch left staged excluded) and the ETA — and how they become the wrapper's start-up metrics
(engine/status.py) that the health loop reads into `startupProgress` and `startupDownload`."""

from __future__ import annotations

import pytest

from vllm_operator import constants
from vllm_operator.engine import fetch, phases, status

MiB = 2**20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("done", "total", "rate", "eta"), [
    (0, 100, 0.0, None),  # nothing moved yet: no rate, no estimate
    (40, 100, 10.0, 6.0),
    (100, 100, 0.0, 0.0),  # done
    (120, 100, 5.0, 0.0),  # more on disk than listed (a .part beside its file): done, never negative
    (0, 0, 1.0, None),  # an empty listing: nothing to estimate
])
def test_eta_seconds(done: int, total: int, rate: float, eta: float | None) -> None:
    assert fetch.eta_seconds(done, total, rate) == eta


def test_the_eta_is_at_this_fetchs_rate_not_counting_what_a_killed_fetch_left() -> None:
    clock = Clock()
    p = fetch.Progress(total_files=4, total_bytes=100 * MiB, now=clock, start_bytes=40 * MiB)
    view = p.view()
    assert view["bytesDone"] == 40 * MiB and view["etaSeconds"] is None, "resumed bytes are no rate"
    clock.t += 10
    p.update(60 * MiB)  # 20 MiB in 10 s
    p.files_done = 2
    view = p.view()
    assert view["bytesPerSecond"] == pytest.approx(2 * MiB)
    assert view["etaSeconds"] == pytest.approx(20.0), "40 MiB left at 2 MiB/s"
    assert (view["filesDone"], view["filesTotal"], view["bytesTotal"]) == (2, 4, 100 * MiB)
    assert view["secondsSinceProgress"] == 0.0


def test_a_fetch_that_has_not_moved_has_no_eta_and_counts_its_quiet_time() -> None:
    clock = Clock()
    p = fetch.Progress(total_files=1, total_bytes=10 * MiB, now=clock)
    clock.t += 30
    view = p.view()
    assert view["etaSeconds"] is None and view["secondsSinceProgress"] == 30.0


def fetch_monitor(start: float = 1000.0) -> status.Monitor:
    """The fetch's monitor as `fetch._serve_status` makes it: phase Downloading from the start."""
    return status.Monitor(phases.Tracker(started_at=start, phase=phases.Phase.DOWNLOADING))


def test_the_fetchs_counts_and_eta_become_the_start_up_metrics() -> None:
    monitor = fetch_monitor()
    monitor.observe_download(0, now=1000.0, total=100 * MiB, files=(0, 4))
    assert monitor.snapshot(1000.0)["progress"] == "0 B of 100.0 MiB, 0 of 4 files"
    assert monitor.observe_download(60 * MiB, now=1010.0, total=100 * MiB, files=(2, 4), eta_s=310.0)
    snap = monitor.snapshot(1010.0)
    assert snap["progress"] == "60.0 MiB of 100.0 MiB, 2 of 4 files, ETA 5m10s"
    assert (snap["downloadFiles"], snap["downloadTotalFiles"], snap["downloadEtaSeconds"]) == (2, 4, 310.0)
    assert snap["lastProgressAt"] == 1010.0
    text = status.metrics_text(monitor).decode()
    samples = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    assert samples[constants.METRIC_STARTUP_DOWNLOAD] == 60 * MiB
    assert samples[constants.METRIC_STARTUP_DOWNLOAD_TOTAL] == 100 * MiB
    assert samples[constants.METRIC_STARTUP_DOWNLOAD_FILES] == 2
    assert samples[constants.METRIC_STARTUP_DOWNLOAD_TOTAL_FILES] == 4
    assert samples[constants.METRIC_STARTUP_DOWNLOAD_ETA] == 310.0


def test_a_new_count_or_eta_without_new_bytes_is_not_progress() -> None:
    """The stall limit counts bytes: a file verified (counts move) while no byte arrives must not reset it."""
    monitor = fetch_monitor()
    monitor.observe_download(60 * MiB, now=1000.0, total=100 * MiB, files=(2, 4), eta_s=20.0)
    assert not monitor.observe_download(60 * MiB, now=1300.0, total=100 * MiB, files=(3, 4), eta_s=None)
    snap = monitor.snapshot(1300.0)
    assert snap["lastProgressAt"] == 1000.0 and snap["progress"] == "60.0 MiB of 100.0 MiB, 3 of 4 files"
    assert snap["downloadEtaSeconds"] is None


def test_a_download_vllm_makes_itself_exports_no_counts_or_eta() -> None:
    monitor = status.Monitor(phases.Tracker(started_at=1000.0))
    monitor.feed("Starting to load model org/big...", 1001.0)
    monitor.observe_download(0, now=1002.0)
    monitor.observe_download(2 * 2**30, now=1004.0)
    assert monitor.snapshot(1004.0)["progress"] == "2.0 GiB downloaded"
    text = status.metrics_text(monitor).decode()
    assert constants.METRIC_STARTUP_DOWNLOAD + " " in text
    for name in (constants.METRIC_STARTUP_DOWNLOAD_FILES, constants.METRIC_STARTUP_DOWNLOAD_TOTAL_FILES,
                 constants.METRIC_STARTUP_DOWNLOAD_ETA):
        assert name not in text


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (44.6, "45s"), (310, "5m10s"), (7500, "2h05m")])
def test_human_seconds(seconds: float, text: str) -> None:
    assert phases.human_seconds(seconds) == text
