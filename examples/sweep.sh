#!/usr/bin/env bash
# The sweeps of the docs on the bundled data, each ending with its tables (`rdpp table <sweep>`):
#
#   bash examples/sweep.sh toy         docs/experiments.md: XE -> SCST, mean-baseline SCST, XE + 5 CIDEr,
#                                      R-DPP m = 2, 3, 5, 7, R-DPP m = 5 with the mean baseline; each model
#                                      sampled (greedy, beam 3, 10 and 20 random captions per test image) and
#                                      scored; the paper's Table 1, Table 2, Fig. 1 (also as fig1.png) and the
#                                      results table. ~1.5-2 h on 2 CPU cores; needs Java (METEOR, PTB tokenizer).
#   bash examples/sweep.sh objective   docs/experiments.md's two-seed checks: XE, SCST and R-DPP m = 2, 5
#                                      fine-tuned with seeds 123 and 7 (seed 7's runs named <model>-s7), each
#                                      sampled greedy and 10 random, scored. The seed-123 runs are the toy
#                                      sweep's, so both share one workspace.
#   bash examples/sweep.sh precision   docs/training.md "Precision": for each precision (PRECISIONS) and seed,
#                                      an XE model and SCST and R-DPP m = 5 from it, every stage in that
#                                      precision; 12 trainings. Workspace ./runs-precision by default.
#   bash examples/sweep.sh selection   docs/decoding.md "Choosing a set": for K = 5 and 10 captions per test
#                                      image of the XE, SCST and R-DPP m=5 models, random sampling, beam, diverse
#                                      beam search, --select logprob / mbr / dpp from C = 50 samples; the
#                                      temperature curves of XE and SCST; the R-DPP points m = 2, 3, 5, 7; the
#                                      plot $WS/selection.png. Runs after the toy sweep (or rdpp demo) in its
#                                      workspace: models are found there by name, or given: XE=... SCST=...
#                                      DPP_M5=... (rdpp demo's newest xe/*, finetune/scst-v*, finetune/dpp-m5-v*).
#   bash examples/sweep.sh models      docs/experiments.md "Across models": for each model of MODELS (default
#                                      "att2in updown transformer"), XE (`train-xe --model M --preset small`) and
#                                      SCST and R-DPP m = 5 from it, each sampled with 10 random captions per test
#                                      image and scored: xe/xe-M, finetune/scst-M, finetune/dpp-m5-M; the three
#                                      sets side by side (rdpp compare: compare/models-M, its figure.png of the
#                                      first 4 test images). Workspace
#                                      ./runs-models by default. Per-model settings below (XE_EPOCHS_<model>, ...);
#                                      DEVICE=cuda for a GPU. Att2in's three trainings: ~50 min on 2 shared cores.
#   bash examples/sweep.sh models-lr   docs/experiments.md "The fine-tuning learning rate per model": after `models` in
#                                      its workspace, SCST and R-DPP m = 5 from each model's xe/xe-M at every lr of
#                                      RL_LRS (default "3e-5 1e-4 3e-4"; the models sweep's own runs where made at
#                                      that lr), then
#                                      a table of each run's best val CIDEr-D and val self-CIDEr (metrics.csv).
#   bash examples/sweep.sh models-real the same on the 390 real COCO photos of examples/real_photos.sh (REAL=
#                                      their folder, WEIGHTS= the MobileNetV2 trunk; 224 pixels, 7x7 grid, batch
#                                      10). Workspace ./runs-models-real by default. Att2in's: ~1.5 h.
#
# Every step is skipped when its artifact is complete, so an interrupted sweep continues. CPU, 2 cores: XE
# ~11 min, each fine-tune (6 epochs) 2-13 min, sampling seconds, scoring about a minute per artifact.
# To compare two versions of rdpp, run a sweep into another workspace with RDPP="python -m rdpp_cli" from a
# checkout of the other version and compare: rdpp table objective --workspace NEW --against OLD.
#
#   bash examples/sweep.sh toy                                               # workspace ./runs-sweep (or WS=...)
#   IMAGES=300 XE_EPOCHS=1 RL_EPOCHS=1 WS=/tmp/smoke bash examples/sweep.sh toy   # smoke run, ~10 min
#   WS=/tmp/ws MAX_IMAGES=40 C=20 bash examples/sweep.sh selection               # a small selection check
#   IMAGES=300 XE_EPOCHS=1 RL_EPOCHS=1 MODELS=att2in WS=/tmp/models-smoke bash examples/sweep.sh models  # smoke
set -euo pipefail
SWEEP=${1:-}
case $SWEEP in
  toy | objective | selection) WS=${WS:-runs-sweep} ;;
  precision) WS=${WS:-runs-precision} ;;
  models | models-lr) WS=${WS:-runs-models} ;;
  models-real) WS=${WS:-runs-models-real} ;;
  *) echo "usage: bash examples/sweep.sh toy|objective|precision|selection|models|models-lr|models-real (got '$SWEEP')" >&2
     exit 2 ;;
