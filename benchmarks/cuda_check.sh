#!/usr/bin/env bash
# The GPU's figures in one run, rdpp against self-critical.pytorch's own code in the same process:
# about 6-8 minutes of wall time on one H100/H200, no network. Steps (STEPS="1 3" runs some):
#   1. the XE step, paper shapes, batch 50: rdpp fp32 and bf16 against the peer (benchmarks/train.py)
#   2. the RL steps at m = 5: rdpp SCST and R-DPP, fp32 and bf16, against the peer's SCST step and the
#      published R-DPP way (benchmarks/finetune.py)
#   3. the XE step at batch 200, fp32 and bf16, against the peer (benchmarks/train.py)
#   4. whole epochs over 10,000 COCO-shaped rows, loading included: XE at batch 50 fp32, 200 fp32 and
#      200 bf16; R-DPP and SCST at m = 5 (paper preset) from that model (benchmarks/data_epochs.py),
#      then the paper recipe's projected GPU-hours (benchmarks/recipe_hours.py)
#   not by default (STEPS="5 6 7 8 9 10 11"): 5. tests/test_cuda.py, the CUDA path against the CPU in float64;
#   6. benchmarks/precision_cuda.sh, bf16 against fp32 (numerics and steps); 7. decoding on the GPU
#   against the peer's own decoding, and DPP selection (benchmarks/sample.py, benchmarks/selection.py); 8. the demo's training
#   stages (without Java it stops at its first scoring step); 9. the training fast path (--fast on;
#   about 8 minutes, most of it compiling): its GPU tests in tests/test_cuda.py, then
#   benchmarks/fast_path.py, eager against fast (CUDA graphs) and fast without CUDA graphs, XE /
#   R-DPP / SCST steps at the paper's shapes; 10. the content check on read of features.h5 at
#   COCO's scale (benchmarks/data_content_check.py); 11. UpDown and the Transformer against the peer's own
#   UpDownModel / TransformerModel: XE, SCST and R-DPP (m = 5) steps and decoding 5 samples per image, batch 50
#   (benchmarks/models_speed.py --device cuda; models_updown.log, models_transformer.log)
# Each step prints its table and writes its log (JSON lines included) to $OUT (default
# /tmp/rdpp-cuda-check): train_b50.log, finetune_m5.log, train_b200.log, epochs.log, recipe.log.
#
# The peer's code is read from $SCP_REPO, else .peer/self-critical.pytorch-4c48a33 in this
# repository, else ../shared/peers/self-critical.pytorch-4c48a33 (benchmarks/peer.py). A GPU machine
# with torch but without yacs (the peer's option parser needs it) installs the wheels in .whl/.
#
# On the device machine (the coordinator's call), prepared once in the repository root:
#   echo /.whl/ >> .git/info/exclude; echo /.peer/ >> .git/info/exclude
#   mkdir -p .peer && cp -r ../shared/peers/self-critical.pytorch-4c48a33 .peer/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl yacs==0.1.8
# then run:  command "bash benchmarks/cuda_check.sh"   carry [".peer", ".whl"]   timeout_s 590
#
# The same script on a CPU at tiny sizes (checks every code path, measures nothing):
#   DEVICE=cpu bash benchmarks/cuda_check.sh

