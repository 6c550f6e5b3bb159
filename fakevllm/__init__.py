"""A fake vLLM engine for tests and benchmarks: vLLM's HTTP surface without a model (`fakevllm.engine`).

Test support, like `testcluster`: the product (`operator/vllm_operator`) never imports it
(import-linter) and no image contains it. Run it as a process with `python -m fakevllm --port N ...`.
"""