esac
RDPP=${RDPP:-rdpp}
GIVEN_XE_EPOCHS=${XE_EPOCHS:-}  # models: given, it wins over the per-model defaults
GIVEN_RL_EPOCHS=${RL_EPOCHS:-}  # models: given, it wins over the fine-tuning recipe's
IMAGES=${IMAGES:-3000}          # training images of the bundled data
XE_EPOCHS=${XE_EPOCHS:-8}
RL_EPOCHS=${RL_EPOCHS:-6}
SEEDS=${SEEDS:-"123 7"}         # objective, precision
PRECISIONS=${PRECISIONS:-"fp32 bf16"}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
done_() { [ -f "$1/manifest.json" ]; }
common=(--workspace "$WS" --device cpu)

data() { done_ "$WS/data/toy" || $RDPP prepro toy --images "$IMAGES" --workspace "$WS" --out "$WS/data/toy"; }

xe() {  # name, then more train-xe options
  local name=$1; shift
  done_ "$WS/xe/$name" || $RDPP train-xe --data "$WS/data/toy" "${common[@]}" --preset small --epochs "$XE_EPOCHS" \
    --lr 1e-3 --out "$WS/xe/$name" "$@"
}

ft() {  # the XE model, the name, then the reward and other finetune options
  local from=$1 name=$2; shift 2
  done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/$from" "${common[@]}" --epochs "$RL_EPOCHS" --lr 1e-4 \
    --out "$WS/finetune/$name" "$@"
}

run() {  # model folder, artifact name, the sampling options, "--", the scoring options: samples/<name>, scores/<name>
  local model=$1 name=$2 sample=()
  shift 2
  while [ "$1" != "--" ]; do sample+=("$1"); shift; done
  shift
  done_ "$WS/samples/$name" || $RDPP sample "$model" "${common[@]}" "${sample[@]}" --out "$WS/samples/$name"
  done_ "$WS/scores/$name" || $RDPP score "$WS/samples/$name" --workspace "$WS" "$@" --out "$WS/scores/$name"
}

toy() {
  data
  xe xe
  ft xe scst --reward scst
  ft xe scst-mean --reward scst-mean
  ft xe xe-cider --reward xe-cider --lam 5
  for m in 2 3 5 7; do ft xe "dpp-m$m" --reward dpp --m "$m"; done
  ft xe dpp-m5-mean --reward dpp --m 5 --baseline mean
  local metrics=Bleu_4,METEOR,ROUGE_L,CIDEr model name
  for model in "$WS/xe/xe" "$WS"/finetune/*; do
    name=$(basename "$model")
    run "$model" "$name-beam3" --split test --method beam --beam 3 --n 1 -- --metrics "$metrics,SPICE"
    run "$model" "$name-random10" --split test --method random --n 10 -- --oracle --self-cider --diversity \
      --metrics "$metrics"
    run "$model" "$name-random20" --split test --method random --n 20 -- --oracle --metrics "$metrics"
  done
  local labels
  labels=$(for d in "$WS"/scores/*-random10; do basename "$d" -random10; done | paste -sd, -)
  $RDPP plot "$WS"/scores/*-random10 --labels "$labels" --workspace "$WS" --out "$WS/fig1.png"
}

objective() {
  data
  xe xe
  local seed suffix spec name model
  for seed in $SEEDS; do
    suffix=$([ "$seed" = 123 ] && echo "" || echo "-s$seed")
    for spec in "scst --reward scst" "dpp-m2 --reward dpp --m 2" "dpp-m5 --reward dpp --m 5"; do
      set -- $spec; name=$1$suffix; shift
      ft xe "$name" --seed "$seed" "$@"
    done
  done
  for model in "$WS/xe/xe" "$WS"/finetune/scst* "$WS"/finetune/dpp-m2 "$WS"/finetune/dpp-m2-s* "$WS"/finetune/dpp-m5 \
               "$WS"/finetune/dpp-m5-s*; do
    [ -d "$model" ] || continue
    name=$(basename "$model")
    run "$model" "$name-greedy" --split test --method greedy --n 1 -- --metrics CIDEr
    run "$model" "$name-random10" --split test --method random --n 10 -- --oracle --self-cider --diversity \
      --metrics CIDEr
  done
}

precision() {
  data
  local p seed tag spec name model
  for p in $PRECISIONS; do
    for seed in $SEEDS; do
      tag="$p-s$seed"
      xe "xe-$tag" --seed "$seed" --precision "$p"
      for spec in "scst --reward scst" "dpp-m5 --reward dpp --m 5"; do
        set -- $spec; name=$1-$tag; shift
        ft "xe-$tag" "$name" --seed "$seed" --precision "$p" "$@"
      done
      for model in "$WS/xe/xe-$tag" "$WS/finetune/scst-$tag" "$WS/finetune/dpp-m5-$tag"; do
        name=$(basename "$model")
        run "$model" "$name-greedy" --split test --method greedy --n 1 --precision "$p" -- --metrics CIDEr
        run "$model" "$name-random10" --split test --method random --n 10 --precision "$p" -- --oracle \
          --self-cider --metrics CIDEr
      done
    done
  done
}

# ---- selection: set selection against the decoders, on models found in $WS ---------------------------------

C=${C:-50}                      # candidates per image for --select
KS=${KS:-"5 10"}                # set sizes of the table
TEMPS=${TEMPS:-"0.2 0.3 0.4 0.5 0.7 0.85 1.0 1.25 1.5 2.0"}  # the temperature curves (10 samples per image; an RL model needs T < 0.5 to reach low self-CIDEr)

pick() {  # group, name: $WS/group/name, else the newest complete $WS/group/name-v<k>
  local d=$WS/$1/$2
  if done_ "$d"; then echo "$d"; return; fi
  for d in $(ls -d "$WS/$1/$2"-v[0-9]* 2>/dev/null | sort -V -r); do
    if done_ "$d"; then echo "$d"; return; fi
  done
}
newest() { ls -d "$WS/$1"/*/ 2>/dev/null | while read -r d; do done_ "$d" && echo "${d%/}"; done | tail -1; }

