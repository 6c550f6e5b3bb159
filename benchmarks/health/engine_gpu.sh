#!/bin/bash
# On the H200 machine: the engine wrapper around a REAL vLLM (0.26.0, CUDA) — a CUDA out-of-memory at start-up
# (a KV cache larger than the GPU, which vLLM allocates without checking) must end as exit code 87 (EngineOOM), and a
# SIGKILLed engine core as 88 (EngineDead), each with its termination message.
# Prerequisite (the workspace's GPU packing scripts, outside this repository): .gpu/p1 (+ model), .gpu/p2 and .gpu/unpack.sh from pack.sh.
#   call 1: carry [".gpu/p1", ".gpu/unpack.sh"]  command: bash .gpu/unpack.sh .gpu
#   call 2 (at once): carry [".gpu/p2", ".gpu/unpack.sh"]  command: bash benchmarks/health/engine_gpu.sh
# Output: $OUT/engine_gpu.tgz (logs, termination messages, summary.txt).
set -u
bash .gpu/unpack.sh .gpu
export PYTHONPATH=/tmp/site:$PWD/operator VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
L=/tmp/engine_gpu; rm -rf "$L"; mkdir -p "$L"
now() { python3 -c 'import time; print(f"{time.time():.2f}")'; }
W="python3 -m vllm_operator.cli engine --launcher=cli-main --python=python3"
ARGS="--load-format dummy --enforce-eager --max-model-len 8192"
S=$L/summary.txt

t0=$(now)
$W --termination-message-path=$L/tm-oom -- vllm serve /tmp/model $ARGS --kv-cache-memory-bytes 200G --port 8001 \
  > $L/oom.log 2>&1
rc=$?
echo "startup-oom: wrapper rc=$rc after $(python3 -c "print(round($(now)-$t0,1))") s; message: $(cat $L/tm-oom 2>/dev/null)" >> $S

$W --termination-message-path=$L/tm-dead -- vllm serve /tmp/model $ARGS --gpu-memory-utilization 0.5 --port 8002 \
  > $L/dead.log 2>&1 &
WP=$!
t0=$(now)
for i in $(seq 1 600); do
  curl -fs -o /dev/null http://127.0.0.1:8002/health && break
  kill -0 $WP 2>/dev/null || break
  sleep 0.5
done
echo "dead: healthy after $(python3 -c "print(round($(now)-$t0,1))") s" >> $S
CORE=$(python3 - $WP <<'PY'
import os, sys
root = int(sys.argv[1]); kids = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(d))
todo, found = [root], []
while todo:
    for c in kids.get(todo.pop(), []):
        found.append(c); todo.append(c)
for pid in found:
    try:
        if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"VLLM::EngineCore"):
            print(pid); break
    except OSError:
        pass
PY
)
echo "dead: engine core pid $CORE" >> $S
t0=$(now)
[ -n "$CORE" ] && kill -9 "$CORE"
wait $WP
rc=$?
echo "dead: wrapper rc=$rc after $(python3 -c "print(round($(now)-$t0,1))") s from SIGKILL; message: $(cat $L/tm-dead 2>/dev/null)" >> $S
grep -nE "out of memory|OutOfMemoryError|EngineCore|EngineDead|died" $L/oom.log $L/dead.log | tail -20 >> $S
tar czf $OUT/engine_gpu.tgz -C /tmp engine_gpu; cp $S $OUT/summary.txt
cat $S
