# vllm-operator — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
VLLM_VENV := .venv-vllm
TOOLS := .tools

.PHONY: demo test lint unit integration e2e crds schemas goldens bench venv test-deps vllm-venv tools clean cluster-bin \
	control-plane images

$(BIN)/vllm-operator: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/vllm-operator

## demo: create .venv, install, build the control plane, and run the main job: the chart and the operator on a real
## kube-apiserver with kwok GPU nodes (testcluster/demo.py; EXAMPLES=DIR for another directory).
demo: venv control-plane
	scripts/install-helm.sh
	$(BIN)/python -m testcluster.demo --examples $(or $(EXAMPLES),examples)

## test: install everything the tests need from scratch, then run all tiers (lint, unit, integration, e2e).
test: venv test-deps
	scripts/run-tiers.sh

## System packages and binaries the integration/e2e tiers use (Prometheus, promtool, Lua, helm, vLLM on CPU), and the
## images the image tests run.
test-deps: venv cluster-bin images
	scripts/install-test-deps.sh

## images: build the operator, router and engine-cpu images from images/*.Dockerfile with buildah on a Debian base
## made here (installs buildah, podman, runc and mmdebstrap from Debian when missing), tagged as the operator's
## defaults resolve them, into container storage and OCI archives under ~/.cache/vllm-operator/images/ (outside the
## clone; a no-op when built for this content; cold ~8-9 min on a shared 2-core machine, see images/README.md).
images:
	scripts/build-images.sh

## control-plane: build etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from the pinned Go
## modules in cluster/ into ~/.cache/vllm-operator/kube-<hash>/ (outside the clone; a no-op when built): all that
## `make demo` runs (testcluster/demo.py starts no KEDA and no Prometheus: the operator runs with --no-health).
control-plane:
	scripts/build-cluster-bin.sh

## cluster-bin: the control plane, and what the tests run beside it: kubelet (cluster/kubelet) and the pause binary
## into ~/.cache/vllm-operator/kubelet-<hash>/ and kube-proxy (cluster/kube-proxy) into
## ~/.cache/vllm-operator/kube-proxy-<hash>/ (testcluster/node.py), KEDA (cluster/keda) into
## ~/.cache/vllm-operator/keda-<hash>/, Prometheus with Kubernetes service discovery (cluster/prometheus) into
## ~/.cache/vllm-operator/prometheus-<hash>/ and prometheus-operator (cluster/prometheus-operator) into
## ~/.cache/vllm-operator/prometheus-operator-<hash>/ (each a no-op when built; cold times in the README).
cluster-bin: control-plane
	scripts/build-kubelet.sh
	scripts/build-kube-proxy.sh
	scripts/build-keda-bin.sh
	scripts/build-prometheus.sh
	scripts/build-prometheus-operator.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mypy --python-version 3.12 --cache-dir .mypy_cache/py312
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

e2e: venv
	$(BIN)/pytest -q tests/e2e

## crds / schemas: regenerate the generated artifacts (tests fail when they drift).
crds: venv
	$(BIN)/vllm-operator crd > crds/vllm-operator.dev_vllmdeployments.yaml
	$(BIN)/vllm-operator crd --workload-class > crds/vllm-operator.dev_vllmworkloadclasses.yaml
	cp crds/vllm-operator.dev_vllmdeployments.yaml crds/vllm-operator.dev_vllmworkloadclasses.yaml \
		charts/vllm-operator/crds/ 2>/dev/null || true
	$(BIN)/vllm-operator crd --builtin-classes > charts/vllm-operator/templates/workloadclasses.yaml

schemas: venv
	$(BIN)/python -m vllm_operator.api.schemas operator/vllm_operator/api/schemas

## goldens: re-render every example into tests/unit/rendering/golden (review the diff, then commit).
goldens: venv
	UPDATE_GOLDENS=1 $(BIN)/pytest -q -p no:cacheprovider tests/unit/rendering/test_golden.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TOOLS) .pytest_cache .mypy_cache .ruff_cache