selection() {
  local xe_model=${XE:-$(pick xe xe)}
  declare -gA MODEL=([xe]=${xe_model:-$(newest xe)} [scst]=${SCST:-$(pick finetune scst)})
  local m var label K T
  for m in 2 3 5 7; do
    var=DPP_M$m
    MODEL[dpp-m$m]=${!var:-$(pick finetune "dpp-m$m")}
  done
  for label in xe scst dpp-m5; do
    [ -n "${MODEL[$label]}" ] || { echo "no $label model in $WS (give it as ${label^^}=PATH, e.g. DPP_M5=...)" >&2; exit 2; }
  done
  common=(--workspace "$WS" --device "${DEVICE:-cpu}" --split "${SPLIT:-test}" --seed "${SEED:-0}")
  [ -n "${MAX_IMAGES:-}" ] && common+=(--max-images "$MAX_IMAGES")
  for label in xe scst dpp-m5; do
    for K in $KS; do
      sel "$label" "random-k$K" --method random --n "$K"
      sel "$label" "beam-k$K" --method beam --n "$K"
      sel "$label" "dbs-k$K" --method dbs --n "$K"
      sel "$label" "logprob-c$C-k$K" --n "$K" --select logprob --candidates "$C"
      sel "$label" "mbr-c$C-k$K" --n "$K" --select mbr --candidates "$C"
      sel "$label" "dpp-consensus-c$C-k$K" --n "$K" --select dpp --quality consensus --candidates "$C"
      sel "$label" "dpp-logprob-c$C-k$K" --n "$K" --select dpp --quality logprob --candidates "$C"
    done
  done
  for label in xe scst; do  # the temperature curves; T = 1 is the random-k10 point above
    for T in $TEMPS; do
      if awk "BEGIN { exit !($T == 1) }"; then sel "$label" "random-k10" --method random --n 10; continue; fi
      sel "$label" "random-k10-t$T" --method random --n 10 --temperature "$T"
    done
  done
  for m in 2 3 5 7; do  # the R-DPP points
    if [ -n "${MODEL[dpp-m$m]}" ]; then sel "dpp-m$m" "random-k10" --method random --n 10
    else echo "note: no R-DPP m=$m model in $WS (DPP_M$m=PATH); its point is left out" >&2; fi
  done
}

sel() {  # model label, tag, then the sampling options: sampled and scored as sel-<label>-<tag>
  local label=$1 tag=$2; shift 2
  run "${MODEL[$label]}" "sel-$label-$tag" "$@" -- --metrics CIDEr --oracle --self-cider --diversity
}

# ---- models: XE, SCST and R-DPP m=5 of every model, on the bundled data or the real photos ----------------

