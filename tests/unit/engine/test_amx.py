"""amx.py's pure part: reading the CPU flags."""

from __future__ import annotations

from vllm_operator.engine import amx

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\nbugs\t\t: spectre_v1\n"
ICELAKE = "processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni\n"


def test_amx_tile_is_read_from_the_flags_line() -> None:
    assert amx.has_amx_tile(SAPPHIRE)
    assert not amx.has_amx_tile(ICELAKE)
    assert not amx.has_amx_tile("bugs : amx_tile\n")  # only the flags line counts
    assert not amx.has_amx_tile("")
