#!/usr/bin/env bash
# The diversity-accuracy sweep of docs/experiments.md on the bundled data, ending with the paper's
# Table 1 (one beam-3 caption per image), Table 2 (oracle of 10 and 20 random samples) and Fig. 1
# (self-CIDEr vs mean CIDEr of 10 random samples):
#
#   XE -> SCST, mean-baseline SCST, XE + 5 CIDEr, R-DPP m = 2, 3, 5, 7, R-DPP m = 5 with the mean baseline
#
# Every step is skipped when its artifact is already complete, so an interrupted sweep continues.
# CPU, 2 cores: XE ~11 min, each fine-tune (6 epochs) 2-13 min, sampling seconds, scoring with
# METEOR about a minute per artifact; ~1.5-2 h in all. Needs Java (METEOR, PTB tokenizer).
#
#   bash examples/toy_sweep.sh              # workspace ./runs-sweep (or WS=...)
#   IMAGES=300 XE_EPOCHS=1 RL_EPOCHS=1 WS=/tmp/sweep-smoke bash examples/toy_sweep.sh   # smoke run, ~10 min
set -euo pipefail
WS=${WS:-runs-sweep}
RDPP=${RDPP:-rdpp}
PY=${PY:-python3}
IMAGES=${IMAGES:-3000}
XE_EPOCHS=${XE_EPOCHS:-8}
RL_EPOCHS=${RL_EPOCHS:-6}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
done_() { [ -f "$1/manifest.json" ]; }
common=(--workspace "$WS" --device cpu)

done_ "$WS/data/toy" || $RDPP prepro toy --images "$IMAGES" --workspace "$WS" --out "$WS/data/toy"
done_ "$WS/xe/xe" || $RDPP train-xe --data "$WS/data/toy" "${common[@]}" --preset small --epochs "$XE_EPOCHS" --lr 1e-3 \
  --out "$WS/xe/xe"

ft() {  # name, then the reward options
  local name=$1; shift
  done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/xe" "${common[@]}" --epochs "$RL_EPOCHS" --lr 1e-4 \
    --out "$WS/finetune/$name" "$@"
}
ft scst --reward scst
ft scst-mean --reward scst-mean
ft xe-cider --reward xe-cider --lam 5
for m in 2 3 5 7; do ft "dpp-m$m" --reward dpp --m "$m"; done
ft dpp-m5-mean --reward dpp --m 5 --baseline mean

metrics=Bleu_4,METEOR,ROUGE_L,CIDEr
for model in "$WS/xe/xe" "$WS"/finetune/*; do
  name=$(basename "$model")
  for spec in "beam3 --method beam --beam 3 --n 1" "random10 --method random --n 10" "random20 --method random --n 20"; do
    set -- $spec; tag=$1; shift
    done_ "$WS/samples/$name-$tag" || $RDPP sample "$model" "${common[@]}" --split test "$@" --out "$WS/samples/$name-$tag"
  done
  done_ "$WS/scores/$name-beam3" || $RDPP score "$WS/samples/$name-beam3" --workspace "$WS" \
    --metrics "$metrics,SPICE" --out "$WS/scores/$name-beam3"
  done_ "$WS/scores/$name-random10" || $RDPP score "$WS/samples/$name-random10" --workspace "$WS" \
    --oracle --self-cider --diversity --metrics "$metrics" --out "$WS/scores/$name-random10"
  done_ "$WS/scores/$name-random20" || $RDPP score "$WS/samples/$name-random20" --workspace "$WS" \
    --oracle --metrics "$metrics" --out "$WS/scores/$name-random20"
done

labels=$(for d in "$WS"/scores/*-random10; do basename "$d" -random10; done | paste -sd, -)
$RDPP plot "$WS"/scores/*-random10 --labels "$labels" --workspace "$WS" --out "$WS/fig1.png"
$PY "$(dirname "$0")/sweep_tables.py" "$WS"
