#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU (CI has none): the CPU-equality tests (tests/test_cuda.py),
# the demo on the GPU (up to its scoring where Java is absent), and the GPU rows of the training and
# decoding benchmarks. Logs go to ${OUT:-/tmp}.
#   bash benchmarks/cuda_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
PY=${PY:-python3}
export RDPP_NO_PROGRESS=1 COLUMNS=120
nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -25
# Without Java (the lent GPU machines have none) the demo stops at its first scoring step, after
# the three trainings and the XE model's sampling: their times are the lines printed here.
command -v java >/dev/null || echo "no java here: the demo stops at scoring (the PTB tokenizer needs Java)"
timeout 240 $PY -c "from rdpp_cli.demo import demo; demo('/tmp/cuda_demo_ws', device='cuda')" > "$OUT/cuda_demo.log" 2>&1
grep -E "✓|error" "$OUT/cuda_demo.log"; tail -8 "$OUT/cuda_demo.log"
timeout 100 $PY benchmarks/train.py --device cuda --steps 5 2>&1 | tee "$OUT/cuda_bench_train.log" | tail -15
timeout 150 $PY benchmarks/sample.py --device cuda --sections decode 2>&1 | tee "$OUT/cuda_bench_sample.log" | tail -15
