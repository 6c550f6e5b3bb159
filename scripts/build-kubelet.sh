#!/usr/bin/env bash
# Builds the node agent the real-node tests run (kubelet, from the same pinned k8s.io/kubernetes version as the
# control plane, in a module of its own: cluster/kubelet) and the pause image's binary (build/pause/linux/pause.c of
# that module, compiled statically: no registry can be reached, so the sandbox image is made here), into a cache
# OUTSIDE the clone:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/kubelet-<hash>/   (hash: cluster/kubelet/go.mod and go.sum, the Go
#   version, the C compiler's version and this script's recipe)
# A module and a cache entry of their own rather than a fifth binary in kube-<hash>: kubelet needs modules that
# cluster/kube/go.sum lacks (k8s.io/cri-streaming, otelrestful), and adding them would change that key and rebuild
# kube-apiserver for every clone. A no-op when built (scripts/lib/cached-build.sh).
#   scripts/build-kubelet.sh              build if missing, print the directory on the last line
#   scripts/build-kubelet.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"

KUBE_VERSION=v1.37.2   # k8s.io/kubernetes in cluster/kubelet/go.mod (the same as cluster/kube/go.mod)
RECIPE=1               # bump when the build commands below change in a way that changes the outputs
static_libc() { command -v gcc >/dev/null && [ -f "$(gcc -print-file-name=libc.a)" ]; }
if ! static_libc; then
  echo "kubelet: installing gcc and libc6-dev (the pause binary is compiled from C, statically)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
    || { echo "kubelet: 'apt-get install gcc libc6-dev' failed" >&2; exit 1; }
fi
cc_version="$(gcc -dumpfullversion)"

cache_init kubelet "kubelet" "recipe=$RECIPE gcc=$cc_version" cluster/kubelet/go.mod cluster/kubelet/go.sum

[ "${1:-}" = "--print-dir" ] && cache_print_dir
if cache_done; then
  echo "kubelet: present in $dest"
  echo "$dest"; exit 0
fi

cache_begin
echo "kubelet: building into $dest with $go_version (cold: ~3 min on 2 cores once the module cache is warm)"
ldflags_version=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags_version+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags_version+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd cluster/kubelet && go mod download -x 2>&1 | grep -c "^# get" | sed "s/^/kubelet: downloaded modules: /") || true
timed_build kubelet kubelet k8s.io/kubernetes/cmd/kubelet "-ldflags=-s -w $ldflags_version"

src="$(cd cluster/kubelet && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
t0=$SECONDS
gcc -Os -static -Wall -Werror -DVERSION="$KUBE_VERSION-vllm-operator" -o "$tmp/pause" "$src"
strip "$tmp/pause"
echo "pause                    $((SECONDS - t0)) s wall (gcc -static $src)" | tee -a "$tmp/build-times.txt"

cache_finish "$go_version $KUBE_VERSION gcc=$cc_version"
echo "kubelet: done ($(du -sm "$dest" | cut -f1) MB in $dest)"
echo "$dest"
