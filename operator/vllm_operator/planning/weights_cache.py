"""Where an engine pod's Hub weights come from: the weights cache (docs/weights-cache.md), decided once per plan.

Three forms, for a model whose source is the Hugging Face Hub (a `source.pvc` model is read from its own claim and
never cached):

* the node cache (default): the operator's `--weights-cache-host-path` directory on every node (chart value
  `weightsCache.hostPath`), limited to `--weights-cache-max-size` per node;
* the claim form (`model.cache.claim`): a PersistentVolumeClaim the operator creates for the deployment, limited to
  its size;
* off (`model.cache.enabled: false`, or an operator started with no host path and no claim in the spec): each pod
  downloads into its own emptyDir, as before the cache.

Pure: the operator-wide settings arrive as `NodeCache` in the PlanContext.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from vllm_operator import constants, names
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import WeightsCachePlan, WeightsClaimPlan
from vllm_operator.api.spec import VLLMDeploymentSpec

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([eE][0-9]+|[numkKMGTPE]i?)?$")
_FACTORS = {"": 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
            "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
CLAIM_HEADROOM = 0.95
"""Of a claim's size, what the cache may fill: file system metadata takes the rest."""


def quantity_bytes(text: str) -> int:
    """A Kubernetes quantity ("500Gi", "1.5T", "2e9") in bytes; ValueError naming the text otherwise."""
    m = _QUANTITY.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a quantity (e.g. 500Gi)")
    number, suffix = float(m.group(1)), m.group(2) or ""
    factor = 10 ** int(suffix[1:]) if suffix[:1] in ("e", "E") else _FACTORS.get(suffix)
    if factor is None:
        raise ValueError(f"{text!r} is not a quantity (e.g. 500Gi)")
    return int(number * factor)


@dataclass(frozen=True)
class NodeCache:
    """The operator-wide node cache: a directory on every node that runs engines (None: no node cache)."""

    host_path: str | None = constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH
    max_bytes: int = constants.DEFAULT_WEIGHTS_CACHE_MAX_BYTES

    def __post_init__(self) -> None:
        if self.host_path is not None and (not self.host_path.startswith("/") or self.host_path.rstrip("/") == ""
                                           or ".." in self.host_path.split("/")):
            raise ValueError(f"weights cache host path {self.host_path!r} must be an absolute directory other than "
                             "/ without '..'")
        if self.max_bytes < 1:
            raise ValueError(f"weights cache max size {self.max_bytes} must be at least 1 byte")


DEFAULT_NODE_CACHE = NodeCache()


def hub_repo(spec: VLLMDeploymentSpec) -> str | None:
    """The Hub repository of a Hub-sourced model (None for source.pvc)."""
    src = spec.model.source
    if src is not None and src.pvc is not None:
        return None
    hub = src.hugging_face if src is not None else None
    return hub.repo if hub is not None and hub.repo else spec.model.name


def plan(spec: VLLMDeploymentSpec, name: str, node: NodeCache) -> tuple[WeightsCachePlan | None,
                                                                          WeightsClaimPlan | None]:
    """(the pools' cache, the claim to create) for a spec; (None, None) when the weights are not cached."""
    repo = hub_repo(spec)
    cache = spec.model.cache
    if repo is None or (cache is not None and cache.enabled is False):
        return None, None
    src = spec.model.source
    revision = src.hugging_face.revision if src is not None and src.hugging_face is not None else None
    if cache is not None and cache.claim is not None:
        c = cache.claim
        try:
            size = quantity_bytes(c.size)
        except ValueError as err:
            raise SpecError("spec.model.cache.claim.size", str(err)) from err
        claim = WeightsClaimPlan(name=names.weights_claim(name), storage_class_name=c.storage_class_name,
                                 size=c.size, access_mode=c.access_mode, volume_name=c.volume_name)
        return WeightsCachePlan(claim_name=claim.name, repo=repo, revision=revision,
                                max_bytes=max(int(size * CLAIM_HEADROOM), 1)), claim
    if node.host_path is None:
        return None, None
    return WeightsCachePlan(host_path=node.host_path, repo=repo, revision=revision, max_bytes=node.max_bytes), None


def node_cache_argument_problem(path: str, size: str) -> tuple[NodeCache | None, str | None]:
    """(the NodeCache of `--weights-cache-host-path`/`--weights-cache-max-size`, None) or (None, what is wrong);
    an empty path turns the node cache off."""
    try:
        max_bytes = quantity_bytes(size)
        return NodeCache(host_path=path or None, max_bytes=max_bytes), None
    except ValueError as err:
        return None, str(err)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--weights-cache-host-path and --weights-cache-max-size, the same on `run`, `plan` and `render`."""
    parser.add_argument("--weights-cache-host-path", default=constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH,
                        metavar="DIR", help="node directory Hub weights are cached in, shared by the engine pods of "
                                            "a node (chart value weightsCache.hostPath; '' turns the node cache "
                                            "off; default %(default)s)")
    parser.add_argument("--weights-cache-max-size", default=f"{constants.DEFAULT_WEIGHTS_CACHE_MAX_BYTES >> 30}Gi",
                        metavar="QUANTITY", help="per-node limit of that cache; least-recently-used models no engine "
                                                 "uses are evicted to fit a new one (default %(default)s)")


def from_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> NodeCache:
    """The NodeCache of the parsed flags; exits through `parser.error` naming the flag when one is wrong."""
    cache, problem = node_cache_argument_problem(args.weights_cache_host_path, args.weights_cache_max_size)
    if cache is None:
        parser.error(f"--weights-cache-host-path/--weights-cache-max-size: {problem}")
    return cache
