# syntax=docker/dockerfile:1.7
# The operator: `vllm-operator run` (kopf controller, /healthz and /metrics on 8080).
# Build from the repository root:  docker build -f images/operator.Dockerfile -t ghcr.io/vllm-operator/operator:0.1.0 .
# Base images are pinned by tag here; pin them by digest (`@sha256:…`) in the release pipeline, which can resolve them.
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

# --- build: a self-contained virtualenv with the project and its pinned runtime dependencies -------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY images/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN python -m venv /opt/vllm-operator \
 && /opt/vllm-operator/bin/pip install --constraint /tmp/constraints.txt '.[operator]' \
 && /opt/vllm-operator/bin/vllm-operator --help >/dev/null \
 && /opt/vllm-operator/bin/vllm-operator run --help >/dev/null

# --- runtime: the virtualenv on a clean base, no compiler, no pip cache, non-root ------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-operator" \
      org.opencontainers.image.description="Kubernetes operator for length-aware vLLM pools" \
      org.opencontainers.image.source="https://github.com/vllm-operator/vllm-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/vllm-operator /opt/vllm-operator
ENV PATH=/opt/vllm-operator/bin:${PATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# 65532 = the conventional "nonroot" uid; the chart sets runAsNonRoot and a read-only root filesystem (+ /tmp emptyDir).
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["vllm-operator"]
CMD ["run", "--standalone"]
