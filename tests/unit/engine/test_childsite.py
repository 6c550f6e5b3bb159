"""childsite.py: the environment that puts the wrapper's `sitecustomize` in every Python process of vLLM's."""

from __future__ import annotations

import os

from vllm_operator.engine import childsite

SITE = str(childsite.SITE_DIR)


def test_the_site_dir_goes_first_once_and_the_rest_is_kept_in_order() -> None:
    assert childsite.child_env({"A": "1"}, False) == {"A": "1", "PYTHONPATH": SITE}
    env = childsite.child_env({"PYTHONPATH": os.pathsep.join(["/img", SITE, "", "/x"])}, False)
    assert env["PYTHONPATH"] == os.pathsep.join([SITE, "/img", "/x"])


def test_the_amx_request_is_switched_on_only_where_the_cpu_has_tiles() -> None:
    assert childsite.child_env({}, True)[childsite.AMX_TILE_ENV] == "1"
    assert childsite.AMX_TILE_ENV not in childsite.child_env({}, False)
    # a switch inherited from the pod's environment does not outlive a host without tiles
    assert childsite.AMX_TILE_ENV not in childsite.child_env({childsite.AMX_TILE_ENV: "1"}, False)


def test_the_site_dir_holds_both_modules_the_package_ships() -> None:
    site = (childsite.SITE_DIR / "sitecustomize.py").read_text()
    assert childsite.AMX_TILE_ENV in site and "_vllm_operator_working_set" in site
    assert (childsite.SITE_DIR / "_vllm_operator_working_set.py").is_file()
