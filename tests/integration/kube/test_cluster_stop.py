"""The test cluster stops cleanly: every component finishes its own shutdown on SIGTERM, none is left to SIGKILL.

Signalled all at once, kube-apiserver never finished shutting down once etcd had gone and was killed at the end of
the grace period, and etcd took 7 s with the API server's connections open: every cluster stop (each e2e stack,
every integration module with a cluster of its own) cost the whole 10 s. `cluster.stop` now stops them one at a time
in reverse start order; kube-apiserver's own last words are the proof that it was not killed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testcluster import cluster

pytestmark = pytest.mark.integration
APISERVER_EXITED = "[graceful-termination] apiserver is exiting"
"""What kube-apiserver logs when its graceful termination has run to the end (genericapiserver.go)."""


def test_stop_lets_every_component_shut_itself_down(tmp_path: Path) -> None:
    kube = cluster.start(tmp_path / "kube", kwok=True)
    pids = dict(kube.state.pids)
    log = kube.log("kube-apiserver")
    kube.stop()
    assert not [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()], "a component outlived stop"
    assert APISERVER_EXITED in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
