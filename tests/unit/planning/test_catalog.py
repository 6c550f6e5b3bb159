"""GPU and model catalogs: product strings, node labels, the KV dtype table, model lookup and config.json."""

from __future__ import annotations

import pytest

from vllm_operator import constants
from vllm_operator.api.errors import SpecError
from vllm_operator.constants import AttentionBackend, KVVerdict, kv_dtype_verdict
from vllm_operator.planning import catalog


@pytest.mark.parametrize(("product", "gpu"), [
    ("NVIDIA-H100-80GB-HBM3", "nvidia-h100-80gb"), ("NVIDIA-L4", "nvidia-l4-24gb"), ("NVIDIA-A10G", "nvidia-a10g-24gb"),
    ("Tesla-T4", "nvidia-t4-16gb"), ("NVIDIA-A100-SXM4-80GB", "nvidia-a100-80gb"),
    ("NVIDIA-A100-PCIE-40GB", "nvidia-a100-40gb"), ("NVIDIA-H200", "nvidia-h200-141gb"),
    ("NVIDIA-L40S", "nvidia-l40s-48gb"), ("nvidia-l4", "nvidia-l4-24gb"), ("NVIDIA-L4-SHARED", "nvidia-l4-24gb"),
    ("NVIDIA-A100-80GB-PCIe", "nvidia-a100-80gb"), ("NVIDIA-H100-PCIe", "nvidia-h100-80gb"),
], ids=str)
def test_product_strings_identify_types(product: str, gpu: str) -> None:
    found = catalog.gpu_type_for_product(product)
    assert found is not None and found.name == gpu


@pytest.mark.parametrize("product", ["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-GeForce-RTX-4090", ""],
                         ids=["mig-slice", "unknown", "empty"])
def test_unknown_products_match_nothing(product: str) -> None:
    assert catalog.gpu_type_for_product(product) is None


def test_every_type_in_the_api_enum_is_in_the_catalog() -> None:
    from vllm_operator.api.spec import AcceleratorType
    gpus = {t.value for t in AcceleratorType} - {"cpu", "auto"}
    assert gpus == set(catalog.GPUS_BY_NAME)
    assert all(g.source and g.products for g in catalog.GPUS)


@pytest.mark.parametrize(("labels", "expected"), [
    ({constants.GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3", constants.GFD_COMPUTE_MAJOR: "9",
      constants.GFD_COMPUTE_MINOR: "0"}, "nvidia-h100-80gb"),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_MEMORY: "23034"}, "nvidia-l4-24gb"),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_COMPUTE_MAJOR: "8", constants.GFD_COMPUTE_MINOR: "0"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_COMPUTE_MAJOR: "x", constants.GFD_COMPUTE_MINOR: "0"}, None),
    ({"kubernetes.io/hostname": "cpu-node"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-B200"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-L4-SHARED", constants.GFD_REPLICAS: "4"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_REPLICAS: "2"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_REPLICAS: "1"}, "nvidia-l4-24gb"),
], ids=["h100-with-cc", "l4", "cc-contradicts", "cc-garbage", "no-gpu", "not-in-catalog", "time-sliced",
        "replicas-without-rename", "one-replica"])
def test_accelerator_from_node_labels(labels: dict[str, str], expected: str | None) -> None:
    facts = catalog.accelerator_from_node_labels(labels, 2)
    if expected is None:
        assert facts is None
        return
    assert facts is not None
    assert (facts.type, facts.count, facts.is_gpu, facts.product) == (expected, 2, True, labels[constants.GFD_PRODUCT])
    assert facts.memory_bytes == catalog.GPUS_BY_NAME[expected].usable_bytes


@pytest.mark.parametrize(("gpu", "dtype", "verdict"), [
    ("nvidia-h100-80gb", "auto", KVVerdict.DEFAULT),
    ("nvidia-h100-80gb", "fp8", KVVerdict.DEFAULT),
    ("nvidia-h200-141gb", "fp8_e4m3", KVVerdict.DEFAULT),
    ("nvidia-l4-24gb", "fp8", KVVerdict.DEFAULT),
    ("nvidia-l40s-48gb", "fp8", KVVerdict.DEFAULT),
    ("nvidia-a100-80gb", "fp8", KVVerdict.ON_REQUEST),
    ("nvidia-a10g-24gb", "fp8_e5m2", KVVerdict.ON_REQUEST),
    ("nvidia-t4-16gb", "fp8", KVVerdict.ON_REQUEST),
    ("nvidia-t4-16gb", "float16", KVVerdict.DEFAULT),
    ("nvidia-t4-16gb", "bfloat16", KVVerdict.REFUSED),
], ids=str)
def test_kv_dtype_table_per_gpu(gpu: str, dtype: str, verdict: KVVerdict) -> None:
    assert kv_dtype_verdict(catalog.GPUS_BY_NAME[gpu].compute_capability, dtype) is verdict


