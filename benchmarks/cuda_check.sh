#!/usr/bin/env bash
# Every check that needs a GPU, in one run (CI has no GPU): about 8 minutes on one H100/H200, no
# network, no Java. Tables go to stdout, logs and JSON lines to ${OUT:-/tmp}.
#   1. benchmarks/precision_cuda.sh: bf16 vs fp32 numerics and the on-policy replay, the XE step and
#      the RL steps (m = 2, 5) against self-critical.pytorch as it is today, tests/test_cuda.py
#   2. what on-policy sampling costs on the GPU (benchmarks/finetune.py --sample-modes)
#   3. one XE epoch at the paper's shapes over a synthetic COCO-shaped features.h5, data loading
#      included (benchmarks/data.py --xe-epoch)
#   4. decoding and DPP selection on the GPU (benchmarks/sample.py)
#   5. the demo's training stages on the GPU (without Java it stops at its first scoring step)
#   6. the training fast path (--fast on), not run by default (about 8 minutes, most of it compiling):
#      its GPU tests in tests/test_cuda.py, then benchmarks/fast_path.py: eager against fast (CUDA
#      graphs) and fast without CUDA graphs, XE / R-DPP / SCST steps at the paper's shapes
#   bash benchmarks/cuda_check.sh              # steps 1-5; STEPS="1 2" bash ... runs some, STEPS=6 the fast path

set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
PY=${PY:-python3}
export RDPP_NO_PROGRESS=1 COLUMNS=150 PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
STEPS=" ${STEPS:-1 2 3 4 5} "
want() { [[ "$STEPS" == *" $1 "* ]]; }

if want 1; then
stamp "1. precision_cuda.sh"
OUT=$OUT PY=$PY timeout 200 bash benchmarks/precision_cuda.sh 2>&1 | tee "$OUT/cuda_precision.log"
fi

if want 2; then
stamp "2. on-policy sampling vs eval-mode sampling, m = 5"
timeout 60 $PY benchmarks/finetune.py --device cuda --ms 5 --repeats 3 --no-reference --sample-modes --json \
  > "$OUT/cuda_onpolicy.log" 2>&1; echo "exit $?"; grep -v '^{' "$OUT/cuda_onpolicy.log" | tail -12
fi

if want 3; then
stamp "3. one XE epoch over 10,000 COCO-shaped rows, loading included"
timeout 200 $PY benchmarks/data.py --xe-epoch --device cuda --rows 10000 --workers 0,2,4 --json \
  > "$OUT/cuda_data_epoch.log" 2>&1; echo "exit $?"; grep -v '^{' "$OUT/cuda_data_epoch.log" | tail -20
fi

if want 4; then
stamp "4. decoding and selection"
timeout 100 $PY benchmarks/sample.py --device cuda --sections decode --json > "$OUT/cuda_sample.log" 2>&1
echo "exit $?"; grep -v '^{' "$OUT/cuda_sample.log" | tail -16
timeout 60 $PY benchmarks/sample.py --device cuda --sections select --select-images 1000 --json \
  > "$OUT/cuda_select.log" 2>&1; echo "exit $?"; grep -v '^{' "$OUT/cuda_select.log" | tail -10
fi

if want 5; then
stamp "5. the demo's stages on cuda"
command -v java >/dev/null || echo "no java here: the demo stops at scoring (the PTB tokenizer needs Java)"
timeout 120 $PY -c "from rdpp_cli.demo import demo; demo('/tmp/cuda_demo_ws', device='cuda')" > "$OUT/cuda_demo.log" 2>&1
grep -E "✓|error" "$OUT/cuda_demo.log" | tail -12
fi

if want 6; then
stamp "6. the training fast path: GPU tests, then eager against --fast on"
timeout 300 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "fast or reward_on_cuda" 2>&1 \
  | tee "$OUT/cuda_fast_tests.log" | tail -15
timeout 420 $PY benchmarks/fast_path.py --device cuda --sections xe,dpp,scst --variants fast,fast-default \
  --steps 10 --warmup 3 --json > "$OUT/cuda_fast_path.log" 2>&1; echo "exit $?"
grep -v '^{' "$OUT/cuda_fast_path.log" | tail -30
fi

stamp "done"
