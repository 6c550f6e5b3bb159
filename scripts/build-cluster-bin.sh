#!/usr/bin/env bash
# Builds the upstream control plane the tests and the demo run on (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) from the pinned Go modules under cluster/, into a cache OUTSIDE the clone so fresh clones on
# the same machine reuse it:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/kube-<hash>/   (hash: every go.mod/go.sum under cluster/, the Go
#   version and this script's build recipe)
# A no-op when that directory exists; built in a temporary directory and renamed into place (scripts/lib/cached-build.sh).
#   scripts/build-cluster-bin.sh              build if missing, print the directory on the last line
#   scripts/build-cluster-bin.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"

KUBE_VERSION=v1.37.2   # k8s.io/kubernetes in cluster/kube/go.mod; stamped into the binaries (helm and kubectl read it)
KWOK_VERSION=v0.8.0    # sigs.k8s.io/kwok in cluster/kwok/go.mod; its stage YAMLs are copied from the same version
RECIPE=2               # bump when the build commands below change in a way that changes the binaries

cache_init kube "cluster binaries" "recipe=$RECIPE" cluster/kube/go.mod cluster/kube/go.sum cluster/etcd/go.mod \
  cluster/etcd/go.sum cluster/kwok/go.mod cluster/kwok/go.sum

# kwok starts only with stage definitions; take every stage of the same kwok version from its module (fast, heartbeat,
# general and the chaos ones the health tests use), not copied into the repo. Separate from the binaries (cheap, and
# redone when this list changes) and also atomic.
STAGES_VERSION=2
ensure_stages() {  # ensure_stages <cache dir>
  local dir=$1
  [ -f "$dir/kwok-stages/.complete-$STAGES_VERSION" ] && return 0
  local src staging
  src="$(cd cluster/kwok && go mod download sigs.k8s.io/kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  staging="$(mktemp -d "$dir/.kwok-stages.XXXXXX")"
  (cd "$src/kustomize/stage" && find . -name '*.yaml' ! -name kustomization.yaml ! -path '*/testdata/*') |
    while read -r f; do mkdir -p "$staging/$(dirname "$f")"; cp "$src/kustomize/stage/$f" "$staging/$f"; done
  chmod -R u+w "$staging"
  touch "$staging/.complete-$STAGES_VERSION"
  rm -rf "$dir/kwok-stages"
  mv "$staging" "$dir/kwok-stages"
  echo "cluster binaries: kwok $KWOK_VERSION stages in $dir/kwok-stages"
}

if [ "${1:-}" = "--print-dir" ]; then
  stages=0; [ -f "$dest/kwok-stages/.complete-$STAGES_VERSION" ] || stages=1
  cache_print_dir "$stages"
fi
if cache_done; then
  ensure_stages "$dest"
  echo "cluster binaries: present in $dest"
  echo "$dest"; exit 0
fi

cache_begin
echo "cluster binaries: building into $dest with $go_version (cold: ~15-20 min on 2 cores)"

ldflags_version=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags_version+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags_version+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
kube_ldflags="-ldflags=-s -w $ldflags_version"

(cd cluster/kube && go mod download -x 2>&1 | grep -c '^# get' | sed 's/^/cluster binaries: downloaded modules (kube): /') || true
timed_build kube kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
timed_build kube kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
timed_build kube kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kube_ldflags"
timed_build etcd etcd go.etcd.io/etcd/server/v3 "-ldflags=-s -w"
timed_build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-ldflags=-s -w"

cache_finish "$go_version $KUBE_VERSION kwok=$KWOK_VERSION"
ensure_stages "$dest"
echo "cluster binaries: done ($(du -sm "$dest" | cut -f1) MB in $dest; module cache $(du -sm "$(go env GOMODCACHE)" | cut -f1) MB)"
echo "$dest"
