"""amx.py's pure parts: reading the CPU flags and building vLLM's PYTHONPATH."""

from __future__ import annotations

import os

from vllm_operator.engine import amx

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\nbugs\t\t: spectre_v1\n"
ICELAKE = "processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n"


def test_amx_tile_is_read_from_the_flags_line() -> None:
    assert amx.has_amx_tile(SAPPHIRE)
    assert not amx.has_amx_tile(ICELAKE)
    assert not amx.has_amx_tile("bugs : amx_tile\n")  # only the flags line counts
    assert not amx.has_amx_tile("")


def test_site_dir_goes_first_once_and_the_rest_is_kept() -> None:
    site = str(amx.SITE_DIR)
    assert amx.child_env({"A": "1"}, True) == {"A": "1", "PYTHONPATH": site}
    env = amx.child_env({"PYTHONPATH": os.pathsep.join(["/img", site, "", "/x"])}, True)
    assert env["PYTHONPATH"] == os.pathsep.join([site, "/img", "/x"])


def test_without_amx_tiles_the_environment_is_unchanged() -> None:
    assert amx.child_env({"PYTHONPATH": "/img"}, False) == {"PYTHONPATH": "/img"}


def test_the_site_dir_holds_the_sitecustomize_the_package_ships() -> None:
    assert (amx.SITE_DIR / "sitecustomize.py").is_file()
