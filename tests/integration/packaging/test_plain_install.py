"""The commands the images run, executed from a plain (non-editable) install built from the images' build context.

The context is assembled the way `docker build` would send it (the Dockerfiles' COPY sources filtered by
.dockerignore), a wheel is built from it with pip, and installed into fresh virtualenvs:
- "operator/router image": the wheel with its dependencies (taken from the project venv through a .pth line rather
  than downloaded again), so missing package data or a missing module in the wheel fails here;
- "engine image": the wheel with NO dependencies, as the engine Dockerfiles install it next to vLLM's own pins, plus
  only packages vLLM itself depends on (VLLM_PROVIDES: pydantic for its configs, PyYAML), so the entrypoint wrapper
  must not need kopf, kubernetes, aiohttp or anything else the operator installs.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support.dockerfiles import DOCKERFILES, IMAGES, copy_sources, in_context, parse
from tests.support.paths import ROOT


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


def make_venv(root: Path, wheel: Path, *, with_deps: bool) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                           str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    if with_deps:
        # Appended after the venv's own site-packages: the wheel's vllm_operator wins over the editable checkout.
        (purelib / "project-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    else:
        provide_vllm_deps(purelib, root / "vllm-provides")
    return root


@pytest.fixture(scope="module")
def full_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("full"), wheel, with_deps=True)


@pytest.fixture(scope="module")
def bare_env(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    return make_venv(tmp_path_factory.mktemp("bare"), wheel, with_deps=False)


def run(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(env / "bin" / "vllm-operator"), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False, env={"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)})


def test_installed_package_is_the_wheel_not_the_checkout(full_env: Path, tmp_path: Path) -> None:
    code = "import vllm_operator; print(vllm_operator.__file__)"
    proc = subprocess.run([str(full_env / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=True)
    assert str(full_env) in proc.stdout, proc.stdout


def image_help_command(name: str) -> list[str]:
    """The image's ENTRYPOINT up to its subcommand, plus --help."""
    final = parse(IMAGES / f"{name}.Dockerfile").final
    argv = [a for a in final.last("ENTRYPOINT").value if a != "--"]  # type: ignore[union-attr]
    if len(argv) == 1:
        argv.append(final.last("CMD").value[0])  # type: ignore[union-attr]
    assert argv[0] == "vllm-operator"
    return [*argv[1:], "--help"]


@pytest.mark.parametrize("name", ["operator", "router"])
def test_image_command_runs_from_a_plain_install(full_env: Path, tmp_path: Path, name: str) -> None:
    proc = run(full_env, *image_help_command(name), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


@pytest.mark.parametrize("name", ["engine-gpu", "engine-cpu"])
def test_engine_wrapper_runs_with_what_the_vllm_image_has(bare_env: Path, tmp_path: Path, name: str) -> None:
    proc = run(bare_env, *image_help_command(name), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_engine_install_ships_the_amx_sitecustomize(bare_env: Path, tmp_path: Path) -> None:
    """The wrapper puts engine/amx_site first on vLLM's PYTHONPATH (engine/amx.py): a wheel without the file would
    leave vLLM's CPU workers to die of SIGILL on AMX hosts."""
    code = "from vllm_operator.engine import amx; print(amx.SITE_DIR / 'sitecustomize.py')"
    proc = subprocess.run([str(bare_env / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=True)
    shipped = Path(proc.stdout.strip())
    assert str(bare_env) in str(shipped) and shipped.is_file(), proc.stdout
    assert "ARCH_REQ_XCOMP_PERM" in shipped.read_text()


def test_engine_env_really_lacks_the_operator_dependencies(bare_env: Path, tmp_path: Path) -> None:
    for module in ("kopf", "kubernetes", "aiohttp", "tokenizers"):
        proc = subprocess.run([str(bare_env / "bin" / "python"), "-c", f"import {module}"], capture_output=True,
                              text=True, cwd=tmp_path, check=False)
        assert proc.returncode != 0, f"{module} leaked into the engine environment"


def test_cli_and_generated_crd_from_a_plain_install(full_env: Path, tmp_path: Path) -> None:
    proc = run(full_env, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "usage: vllm-operator" in proc.stdout
    crd = run(full_env, "crd", cwd=tmp_path)
    assert crd.returncode == 0, crd.stderr
    assert crd.stdout == (ROOT / "crds" / "vllm-operator.dev_vllmdeployments.yaml").read_text()
