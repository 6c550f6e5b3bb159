"""The router's access log: one line per model request, at INFO, under the logger name `vllm_operator.router.access`.

Why not `logging.Logger.info` for each line: measured in benchmarks/router, one `info()` per request through the
router's stderr handler cost ~37 µs of CPU per request (the caller lookup, the LogRecord, the Formatter's time
formatting, a write and flush per line) — more than a quarter of everything else the router does for a request.
Here a line is one f-string with a timestamp prefix cached per second, appended to a buffer that is written out in
one piece every `FLUSH_SECONDS` (and when it passes `FLUSH_BYTES`, and at shutdown), as nginx's buffered access_log
does. The lines look like the router's other log lines (`basicConfig` format in main.py), and they follow the
logger: when `vllm_operator.router.access` is not enabled for INFO (e.g. `--log-level WARNING`) nothing is written.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Final, TextIO

LOGGER: Final = "vllm_operator.router.access"
FLUSH_SECONDS: Final = 0.1
FLUSH_BYTES: Final = 64 * 1024


class AccessLog:
    """Buffered access lines for one router; `enabled` says whether a line would be written at all."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.logger = logging.getLogger(LOGGER)
        self.on = enabled
        self.stream = stream
        self._parts: list[str] = []
        self._size = 0
        self._flush: asyncio.TimerHandle | None = None
        self._second = -1
        self._stamp = ""

    @property
    def enabled(self) -> bool:
        return self.on and self.logger.isEnabledFor(logging.INFO)

    def write(self, message: str) -> None:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        line = f"{self._stamp},{int((now - second) * 1000):03d} INFO {LOGGER}: {message}\n"
        self._parts.append(line)
        self._size += len(line)
        if self._size >= FLUSH_BYTES:
            self.flush()
        elif self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(text)
        stream.flush()
