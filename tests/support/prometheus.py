"""A real Prometheus for integration tests: 127.0.0.1, 1 s scrapes, file_sd targets. The Debian package by default;
`executable=str(testcluster.binaries.prometheus())` runs v3, built from its module (`make cluster-bin`).

Targets carry the label contract (`namespace`, `pod`, `vllmdeployment`, `pool`) the way the rendered PodMonitor's
relabelings put them on real engine series. `set_targets` rewrites the file_sd file atomically; Prometheus picks it
up within about a second. `stop()` / `start()` keep the data directory and port, so a test can take Prometheus away
and bring it back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.net import free_port


@dataclass(frozen=True)
class Target:
    address: str
    """host:port of the exporter."""
    labels: Mapping[str, str]


def binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise RuntimeError("prometheus is not installed: run scripts/install-test-deps.sh (Debian package)")
    return path


class Prometheus:
    """One Prometheus process on a temporary directory."""

    def __init__(self, root: Path, *, scrape_interval: str = "1s", rule_files: Sequence[Path] = (),
                 scrape_configs: Sequence[Mapping[str, object]] | None = None, host: str = "127.0.0.1",
                 executable: str | None = None) -> None:
        """`scrape_configs` replaces the file_sd job (the real control plane's kubernetes_sd jobs, which need
        `executable`: the Prometheus built with Kubernetes discovery)."""
        self.executable = executable
        self.root = root
        self.host = host
        """Where it listens and what `url` names: loopback, or an address of a testcluster's network namespace for
        clients inside it (KEDA's triggers, the end-to-end tier)."""
        self.port = free_port()
        self.targets_file = root / "targets" / "engines.json"
        self.targets_file.parent.mkdir(parents=True, exist_ok=True)
        self.targets_file.write_text("[]")
        config = {
            "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": list(scrape_configs) if scrape_configs is not None else [{
                "job_name": "vllm-engines",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}],
            }],
        }
        self.config_file = root / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        self.log_file = root / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        if self._proc is not None:
            return
        log = self.log_file.open("ab")
        self._proc = subprocess.Popen(
            [self.executable or binary(), f"--config.file={self.config_file}",
             f"--storage.tsdb.path={self.root / 'data'}",
             f"--web.listen-address={self.host}:{self.port}", "--web.enable-lifecycle",
             "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                if resp.status == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready within {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def set_targets(self, targets: Sequence[Target]) -> None:
        groups = [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)

    def query(self, promql: str) -> list[dict[str, object]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@contextlib.contextmanager
def running_prometheus(**kwargs: object) -> Iterator[Prometheus]:
    root = Path(tempfile.mkdtemp(prefix="prometheus-"))
    prom = Prometheus(root, **kwargs)  # type: ignore[arg-type]
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        shutil.rmtree(root, ignore_errors=True)
