"""plan(): examples, class profiles in the arguments, max_tokens semantics, router config, pods' facts, warnings."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.paths import EXAMPLE_FILES
from tests.unit.planning.helpers import arg, make_plan, make_spec
from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.api.plan import Plan
from vllm_operator.api.resource import parse_resource, parse_spec
from vllm_operator.api.spec import SecretKeyRef, Toleration
from vllm_operator.handlers import conditions
from vllm_operator.planning import RemediationState, catalog, plan, profiles
from vllm_operator.planning.catalog import GIB
from vllm_operator.planning.planner import check_name


def plan_file(path: Path) -> Plan:
    resource = parse_resource(yaml.safe_load(path.read_text()))
    return plan(resource.spec, None, RemediationState(), name=resource.metadata.name,
                namespace=resource.metadata.namespace)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_every_example_plans(path: Path) -> None:
    p = plan_file(path)
    written = yaml.safe_load(path.read_text())["spec"].get("pools") or {}
    assert set(p.pools) == {"short", "long"}
    for pool in p.pools.values():
        assert pool.kv.planned_tokens >= pool.max_model_len  # at least one full sequence fits
        extra = [str(a) for a in (written.get(pool.name) or {}).get("extraArgs", [])]
        managed = pool.engine_args[:len(pool.engine_args) - len(extra)]
        assert managed == sorted(managed) and pool.engine_args[len(managed):] == extra  # extraArgs go last, as given
        assert f"--max-model-len={pool.max_model_len}" in pool.engine_args
        assert f'--override-generation-config={{"max_new_tokens":{pool.max_tokens}}}' in pool.engine_args
        assert "--host=$(POD_IP)" in pool.engine_args and f"--port={constants.ENGINE_PORT}" in pool.engine_args
    assert plan_file(path) == p  # deterministic, hash included


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_example_shows_its_class_profile(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    p = plan_file(path)
    prof = profiles.builtin(doc["spec"]["workloadClass"])
    for name, pool in p.pools.items():
        overrides = (doc["spec"].get("pools") or {}).get(name) or {}
        want = prof.pool(name)
        assert arg(p, name, "--max-num-seqs") == str(overrides.get("maxNumSeqs", want.max_num_seqs))
        assert arg(p, name, "--max-num-batched-tokens") == str(
            overrides.get("maxNumBatchedTokens", want.max_num_batched_tokens))
        assert pool.max_model_len == overrides.get("maxModelLen", want.max_model_len)
        if want.chunked_prefill:
            assert arg(p, name, "--enable-chunked-prefill") == ""


def test_long_doc_long_pool_is_chunked_fp8_on_h100() -> None:
    p = make_plan(workloadClass="long-doc")
    assert arg(p, "long", "--enable-chunked-prefill") == ""
    assert arg(p, "long", "--kv-cache-dtype") == "fp8"
    assert arg(p, "long", "--max-num-batched-tokens") == "8192"
    assert arg(p, "long", "--max-num-seqs") == "8"
    assert arg(p, "short", "--kv-cache-dtype") == "auto"
    assert p.pools["long"].max_model_len == 32768 and p.pools["long"].max_tokens == 4096


@pytest.mark.parametrize(("gpu", "dtype"), [("nvidia-a100-80gb", "auto"), ("nvidia-l40s-48gb", "fp8"),
                                            ("nvidia-h200-141gb", "fp8")], ids=["a100-no-native", "l40s", "h200"])
def test_long_doc_fp8_only_where_native(gpu: str, dtype: str) -> None:
    assert arg(make_plan(workloadClass="long-doc", accelerator={"type": gpu}), "long", "--kv-cache-dtype") == dtype


def test_chat_short_leaves_chunked_prefill_to_the_engine() -> None:
    p = make_plan()
    assert arg(p, "short", "--enable-chunked-prefill") is None
    assert arg(p, "long", "--enable-chunked-prefill") == ""


def test_chunked_prefill_forced_when_batch_shorter_than_length() -> None:
    p = make_plan(pools={"short": {"maxNumBatchedTokens": 1024}})
    assert arg(p, "short", "--enable-chunked-prefill") == ""


def test_llama_8b_chat_on_l4_plans_with_a_warning() -> None:
    p = make_plan(accelerator={"type": "nvidia-l4-24gb"})
    short = p.pools["short"]
    assert short.kv.planned_tokens > 4096
    assert any("fit in the KV cache" in w and "expects at least 16" in w for w in short.warnings)


def test_fp8_on_request_on_a100_warns() -> None:
    p = make_plan(accelerator={"type": "nvidia-a100-80gb"}, pools={"short": {"kvCacheDtype": "fp8"}})
    assert arg(p, "short", "--kv-cache-dtype") == "fp8"
    assert any("not native" in w for w in p.pools["short"].warnings)


def test_profile_lengths_clamped_to_native_context_with_warning() -> None:
    p = make_plan(model={"name": "THUDM/glm-4-9b"}, workloadClass="rag")
    assert p.pools["long"].max_model_len == 8192
    assert any("native context" in w for w in p.pools["long"].warnings)


def test_fp8_halves_bytes_and_doubles_tokens_roughly() -> None:
    bf16 = make_plan(pools={"short": {"kvCacheDtype": "auto"}}).pools["short"].kv
    fp8 = make_plan(pools={"short": {"kvCacheDtype": "fp8"}}).pools["short"].kv
    assert fp8.bytes_per_token * 2 == bf16.bytes_per_token
    assert abs(fp8.planned_tokens - 2 * bf16.planned_tokens) <= 16


def test_tensor_parallel_70b_on_four_h100() -> None:
    p = make_plan(model={"name": "meta-llama/Llama-3.1-70B-Instruct"}, accelerator={"count": 4})
    long = p.pools["long"]
    assert arg(p, "long", "--tensor-parallel-size") == "4"
    assert long.resources.limits[constants.GPU_RESOURCE] == "4"
    assert long.kv.bytes_per_token == 2 * 80 * 2 * 128 * 2  # 8 KV heads over 4 GPUs
    assert long.kv.breakdown.weights_bytes == catalog.catalog_model("meta-llama/Llama-3.1-70B").weights_bytes // 4


def test_single_gpu_has_no_tensor_parallel_flag() -> None:
    assert arg(make_plan(), "short", "--tensor-parallel-size") is None


def test_quantized_checkpoint_shrinks_weights_and_sets_flag() -> None:
    plain = make_plan().pools["short"].kv
    awq = make_plan(model={"quantization": "awq"})
    assert arg(awq, "short", "--quantization") == "awq"
    # 4-bit linear layers with group scales and zeros, 16-bit embeddings and LM head (2.1 B of the 8.0 B params):
    # 5.48 GiB (hugging-quants' AWQ INT4 checkpoint of Llama-3.1-8B is 5.73 GB = 5.34 GiB on disk with 4-bit zeros;
    # vLLM's Machete kernel on Hopper keeps them in 16 bit).
    assert awq.pools["short"].kv.breakdown.weights_bytes / GIB == pytest.approx(5.48, abs=0.01)
    assert awq.pools["short"].kv.planned_tokens > plain.planned_tokens


# --- max_tokens semantics and the router ------------------------------------------------------------------------

def test_tier_default_filled_from_cap() -> None:
    p = make_plan(routing={"tiers": [{"name": "free", "defaultMaxTokens": 100, "maxTokens": 512},
                                     {"name": "pro", "maxTokens": 1024}]})
    assert [(t.name, t.default_max_tokens, t.max_tokens) for t in p.router.tiers] == [
        ("free", 100, 512), ("pro", 1024, 1024)]


def test_default_tier_without_tiers() -> None:
    p = make_plan()
    assert [(t.name, t.default_max_tokens, t.max_tokens) for t in p.router.tiers] == [("default", 512, 1024)]


def test_tier_cap_equal_to_long_max_tokens_is_fine() -> None:
    p = make_plan(pools={"long": {"maxTokens": 2048}}, routing={"tiers": [{"name": "a", "maxTokens": 2048}]})
    assert p.router.tiers[0].max_tokens == 2048


def test_threshold_and_prompt_ranges() -> None:
    p = make_plan()
    assert p.router.prompt_length_threshold == 4096 - 512
    assert p.pools["short"].prompt_range == (0, 3584)
    assert p.pools["long"].prompt_range == (3584, 16384)
    explicit = make_plan(routing={"promptLengthThreshold": 2000})
    assert explicit.router.prompt_length_threshold == 2000


def test_pool_max_tokens_is_the_engine_fuse() -> None:
    p = make_plan(pools={"short": {"maxTokens": 300}})
    assert arg(p, "short", "--override-generation-config") == '{"max_new_tokens":300}'
    assert p.router.pools.short.max_tokens == 300


def test_max_tokens_default_shrinks_with_a_short_override() -> None:
    p = make_plan(pools={"short": {"maxModelLen": 512}})
    assert p.pools["short"].max_tokens == 256


def test_router_config_defaults() -> None:
    r = make_plan().router
    assert (r.timeouts.connect_seconds, r.timeouts.first_byte_seconds, r.timeouts.idle_seconds,
            r.timeouts.total_seconds) == (2, 60, 30, 600)
    assert r.max_body_bytes == 8 * 1024 * 1024
    assert r.over_limit.value == "clamp"
    assert r.api_keys_dir is None
    assert r.pools.short.service is not None and r.pools.short.service.name == "demo-short"
    assert r.pools.long.service is not None and r.pools.long.service.namespace == "ns"
    assert r.pools.long.service.port == constants.ENGINE_PORT
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (r.tokenizer.hf_repo, r.tokenizer.path, r.tokenizer.hf_token_file) == (
        "meta-llama/Llama-3.1-8B-Instruct", None, None)


@pytest.mark.parametrize(("workload", "strategy"), [
    ("chat", "least-outstanding"), ("multi-turn", "prefix"), ("rag", "prefix"), ("long-doc", "prefix")])
def test_routing_strategy_defaults_per_class_and_prefix_blocks_follow_the_engine(workload: str,
                                                                                  strategy: str) -> None:
    p = make_plan(workloadClass=workload)
    for name in ("short", "long"):
        route = getattr(p.router.pools, name)
        assert route.strategy.value == strategy == profiles.builtin(workload).pool(name).routing
        assert route.prefix.block_tokens == 16  # the GPU engine's KV block
        blocks = p.pools[name].kv.planned_tokens // 16 * 8  # eight replicas' worth, whatever the pool's replicas
        assert route.prefix.index_blocks == min(max(blocks, 1024), 262_144)
        assert route.prefix.load_factor == 1.25


def test_a_replicas_edit_leaves_the_router_config_unchanged() -> None:
    """router.json is the router pods' rolling hash: sizing the prefix index by replicas rolled the routers (and reset
    their index) on every scale step."""
    one, three = make_plan(), make_plan(pools={"short": {"replicas": 3}})
    assert one.pools["short"].replicas != three.pools["short"].replicas
    assert one.router == three.router


def test_routing_strategy_from_spec_and_cpu_blocks() -> None:
    p = make_plan(routing={"pools": {"short": {"strategy": "prefix"}}})
    assert (p.router.pools.short.strategy.value, p.router.pools.long.strategy.value) == ("prefix",
                                                                                         "least-outstanding")
    cpu = plan_file(next(f for f in EXAMPLE_FILES if f.stem == "cpu-dev"))
    assert cpu.router.pools.short.prefix.block_tokens == 128  # vLLM's CPU build


def test_router_config_from_spec() -> None:
    p = make_plan(model={"served_model_name": "llama", "source": {"huggingFace": {
        "revision": "abc", "tokenSecretRef": {"name": "hf", "key": "token"}}}},
        routing={"overLimit": "reject", "apiKeySecretRef": {"name": "keys"}, "maxBodyBytes": 4096,
                 "timeouts": {"firstByteSeconds": 120}})
    r = p.router
    assert r.model == "llama" and arg(p, "short", "--served-model-name") == "llama"
    assert r.over_limit.value == "reject" and r.api_keys_dir == "/etc/vllm-operator/api-keys"
    assert r.max_body_bytes == 4096 and r.timeouts.first_byte_seconds == 120 and r.timeouts.connect_seconds == 2
    assert (r.tokenizer.hf_repo, r.tokenizer.hf_revision, r.tokenizer.hf_token_file) == (
        "meta-llama/Llama-3.1-8B-Instruct", "abc", "/etc/vllm-operator/hf-token/token")
    cache = p.pools["short"].weights_cache
    assert cache is not None and (cache.repo, cache.revision) == ("meta-llama/Llama-3.1-8B-Instruct", "abc"), \
        "the fetch init container resolves the revision; vLLM reads the cached commit's directory"
    assert arg(p, "short", "--revision") is None and p.pools["short"].model == constants.WEIGHTS_LINK
    off = make_plan(model={"source": {"huggingFace": {"revision": "abc"}}, "cache": {"enabled": False}})
    assert arg(off, "short", "--revision") == "abc" and arg(off, "short", "--tokenizer-revision") == "abc"
    assert off.pools["short"].model == "meta-llama/Llama-3.1-8B-Instruct" and off.pools["short"].weights_cache is None


def test_router_access_log_is_on_unless_the_spec_turns_it_off() -> None:
    assert make_plan().router.access_log is True
    assert make_plan(router={"accessLog": True}).router.access_log is True
    assert make_plan(router={"accessLog": False}).router.access_log is False
    assert make_plan(router={"accessLog": False}).router.to_wire()["accessLog"] is False


def test_tokenizer_from_config_map() -> None:
    p = make_plan(model={"tokenizer": {"configMap": {"name": "tok"}}})
    assert p.router.tokenizer.path == "/etc/vllm-operator/tokenizer" and p.router.tokenizer.hf_repo is None


# --- pods -------------------------------------------------------------------------------------------------------

def test_gpu_pool_pod_facts() -> None:
    p = make_plan(accelerator={"type": "nvidia-l4-24gb"}, pools={"short": {"replicas": 3, "nodeSelector": {
        "pool": "gpu"}, "env": [{"name": "FOO", "value": "bar"}, {"name": "S", "secretKeyRef": {"name": "s",
                                                                                                "key": "k"}}]}})
    short = p.pools["short"]
    assert short.replicas == 3 and p.pools["long"].replicas == 1
    assert short.node_selector == {"pool": "gpu"}
    assert short.gpu_products == ["NVIDIA-L4"]
    assert short.resources.limits == {constants.GPU_RESOURCE: "1"}
    assert short.image == "ghcr.io/vllm-operator/engine-gpu:0.33.0" and p.engine_version == "0.33.0"
    assert short.model == constants.WEIGHTS_LINK and short.weights_cache is not None
    assert short.weights_cache.repo == "meta-llama/Llama-3.1-8B-Instruct"
    assert short.weights_cache.host_path == constants.DEFAULT_WEIGHTS_CACHE_HOST_PATH
    assert short.env["HF_HUB_OFFLINE"] == "1" and "HF_HOME" not in short.env
    assert short.env["FOO"] == "bar" and "S" not in short.env
    assert short.secret_env == {"S": SecretKeyRef(name="s", key="k")}
    assert short.tolerations == [Toleration(key=constants.GPU_RESOURCE, operator="Exists", effect="NoSchedule")]
    assert short.run_as_user == 2000 and short.model_claim is None and p.pools["long"].tolerations == short.tolerations
    assert short.gpu_memory_utilization == 0.9 and arg(p, "short", "--gpu-memory-utilization") == "0.9"


def test_pvc_model_path_and_offline_env() -> None:
    p = make_plan(model={"source": {"pvc": {"claimName": "models", "path": "/llama/8b/"}}})
    assert p.pools["short"].model == "/models/llama/8b"
    assert p.pools["short"].env["HF_HUB_OFFLINE"] == "1"
    # The claim is mounted read-only at /models: HF_HOME must not point into it (the renderer's fallback and the
    # planner's value once both said /models/..., and the planner's always won).
    assert "HF_HOME" not in p.pools["short"].env and p.pools["short"].model_claim == "models"


def test_environment_is_decided_once_a_name_a_literal_or_a_secret() -> None:
    """The model's Hub token is HF_TOKEN from its Secret; a spec entry of the same name wins, whichever kind it is,
    and the last entry of a name wins; the router's HF_HOME is the plan's too."""
    token = {"huggingFace": {"tokenSecretRef": {"name": "hf", "key": "t"}}}
    p = make_plan(model={"source": token}, pools={"short": {"env": [
        {"name": "HF_TOKEN", "value": "literal"}, {"name": "DO_NOT_TRACK", "secretKeyRef": {"name": "s", "key": "k"}},
        {"name": "X", "value": "1"}, {"name": "X", "secretKeyRef": {"name": "s", "key": "x"}}]}})
    short, long = p.pools["short"], p.pools["long"]
    assert long.secret_env == {"HF_TOKEN": SecretKeyRef(name="hf", key="t")} and "HF_TOKEN" not in long.env
    assert short.env["HF_TOKEN"] == "literal" and "HF_TOKEN" not in short.secret_env
    assert short.secret_env["DO_NOT_TRACK"] == SecretKeyRef(name="s", key="k") and "DO_NOT_TRACK" not in short.env
    assert short.secret_env["X"] == SecretKeyRef(name="s", key="x") and "X" not in short.env
    assert p.router_pod.env == {"HF_HOME": "/tmp/hf-home"} and p.router_pod.hf_token_secret == SecretKeyRef(
        name="hf", key="t")


def test_cpu_pool_uses_kv_cache_memory_bytes() -> None:
    p = make_plan(model={"name": "x/tiny", "facts": {"numLayers": 2, "numKVHeads": 2, "numAttentionHeads": 4,
                                                       "headDim": 64, "maxContextLength": 65536,
                                                       "weightsGiB": 0.05}},
                  accelerator={"type": "cpu", "memoryGiB": 4, "cpuCores": 3})
    short = p.pools["short"]
    assert arg(p, "short", "--gpu-memory-utilization") is None
    kv_bytes = int(arg(p, "short", "--kv-cache-memory-bytes") or 0)
    assert kv_bytes == short.kv.budget_bytes > 0
    blocks = kv_bytes // (short.kv.bytes_per_token * 128)
    assert short.kv.planned_tokens == int(blocks / (4096 // 128) * 4096)  # chat short pool: maxModelLen 4096
    assert short.resources.limits == {"cpu": "3", "memory": "4096Mi"}
    assert short.resources.requests == {"cpu": "3", "memory": "4096Mi"}
    assert short.node_selector == {}
    assert short.image == "ghcr.io/vllm-operator/engine-cpu:0.32.0" and p.engine_version == "0.32.0"


def test_engine_image_and_version_from_spec_and_override() -> None:
    p = make_plan(engine={"gpu": {"image": "my/vllm:1", "version": "0.26.0"}})
    assert p.pools["short"].image == "my/vllm:1" and p.engine_version == "0.26.0"
    q = make_plan(engine_version="0.32.1")
    assert q.engine_version == "0.32.1" and q.warnings == []


def test_unknown_newer_version_plans_with_the_nearest_table() -> None:
    p = make_plan(engine_version="0.40")
    assert any("0.33 flag table" in w for w in p.warnings)


def test_accelerator_facts_from_nodes_are_used() -> None:
    facts = catalog.accelerator_from_node_labels({constants.GFD_PRODUCT: "NVIDIA-A100-PCIE-40GB"}, 1)
    p = plan(make_spec(accelerator={"type": "auto"}), facts, RemediationState(), name="d", namespace="n")
    assert p.accelerator.type == "nvidia-a100-40gb"
    assert p.pools["short"].node_selector == {}
    assert p.pools["short"].gpu_products == ["A100-PCIE-40GB", "A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB",
                                             "NVIDIA-A100-SXM4-40GB"]


@pytest.mark.parametrize(("gpu", "products"), [
    ("nvidia-a100-80gb", ["A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-80GB",
                          "NVIDIA-A100-SXM4-80GB"]),
    ("nvidia-h100-80gb", ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-SXM5-80GB"]),
], ids=str)
def test_a_named_gpu_type_selects_every_variant(gpu: str, products: list[str]) -> None:
    # issue 21: the pods were pinned to the first product string and an A100 PCIe node stayed unused
    p = make_plan(accelerator={"type": gpu})
    assert p.pools["short"].gpu_products == products and p.pools["short"].node_selector == {}


def test_auto_from_a_lowercase_label_keeps_the_spelling_seen() -> None:
    facts = catalog.accelerator_from_node_labels({constants.GFD_PRODUCT: "nvidia-l4"}, 1)
    p = plan(make_spec(accelerator={"type": "auto"}), facts, RemediationState(), name="d", namespace="n")
    assert p.pools["long"].gpu_products == ["NVIDIA-L4", "nvidia-l4"]


def test_cpu_pools_select_no_gpu_products() -> None:
    p = make_plan(model={"name": "x/tiny", "facts": {"numLayers": 2, "numKVHeads": 2, "headDim": 64,
                                                       "maxContextLength": 65536, "weightsGiB": 0.05}},
                  accelerator={"type": "cpu", "memoryGiB": 4})
    assert p.pools["short"].gpu_products == []


def test_hash_is_stable_and_tracks_content() -> None:
    a, b = make_plan(), make_plan()
    assert a.hash == b.hash and len(a.hash) == 64
    assert make_plan(pools={"short": {"replicas": 2}}).hash != a.hash
    # The class generation is left out: a class edit that changes no number must roll nothing.
    body = a.model_dump(mode="json", by_alias=True, exclude={"hash", "workload_class_generation"})
    assert hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest() == a.hash


def test_disabled_pool_is_planned_but_not_checked() -> None:
    p = make_plan(accelerator={"type": "nvidia-a10g-24gb"},
                  pools={"long": {"enabled": False, "maxModelLen": 131072}})
    assert not p.pools["long"].enabled and p.router.pools.long.enabled is False
    assert p.pools["short"].prompt_range == (0, 4096)


def test_remote_code_models_warn_until_trusted() -> None:
    glm = make_plan(model={"name": "THUDM/glm-4-9b-chat"})
    assert any("--trust-remote-code" in w for w in glm.pools["short"].warnings)
    trusted = make_plan(model={"name": "THUDM/glm-4-9b-chat"}, pools={"short": {"extraArgs": ["--trust-remote-code"]}})
    assert not any("--trust-remote-code" in w for w in trusted.pools["short"].warnings)
    assert not any("--trust-remote-code" in w for w in make_plan(model={"name": "THUDM/glm-4-9b-chat-hf"}).pools[
        "short"].warnings)


@pytest.mark.parametrize(("name", "suggestion"), [("chat.prod", "chat-prod"), ("1chat", "vllm-1chat"),
                                                  ("Chat_Prod", "chat-prod")])
def test_a_name_that_cannot_prefix_service_names_is_refused_with_one_that_can(name: str, suggestion: str) -> None:
    with pytest.raises(SpecError) as err:
        check_name(name)
    assert err.value.field == "metadata.name"
    assert repr(name) in err.value.message and repr(suggestion) in err.value.message
    check_name(suggestion)


def _paused_plan(**pools: Any) -> Any:
    spec = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "workloadClass": "chat",
            "accelerator": {"type": "nvidia-l4-24gb", "count": 1}, "pools": pools}
    return plan(parse_spec(spec), None, RemediationState(pools={}), name="chat", namespace="ml")


@pytest.mark.parametrize(("pools", "warning"), [
    ({"short": {"replicas": 0}, "long": {"replicas": 0}},
     "pools: both pools are at replicas 0 with no autoscaling (a paused deployment): the router has no engine"),
    ({"short": {"enabled": False}, "long": {"replicas": 0}},
     "pools: the only enabled pool (long) is at replicas 0 with no autoscaling (a paused deployment)"),
    ({"short": {"replicas": 1}, "long": {"replicas": 0}},
     "pools.long: replicas 0 with no autoscaling while the short pool runs: requests the router sends to the long "
     "pool (prompts of the routing threshold or more, and max_tokens above the short pool's 512) get 503"),
    ({"short": {"replicas": 0}, "long": {"replicas": 1}}, None),  # short requests fall back to the long pool
    ({"short": {"replicas": 0, "externalAutoscaler": True}, "long": {"replicas": 0, "externalAutoscaler": True}},
     None),
    ({"short": {"replicas": 0}, "long": {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}}, None),
], ids=["both-paused", "only-pool-paused", "long-paused", "short-paused", "external-autoscaler", "long-autoscaled"])
def test_paused_pools_are_planned_with_what_the_router_answers(pools: dict[str, Any], warning: str | None) -> None:
    """Issue 42: legal, but a request then has no engine; the warning says what clients get."""
    planned = _paused_plan(**pools)
    found = [w for w in planned.warnings if "replicas 0" in w]
    if warning is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(warning), found
        # and the status shows it: the plan summary the operator writes to status.plan.warnings
        status = conditions.with_plan(None, planned, {"short": None, "long": None}, None, generation=1,
                                      now="2026-12-04T00:00:00Z")
        assert status.plan is not None and found[0] in status.plan.warnings
