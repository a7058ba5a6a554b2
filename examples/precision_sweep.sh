#!/usr/bin/env bash
# fp32 against bf16 on the bundled data (docs/training.md "Precision"): for each precision
# and seed, an XE model (train-xe --preset small, the toy sweep's settings) and, from it, SCST and
# R-DPP m = 5 (the toy sweep's fine-tuning), every stage run with that --precision; then each model
# sampled (greedy, and 10 random captions per test image, in the same precision) and scored (CIDEr,
# oracle, self-CIDEr). examples/precision_tables.py prints the per-run table, the mean over seeds,
# bf16 minus fp32, and whether bf16 lands within ±0.03 greedy val CIDEr-D of fp32.
#
# Every step is skipped when its artifact is complete, so an interrupted sweep continues.
# CPU, 2 cores, full size: each XE ~10 min in fp32, each fine-tune 2-13 min; 12 trainings in all.
#
#   bash examples/precision_sweep.sh                       # workspace ./runs-precision (or WS=...)
#   IMAGES=300 XE_EPOCHS=1 RL_EPOCHS=1 WS=/tmp/prec-smoke bash examples/precision_sweep.sh   # smoke run
#   python examples/precision_tables.py runs-precision
set -euo pipefail
WS=${WS:-runs-precision}
RDPP=${RDPP:-rdpp}
PY=${PY:-python3}
IMAGES=${IMAGES:-3000}
XE_EPOCHS=${XE_EPOCHS:-8}
RL_EPOCHS=${RL_EPOCHS:-6}
SEEDS=${SEEDS:-"123 7"}
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
done_() { [ -f "$1/manifest.json" ]; }
common=(--workspace "$WS" --device cpu)

done_ "$WS/data/toy" || $RDPP prepro toy --images "$IMAGES" --workspace "$WS" --out "$WS/data/toy"

for p in $PRECISIONS; do
  for seed in $SEEDS; do
    tag="$p-s$seed"
    done_ "$WS/xe/xe-$tag" || $RDPP train-xe --data "$WS/data/toy" "${common[@]}" --preset small \
      --epochs "$XE_EPOCHS" --lr 1e-3 --seed "$seed" --precision "$p" --out "$WS/xe/xe-$tag"
    for spec in "scst --reward scst" "dpp-m5 --reward dpp --m 5"; do
      set -- $spec; name=$1-$tag; shift
      done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/xe-$tag" "${common[@]}" --epochs "$RL_EPOCHS" \
        --lr 1e-4 --seed "$seed" --precision "$p" --out "$WS/finetune/$name" "$@"
    done
    for model in "$WS/xe/xe-$tag" "$WS/finetune/scst-$tag" "$WS/finetune/dpp-m5-$tag"; do
      name=$(basename "$model")
      done_ "$WS/samples/$name-greedy" || $RDPP sample "$model" "${common[@]}" --split test --method greedy \
        --n 1 --precision "$p" --out "$WS/samples/$name-greedy"
      done_ "$WS/samples/$name-random10" || $RDPP sample "$model" "${common[@]}" --split test --method random \
        --n 10 --precision "$p" --out "$WS/samples/$name-random10"
      done_ "$WS/scores/$name-greedy" || $RDPP score "$WS/samples/$name-greedy" --workspace "$WS" \
        --metrics CIDEr --out "$WS/scores/$name-greedy"
      done_ "$WS/scores/$name-random10" || $RDPP score "$WS/samples/$name-random10" --workspace "$WS" \
        --oracle --self-cider --metrics CIDEr --out "$WS/scores/$name-random10"
    done
  done
done

$PY "$(dirname "$0")/precision_tables.py" "$WS"