MODELS=${MODELS:-"att2in updown transformer"}
RL_LRS=${RL_LRS:-"3e-5 1e-4 3e-4"}            # models-lr: the fine-tuning learning rates tried per model
MODEL_RUNS=("scst --reward scst --m 5" "dpp-m5 --reward dpp --m 5")  # models, models-lr: each model's fine-tunes
REAL=${REAL:-../shared/data/coco-real-390}   # models-real: the photo set (dataset_coco390.json, images/)
WEIGHTS=${WEIGHTS:-../shared/weights/mobilenet_v2-imagenet-features.pth}
# Each model's XE epochs and learning rate; XE_EPOCHS_<model>, XE_LR_<model> win (XE_EPOCHS for every model),
# set but empty XE_LR_<model>= means the preset's (train-xe --preset small: lr 4e-4 x0.8 every 3 epochs;
# the transformer's Noam schedule, lr factor 1.0, 400 warm-up steps). XE_OPTS_<model>: more train-xe options;
# RL_EPOCHS_<model>, RL_LR_<model>: finetune's (default: the model's `finetune --preset small` recipe, RL_EPOCHS when
# given).
#   bundled data, 48 steps of 50 images per epoch: att2in as the toy sweep's xe (8 epochs, lr 1e-3); updown at
#   the same settings (same sizes as att2in's small preset); the transformer 15 epochs of its Noam schedule,
#   whose 400 warm-up steps take 8 of them.
#   real photos, 32 steps of 10 photos per epoch: 25 epochs at the preset's schedule, as examples/real_photos.sh.
declare -A XE_EPOCHS_TOY=([att2in]=8 [updown]=8 [transformer]=15) XE_LR_TOY=([att2in]=1e-3 [updown]=1e-3)

setting() {  # NAME, model, default: $NAME_<model> when set (even empty), else the default
  local var="$1_${2//[^A-Za-z0-9_]/_}"
  if [ -n "${!var+set}" ]; then echo "${!var}"; else echo "$3"; fi
}

real_data() {
  if [ ! -f "$REAL/dataset_coco390.json" ] || [ ! -d "$REAL/images" ]; then
    echo "error: no photo set at REAL=$REAL (it needs dataset_coco390.json and images/); give the folder of the" \
         "390 COCO photos of examples/real_photos.sh as REAL=PATH" >&2; exit 2
  fi
  if [ ! -f "$WEIGHTS" ]; then
    echo "error: no backbone weights at WEIGHTS=$WEIGHTS; give the MobileNetV2 ImageNet trunk as WEIGHTS=PATH" >&2
    exit 2
  fi
  done_ "$WS/data/real" || $RDPP prepro coco --karpathy-json "$REAL/dataset_coco390.json" --images-root \
    "$REAL/images" --backbone mobilenet_v2 --weights "$WEIGHTS" --image-size 224 --att-size 7 --workspace "$WS" \
    --out "$WS/data/real"
}

model_chain() {  # model, data artifact, XE epochs and lr by default ("": the preset's), then options of both stages
  local m=$1 data=$2 name model spec
  local epochs=${GIVEN_XE_EPOCHS:-$3} lr
  lr=$(setting XE_LR "$m" "$4")
  shift 4
  local xe_opts=(--model "$m" --preset small --epochs "$(setting XE_EPOCHS "$m" "$epochs")" ${lr:+--lr "$lr"})
  local -a more parts
  read -r -a more <<< "$(setting XE_OPTS "$m" "")"
  done_ "$WS/xe/xe-$m" || $RDPP train-xe --data "$data" "${common[@]}" "${xe_opts[@]}" "$@" "${more[@]}" \
    --out "$WS/xe/xe-$m"
  local rl_epochs rl_lr
  rl_epochs=$(setting RL_EPOCHS "$m" "$GIVEN_RL_EPOCHS")
  rl_lr=$(setting RL_LR "$m" "")
  local rl_opts=(--preset small ${rl_epochs:+--epochs "$rl_epochs"} ${rl_lr:+--lr "$rl_lr"} "$@")
  for spec in "${MODEL_RUNS[@]}"; do
    read -r -a parts <<< "$spec"
    name=${parts[0]}-$m
    done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/xe-$m" "${common[@]}" "${rl_opts[@]}" "${parts[@]:1}" \
      --out "$WS/finetune/$name"
  done
  for model in "$WS/xe/xe-$m" "$WS/finetune/scst-$m" "$WS/finetune/dpp-m5-$m"; do
    name=$(basename "$model")
    run "$model" "$name-random10" --split test --method random --n 10 -- --oracle --self-cider --diversity \
      --metrics CIDEr
  done
  compare_figure "$m"
}

