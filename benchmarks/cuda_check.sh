#!/usr/bin/env bash
# Every GPU figure of the README, rdpp against self-critical.pytorch's own code in the same process,
# each part ending with one summary table, no network. Two parts, each one call of at most 8 minutes
# on one H100/H200 with a cold compile cache (each step's time limit covers its own compiling, as
# measured on an H200: 40-72 s per compiled graph; `--plan` prints the steps and limits):
#   --part 1 (the default on CUDA): steps 1 and 2 (tests/test_cuda.py; Att2in against the peer, its
#            fast path): the README's GPU figures
#   --part 2: steps 3 and 4 (UpDown and the Transformer against the peer, their fast paths; epochs)
#   --part all: both in one run (about 15 minutes cold; the default with --device cpu)
# The steps:
#   1. tests/test_cuda.py: the CUDA path against the CPU in float64, the fast path in CUDA graphs, the
#      sampling pass compiled at the paper's shapes
#   2. Att2in against the peer's Att2in2Model, batch 50: XE fp32 / bf16 / scheduled sampling, SCST and
#      R-DPP m = 5 (and the published R-DPP way), decoding 5 samples; the fast path against eager
#      (benchmarks/models_speed.py --model att2in ... --fast fast)
#   3. UpDown and the Transformer against the peer's UpDownModel / TransformerModel, batch 50, and their
#      fast paths (XE, R-DPP m = 5, decoding)
#   4. whole epochs over COCO-shaped rows as the paper presets run them, loading and validation
#      included: XE at the preset's batch, R-DPP m = 5 at the preset's batch, cold page cache, each
#      after an untimed warm-up whose seconds (compiling) are printed apart (benchmarks/data.py
#      epochs; XE_CONFIGS adds e.g. scheduled sampling), then the paper recipe's projected GPU-hours,
#      validation included (benchmarks/data.py recipe)
#   5. the summary table of every figure above, the fast sides' compile seconds included
#      (benchmarks/models_speed.py --summary)
# Every step prints its rows as they finish (a call cut short still shows what it measured); each
# step's whole log (JSON lines included) goes to $OUT (default /tmp/rdpp-cuda-check). STEPS="2 3"
# runs some; FAST=fast,fast-default also times the fast path compiled without CUDA graphs. The steps
# share one compile cache (TORCHINDUCTOR_CACHE_DIR, default /tmp/rdpp-inductor-cache: a second call on
# the same machine reuses what the first compiled).
#
# The peer's code is read from $SCP_REPO, else .peer/self-critical.pytorch-4c48a33 in this
# repository, else ../shared/peers/self-critical.pytorch-4c48a33 (benchmarks/peer.py). A GPU machine
# with torch but without yacs (the peer's option parser needs it) installs the wheels in .whl/.
# On the device machine, prepared once in the repository root:
#   echo /.whl/ >> .git/info/exclude; echo /.peer/ >> .git/info/exclude
#   mkdir -p .peer && cp -r ../shared/peers/self-critical.pytorch-4c48a33 .peer/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl yacs==0.1.8
# then run:  command "bash benchmarks/cuda_check.sh"   carry [".peer", ".whl"]   timeout_s 470
# and, on the same machine while it is warm, the same with --part 2 (timeout_s 540).
#
# The same script on a CPU at tiny sizes (checks every code path, measures nothing; limits x10):
#   bash benchmarks/cuda_check.sh --device cpu
# The steps and their time limits (on CUDA; each part's sum to at most 480 s), without running anything:
#   bash benchmarks/cuda_check.sh --device cpu --plan

set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda PLAN=0 PART=
while (( $# )); do
  case $1 in
    --device) DEVICE=${2:?--device cpu or cuda}; shift 2 ;;
    --plan) PLAN=1; shift ;;
    --part) PART=${2:?--part 1, 2 or all}; shift 2 ;;
    *) echo "cuda_check.sh: unknown option $1 (--device cpu|cuda, --part 1|2|all, --plan)" >&2; exit 2 ;;
  esac
done
case $PART in
  1) DEFAULT_STEPS="1 2" ;;
  2) DEFAULT_STEPS="3 4" ;;
  all) DEFAULT_STEPS="1 2 3 4" ;;
  "") DEFAULT_STEPS="1 2"; [[ $DEVICE == cpu ]] && DEFAULT_STEPS="1 2 3 4" ;;  # one GPU call; every path on a CPU
  *) echo "cuda_check.sh: --part is 1 (tests/test_cuda.py, Att2in), 2 (UpDown, the Transformer, epochs) or all, not $PART" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/rdpp-cuda-check}
