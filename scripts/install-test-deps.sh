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
