"""A local server that speaks the part of the Hugging Face Hub API `huggingface_hub` uses to fetch a model (test
support only; it listens on loopback or in a test's own network namespace, never off-machine).

Routes: `GET /api/models/<org>/<name>[/revision/<rev>]` (model info: sha, siblings with size and LFS sha256),
`HEAD|GET /<org>/<name>/resolve/<rev>/<file>` (ETag, X-Repo-Commit, Content-Length, and Range for resume). Gated
repositories answer 401/403 with `X-Error-Code: GatedRepo` unless the request's bearer token is in the repo's allowed
set. Every request is counted (`requests`), and so are the body bytes sent (`bytes_sent`). `throttle_bytes_per_s`
slows file bodies down (to kill a fetch halfway); `fail_with` makes every call answer that status.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_MIN_BYTES = 1024
"""Files at least this big are listed as LFS objects (with a SHA-256), as the Hub lists weights."""


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = COMMIT
    allowed_tokens: set[str] | None = None
    """None: public; otherwise gated, readable with these bearer tokens only."""


@dataclass
class HubState:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    bytes_sent: int = 0
    throttle_bytes_per_s: float | None = None
    fail_with: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, n_bytes: int = 0) -> None:
        with self.lock:
            self.requests[kind] += 1
            self.bytes_sent += n_bytes

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_sent = 0


def model_dir_files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?/?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


def _etag(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def handler_for(state: HubState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  head: bool = False, throttle: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self._write_body(body, state.throttle_bytes_per_s if throttle else None)

        def _write_body(self, body: bytes, rate: float | None) -> None:
            if not rate:
                self.wfile.write(body)
                return
            chunk = max(int(rate / 10), 1)
            for i in range(0, len(body), chunk):
                self.wfile.write(body[i:i + chunk])
                self.wfile.flush()
                time.sleep(0.1)

        def _repo(self, name: str) -> Repo | None:
            return state.repos.get(name)

        def _denied(self, repo: Repo, head: bool) -> bool:
            if repo.allowed_tokens is None:
                return False
            auth = self.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
            if token in repo.allowed_tokens:
                return False
            status = 401 if token is None else 403
            self._send(status, json.dumps({"error": "Access to model is restricted."}).encode(),
                       {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to model is restricted.",
                        "Content-Type": "application/json"}, head)
            return True

        def _handle(self, head: bool) -> None:
            if state.fail_with is not None:
                state.count("failed")
                self._send(state.fail_with, b"{}", {"Content-Type": "application/json"}, head)
                return
            path = urllib.parse.unquote(self.path.split("?", 1)[0])
            if (m := INFO.match(path)) is not None:
                self._info(m.group("repo"), m.group("rev"), head)
                return
            if (m := RESOLVE.match(path)) is not None:
                self._resolve(m.group("repo"), m.group("rev"), m.group("file"), head)
                return
            state.count("unknown")
            self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)

        def _info(self, name: str, rev: str | None, head: bool) -> None:
            state.count("info")
            repo = self._repo(name)
            if repo is None:
                self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, head)
                return
            if self._denied(repo, head):
                return
            if rev not in (None, "main", repo.commit):
                self._send(404, b"{}", {"X-Error-Code": "RevisionNotFound"}, head)
                return
            siblings = []
            for fname, body in sorted(repo.files.items()):
                entry: dict[str, Any] = {"rfilename": fname, "size": len(body), "blobId": _etag(body)[:40]}
                if len(body) >= LFS_MIN_BYTES:
                    entry["lfs"] = {"sha256": _etag(body), "size": len(body), "pointerSize": 134}
                siblings.append(entry)
            info = {"id": name, "modelId": name, "sha": repo.commit, "private": False,
                    "gated": "manual" if repo.allowed_tokens is not None else False, "siblings": siblings,
                    "tags": [], "downloads": 0, "likes": 0}
            self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)

        def _resolve(self, name: str, rev: str, fname: str, head: bool) -> None:
            repo = self._repo(name)
            if repo is None:
                state.count("resolve")
                self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, head)
                return
            if self._denied(repo, head):
                state.count("resolve")
                return
            body = repo.files.get(fname)
            if body is None or rev not in ("main", repo.commit):
                state.count("resolve")
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                return
            headers = {"ETag": f'"{_etag(body)}"', "X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                       "Content-Type": "application/octet-stream"}
            rng = self.headers.get("Range")
            start = 0
            if rng and (m := re.match(r"bytes=(\d+)-(\d*)", rng)):
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else len(body) - 1
                part = body[start:end + 1]
                headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
                state.count("head" if head else "range", 0 if head else len(part))
                self._send(206, part, headers, head, throttle=True)
                return
            state.count("head" if head else "get", 0 if head else len(body))
            self._send(200, body, headers, head, throttle=True)

        def do_GET(self) -> None:
            self._handle(head=False)

        def do_HEAD(self) -> None:
            self._handle(head=True)

    return Handler


class HubServer:
    """`with HubServer(state) as hub: hub.url` — a ThreadingHTTPServer on 127.0.0.1 (or `host`)."""

    def __init__(self, state: HubState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        self.server = ThreadingHTTPServer((host, port), handler_for(state))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
