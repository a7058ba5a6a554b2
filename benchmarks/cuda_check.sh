#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU (CI has none): the CPU-equality tests (tests/test_cuda.py),
# the demo's training and sampling stages on the GPU (the whole demo where Java is present for
# scoring), and the GPU rows of the training and decoding benchmarks. Logs go to ${OUT:-/tmp}.
#   bash benchmarks/cuda_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
PY=${PY:-python3}
export RDPP_NO_PROGRESS=1 COLUMNS=120
nvidia-smi -L; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
timeout 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/cuda_tests.log" | tail -25
if command -v java >/dev/null; then
  timeout 240 $PY -c "from rdpp_cli.demo import demo; demo('/tmp/cuda_demo_ws', device='cuda')" > "$OUT/cuda_demo.log" 2>&1
  tail -12 "$OUT/cuda_demo.log"; grep -E "✓ (train|finetune|sample)" "$OUT/cuda_demo.log"
else
  echo "no java here: timing the demo's training and sampling stages (scoring needs the PTB tokenizer)"
  timeout 240 $PY - > "$OUT/cuda_demo.log" 2>&1 <<'PY'
import time
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.decoding.sample import sample
from rdpp_cli.demo import DemoPlan
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.xe import train_xe
p, ws, t = DemoPlan(), "/tmp/cuda_demo_ws", {}
def timed(name, fn):
    t0 = time.perf_counter(); r = fn(); t[name] = time.perf_counter() - t0; return r
data = timed("prepro toy", lambda: prepro_toy(workspace=ws, images=p.images, seed=p.seed))
xe = timed("train-xe", lambda: train_xe(data.path, workspace=ws, device="cuda", **p.xe))
for reward, extra in (("scst", {}), ("dpp", {"m": p.dpp_m})):
    m = timed(f"finetune {reward}", lambda: finetune(xe.path, data=data.path, workspace=ws, device="cuda",
                                                     reward=reward, **extra, **p.rl))
    timed(f"sample {reward} random n={p.n}", lambda: sample(m.path, data=data.path, workspace=ws, device="cuda",
                                                           method="random", n=p.n, split="test"))
    timed(f"sample {reward} beam {p.beam}", lambda: sample(m.path, data=data.path, workspace=ws, device="cuda",
                                                          method="beam", n=1, beam=p.beam, split="test"))
print("CUDA_DEMO_TIMES", {k: round(v, 1) for k, v in t.items()}, "total", round(sum(t.values()), 1))
PY
  grep -E "CUDA_DEMO_TIMES|Error|error" "$OUT/cuda_demo.log" | tail -5
fi
timeout 100 $PY benchmarks/train.py --device cuda --steps 5 2>&1 | tee "$OUT/cuda_bench_train.log" | tail -15
timeout 60 $PY benchmarks/sample.py --device cuda 2>&1 | tee "$OUT/cuda_bench_sample.log" | tail -15