set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rdpp-cuda-check}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export RDPP_NO_PROGRESS=1 COLUMNS=150 PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
STEPS=" ${STEPS:-1 2 3 4} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
run() {  # run LOG SECONDS CMD...: the command's output to $OUT/LOG, its tables (not its JSON) to stdout
  local log=$1 limit=$(( $2 * ${SLOW:-1} )); shift 2
  timeout "$limit" "$@" > "$OUT/$log" 2>&1; local rc=$?
  grep -v '^{' "$OUT/$log" | grep -v -E '^(USDT|ERROR:.*gpuGetDeviceCount)' | tail -${TAIL:-40}
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

if [[ "$DEVICE" == cuda ]]; then  # the measurement: the issue's shapes and counts
  B=50 BIG=200 NSTEPS=10 REPEATS=5 MM=4096 ROWS=10000 PRESET=paper WORKERS=${WORKERS:-4} THREADS=${THREADS:-8}
  XE_CONFIGS=50:fp32,200:fp32,200:bf16 CACHES=${CACHES:-warm,cold}
  FAST_ARGS="--variants fast,fast-default --warmup 3"
  DECODE_ARGS="" SELECT_ARGS="--select-images 1000" MODELS_ARGS="--batch $B --repeat $REPEATS"
  nvidia-smi -L
else  # a check of the code paths on a CPU: tiny sizes, nothing worth reading in the times
  B=2 BIG=3 NSTEPS=1 REPEATS=1 MM=256 ROWS=${ROWS:-260} PRESET=small WORKERS=0 THREADS=2
  XE_CONFIGS=50:fp32,100:bf16 CACHES=warm SLOW=${SLOW:-10}  # time limits x10: a shared 2-core machine
  FAST_ARGS="--variants fast --warmup 1 --backend aot_eager"  # the compiler's quick backend
  DECODE_ARGS="--batch 2 --n 4 --repeats 1" SELECT_ARGS="--select-images 50 --candidates 6 --keep 2 --repeats 1"
  MODELS_ARGS="--quick --batch $B"
fi
$PY -c "import torch, rdpp_cli; from rdpp_cli.precision import resolve_precision as r
gpu = torch.cuda.is_available()
print('torch', torch.__version__, torch.cuda.get_device_name() if gpu else 'no GPU', '| rdpp', rdpp_cli.__version__,
      '| --precision auto ->', r('auto', 'cuda') if gpu else '(a CPU measures it: not here)')" || exit 1
$PY -c "import sys; sys.path.insert(0, 'benchmarks'); import peer; print('peer:', peer.modules(peer.find_repo()).repo)" \
  || echo "the peer's code does not load: steps 1, 2 and 4 will fail (see above)"

if want 1; then
  stamp "1. XE step, batch $B, rdpp fp32 / bf16 against self-critical.pytorch"
  run train_b50.log 120 $PY benchmarks/train.py --device "$DEVICE" --batch $B --steps $NSTEPS --threads $THREADS \
    --matmul-size $MM --json
fi

if want 2; then
  stamp "2. RL steps, m = 5: rdpp SCST / R-DPP against self-critical.pytorch's SCST and the published R-DPP way"
  run finetune_m5.log 150 $PY benchmarks/finetune.py --device "$DEVICE" --batch $B --ms 5 --repeats $REPEATS \
    --threads $THREADS --matmul-size $MM --json
fi

if want 3; then
  stamp "3. XE step, batch $BIG, rdpp fp32 / bf16 against self-critical.pytorch"
  run train_b200.log 120 $PY benchmarks/train.py --device "$DEVICE" --batch $BIG --steps $NSTEPS --threads $THREADS \
    --matmul-size $MM --json
fi

if want 4; then
  stamp "4. whole epochs over $ROWS COCO-shaped rows (XE $XE_CONFIGS; R-DPP and SCST m = 5), loading included"
  rm -rf /tmp/rdpp-cuda-epochs
  run epochs.log 330 $PY benchmarks/data_epochs.py --device "$DEVICE" --preset $PRESET --rows $ROWS \
    --workers $WORKERS --xe-configs $XE_CONFIGS --caches $CACHES --rl-epoch dpp,scst --threads $THREADS \
    --dir /tmp/rdpp-cuda-epochs --json
  stamp "   the paper recipe (30 XE + 100 R-DPP epochs over 113,287 images), projected from those epochs"
  run recipe.log 30 $PY benchmarks/recipe_hours.py "$OUT/epochs.log" --json
fi

if want 5; then
  stamp "5. tests/test_cuda.py"
  run test_cuda.log 120 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
fi

if want 6; then
  stamp "6. bf16 against fp32: numerics and steps (precision_cuda.sh)"
  run precision.log 240 env OUT="$OUT" PY="$PY" bash benchmarks/precision_cuda.sh
fi

if want 7; then
  stamp "7. decoding against self-critical.pytorch's own decoding, and selection"
  run sample.log 150 $PY benchmarks/sample.py --device "$DEVICE" $DECODE_ARGS --json
  run select.log 60 $PY benchmarks/selection.py --device "$DEVICE" $SELECT_ARGS --json
fi

if want 8; then
  stamp "8. the demo's stages on $DEVICE"
  command -v java >/dev/null || echo "no java here: the demo stops at scoring (the PTB tokenizer needs Java)"
  TAIL=14 run demo.log 200 $PY -c "from rdpp_cli.demo import demo; demo(out='/tmp/rdpp-cuda-demo', device='$DEVICE')"
fi

if want 9; then
  stamp "9. the training fast path: GPU tests, then eager against --fast on"
  run cuda_fast_tests.log 300 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "fast or reward_on_cuda"
  run cuda_fast_path.log 420 $PY benchmarks/fast_path.py --device "$DEVICE" --sections xe,dpp,scst --batch $B \
    --steps $NSTEPS --matmul-size $MM --threads $THREADS $FAST_ARGS --json
fi

if want 10; then
  stamp "10. the content check on read of features.h5 ($ROWS COCO-shaped rows), projected to COCO"
  run content_check.log 300 $PY benchmarks/data_content_check.py --rows $ROWS --rounds 2 --dir /tmp/rdpp-cuda-content \
    --gpu-epoch-s 80 --json
  rm -rf /tmp/rdpp-cuda-content
fi

if want 11; then
  stamp "11. UpDown and the Transformer against self-critical.pytorch's own modules: XE, SCST / R-DPP m = 5, decoding"
  for model in updown transformer; do
    run models_$model.log 240 $PY benchmarks/models_speed.py --model $model --device "$DEVICE" $MODELS_ARGS \
      --threads $THREADS --json
  done
fi

stamp "done"
