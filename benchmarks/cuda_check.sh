#!/usr/bin/env bash
# Every GPU figure of the README in one call, rdpp against self-critical.pytorch's own code in the
# same process, ending with one summary table; designed for at most 8 minutes on one H100/H200 (each
# step has a time limit), no network:
#   1. tests/test_cuda.py: the CUDA path against the CPU in float64, the fast path in CUDA graphs
#   2. Att2in against the peer's Att2in2Model, batch 50: XE fp32 / bf16 / scheduled sampling, SCST and
#      R-DPP m = 5 (and the published R-DPP way), decoding 5 samples; the fast path against eager
#      (benchmarks/models_speed.py --model att2in ... --fast fast)
#   3. UpDown and the Transformer against the peer's UpDownModel / TransformerModel, batch 50
#   4. whole epochs over COCO-shaped rows as the paper presets run them, loading and validation
#      included: XE at the preset's batch without and with scheduled sampling, R-DPP m = 5 at the
#      preset's batch, cold page cache (benchmarks/data.py epochs), then the paper recipe's projected
#      GPU-hours (benchmarks/data.py recipe)
#   5. the summary table of every figure above (benchmarks/models_speed.py --summary)
# Each step's log (JSON lines included) goes to $OUT (default /tmp/rdpp-cuda-check); STEPS="2 3" runs some;
# FAST=fast,fast-default also times the fast path compiled without CUDA graphs.
#
# The peer's code is read from $SCP_REPO, else .peer/self-critical.pytorch-4c48a33 in this
# repository, else ../shared/peers/self-critical.pytorch-4c48a33 (benchmarks/peer.py). A GPU machine
# with torch but without yacs (the peer's option parser needs it) installs the wheels in .whl/.
# On the device machine, prepared once in the repository root:
#   echo /.whl/ >> .git/info/exclude; echo /.peer/ >> .git/info/exclude
#   mkdir -p .peer && cp -r ../shared/peers/self-critical.pytorch-4c48a33 .peer/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl yacs==0.1.8
# then run:  command "bash benchmarks/cuda_check.sh"   carry [".peer", ".whl"]   timeout_s 590
#
# The same script on a CPU at tiny sizes (checks every code path, measures nothing):
#   bash benchmarks/cuda_check.sh --device cpu

set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda
[[ "${1:-}" == "--device" ]] && DEVICE=${2:?--device cpu or cuda}
OUT=${OUT:-/tmp/rdpp-cuda-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export RDPP_NO_PROGRESS=1 COLUMNS=150 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
STEPS=" ${STEPS:-1 2 3 4} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
run() {  # run LOG SECONDS CMD...: the command's output to $OUT/LOG, its tables (not its JSON) to stdout
  local log=$1 limit=$(( $2 * ${SLOW:-1} )); shift 2
  timeout "$limit" "$@" > "$OUT/$log" 2>&1; local rc=$?
  grep -v '^{' "$OUT/$log" | grep -v -E '^(USDT|ERROR:.*gpuGetDeviceCount|  - |.*dispatch mode)' | tail -${TAIL:-30}
  echo "exit $rc ($log)"
}

if compgen -G ".whl/*.whl" > /dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rdpp-site .whl/*.whl \
    && export PYTHONPATH=/tmp/rdpp-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ -z "${SCP_REPO:-}" && -d .peer/self-critical.pytorch-4c48a33 ]]; then
  export SCP_REPO=$PWD/.peer/self-critical.pytorch-4c48a33
fi

if [[ "$DEVICE" == cuda ]]; then  # the measurement: the paper's shapes; repeat counts sized to the time limit
  SPEED="--batch 50 --repeat 5 --threads 8 --matmul-size 4096" FAST=${FAST:-fast} BACKEND=inductor
  EPOCHS="--preset paper --rows 5000 --val 500 --workers 4 --caches cold --threads 8"
  nvidia-smi -L
else  # a check of the code paths on a CPU: tiny sizes, nothing worth reading in the times
  SPEED="--quick --threads 2" FAST=${FAST:-fast} BACKEND=aot_eager SLOW=${SLOW:-10}  # time limits x10: a shared 2-core machine
  EPOCHS="--preset small --rows 60 --val 10 --workers 0 --caches warm --threads 2"
fi
$PY -c "import torch, rdpp_cli; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available()
      else 'no GPU', '| rdpp', rdpp_cli.__version__)" || exit 1

if want 1; then
  stamp "1. tests/test_cuda.py"
  TAIL=4 run test_cuda.log 120 $PY -m pytest -o addopts="" -q -p no:cacheprovider -m "not slow or slow" tests/test_cuda.py
fi
if want 2; then
  stamp "2. Att2in against the peer's Att2in2Model: XE, SCST / R-DPP m = 5, decoding; the fast path"
  run models_att2in.log 200 $PY benchmarks/models_speed.py --model att2in --device "$DEVICE" $SPEED \
    --precision fp32,bf16 --ss 0.25 --fast "$FAST" --backend $BACKEND --json
fi
if want 3; then
  for model in updown transformer; do
    stamp "3. $model against the peer's own module: XE, SCST / R-DPP m = 5, decoding"
    run models_$model.log 90 $PY benchmarks/models_speed.py --model $model --device "$DEVICE" $SPEED --json
  done
fi
if want 4; then
  stamp "4. whole epochs as the paper presets run them (loading and validation included), then the recipe"
  rm -rf /tmp/rdpp-cuda-epochs
  TAIL=14 run epochs.log 150 $PY benchmarks/data.py epochs --device "$DEVICE" $EPOCHS --rl-epoch dpp \
    --dir /tmp/rdpp-cuda-epochs --json
  run recipe.log 30 $PY benchmarks/data.py recipe "$OUT/epochs.log" --json
fi
stamp "5. summary"
$PY benchmarks/models_speed.py --summary "$OUT"/test_cuda.log "$OUT"/models_*.log "$OUT"/epochs.log "$OUT"/recipe.log
stamp "done"
