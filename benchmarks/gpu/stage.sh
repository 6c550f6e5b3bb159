#!/bin/bash
# Stages what a dataplane.py GPU call needs into DEST (a git-ignored folder that `carry` names): the operator
# package, these scripts and deployments, fresh plans and unpack.sh.
# Usage: bash benchmarks/gpu/stage.sh DEST UNPACK_SH      (from the repository root; the venv must exist)
set -euo pipefail
DEST=${1:?usage: stage.sh DEST UNPACK_SH}; UNPACK=${2:?usage: stage.sh DEST UNPACK_SH}
rm -rf "$DEST/src" "$DEST/bench" "$DEST/plans"; mkdir -p "$DEST/src" "$DEST/bench" "$DEST/plans"
cp -r operator/vllm_operator "$DEST/src/"
find "$DEST/src" -name __pycache__ -prune -exec rm -rf {} +
cp benchmarks/gpu/*.py "$DEST/bench/"; cp -r benchmarks/gpu/deployments "$DEST/bench/"
for v in shared unified oom moe lora; do
  .venv/bin/vllm-operator plan "benchmarks/gpu/deployments/$v.yaml" -o json --engine-version 0.26.0 > "$DEST/plans/$v.json"
done
cp "$UNPACK" "$DEST/unpack.sh"
du -sh "$DEST"
