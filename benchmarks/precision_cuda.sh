#!/usr/bin/env bash
# fp32 against bf16 on one CUDA GPU (docs/training.md "Precision"), under 3 minutes on an H100/H200, no network:
#   1. numerics: bf16 XE loss and gradients against fp32, and the on-policy replay in fp32 and bf16
#      (benchmarks/precision_numerics.py: PASS/FAIL against its stated tolerances);
#   2. the XE step: rdpp fp32, rdpp bf16, self-critical.pytorch's own code (benchmarks/train.py);
#   3. the RL steps at m = 5 (and 2): rdpp SCST and R-DPP in fp32 and bf16, self-critical.pytorch's own
#      SCST step and the published R-DPP way (benchmarks/finetune.py; the peer's checkout as there);
#   4. the CPU-equality tests of the CUDA path in float64 (tests/test_cuda.py).
# Tables go to stdout; logs and JSON to ${OUT:-/tmp}.
#   bash benchmarks/precision_cuda.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
PY=${PY:-python3}
export RDPP_NO_PROGRESS=1 COLUMNS=150
nvidia-smi -L
$PY -c "import torch; from rdpp_cli.precision import resolve_precision as r
print('torch', torch.__version__, torch.cuda.get_device_name(), 'capability', torch.cuda.get_device_capability(),
      '| --precision auto ->', r('auto', 'cuda'))"
echo "== 1. numerics (bf16 vs fp32, on-policy replay) =="
timeout 60 $PY benchmarks/precision_numerics.py --device cuda --json > "$OUT/precision_numerics.log" 2>&1
echo "exit $?"; grep -v '^{' "$OUT/precision_numerics.log" | tail -12
echo "== 2. XE step, paper shapes, 50 images x 5 captions of 16 words =="
timeout 60 $PY benchmarks/train.py --device cuda --steps 10 --json > "$OUT/precision_train.log" 2>&1
echo "exit $?"; grep -v '^{' "$OUT/precision_train.log" | tail -14
echo "== 3. RL steps (captions of ~9 words), m = 2 and 5 =="
timeout 90 $PY benchmarks/finetune.py --device cuda --ms 2,5 --repeats 5 --json > "$OUT/precision_finetune.log" 2>&1
echo "exit $?"; grep -v '^{' "$OUT/precision_finetune.log" | tail -30
echo "== 4. CUDA path against the CPU in float64 =="
timeout 60 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -4