PY=${PY:-python3}
export RDPP_NO_PROGRESS=1 COLUMNS=150 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/rdpp-inductor-cache}  # one cache for every step
export TORCHINDUCTOR_FX_GRAPH_CACHE=1 TORCHINDUCTOR_AUTOGRAD_CACHE=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
STEPS=" ${STEPS:-$DEFAULT_STEPS} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
TOTAL=0
run() {  # run LOG SECONDS CMD...: the command's output to $OUT/LOG, its rows (not its JSON) to stdout as they come
  local log=$1 limit=$2; shift 2
  TOTAL=$(( TOTAL + limit ))
  if (( PLAN )); then
    printf '%5d s  %-22s %s\n' "$limit" "$log" "$*"
    return 0
  fi
  timeout "$(( limit * ${SLOW:-1} ))" "$@" 2>&1 | tee "$OUT/$log" \
    | grep --line-buffered -v -E '^(\{|USDT|ERROR:.*gpuGetDeviceCount|  - |.*dispatch mode)'
  local rc=${PIPESTATUS[0]}
  echo "exit $rc ($log$( (( rc == 124 )) && echo ": stopped at its limit of $(( limit * ${SLOW:-1} )) s"))"
}
step() { (( PLAN )) && echo "$*" || stamp "$*"; }

if (( ! PLAN )); then
  mkdir -p "$OUT" "$TORCHINDUCTOR_CACHE_DIR"
  if compgen -G ".whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rdpp-site .whl/*.whl \
      && export PYTHONPATH=/tmp/rdpp-site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ -z "${SCP_REPO:-}" && -d .peer/self-critical.pytorch-4c48a33 ]]; then
  export SCP_REPO=$PWD/.peer/self-critical.pytorch-4c48a33
fi

if [[ "$DEVICE" == cuda ]]; then  # the measurement: the paper's shapes; repeat counts sized to the time limits
  SPEED="--batch 50 --repeat 5 --threads 8 --matmul-size 4096" FAST=${FAST:-fast} BACKEND=inductor
  EPOCHS="--preset paper --rows 5000 --val 500 --workers 4 --caches cold --threads 8"
  (( PLAN )) || nvidia-smi -L
else  # a check of the code paths on a CPU: tiny sizes, nothing worth reading in the times
  SPEED="--quick --threads 2" FAST=${FAST:-fast} BACKEND=aot_eager SLOW=${SLOW:-10}  # time limits x10: a shared 2-core machine
  EPOCHS="--preset small --rows 60 --val 10 --workers 0 --caches warm --threads 2"
fi
if (( PLAN )) && [[ -z $PART || $PART == all ]]; then  # the plan of the whole check: its two parts, each one GPU call
  bash "$0" --device "$DEVICE" --plan --part 1 && bash "$0" --device "$DEVICE" --plan --part 2
  exit
fi
if (( PLAN )); then
  echo "cuda_check.sh --device $DEVICE --part $PART: the steps and their time limits on CUDA$( [[ $DEVICE == cpu ]] && echo " (x${SLOW} on this CPU)")"
else
  $PY -c "import torch, rdpp_cli; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available()
        else 'no GPU', '| rdpp', rdpp_cli.__version__)" || exit 1
fi

if want 1; then
  step "1. tests/test_cuda.py"
  run test_cuda.log 210 $PY -m pytest -o addopts="" -v -p no:cacheprovider -m "not slow or slow" --durations=5 tests/test_cuda.py
fi
if want 2; then
  step "2. Att2in against the peer's Att2in2Model: XE, SCST / R-DPP m = 5, decoding; the fast path"
  run models_att2in.log 180 $PY benchmarks/models_speed.py --model att2in --device "$DEVICE" $SPEED \
    --precision fp32,bf16 --ss 0.25 --fast "$FAST" --backend $BACKEND --json
fi
if want 3; then
  for model in updown transformer; do
    step "3. $model against the peer's own module: XE, R-DPP m = 5, decoding; the fast path"
    run models_$model.log 140 $PY benchmarks/models_speed.py --model $model --device "$DEVICE" $SPEED \
      --what xe,dpp,decode --fast "$FAST" --backend $BACKEND --warmup 2 --json
  done
fi
if want 4; then
  step "4. whole epochs as the paper presets run them (loading and validation included), then the recipe"
  (( PLAN )) || rm -rf /tmp/rdpp-cuda-epochs
  run epochs.log 170 $PY benchmarks/data.py epochs --device "$DEVICE" $EPOCHS --xe-configs "${XE_CONFIGS:-preset:fp32}" \
    --rl-epoch dpp --dir /tmp/rdpp-cuda-epochs --json
  run recipe.log 5 $PY benchmarks/data.py recipe "$OUT/epochs.log" --json
fi
step "5. summary"
run summary.log 10 $PY benchmarks/models_speed.py --summary "$OUT"/test_cuda.log "$OUT"/models_*.log "$OUT"/epochs.log \
  "$OUT"/recipe.log
if (( PLAN )); then
  echo "part $PART total: $TOTAL s (one GPU call: at most 480 s)"
else
  stamp "done"
fi
