#!/usr/bin/env bash
# Builds the real nodes' Service proxy: kube-proxy from the same pinned k8s.io/kubernetes as the control plane and the
# kubelet, in a module of its own (cluster/kube-proxy: it needs modules that cluster/kubelet/go.sum lacks, and adding
# them there would change the kubelet's key and rebuild it), into a cache OUTSIDE the clone:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/kube-proxy-<hash>/   (hash: cluster/kube-proxy/go.mod and go.sum,
#   the Go version and this script's recipe)
# testcluster/node.py runs it per node, in the node's network namespace, in iptables mode: pods reach the API server
# through the `kubernetes` Service's ClusterIP (KUBERNETES_SERVICE_HOST), as on any cluster. A no-op when built.
#   scripts/build-kube-proxy.sh              build if missing, print the directory on the last line
#   scripts/build-kube-proxy.sh --print-dir  print the directory only (no build; exits 1 if it is not built)
source "$(dirname "$0")/lib/cached-build.sh"

KUBE_VERSION=v1.37.2   # k8s.io/kubernetes in cluster/kube-proxy/go.mod (the same as cluster/kube/go.mod)
RECIPE=1               # bump when the build commands below change in a way that changes the outputs

cache_init kube-proxy "kube-proxy" "recipe=$RECIPE" cluster/kube-proxy/go.mod cluster/kube-proxy/go.sum

[ "${1:-}" = "--print-dir" ] && cache_print_dir
if cache_done; then
  echo "kube-proxy: present in $dest"
  echo "$dest"; exit 0
fi

cache_begin
echo "kube-proxy: building into $dest with $go_version (~1 min on 2 cores once the kubelet's modules are cached)"
ldflags_version=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags_version+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=37"
  ldflags_version+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
(cd cluster/kube-proxy && go mod download -x 2>&1 | grep -c "^# get" | sed "s/^/kube-proxy: downloaded modules: /") \
  || true
timed_build kube-proxy kube-proxy k8s.io/kubernetes/cmd/kube-proxy "-ldflags=-s -w $ldflags_version"

cache_finish "$go_version $KUBE_VERSION"
echo "kube-proxy: done ($(du -sm "$dest" | cut -f1) MB in $dest)"
echo "$dest"
