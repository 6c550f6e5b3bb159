#!/usr/bin/env bash
# Runs every test tier in order and prints how long each took. Stops at the first failing tier.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
declare -a names=() secs=()
run_tier() {
  local name=$1; shift
  local t0=$SECONDS
  echo "=== tier: $name"
  "$@"
  local rc=$?
  names+=("$name"); secs+=($((SECONDS - t0)))
  if [ $rc -ne 0 ]; then
    echo "=== tier $name FAILED (rc=$rc) after $((SECONDS - t0)) s"
    summary; exit $rc
  fi
}
summary() {
  echo "=== tier timings"
  for i in "${!names[@]}"; do printf '%-12s %5d s\n' "${names[$i]}" "${secs[$i]}"; done
}
# mypy twice: the images we build here run Python 3.11 (Debian bookworm), the Dockerfiles' default base 3.12
run_tier lint bash -c "$BIN/ruff check . && $BIN/mypy && $BIN/mypy --python-version 3.12 --cache-dir \
  .mypy_cache/py312 && $BIN/lint-imports"
run_tier unit $BIN/pytest -q -p no:cacheprovider tests/unit
run_tier integration $BIN/pytest -q -p no:cacheprovider --durations=12 tests/integration
run_tier e2e $BIN/pytest -q -p no:cacheprovider --durations=20 tests/e2e
summary
