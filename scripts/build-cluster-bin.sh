#!/usr/bin/env bash
# Builds the upstream control plane the tests and the demo run on (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) from the pinned Go modules under cluster/, into a cache OUTSIDE the clone so fresh clones on
# the same machine reuse it:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/kube-<hash>/   (hash: every go.mod/go.sum under cluster/, the Go
#   version and this script's build recipe)
# A no-op when that directory exists. It is built in a temporary directory and renamed into place at the end, so an
# interrupted build leaves nothing that looks finished and is redone on the next run.
#   scripts/build-cluster-bin.sh              build if missing, print the directory on the last line
#   scripts/build-cluster-bin.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

KUBE_VERSION=v1.37.2   # k8s.io/kubernetes in cluster/kube/go.mod; stamped into the binaries (helm and kubectl read it)
KWOK_VERSION=v0.8.0    # sigs.k8s.io/kwok in cluster/kwok/go.mod; its stage YAMLs are copied from the same version
RECIPE=2               # bump when the build commands below change in a way that changes the binaries

command -v go >/dev/null || { echo "build-cluster-bin: 'go' is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }
go_version="$(go env GOVERSION)"
key="$( { cat cluster/kube/go.mod cluster/kube/go.sum cluster/etcd/go.mod cluster/etcd/go.sum \
            cluster/kwok/go.mod cluster/kwok/go.sum; echo "$go_version recipe=$RECIPE"; } | sha256sum | cut -c1-16)"
cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
dest="$cache_root/kube-$key"

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
  [ -f "$dest/.complete" ] && [ -f "$dest/kwok-stages/.complete-$STAGES_VERSION" ] ||
    { echo "build-cluster-bin: $dest is not built (run make cluster-bin)" >&2; exit 1; }
  echo "$dest"; exit 0
fi
if [ -f "$dest/.complete" ]; then
  ensure_stages "$dest"
  echo "cluster binaries: present in $dest"
  echo "$dest"; exit 0
fi

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.kube-$key.partial.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "cluster binaries: building into $dest with $go_version (cold: ~15-20 min on 2 cores)"

ldflags_version=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags_version+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags_version+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

child_cpu() {  # sets $cpu: CPU seconds (user+sys) of every child this shell has waited for so far
  times > "$tmp/.times"
  cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } print n }' \
    "$tmp/.times")
}

build() {  # build <module dir> <output name> <package> [extra ldflags]
  local dir=$1 name=$2 pkg=$3 extra=${4:-}
  local t0=$SECONDS cpu c0
  echo "cluster binaries: building $name ($pkg)"
  child_cpu; c0=$cpu
  (cd "cluster/$dir" && go build -trimpath -ldflags="-s -w $extra" -o "$tmp/$name" "$pkg")
  child_cpu
  # wall seconds depend on what else the machine runs; CPU seconds (user+sys) are the build's own work
  awk -v n="$name" -v w="$((SECONDS - t0))" -v c="$cpu" -v c0="$c0" -v b="$(stat -c %s "$tmp/$name")" \
    'BEGIN { printf "%-24s %5d s wall %5.0f s CPU %4d MB\n", n, w, c - c0, b / 1e6 }' | tee -a "$tmp/build-times.txt"
}

(cd cluster/kube && go mod download -x 2>&1 | grep -c '^# get' | sed 's/^/cluster binaries: downloaded modules (kube): /') || true
build kube kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$ldflags_version"
build kube kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$ldflags_version"
build kube kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$ldflags_version"
build etcd etcd go.etcd.io/etcd/server/v3
build kwok kwok sigs.k8s.io/kwok/cmd/kwok

echo "$go_version $KUBE_VERSION kwok=$KWOK_VERSION" > "$tmp/VERSIONS"
rm -f "$tmp/.times"
touch "$tmp/.complete"
chmod 755 "$tmp"

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
ensure_stages "$dest"
echo "cluster binaries: done ($(du -sm "$dest" | cut -f1) MB in $dest; module cache $(du -sm "$(go env GOMODCACHE)" | cut -f1) MB)"
echo "$dest"
