"""Kubeconfig files that point real clients (kubectl, the official client, kopf) at the simulated API server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CONTEXT = "vllm-operator-sim"


def kubeconfig_dict(server_url: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT, "user": {"token": "sim-token"}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike[str], server_url: str, namespace: str = "default") -> Path:
    """Write (atomically) a kubeconfig whose current context talks to `server_url`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig_dict(server_url, namespace), sort_keys=False), encoding="utf-8")
    tmp.replace(target)
    return target
