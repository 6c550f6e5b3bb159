"""The commands each deployable runs, executed from a plain (non-editable) install built from the images' context.

The context is assembled the way `docker build` would send it (the Dockerfiles' COPY sources filtered by
.dockerignore), a wheel is built from it with pip, and installed into fresh virtualenvs, one per deployable, each
given exactly the distributions its install would bring: the closure of the wheel's own requirements for that extra
(read from the installed wheel's metadata, markers evaluated), taken from the project venv through a directory of
symlinks and a .pth line rather than downloaded again:
- "bare" (`pip install vllm-operator`): `plan`, `render` and `crd` work, and nothing of the operator's or the
  router's dependencies is there;
- "router" (`'.[router]'`, images/router.Dockerfile): the router starts, serves, and imports nothing of the operator
  (no kopf, prometheus-api-client or cryptography, no planning/rendering/handlers module), checked on the modules a
  real run imported (`python -X importtime`);
- "operator" (`'.[operator]'`, images/operator.Dockerfile): every module of the controller imports, `run --help`
  works, and the router's dependencies (tokenizers, msgspec, httptools) are not there;
- "engine": the wheel with NO dependencies, as the engine Dockerfiles install it next to vLLM's own pins, plus only
  packages vLLM itself depends on (VLLM_PROVIDES), so the entrypoint wrapper must not need anything else.
So missing package data, a module missing from the wheel, or an import the deployable's extra does not provide
fails here.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import site
import subprocess
import sys
import urllib.error
import urllib.request
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.dockerfiles import DOCKERFILES, IMAGES, copy_sources, in_context, parse
from tests.support.paths import ROOT
from tests.support.router import MODEL, router_config


def assemble_context(dest: Path) -> None:
    sources = {s for path in DOCKERFILES for s in copy_sources(parse(path))}
    for source in sorted(sources):
        src = ROOT / source
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for file in files:
            rel = file.relative_to(ROOT).as_posix()
            if in_context(rel):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = tmp_path_factory.mktemp("context")
    assemble_context(ctx)
    out = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                           str(ctx)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    (built,) = out.glob("vllm_operator-*.whl")
    return built


# Top-level modules every vLLM image has because vLLM requires them (vllm's requirements: pydantic, pyyaml, and
# prometheus_client, which vLLM serves its own /metrics with; the engine wrapper's start-up status endpoint uses it).
VLLM_PROVIDES = ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection", "yaml",
                 "prometheus_client")


def provide_vllm_deps(purelib: Path, target: Path) -> None:
    """Expose only VLLM_PROVIDES from the project venv, through a directory of symlinks and a .pth line."""
    target.mkdir()
    for site_dir in map(Path, site.getsitepackages()):
        for entry in site_dir.iterdir():
            if entry.name.removesuffix(".py") in VLLM_PROVIDES and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    found = {p.name.removesuffix(".py") for p in target.iterdir()}
    assert found == set(VLLM_PROVIDES), f"missing in the project venv: {set(VLLM_PROVIDES) - found}"
    (purelib / "vllm-provides.pth").write_text(f"{target}\n")


def wheel_requirements(python: Path) -> list[Requirement]:
    """The installed wheel's requirements, extras' ones with their `extra == …` markers."""
    code = "import importlib.metadata as m, json; print(json.dumps(m.requires('vllm-operator') or []))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return [Requirement(r) for r in json.loads(out)]


def closure(requirements: list[Requirement], extra: str) -> set[str]:
    """Every distribution (canonical name) that installing `requirements` with `extra` ("" for none) brings, from
    the project venv's metadata."""
    found: set[tuple[str, str]] = set()
    todo = [(r, extra) for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in found:
                continue
            found.add((name, wanted))
            todo += [(Requirement(r), wanted) for r in importlib.metadata.distribution(name).requires or []]
    return {name for name, _ in found}


def provide(purelib: Path, target: Path, dists: set[str]) -> None:
    """Expose only `dists` from the project venv (their top-level modules and metadata), through a directory of
    symlinks and a .pth line."""
    target.mkdir()
    for name in sorted(dists):
        dist = importlib.metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            if not (target / top).exists() and (base / top).exists():
                (target / top).symlink_to(base / top)
    (purelib / "deps.pth").write_text(f"{target}\n")


def make_venv(root: Path, wheel: Path, extra: str | None) -> Path:
    """A venv with the wheel and the distributions an install of `extra` brings ("" none; None: the engine's
    install, --no-deps beside vLLM's own)."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    if extra is None:
        provide_vllm_deps(purelib, root / "vllm-provides")
    else:
        provide(purelib, root / "deps", closure(wheel_requirements(python), extra))
    return root


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("bare"), wheel, "")


@pytest.fixture(scope="module")
def router_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("router"), wheel, "router")


@pytest.fixture(scope="module")
def operator_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("operator"), wheel, "operator")


@pytest.fixture(scope="module")
def engine_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("engine"), wheel, None)


ENVS = {"operator": "operator_env", "router": "router_env"}


def importable(env: Path, module: str, cwd: Path) -> bool:
    return subprocess.run([str(env / "bin" / "python"), "-c", f"import {module}"], capture_output=True, cwd=cwd,
                          check=False).returncode == 0


def run(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(env / "bin" / "vllm-operator"), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False, env={"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)})


def test_installed_package_is_the_wheel_not_the_checkout(router_env: Path, tmp_path: Path) -> None:
    code = "import vllm_operator; print(vllm_operator.__file__)"
    proc = subprocess.run([str(router_env / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=True)
    assert str(router_env) in proc.stdout, proc.stdout


def image_help_command(name: str) -> list[str]:
    """The image's ENTRYPOINT up to its subcommand, plus --help."""
    final = parse(IMAGES / f"{name}.Dockerfile").final
    argv = [a for a in final.last("ENTRYPOINT").value if a != "--"]  # type: ignore[union-attr]
    if len(argv) == 1:
        argv.append(final.last("CMD").value[0])  # type: ignore[union-attr]
    assert argv[0] == "vllm-operator"
    return [*argv[1:], "--help"]


@pytest.mark.parametrize("name", ["operator", "router"])
def test_image_command_runs_from_its_extra(request: pytest.FixtureRequest, tmp_path: Path, name: str) -> None:
    env: Path = request.getfixturevalue(ENVS[name])
    proc = run(env, *image_help_command(name), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_router_serves_from_its_extra_and_imports_nothing_of_the_operator(router_env: Path, tmp_path: Path) -> None:
    """A real run of `vllm-operator router` (start, /livez, /v1/models, a chat request answered 503 for want of
    engines): every module it imported, by `python -X importtime`, is the router's or the shared core's."""
    config = router_config()
    (tmp_path / "router.json").write_text(config.model_dump_json(by_alias=True))
    log = tmp_path / "stderr"  # a file, not a pipe: -X importtime writes more than a pipe holds before the start
    proc = subprocess.Popen([str(router_env / "bin" / "python"), "-X", "importtime", "-m", "vllm_operator.cli",
                             "router", "--config", str(tmp_path / "router.json"), "--host", "127.0.0.1",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=tmp_path,
                            env={"PATH": f"{router_env / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("router listening on http://"), line
        url = line.split()[-1]
        with urllib.request.urlopen(url + "/livez", timeout=10) as response:
            assert response.status == 200
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == MODEL
        chat = urllib.request.Request(url + "/v1/chat/completions", method="POST", headers={
            "Content-Type": "application/json"}, data=json.dumps({
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(chat, timeout=10)
        assert answer.value.code == 503
        assert json.load(answer.value)["error"]["code"] == "no_healthy_endpoint"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    stderr = log.read_text()
    imported = {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", stderr, re.M)}
    assert "vllm_operator.router.proxy" in imported and "msgspec" in imported
    operator_only = {m for m in imported if m.split(".")[0] in {"kopf", "prometheus_api_client", "cryptography"}
                     or m.startswith(("vllm_operator.handlers", "vllm_operator.health", "vllm_operator.planning",
                                      "vllm_operator.rendering", "vllm_operator.engine", "vllm_operator.certs"))}
    assert operator_only == set()
    for module in ("kopf", "prometheus_api_client", "cryptography"):
        assert not importable(router_env, module, tmp_path), f"{module} is installed with the router"


def test_every_operator_module_imports_from_its_extra(operator_env: Path, tmp_path: Path) -> None:
    """The controller's whole package (what `run` loads, and what it loads later, as the health loop's Prometheus
    source), without the router's dependencies."""
    packages = ["handlers", "health", "planning", "rendering", "api"]
    modules = ["vllm_operator.k8s", "vllm_operator.certs", *(
        f"vllm_operator.{p}.{m.stem}" for p in packages for m in (ROOT / "operator" / "vllm_operator" / p).glob(
            "*.py") if m.stem != "__init__")]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    proc = subprocess.run([str(operator_env / "bin" / "python"), "-c", code, *modules], capture_output=True,
                          text=True, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    for module in ("tokenizers", "msgspec", "httptools", "jinja2"):
        assert not importable(operator_env, module, tmp_path), f"{module} is installed with the operator"


def test_bare_install_plans_renders_and_prints_the_crd(bare_env: Path, tmp_path: Path) -> None:
    """`pip install vllm-operator` with no extra: the offline commands a user runs on a laptop."""
    example = ROOT / "examples" / "chat.yaml"
    planned = run(bare_env, "plan", "-f", str(example), cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert "--max-model-len" in planned.stdout
    rendered = run(bare_env, "render", "-f", str(example), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: Deployment" in rendered.stdout
    crd = run(bare_env, "crd", cwd=tmp_path)
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == (ROOT / "crds" / "vllm-operator.dev_vllmdeployments.yaml").read_text()
    for module in ("kopf", "aiohttp", "kubernetes_asyncio", "tokenizers", "cryptography", "prometheus_client"):
        assert not importable(bare_env, module, tmp_path), f"{module} is installed without an extra"


@pytest.mark.parametrize("name", ["engine-gpu", "engine-cpu"])
def test_engine_wrapper_runs_with_what_the_vllm_image_has(engine_env: Path, tmp_path: Path, name: str) -> None:
    proc = run(engine_env, *image_help_command(name), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_engine_install_ships_the_sitecustomize(engine_env: Path, tmp_path: Path) -> None:
    """The wrapper puts engine/vllm_site first on vLLM's PYTHONPATH (engine/childsite.py): a wheel without its two
    files would leave vLLM's CPU workers to die of SIGILL on AMX hosts and to refuse their KV cache on a node with a
    cold page cache."""
    code = "from vllm_operator.engine import childsite; print(childsite.SITE_DIR)"
    proc = subprocess.run([str(engine_env / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=True)
    site = Path(proc.stdout.strip())
    assert str(engine_env) in str(site), proc.stdout
    assert "ARCH_REQ_XCOMP_PERM" in (site / "sitecustomize.py").read_text()
    assert "total_inactive_file" in (site / "_vllm_operator_working_set.py").read_text()


def test_engine_env_really_lacks_the_operator_dependencies(engine_env: Path, tmp_path: Path) -> None:
    for module in ("kopf", "kubernetes", "aiohttp", "tokenizers"):
        assert not importable(engine_env, module, tmp_path), f"{module} leaked into the engine environment"


def test_cli_help_from_a_plain_install(bare_env: Path, tmp_path: Path) -> None:
    proc = run(bare_env, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "usage: vllm-operator" in proc.stdout