compare_figure() {  # model: its three sets side by side (compare/models-M), and a figure of the first 4 test images
  local m=$1 s=$WS/samples out=$WS/compare/models-$1
  done_ "$out" && return
  python3 -c 'import json, sys; print(*(r["image_id"] for r in json.load(open(sys.argv[1]))[:4]), sep="\n")' \
    "$s/xe-$m-random10/samples.json" > "$WS/figure-ids-$m.txt"
  $RDPP compare "$s/xe-$m-random10" "$s/scst-$m-random10" "$s/dpp-m5-$m-random10" --labels "XE,SCST,R-DPP m=5" \
    --figure "$WS/figure-ids-$m.txt" --format png --figure-captions 4 --workspace "$WS" --out "$out"
}

models() {
  local m
  common=(--workspace "$WS" --device "${DEVICE:-cpu}")
  data
  for m in $MODELS; do
    model_chain "$m" "$WS/data/toy" "${XE_EPOCHS_TOY[$m]:-8}" "${XE_LR_TOY[$m]:-}"
  done
}

models-lr() {  # after `models` in the same WS: SCST and R-DPP m=5 from each xe/xe-M at every fine-tuning lr of RL_LRS
  local m lr spec name parts epochs
  common=(--workspace "$WS" --device "${DEVICE:-cpu}")
  for m in $MODELS; do
    done_ "$WS/xe/xe-$m" || { echo "error: no $WS/xe/xe-$m; run bash examples/sweep.sh models first (same WS=)" >&2
                              exit 2; }
    epochs=$(setting RL_EPOCHS "$m" "$GIVEN_RL_EPOCHS")  # the models sweep's fine-tuning budget
    for lr in $RL_LRS; do
      for spec in "${MODEL_RUNS[@]}"; do
        read -r -a parts <<< "$spec"
        name=$(lr_run "${parts[0]}" "$m" "$lr")
        done_ "$WS/finetune/$name" || $RDPP finetune "$WS/xe/xe-$m" "${common[@]}" --preset small --lr "$lr" \
          ${epochs:+--epochs "$epochs"} "${parts[@]:1}" --out "$WS/finetune/$name"
      done
    done
  done
}

lr_run() {  # objective, model, lr: the models sweep's own run when it was made at that lr, else <objective>-<model>-lr<lr>
  local own=$WS/finetune/$1-$2
  if done_ "$own" && python3 -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["config"]["lr"] != float(sys.argv[2]))' \
       "$own/manifest.json" "$3"; then
    echo "$1-$2"
  else
    echo "$1-$2-lr$3"
  fi
}

lr_table() {  # the models-lr table: per model and lr, each run's best val CIDEr-D and its last val self-CIDEr
  local m lr
  echo "| model | lr | SCST best val CIDEr-D (epoch) | SCST val self-CIDEr | R-DPP m=5 best val CIDEr-D (epoch) | R-DPP m=5 val self-CIDEr |"
  echo "|---|---|---:|---:|---:|---:|"
  for m in $MODELS; do
    for lr in $RL_LRS; do
      python3 - "$m" "$lr" "$WS/finetune/$(lr_run scst "$m" "$lr")" "$WS/finetune/$(lr_run dpp-m5 "$m" "$lr")" <<'PY'
import csv, sys
from pathlib import Path
cells = []
for run in sys.argv[3:]:
    f = Path(run) / "metrics.csv"
    rows = list(csv.DictReader(f.open())) if f.is_file() else []
    if not rows:
        cells += ["–", "–"]
        continue
    best = max(rows, key=lambda r: float(r["val_cider"]))
    cells += [f"{float(best['val_cider']):.3f} ({best['epoch']})", f"{float(rows[-1]['val_self_cider']):.3f}"]
print("|", " | ".join(sys.argv[1:3] + cells), "|")
PY
    done
  done
}

models-real() {
  local m
  common=(--workspace "$WS" --device "${DEVICE:-cpu}")
  real_data
  for m in $MODELS; do
    model_chain "$m" "$WS/data/real" 25 "" --batch-size 10
  done
}

"$SWEEP"
case $SWEEP in
  selection) $RDPP table selection --workspace "$WS" --candidates "$C" --ks "${KS// /,}" --plot "$WS/selection.png" ;;
  models | models-real) $RDPP table models --workspace "$WS" ;;
  models-lr) lr_table ;;
  *) $RDPP table "$SWEEP" --workspace "$WS" ;;
esac