@pytest.mark.parametrize(("cc", "dtype", "backend", "verdict"), [
    ((9, 0), "fp8", AttentionBackend.FLASH_ATTN, KVVerdict.DEFAULT),
    ((9, 0), "fp8_e5m2", AttentionBackend.FLASH_ATTN, KVVerdict.REFUSED),
    ((8, 0), "fp8", AttentionBackend.FLASH_ATTN, KVVerdict.REFUSED),
    ((8, 0), "fp8", AttentionBackend.TRITON_ATTN, KVVerdict.DEFAULT),
    ((7, 5), "fp8_e5m2", AttentionBackend.TRITON_ATTN, KVVerdict.DEFAULT),
    ((7, 5), "auto", AttentionBackend.FLASHINFER, KVVerdict.REFUSED),
    ((8, 9), "fp8_e5m2", AttentionBackend.FLASHINFER, KVVerdict.DEFAULT),
], ids=["fa3-fp8", "fa-never-e5m2", "fa2-no-fp8", "triton-fp8-any-gpu", "triton-t4", "flashinfer-needs-sm80",
        "flashinfer-e5m2"])
def test_kv_dtype_table_per_backend(cc: tuple[int, int], dtype: str, backend: AttentionBackend,
                                    verdict: KVVerdict) -> None:
    assert kv_dtype_verdict(cc, dtype, backend) is verdict


@pytest.mark.parametrize(("dtype", "verdict"), [("auto", KVVerdict.DEFAULT), ("fp8", KVVerdict.ON_REQUEST),
                                                ("fp8_e5m2", KVVerdict.REFUSED)], ids=["auto", "fp8", "e5m2"])
def test_kv_dtype_table_cpu(dtype: str, verdict: KVVerdict) -> None:
    assert kv_dtype_verdict(None, dtype) is verdict


@pytest.mark.parametrize(("name", "canonical"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("META-LLAMA/llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct"),
    ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct"),
    ("qwen/qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct"),
    ("Qwen/Qwen2.5-72B", "Qwen/Qwen2.5-72B-Instruct"),
    ("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3"),
    ("thudm/GLM-4-9B-Chat", "THUDM/glm-4-9b-chat"),
], ids=str)
def test_models_match_case_insensitively_with_base_aliases(name: str, canonical: str) -> None:
    found = catalog.catalog_model(name)
    assert found is not None and found.name == canonical


def test_glm4_chat_has_128k_context() -> None:
    glm = catalog.catalog_model("THUDM/glm-4-9b-chat")
    assert glm is not None
    assert (glm.max_context_length, glm.num_kv_heads, glm.num_layers, glm.head_dim) == (131072, 2, 40, 128)


LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                "max_position_embeddings": 131072, "vocab_size": 128256, "torch_dtype": "bfloat16"}
CHATGLM_CONFIG = {"architectures": ["ChatGLMModel"],
                  "num_layers": 40, "num_attention_heads": 32, "multi_query_group_num": 2, "kv_channels": 128,
                  "hidden_size": 4096, "seq_length": 131072, "ffn_hidden_size": 13696, "padded_vocab_size": 151552}


def test_hf_config_llama() -> None:
    facts = catalog.facts_from_hf_config(LLAMA_CONFIG)
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim, facts.max_context_length) == (32, 8, 128, 131072)
    # estimated from the shape: ~8.03 B params in bf16
    assert facts.weights_gib == pytest.approx(15.0, rel=0.02)


def test_hf_config_chatglm_names() -> None:
    facts = catalog.facts_from_hf_config(CHATGLM_CONFIG, weights_gib=17.5)
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim, facts.max_context_length, facts.weights_gib) == \
        (40, 2, 128, 131072, 17.5)


@pytest.mark.parametrize(("drop", "message"), [
    ("num_hidden_layers", "num_hidden_layers"), ("max_position_embeddings", "max_position_embeddings"),
], ids=["no-layers", "no-context"])
def test_hf_config_missing_keys_are_named(drop: str, message: str) -> None:
    config = {k: v for k, v in LLAMA_CONFIG.items() if k != drop}
    with pytest.raises(SpecError, match=message):
        catalog.facts_from_hf_config(config)


@pytest.mark.parametrize(("labels", "how"), [
    ({constants.GFD_PRODUCT: "NVIDIA-L4-SHARED", constants.GFD_REPLICAS: "4"},
     "nvidia.com/gpu.product=NVIDIA-L4-SHARED, nvidia.com/gpu.replicas=4"),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_REPLICAS: "2"}, "nvidia.com/gpu.replicas=2"),
    ({constants.GFD_PRODUCT: "NVIDIA-L4", constants.GFD_REPLICAS: "1"}, None),
    ({constants.GFD_PRODUCT: "NVIDIA-L4"}, None),
], ids=["renamed", "replicas-only", "one-replica", "unshared"])
def test_time_sliced_nodes_are_recognised(labels: dict[str, str], how: str | None) -> None:
    assert catalog.shared_gpu(labels) == how


def test_gpu_products_never_include_a_shared_spelling() -> None:
    assert catalog.gpu_products("nvidia-l4-24gb", "NVIDIA-L4-SHARED") == ["NVIDIA-L4"]
