"""The weights cache in the plan: which form a spec gets, what the pools read, and the budgets kept cold."""

from __future__ import annotations

import pytest

from tests.unit.planning.helpers import make_plan, make_spec
from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.resource import parse_spec
from vllm_operator.planning import RemediationState, plan
from vllm_operator.planning.planner import WAKE_ENGINE_START_S, cold_download_s
from vllm_operator.planning.weights_cache import NodeCache, quantity_bytes

SLEEPING_LONG = {"long": {"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}}


def test_a_hub_model_is_read_from_the_node_cache_by_both_pools() -> None:
    p = make_plan()
    short, long = p.pools["short"].weights_cache, p.pools["long"].weights_cache
    assert short is not None and short == long, "one cache entry for both pools: fetched once per node"
    assert (short.host_path, short.claim_name) == (constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH, None)
    assert short.max_bytes == constants.DEFAULT_WEIGHTS_CACHE_MAX_BYTES and short.revision is None
    assert p.pools["short"].model == p.pools["long"].model == constants.WEIGHTS_LINK
    assert p.weights_claim is None


def test_the_operators_node_cache_settings_reach_the_plan() -> None:
    spec = make_spec()
    mine = plan(spec, None, RemediationState(), name="demo", namespace="ns",
                node_cache=NodeCache(host_path="/srv/models", max_bytes=2**40))
    cache = mine.pools["short"].weights_cache
    assert cache is not None and (cache.host_path, cache.max_bytes) == ("/srv/models", 2**40)
    none = plan(spec, None, RemediationState(), name="demo", namespace="ns", node_cache=NodeCache(host_path=None))
    assert none.pools["short"].weights_cache is None, "an operator without a node cache: per-pod downloads"
    assert none.pools["short"].model == "meta-llama/Llama-3.1-8B-Instruct"
    assert none.pools["short"].env["HF_HOME"].startswith(constants.MODELS_MOUNT)


def test_cache_off_and_pvc_sources_are_not_cached() -> None:
    off = make_plan(model={"cache": {"enabled": False}})
    assert off.pools["short"].weights_cache is None and off.weights_claim is None
    pvc = make_plan(model={"source": {"pvc": {"claimName": "store", "path": "llama"}}})
    assert pvc.pools["short"].weights_cache is None and pvc.pools["short"].model_claim == "store"
    assert pvc.pools["short"].model == f"{constants.MODELS_MOUNT}/llama"


def test_the_claim_form_creates_a_claim_shared_by_both_pools() -> None:
    p = make_plan(model={"source": {"huggingFace": {"revision": "v1"}},
                         "cache": {"claim": {"size": "200Gi", "storageClassName": "", "volumeName": "pv-1"}}})
    claim = p.weights_claim
    assert claim is not None and claim.name == "demo-weights" and claim.size == "200Gi"
    assert (claim.storage_class_name, claim.access_mode, claim.volume_name) == ("", "ReadWriteMany", "pv-1")
    cache = p.pools["long"].weights_cache
    assert cache is not None and cache.claim_name == "demo-weights" and cache.host_path is None
    assert cache.max_bytes == int(200 * 2**30 * 0.95) and cache.revision == "v1"


def test_cache_rules_name_the_field() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**make_spec().model_dump(by_alias=True, exclude_none=True),
                    "model": {"name": "x/y", "source": {"pvc": {"claimName": "m"}}, "cache": {"enabled": True}}})
    assert "model.cache is for Hugging Face sources" in str(err.value)


@pytest.mark.parametrize(("text", "expected"), [("500Gi", 500 * 2**30), ("1.5T", 1_500_000_000_000),
                                                ("2e9", 2_000_000_000), ("1024", 1024), ("64Mi", 64 * 2**20)])
def test_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text) == expected


def test_a_bad_quantity_or_node_path_is_refused_in_words() -> None:
    with pytest.raises(ValueError, match="'lots' is not a quantity"):
        quantity_bytes("lots")
    with pytest.raises(ValueError, match="must be an absolute directory"):
        NodeCache(host_path="models")
    with pytest.raises(ValueError, match="must be an absolute directory"):
        NodeCache(host_path="/")
    with pytest.raises(ValueError, match="at least 1 byte"):
        NodeCache(max_bytes=0)


def test_the_wake_budget_of_a_hub_model_stays_cold() -> None:
    """A woken pod may land on a node that never fetched the model (or evicted it): the plan cannot know, so the
    router holds a request for the download too, within the request's own timeout."""
    long_timeout = {"timeouts": {"totalSeconds": 7200}}
    hub = make_plan(pools=SLEEPING_LONG, routing=long_timeout)
    claim = make_plan(pools=SLEEPING_LONG, routing=long_timeout, model={"source": {"pvc": {"claimName": "m"}}})
    pool = hub.pools["long"]
    download = cold_download_s(pool, hub.accelerator)
    assert download == pool.kv.breakdown.weights_bytes / constants.WEIGHTS_DOWNLOAD_BYTES_PER_S > 600
    hub_wake, claim_wake = hub.router.pools.long.wake_seconds, claim.router.pools.long.wake_seconds
    assert claim_wake == 330.0 and hub_wake is not None
    assert hub_wake == pytest.approx(claim_wake + download)
    capped = make_plan(pools=SLEEPING_LONG).router.pools.long.wake_seconds
    assert capped == 540.0, "within the default 600 s total timeout, less 10 %"
    assert WAKE_ENGINE_START_S[True] == 240


def test_the_plan_table_says_where_the_weights_are_cached() -> None:
    from vllm_operator.planning.cli import format_table

    text = format_table(make_plan(model={"source": {"huggingFace": {"revision": "v1"}}}))
    assert (f"  weights  meta-llama/Llama-3.1-8B-Instruct@v1 fetched once into the node cache "
            f"{constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH} (limit 500.00 GiB)") in text
    claim = format_table(make_plan(model={"cache": {"claim": {"size": "100Gi"}}}))
    assert "fetched once into the claim demo-weights (limit 95.00 GiB)" in claim
    assert "  weights  " not in format_table(make_plan(model={"cache": {"enabled": False}}))
