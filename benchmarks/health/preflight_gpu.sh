#!/bin/bash
# On the H200 machine: the engine wrapper's preflight against the real GPU, free and with a torch process holding
# 100 GiB. Output under $OUT. The GPU image has torch (and pynvml) but no pydantic, which the wrapper imports; build
# .gpu/health/site locally first (an ignored folder) and carry it:
#   pip install --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --target .gpu/health/site pydantic==2.14.4 pydantic_core==2.50.5 \
#     annotated-types typing-extensions typing-inspection
#   then run this file with carry [".gpu/health"]. Recorded output: preflight_gpu.h200.log.
set -u
export PYTHONPATH=$PWD/operator:$PWD/.gpu/health/site
W="python3 -m vllm_operator.cli engine --preflight=required"
CHILD='import sys; sys.exit(3)'
{
echo "== nvidia-smi"; nvidia-smi --query-gpu=index,name,memory.total,memory.free,compute_cap --format=csv,noheader,nounits
echo "== pynvml"; python3 -c "import pynvml; print('pynvml', pynvml.__file__)" 2>&1 | tail -1
echo "== read_gpus"; python3 -c "from vllm_operator.engine import preflight; print(preflight.read_gpus())"
echo "== free GPU, util 0.9 (expect child exit 3)"; $W --termination-message-path=$OUT/tm-free -- python3 -c "$CHILD" --gpu-memory-utilization=0.9; echo "rc=$?"
echo "== fp8_e5m2 on FLASH_ATTN (expect 85)"; $W --termination-message-path=$OUT/tm-fp8 -- python3 -c "$CHILD" --kv-cache-dtype=fp8_e5m2 --attention-backend=FLASH_ATTN; echo "rc=$?"; cat $OUT/tm-fp8
echo "== fp8 default backend (expect child exit 3)"; $W --termination-message-path=$OUT/tm-fp8ok -- python3 -c "$CHILD" --kv-cache-dtype=fp8; echo "rc=$?"
python3 -c "
import torch, time, pathlib
x = torch.empty(100 * 2**30, dtype=torch.uint8, device='cuda')
pathlib.Path('/tmp/hog').write_text('1')
time.sleep(90)" &
HOG=$!
for i in $(seq 1 120); do [ -f /tmp/hog ] && break; sleep 0.5; done
echo "== 100 GiB held by another process, util 0.9 (expect 85)"; $W --termination-message-path=$OUT/tm-busy -- python3 -c "$CHILD" --gpu-memory-utilization=0.9; echo "rc=$?"; cat $OUT/tm-busy
echo "== same, util 0.25 fits (expect child exit 3)"; $W --termination-message-path=$OUT/tm-fits -- python3 -c "$CHILD" --gpu-memory-utilization=0.25; echo "rc=$?"
kill $HOG
} > $OUT/preflight.log 2>&1
cat $OUT/preflight.log
