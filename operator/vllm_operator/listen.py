"""One line for a listen socket that cannot be opened (`run`'s /healthz port, the router's port).

A port already taken, a privileged port or an address the host does not have is a setup mistake, not a bug: the
commands print which address and port failed and why, and exit 2, instead of a stack trace ending in
`OSError: [Errno 98]`. Other OSErrors are not about listening and propagate unchanged.
"""

from __future__ import annotations

import errno

LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL})


def listen_failure(err: OSError, host: str, port: int, flag: str = "--port") -> str | None:
    """The one-line message for a failed bind/listen on host:port, or None when `err` is something else."""
    if err.errno not in LISTEN_ERRNOS:
        return None
    why = {errno.EADDRINUSE: "the port is already in use by another process",
           errno.EACCES: "permission denied (ports below 1024 need privileges)",
           errno.EADDRNOTAVAIL: "this host has no such address"}[err.errno]
    shown = f"[{host}]" if ":" in host else host
    return f"cannot listen on {shown}:{port}: {why}; choose another port with {flag}"
