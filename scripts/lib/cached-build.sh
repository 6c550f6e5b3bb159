# Sourced by scripts/build-{cluster-bin,keda-bin,prometheus,prometheus-operator}.sh: the shape they share. Each builds
# upstream Go binaries from a pinned module under cluster/ into a cache OUTSIDE the clone,
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/<prefix>-<hash>/
# keyed by the module files, the Go version and the script's recipe, so fresh clones on the same machine reuse it. A
# build goes to a temporary directory that is renamed into place at the end: an interrupted build leaves nothing that
# looks finished and is redone on the next run.
#
#   cache_init <prefix> <label> <key text after the Go version> <go.mod/go.sum files...>
#       sets go_version, cache_root, dest; <label> starts this script's messages
#   cache_done            true when $dest is complete
#   cache_print_dir [ok]  for --print-dir: print $dest and exit 0 when complete (and `ok` is 0), else exit 1
#   cache_begin           makes $tmp (removed on exit unless cache_finish ran)
#   timed_build <module dir under cluster/> <output name> <package> [go build args...]
#                         builds into $tmp, prints and records wall and CPU seconds in $tmp/build-times.txt
#   cache_finish <VERSIONS line>   marks $tmp complete and renames it to $dest
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

cache_init() {
  local prefix=$1 suffix=$3 key
  label=$2
  shift 3
  command -v go >/dev/null || { echo "$label: 'go' is not on PATH (Go >= 1.26 is needed)" >&2; exit 1; }
  go_version="$(go env GOVERSION)"
  key="$( { cat "$@"; echo "$go_version $suffix"; } | sha256sum | cut -c1-16)"
  cache_prefix=$prefix
  cache_key=$key
  cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
  dest="$cache_root/$prefix-$key"
}

cache_done() { [ -f "$dest/.complete" ]; }

cache_print_dir() {  # cache_print_dir [extra condition's status]
  if cache_done && [ "${1:-0}" = 0 ]; then echo "$dest"; exit 0; fi
  echo "$(basename "$0" .sh): $dest is not built (run make cluster-bin)" >&2
  exit 1
}

cache_begin() {
  mkdir -p "$cache_root"
  tmp="$(mktemp -d "$cache_root/.$cache_prefix-$cache_key.partial.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
}

_child_cpu() {  # sets $cpu: CPU seconds (user+sys) of every child this shell has waited for so far
  times > "$tmp/.times"
  cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); n += a[1] * 60 + a[2] } print n }' \
    "$tmp/.times")
}

timed_build() {  # timed_build <module dir> <output name> <package> [go build args...]
  local dir=$1 name=$2 pkg=$3 t0=$SECONDS cpu c0
  shift 3
  echo "$label: building $name ($pkg)"
  _child_cpu; c0=$cpu
  (cd "cluster/$dir" && go build -trimpath "$@" -o "$tmp/$name" "$pkg")
  _child_cpu
  # wall seconds depend on what else the machine runs; CPU seconds (user+sys) are the build's own work
  awk -v n="$name" -v w="$((SECONDS - t0))" -v c="$cpu" -v c0="$c0" -v b="$(stat -c %s "$tmp/$name")" \
    'BEGIN { printf "%-24s %5d s wall %5.0f s CPU %4d MB\n", n, w, c - c0, b / 1e6 }' | tee -a "$tmp/build-times.txt"
}

cache_finish() {  # cache_finish <VERSIONS line>
  echo "$1" > "$tmp/VERSIONS"
  rm -f "$tmp/.times"
  touch "$tmp/.complete"
  chmod 755 "$tmp"
  rm -rf "$dest"
  mv "$tmp" "$dest"
  trap - EXIT
}
