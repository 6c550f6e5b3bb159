# syntax=docker/dockerfile:1.7
# The length-aware router: `vllm-operator router --config router.json` (OpenAI API, /health, /metrics on 8080).
# Build from the repository root:  docker build -f images/router.Dockerfile -t ghcr.io/vllm-operator/router:0.1.0 .
# The operator renders the router Deployment with its own args (the ConfigMap path); CMD is only the default.
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY images/constraints.txt /tmp/constraints.txt
COPY pyproject.toml README.md ./
COPY operator/ ./operator/
RUN python -m venv /opt/vllm-operator \
 && /opt/vllm-operator/bin/pip install --constraint /tmp/constraints.txt '.[router]' \
 && /opt/vllm-operator/bin/vllm-operator router --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="vllm-operator-router" \
      org.opencontainers.image.description="Length-aware OpenAI-compatible router for vllm-operator pools" \
      org.opencontainers.image.source="https://github.com/vllm-operator/vllm-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/vllm-operator /opt/vllm-operator
ENV PATH=/opt/vllm-operator/bin:${PATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["vllm-operator", "router"]
CMD ["--config", "/etc/vllm-operator/router/router.json"]
