"""vllm-operator: run vLLM on Kubernetes as a short-text and a long-text pool behind a length-aware router."""

__version__ = "0.1.0"
