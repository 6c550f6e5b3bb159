# Sourced by scripts/build-images.sh: the recipe of the Debian base every image we build here starts FROM.
#
# Why a base of our own: no registry of container images can be reached from the development and CI machines, so
# `python:3.x-slim-bookworm` cannot be pulled; Debian's own archive can. mmdebstrap bootstraps a minimal bookworm
# (variant minbase: Essential packages and apt) plus Python, venv, CA certificates and passwd (useradd), pinned by
# suite, with every installed package pinned by version in images/base/bookworm-python.packages. A version the
# mirror no longer carries (Debian replaces versions at each point release) fails the build in one line naming it;
# `scripts/build-images.sh --refresh-pins` then re-records the pins from what the mirror has now.
#
# The recipe is this file plus the pins; its hash is the base's cache key (and part of every image's key).
BASE_SUITE=bookworm
BASE_MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
# What the images need on top of minbase: the interpreter (3.11 on bookworm), venv (ensurepip), python -> python3,
# CA certificates (the runtime's TLS to the API server and Hugging Face), passwd (useradd in engine-cpu.Dockerfile).
BASE_INCLUDE=(python3 python3-venv python-is-python3 ca-certificates passwd)
BASE_PINS=images/base/bookworm-python.packages
# Documentation, manual pages and translations are never read in a container; the copyright files stay.
BASE_DPKG_OPTS=(
  "path-exclude=/usr/share/man/*" "path-exclude=/usr/share/doc/*" "path-include=/usr/share/doc/*/copyright"
  "path-exclude=/usr/share/locale/*" "path-exclude=/usr/share/info/*"
)

# base_bootstrap <out.tar> <packages out> [pinned|unpinned]: one mmdebstrap run; prints its log only on failure.
base_bootstrap() {
  local out=$1 record=$2 mode=${3:-pinned} log include opt
  local -a args=(--variant=minbase --mode=root --format=tar --aptopt='Acquire::Retries "3"')
  for opt in "${BASE_DPKG_OPTS[@]}"; do args+=(--dpkgopt="$opt"); done
  if [ "$mode" = pinned ]; then
    include="$(grep -v '^#' "$BASE_PINS" | paste -sd, -)"
  else
    include="$(IFS=,; echo "${BASE_INCLUDE[*]}")"
  fi
  args+=(--include="$include")
  # An empty /etc/pip.conf: the mount point scripts/build-images.sh bind-mounts the build machine's pip configuration
  # onto for RUN steps. Were it missing, buildah would create the mount point in the layer of every RUN step.
  args+=(--customize-hook='touch "$1/etc/pip.conf"')
  # record exactly what was installed, beside the image
  args+=(--customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package}=\${Version}\n' | LC_ALL=C sort > '$record'")
  log="$(mktemp)"
  if ! mmdebstrap "${args[@]}" "$BASE_SUITE" "$out" "${BASE_MIRRORS[@]}" >"$log" 2>&1; then
    local missing
    missing="$(grep -oE "Version '[^']+' for '[^']+' was not found" "$log" | head -3 | paste -sd';' -)"
    if [ -n "$missing" ]; then
      echo "build-images: base: the Debian mirror no longer has a pinned version ($missing); re-record the pins" \
        "with scripts/build-images.sh --refresh-pins" >&2
    else
      echo "build-images: base: mmdebstrap $BASE_SUITE failed: $(grep -E '^(E:|W:)|error' "$log" | tail -1)" \
        "(full log: $log)" >&2
      return 1
    fi
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

# base_check_pins <packages recorded by base_bootstrap>: the base holds exactly the pinned set, or one line saying
# which package differs (the mirror changed a dependency).
base_check_pins() {
  local diff
  diff="$(LC_ALL=C comm -3 <(grep -v '^#' "$BASE_PINS" | LC_ALL=C sort) "$1" | tr -d '\t' | head -5 | paste -sd' ' -)"
  if [ -n "$diff" ]; then
    echo "build-images: base: installed packages differ from $BASE_PINS ($diff); re-record the pins with" \
      "scripts/build-images.sh --refresh-pins" >&2
    return 1
  fi
}
