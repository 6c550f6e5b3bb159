#!/usr/bin/env bash
# `make images`: builds the images we ship (operator, router, engine-cpu) from images/*.Dockerfile with buildah, as a
# platform team's pipeline would (only build arguments differ from the public defaults), on a Debian base made here
# (scripts/lib/debian-base.sh). engine-gpu is FROM vllm/vllm-openai, which cannot be pulled here: not built.
#
# Cache, outside the clone and shared by every clone on the machine, like the control-plane binaries:
#   ${VLLM_OPERATOR_CACHE:-~/.cache/vllm-operator}/images/
#     storage/, run/             container storage (graph root, run root) that buildah and podman use with --root
#     base-<key>/                the Debian base: packages.txt (what is installed), build-times.txt
#     <name>-<key>/              one image: <name>.oci.tar (OCI archive: `podman load -i`, `ctr -n k8s.io images
#                                import`), packages.txt (Debian packages in the image), image.txt, build-times.txt
# <key> hashes what the image is made of: the Dockerfile, the files it COPYs from the context, the build arguments
# and the base's key (its recipe and pins). A key already built is a no-op (it only re-tags, in case another clone
# tagged a different build); an interrupted build leaves no .complete marker and is redone.
# Images are tagged as the operator's defaults resolve them (operator/vllm_operator/images.py), so a kubelet runs them
# with no flags: ghcr.io/vllm-operator/operator:<version>, …/router:<version>, …/engine-cpu:<vLLM version>.
#
#   scripts/build-images.sh [NAME...]       build what is missing (every step that fails says which, in one line)
#   scripts/build-images.sh --print         one line per image: name ref image-id archive (1 when one is not built)
#                                           and first `store <graph root> <run root>`
#   scripts/build-images.sh --refresh-pins  re-record images/base/*.packages from what the Debian mirror has now
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/debian-base.sh

IMAGES=(operator router engine-cpu)
ENGINE_PINS=images/base/engine-cpu-runtime.packages
cache_root="${VLLM_OPERATOR_CACHE:-$HOME/.cache/vllm-operator}"
img_root="$cache_root/images"
STORE="$img_root/storage"
RUNROOT="$img_root/run"
STORAGE_FLAGS=(--root "$STORE" --runroot "$RUNROOT" --storage-driver overlay)
# runc, not crun (crun 1.8 refuses these machines' hybrid cgroup v1); ulimits within the machines' hard limits
PODMAN=(podman "${STORAGE_FLAGS[@]}" --runtime runc --cgroup-manager cgroupfs --events-backend file)
BUILDAH=(buildah "${STORAGE_FLAGS[@]}")
REPOSITORY=ghcr.io/vllm-operator
ARCHIVE_KEEP_MINUTES="${ARCHIVE_KEEP_MINUTES:-180}"  # how long an archive another clone asked for is kept

say() { echo "build-images: $*"; }
fail() { echo "build-images: $*" >&2; exit 1; }

ensure_tools() {  # Debian's own packages, as a new user would install them (~20 s)
  local need=()
  for tool in buildah podman runc mmdebstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
  if [ ${#need[@]} -gt 0 ]; then
    say "installing Debian packages: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
      || fail "'apt-get install ${need[*]}' failed"
  fi
}

hash_files() { local f; for f in "$@"; do printf '%s  %s\n' "$(sha256sum < "$f" | cut -c1-64)" "$f"; done; }

base_key() { { cat scripts/lib/debian-base.sh "$BASE_PINS"; } | sha256sum | cut -c1-16; }
base_ref() { echo "localhost/vllm-operator/debian-python:$BASE_SUITE-$(base_key)"; }

version_of() {  # the tag the operator's defaults give each image
  case $1 in
    operator|router) sed -n 's/^__version__ = "\(.*\)"$/\1/p' operator/vllm_operator/__init__.py ;;
    engine-cpu) sed -n 's/^DEFAULT_CPU_VERSION = "\(.*\)"$/\1/p' operator/vllm_operator/planning/engine_args.py ;;
  esac
}

