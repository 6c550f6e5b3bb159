#!/usr/bin/env bash
# Fault -> detection / action times of the health loop, measured by the integration and e2e tests that inject each
# fault (real Prometheus scraping fake vLLM engines; the operator on the real control plane; real vLLM on CPU for the
# engine wrapper). Writes results.jsonl and prints a table; README.md records a run.
# Usage: benchmarks/health/run.sh [pytest -k expression]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/health/results.jsonl
rm -f "$out"
HEALTH_TIMINGS="$PWD/$out" .venv/bin/pytest -q -p no:cacheprovider -s \
  tests/integration/health tests/e2e/engine tests/e2e/health ${1:+-k "$1"} | grep -E "fault->detection|passed|failed" || true
.venv/bin/python benchmarks/health/summarize.py "$out"
