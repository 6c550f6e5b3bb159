# syntax=docker/dockerfile:1.7
# GPU engine: the official vLLM image plus the entrypoint wrapper (`vllm-operator engine -- vllm serve …`), which turns
# "CUDA out of memory" / "EngineCore encountered a fatal error" into distinct exit codes and a termination message.
# Build from the repository root:
#   docker build -f images/engine-gpu.Dockerfile -t ghcr.io/vllm-operator/engine-gpu:0.33.0 .
# VLLM_VERSION must match the planner's default GPU engine version (engine.gpu.version in the spec selects flag tables).
ARG VLLM_VERSION=0.33.0
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# --- build: only the project's wheel; the wrapper needs the standard library and what vLLM depends on (pydantic) ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime: vLLM's image, the wheel installed without dependencies (vLLM's own pins stay untouched) ----------------
FROM vllm/vllm-openai:v${VLLM_VERSION}
LABEL org.opencontainers.image.title="vllm-operator-engine-gpu" \
      org.opencontainers.image.description="vLLM (official image) under the vllm-operator entrypoint wrapper" \
      org.opencontainers.image.source="https://github.com/vllm-operator/vllm-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /tmp/wheels
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && vllm-operator engine --help >/dev/null \
 && useradd --uid 2000 --user-group --create-home --home-dir /home/vllm vllm
# vLLM writes compile caches and Hugging Face downloads under HOME; models come from the /models volume.
ENV HOME=/home/vllm HF_HOME=/home/vllm/.cache/huggingface VLLM_CACHE_ROOT=/home/vllm/.cache/vllm \
    PYTHONUNBUFFERED=1
USER 2000:2000
WORKDIR /home/vllm
EXPOSE 8000
# The operator's pod spec supplies the launcher: args `vllm serve <model> --flag=value …`.
ENTRYPOINT ["vllm-operator", "engine", "--"]
CMD ["vllm", "serve", "--help"]