context_files() {  # the files images/$1.Dockerfile COPYs from the build context (as sent: no caches)
  local src
  awk '/^COPY / && !/--from=/ { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "images/$1.Dockerfile" |
    while read -r src; do
      find "$src" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*'
    done | LC_ALL=C sort
}

build_args() {  # build arguments: only the base (and the engine's Debian pins) differ from the public defaults
  echo "PYTHON_IMAGE=$(base_ref)"
  if [ "$1" = engine-cpu ]; then echo "RUNTIME_PACKAGES=$(grep -v '^#' "$ENGINE_PINS" | paste -sd' ' -)"; fi
}

image_key() {
  # shellcheck disable=SC2046
  { hash_files "images/$1.Dockerfile" $(context_files "$1"); build_args "$1"; } | sha256sum | cut -c1-16
}

# step <label> <log> <cmd...>: run one build step into its log; on failure, one line naming the step, and stop.
step() {
  local label=$1 log=$2 t0=$SECONDS
  shift 2
  if ! "$@" >"$log" 2>&1; then
    local at cause
    at="$(grep -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+: ' "$log" | tail -1 | cut -c1-160 || true)"
    # pip's and apt's own error line if there is one, else the last line the failing command printed
    cause="$(grep -E '^(ERROR|E): ' "$log" | tail -1 | cut -c1-240 || true)"
    [ -n "$cause" ] || cause="$(awk '/subprocess exited with status/ { print last; exit } NF { last = $0 }' "$log" |
      cut -c1-240)"
    [ -n "$cause" ] || cause="$(grep -E '[Ee]rror' "$log" | tail -1 | cut -c1-240 || true)"
    fail "$label failed${at:+ at ${at}}${cause:+: $cause} (log: $log)"
  fi
  printf '%-28s %5d s wall\n' "$label" $((SECONDS - t0)) | tee -a "$times"
}

