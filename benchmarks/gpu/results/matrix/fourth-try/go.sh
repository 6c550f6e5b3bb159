#!/bin/bash
# GPU machine, repo root. usage: go.sh CALL CELLS BUDGET_S
# Picks the cells planned for the card present (H200 plans in cells/, H100 plans in cells-h100/), runs matrix.py,
# copies results and the log to $OUT, prints a one-line summary per cell.
set -u
N=$1; CELLS=$2; B=$3
S=/tmp/st/run
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpu-call$N.txt
if [ ! -f /tmp/site/vllm/_C_stable_libtorch.abi3.so ] || [ ! -f /tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so ]; then
  echo "NO VLLM IN /tmp/site (fresh machine?)"; ls /tmp/site/vllm 2>&1 | head -3; exit 3
fi
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$MEM" -lt 100000 ]; then
  echo "card under 100 GB: the H100 plans"; rm -rf $S/cells-h200; mv $S/cells $S/cells-h200; mv $S/cells-h100 $S/cells
fi
export PYTHONPATH=/tmp/site
timeout -s TERM $((B + 15)) python3 $S/matrix.py run --stage $S --out /tmp/c$N --archive $OUT/call$N.tar.xz \
  --budget-s $B --cells $CELLS > $OUT/call$N.log 2>&1
echo "matrix rc $?"
cp /tmp/c$N/results.json $OUT/call$N-results.json 2>/dev/null
python3 - /tmp/c$N/results.json <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    p = r.get("planned") or {}; v = r.get("vllm") or {}; c = r.get("cache_config_info") or {}
    print(r["cell"], r.get("outcome"), r.get("serving_s"), "planned", p.get("kv_tokens"), "vllm",
          c.get("kv_cache_size_tokens") or v.get("kv_tokens"), "w", v.get("weights_gib"), "chat",
          (r.get("chat") or {}).get("status"), (r.get("chat_adapter") or {}).get("status"),
          "ERR", v.get("error_line", "")[-300:], r.get("reason", ""))
EOF
tail -5 $OUT/call$N.log
