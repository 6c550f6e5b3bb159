"""What the built images hold, read layer by layer from their OCI archives (what a registry would serve).

Every layer is read, not only the flattened filesystem: a file a later step deletes still ships in the layer that
added it. Checked: no compiler, no pip cache, no apt lists or caches, no wheel or source tree left from the build
stages, none of the project's test code or scripts (by content), and nothing of the build-time mounts (the machine's
CA bundle and pip configuration, which scripts/build-images.sh bind-mounts read-only into RUN steps: not their
contents, and no mount point a RUN step created); and the image config runs the Dockerfile's non-root user and
entrypoint, tagged as the operator's defaults resolve the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support import images
from tests.support.dockerfiles import IMAGES, parse
from tests.support.paths import ROOT
from vllm_operator import __version__
from vllm_operator.images import DEFAULT_IMAGES
from vllm_operator.planning import engine_args

pytestmark = pytest.mark.integration

BUILT = ["operator", "router", "engine-cpu"]
COMPILER = re.compile(r"^(usr/(local/)?bin/((x86_64-linux-gnu-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|tcc)"
                      r"(-[0-9.]+)?|ld|as)|usr/(lib|libexec)/gcc/.*/cc1(plus)?)$")
PIP_CACHE = re.compile(r"(^|/)\.cache/pip(/|$)|^tmp/pip-|^root/\.cache/")
BUILD_LEFTOVERS = re.compile(r"^(src|wheels|tmp/wheels|opt/build|tmp/requirements\.lock|tmp/constraints\.txt)(/|$)")
APT_CACHE = re.compile(r"^var/cache/apt/.+\.bin$|^var/lib/apt/lists/.+_(Packages|InRelease|Release)")
PIP_CONF = "etc/pip.conf"  # the base's own is empty: the mount point for the build machine's (debian-base.sh)
SHIPPED = {"scripts/vllm-cpu/requirements.lock"}  # engine-cpu keeps it beside its venv, by design
TEST_TREES = ("tests", "testcluster", "fakevllm", "benchmarks", "scripts")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _forbidden_contents() -> dict[tuple[int, str], str]:
    """(size, sha256) -> what it is: the project's test code and scripts, its source-tree files that a wheel does not
    install, and the build-time CA bundle and pip configuration of this machine."""
    wanted: dict[tuple[int, str], str] = {}
    tracked = subprocess.run(["git", "ls-files", *TEST_TREES, "pyproject.toml", "Makefile"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    for rel in tracked:
        if rel in SHIPPED:
            continue
        data = (ROOT / rel).read_bytes()
        if len(data) > 200:  # tiny files (empty __init__.py, one-liners) are not evidence of anything
            wanted[(len(data), _sha256(data))] = f"repository file {rel}"
    for path, what in ((os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"), "build-time CA bundle"),
                       ("/etc/pip.conf", "build-time pip configuration")):
        if Path(path).is_file() and Path(path).stat().st_size:
            data = Path(path).read_bytes()
            wanted[(len(data), _sha256(data))] = f"{what} {path}"
    return wanted


@pytest.fixture(scope="module")
def forbidden() -> dict[tuple[int, str], str]:
    return _forbidden_contents()


@pytest.mark.parametrize("name", BUILT)
def test_no_layer_holds_compilers_caches_sources_tests_or_build_mounts(
        name: str, forbidden: dict[tuple[int, str], str]) -> None:
    sizes = {size for size, _ in forbidden}
    problems: list[str] = []
    layers = 0
    for index, (digest, tar) in enumerate(images.archive_layers(images.image(name).archive)):
        layers += 1
        for member in tar:
            path = member.name.removeprefix("./")
            base = path.rsplit("/", 1)[-1]
            if base.startswith(".wh."):
                continue  # a whiteout deletes; what it deletes was checked in the layer that added it
            for pattern, what in ((COMPILER, "a compiler"), (PIP_CACHE, "a pip cache"), (APT_CACHE, "an apt cache"),
                                  (BUILD_LEFTOVERS, "a build-stage leftover")):
                if pattern.search(path):
                    problems.append(f"{digest[:19]}: {path} ({what})")
            if path == PIP_CONF and (index > 0 or member.size):
                problems.append(f"{digest[:19]}: {path} ({member.size} bytes; only the base's empty one may exist)")
            if member.isfile() and member.size in sizes:
                fh = tar.extractfile(member)
                assert fh is not None
                what_file = forbidden.get((member.size, _sha256(fh.read())))
                if what_file and index == 0 and path == "etc/ssl/certs/ca-certificates.crt":
                    continue  # the base's own bundle (mmdebstrap, no mounts), on a machine whose bundle is Debian's
                if what_file:
                    problems.append(f"{digest[:19]}: {path} is the {what_file}")
    assert layers >= 2
    assert not problems, f"{name}: " + "; ".join(problems[:20])


def test_the_forbidden_contents_are_found_where_they_are(tmp_path: Path,
                                                        forbidden: dict[tuple[int, str], str]) -> None:
    """The check above can fail: the machine's CA bundle is different from Debian's (so finding it means it leaked),
    and the repository's test files are among what it looks for."""
    ca = Path(os.environ.get("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt")).read_bytes()
    assert forbidden[(len(ca), _sha256(ca))].startswith("build-time CA bundle")
    conftest = (ROOT / "tests" / "conftest.py").read_bytes()
    assert len(conftest) <= 200 or (len(conftest), _sha256(conftest)) in forbidden
    data = (ROOT / "tests" / "support" / "images.py").read_bytes()
    assert forbidden[(len(data), _sha256(data))] == "repository file tests/support/images.py"


EXPECTED_REFS = {
    "operator": f"ghcr.io/vllm-operator/operator:{__version__}",
    "router": DEFAULT_IMAGES.router(),
    "engine-cpu": DEFAULT_IMAGES.engine(gpu=False, version=engine_args.DEFAULT_CPU_VERSION),
}


@pytest.mark.parametrize("name", BUILT)
def test_image_is_tagged_as_the_defaults_resolve_and_runs_the_dockerfiles_user_and_entrypoint(name: str) -> None:
    built = images.image(name)
    assert built.ref == EXPECTED_REFS[name]
    tags = images.podman("image", "inspect", "--format", "{{json .RepoTags}}", built.image_id).stdout
    assert built.ref in tags
    config = images.image_config(name)
    final = parse(IMAGES / f"{name}.Dockerfile").final
    assert config["User"] == final.last("USER").value[0]  # type: ignore[union-attr]
    assert config["Entrypoint"] == list(final.last("ENTRYPOINT").value)  # type: ignore[union-attr]
    env = dict(e.split("=", 1) for e in config.get("Env", []))
    assert not {k for k in env if k.startswith(("PIP_CERT", "PIP_INDEX", "PIP_FIND", "SSL_CERT", "REQUESTS_CA"))}


@pytest.mark.parametrize("name", BUILT)
def test_oci_archive_names_the_image_for_podman_and_containerd(name: str) -> None:
    """`ctr -n k8s.io images import` takes the name from the index's org.opencontainers.image.ref.name, as podman
    load does: it must be the full reference the operator renders."""
    with tarfile.open(images.image(name).archive) as outer:
        member = outer.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    (desc,) = index["manifests"]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == EXPECTED_REFS[name]