build_base() {
  local dir="$img_root/base-$(base_key)" ref tmp
  ref="$(base_ref)"
  if [ -f "$dir/.complete" ] && "${PODMAN[@]}" image exists "$ref"; then return; fi
  tmp="$(mktemp -d "$img_root/.base.partial.XXXXXX")"
  times="$tmp/build-times.txt"
  say "bootstrapping the Debian $BASE_SUITE base $ref (mmdebstrap, pinned by $BASE_PINS)"
  local t0=$SECONDS
  base_bootstrap "$tmp/rootfs.tar" "$tmp/packages.txt" pinned || { rm -rf "$tmp"; exit 1; }
  base_check_pins "$tmp/packages.txt" || { rm -rf "$tmp"; exit 1; }
  printf '%-28s %5d s wall\n' "base: mmdebstrap" $((SECONDS - t0)) | tee -a "$times"
  step "base: import" "$tmp/import.log" "${PODMAN[@]}" import "$tmp/rootfs.tar" "$ref"
  rm -f "$tmp/rootfs.tar"
  touch "$tmp/.complete"
  chmod 755 "$tmp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# Read-only mounts for pip inside a build (never part of a layer: `buildah bud -v` bind-mounts them for RUN steps).
build_mounts() {
  local ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
  [ -f "$ca" ] && echo "-v=$ca:/etc/ssl/certs/ca-certificates.crt:ro"
  if [ -f /etc/pip.conf ]; then echo "-v=/etc/pip.conf:/etc/pip.conf:ro"; fi
}

build_image() {
  local name=$1 key ref dir tmp id
  key="$(image_key "$name")"
  ref="$REPOSITORY/$name:$(version_of "$name")"
  dir="$img_root/$name-$key"
  if [ -f "$dir/.complete" ] && id="$(cat "$dir/image-id")" && "${PODMAN[@]}" image exists "$id"; then
    "${PODMAN[@]}" tag "$id" "$ref"
    if [ -f "$dir/$name.oci.tar" ]; then touch "$dir/$name.oci.tar"; else save_archive "$name" "$ref" "$dir"; fi
    prune_builds "$name" "$dir"
    return
  fi
  tmp="$(mktemp -d "$img_root/.$name-$key.partial.XXXXXX")"
  times="$tmp/build-times.txt"
  say "building $ref from images/$name.Dockerfile (key $key)"
  local -a args=()
  while IFS= read -r arg; do args+=(--build-arg "$arg"); done < <(build_args "$name")
  while IFS= read -r mount; do args+=("$mount"); done < <(build_mounts)
  step "$name: buildah bud" "$tmp/build.log" "${BUILDAH[@]}" bud --pull=never --isolation=chroot --layers \
    --ulimit nofile=20000:20000 --format oci "${args[@]}" -f "images/$name.Dockerfile" -t "$ref" \
    --iidfile "$tmp/image-id" .
  id="$(cat "$tmp/image-id")"
  id="${id#sha256:}"
  echo "$id" > "$tmp/image-id"
  # what Debian packages the image holds, and (engine-cpu) that the runtime stage installed exactly its pins
  step "$name: record packages" "$tmp/packages.log" "${PODMAN[@]}" run --rm --network none --user 0 \
    --ulimit nofile=20000:20000 --ulimit nproc=1000:1000 --entrypoint dpkg-query "$id" \
    -W "-f=\${Package}=\${Version}\n"
  LC_ALL=C sort "$tmp/packages.log" > "$tmp/packages.txt"
  if [ "$name" = engine-cpu ]; then
    local extra
    extra="$(LC_ALL=C comm -3 <(LC_ALL=C comm -13 "$img_root/base-$(base_key)/packages.txt" "$tmp/packages.txt") \
      <(grep -v '^#' "$ENGINE_PINS" | LC_ALL=C sort) | tr -d '\t' | paste -sd' ' -)"
    [ -z "$extra" ] || fail "$name: the runtime stage's Debian packages differ from $ENGINE_PINS ($extra); re-record" \
      "them with scripts/build-images.sh --refresh-pins"
  fi
  echo "$ref $id $("${PODMAN[@]}" image inspect --format '{{.Size}}' "$id") bytes" > "$tmp/image.txt"
  save_archive "$name" "$ref" "$tmp"
  touch "$tmp/.complete"
  chmod 755 "$tmp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  # This name's other builds (archive, image, directory) go once no clone has asked for them for
  # ARCHIVE_KEEP_MINUTES (--print and a re-tag touch the archive they hand out): another clone at another commit may
  # be between its --print and its import into a node store (testcluster/imagestore.py), and deleting its archive
  # then failed its e2e tier; keeping every build filled a development machine's disk (13 GB of old images).
  prune_builds "$name" "$dir"
  say "built $ref ($(awk '{ printf "%.0f MB", $3 / 1e6 }' "$dir/image.txt"))"
}

prune_builds() {  # prune_builds <name> <dir kept>: other builds of <name> that no clone asked for lately
  local name=$1 keep=$2 old marker id
  for old in "$img_root/$name"-*/; do
    old="${old%/}"
    [ "$old" != "$keep" ] && [ -f "$old/.complete" ] || continue
    marker="$old/$name.oci.tar"
    [ -f "$marker" ] || marker="$old/image.txt"
    [ -n "$(find "$marker" -mmin "+$ARCHIVE_KEEP_MINUTES" 2>/dev/null)" ] || continue
    id="$(cat "$old/image-id")"
    # plain rmi: it refuses an image a container uses or another tag names (another clone's), and then all is kept
    if ! "${PODMAN[@]}" image exists "$id" || "${PODMAN[@]}" rmi "$id" >/dev/null 2>&1; then
      rm -rf "$old"
      say "removed the build $(basename "$old") (not asked for in $ARCHIVE_KEEP_MINUTES min)"
    fi
  done
}

save_archive() {  # save_archive <name> <ref> <dir>: the OCI archive podman and containerd both import
  local times="$3/build-times.txt"
  rm -f "$3/$1.oci.tar"
  step "$1: save OCI archive" "$3/save.log" "${PODMAN[@]}" save --format oci-archive -o "$3/$1.oci.tar.partial" "$2"
  mv "$3/$1.oci.tar.partial" "$3/$1.oci.tar"
}

print_built() {
  local name key dir status=0
  echo "store $STORE $RUNROOT"
  for name in "${IMAGES[@]}"; do
    key="$(image_key "$name")"
    dir="$img_root/$name-$key"
    if [ -f "$dir/.complete" ] && [ -f "$dir/$name.oci.tar" ]; then
      touch "$dir/$name.oci.tar"  # in use: kept from other clones' clean-up for ARCHIVE_KEEP_MINUTES
      echo "$name $REPOSITORY/$name:$(version_of "$name") $(cat "$dir/image-id") $dir/$name.oci.tar"
    else
      echo "build-images: $name ($dir) is not built (run make images)" >&2
      status=1
    fi
  done
  return $status
}

refresh_pins() {
  local tmp c
  ensure_tools
  tmp="$(mktemp -d)"
  say "re-recording $BASE_PINS from the mirror"
  base_bootstrap "$tmp/rootfs.tar" "$tmp/packages.txt" unpinned
  { sed -n 1p "$BASE_PINS"; cat "$tmp/packages.txt"; } > "$tmp/pins" && mv "$tmp/pins" "$BASE_PINS"
  say "re-recording $ENGINE_PINS (images/engine-cpu.Dockerfile's RUNTIME_PACKAGES resolved on that base)"
  "${PODMAN[@]}" import "$tmp/rootfs.tar" localhost/vllm-operator/debian-python:refresh >/dev/null
  c="$("${BUILDAH[@]}" from --pull=never localhost/vllm-operator/debian-python:refresh)"
  local wanted
  wanted="$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' images/engine-cpu.Dockerfile)"
  "${BUILDAH[@]}" run --isolation=chroot "$c" -- sh -c "apt-get update -qq && apt-get install -s -qq \
    --no-install-recommends $wanted" | sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1=\2/p' | LC_ALL=C sort > "$tmp/engine"
  "${BUILDAH[@]}" rm "$c" >/dev/null
  "${PODMAN[@]}" rmi localhost/vllm-operator/debian-python:refresh >/dev/null
  { sed -n 1p "$ENGINE_PINS"; cat "$tmp/engine"; } > "$tmp/pins" && mv "$tmp/pins" "$ENGINE_PINS"
  rm -rf "$tmp"
  git --no-pager diff --stat -- images/base
}

case "${1:-}" in
  --print) print_built; exit ;;
  --refresh-pins) mkdir -p "$img_root"; exec 9>"$img_root/.lock"; flock 9; refresh_pins; exit ;;
  -*) fail "unknown argument $1 (see the header of $0)" ;;
  ?*) for name in "$@"; do [[ " ${IMAGES[*]} " == *" $name "* ]] || fail "no image $name (${IMAGES[*]})"; done
      IMAGES=("$@") ;;
esac

ensure_tools
mkdir -p "$img_root"
exec 9>"$img_root/.lock"
flock 9  # another clone building: wait, then find its images
t_all=$SECONDS
build_base
# The images are built side by side: engine-cpu's pip install is mostly download and unpacking, which leaves room on
# two cores for the other two (about 1.5 min less than one after another). Each prints its own labelled lines.
pids=()
for name in "${IMAGES[@]}"; do build_image "$name" & pids+=($!); done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ $status = 0 ] || fail "an image failed to build (its line above says which step)"
say "images ready in $((SECONDS - t_all)) s: $(print_built | tail -n +2 | awk '{ print $2 }' | paste -sd' ' -)"
