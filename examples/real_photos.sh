#!/usr/bin/env bash
# Real photos end to end (docs/reproduction.md, "Real photos"): the 390 COCO photos of
# ../shared/data/coco-real-390 with their official captions and an ImageNet MobileNetV2 trunk,
# through every stage as a user types it, ending with the table XE / SCST / R-DPP m=5 and the
# contact sheet of the 39 test photos (`rdpp table real-photos`), then the compare page of the three
# models' random captions with the photos ($WS/compare/index.html; docs/compare.md).
#
#   prepro coco   -> train-xe -> finetune --reward scst, finetune --reward dpp --m 5 (both from the XE model)
#   -> sample (greedy, and 10 random captions per test photo) -> score --oracle --self-cider
#   -> caption the 39 test photo files with the XE and the R-DPP model (5 random captions each)
#
# Every stage is skipped when its artifact is complete, so an interrupted run continues; the wall
# time of each stage run and the load average at its end are appended to $WS/times.tsv.
# CPU settings: 224-pixel images and a 7x7 grid (MobileNetV2's ImageNet size), the small Att2in
# preset, 10 images per batch (312 training photos: 32 steps per epoch). Needs Java (METEOR, PTB).
#
#   bash examples/real_photos.sh                         # workspace ./runs-real (or WS=...)
#   XE_EPOCHS=2 RL_EPOCHS=1 WS=/tmp/real-smoke bash examples/real_photos.sh   # smoke run
set -euo pipefail
WS=${WS:-runs-real}
REAL=${REAL:-../shared/data/coco-real-390}
WEIGHTS=${WEIGHTS:-../shared/weights/mobilenet_v2-imagenet-features.pth}
RDPP=${RDPP:-rdpp}
PY=${PY:-python3}
XE_EPOCHS=${XE_EPOCHS:-25}
RL_EPOCHS=${RL_EPOCHS:-6}
SHEET=${SHEET:-$WS/contact-sheet.png}
export RDPP_NO_PROGRESS=${RDPP_NO_PROGRESS:-1}
mkdir -p "$WS"

stage() {  # name, the artifact it makes, then the command; skipped when the artifact is complete
  local name=$1 dir=$2; shift 2
  if [ -f "$dir/manifest.json" ]; then echo "== $name: $dir is complete, skipped"; return; fi
  echo "== $name: $*"
  local t0; t0=$(date +%s.%N)
  "$@"
  printf '%s\t%s\t%s\n' "$name" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')" \
    "$(cut -d' ' -f1 /proc/loadavg)" >> "$WS/times.tsv"
}
common=(--workspace "$WS" --device cpu)

stage prepro "$WS/data/real" $RDPP prepro coco --karpathy-json "$REAL/dataset_coco390.json" --images-root "$REAL/images" \
  --backbone mobilenet_v2 --weights "$WEIGHTS" --image-size 224 --att-size 7 --workspace "$WS" --out "$WS/data/real"
stage train-xe "$WS/xe/xe" $RDPP train-xe --data "$WS/data/real" "${common[@]}" --preset small --epochs "$XE_EPOCHS" \
  --batch-size 10 --out "$WS/xe/xe"
stage finetune-scst "$WS/finetune/scst" $RDPP finetune "$WS/xe/xe" "${common[@]}" --reward scst --epochs "$RL_EPOCHS" \
  --batch-size 10 --out "$WS/finetune/scst"
stage finetune-dpp-m5 "$WS/finetune/dpp-m5" $RDPP finetune "$WS/xe/xe" "${common[@]}" --reward dpp --m 5 \
  --epochs "$RL_EPOCHS" --batch-size 10 --out "$WS/finetune/dpp-m5"

for model in "$WS/xe/xe" "$WS/finetune/scst" "$WS/finetune/dpp-m5"; do
  name=$(basename "$model")
  stage "sample-$name-greedy" "$WS/samples/$name-greedy" $RDPP sample "$model" "${common[@]}" --split test \
    --method greedy --n 1 --out "$WS/samples/$name-greedy"
  stage "sample-$name-random10" "$WS/samples/$name-random10" $RDPP sample "$model" "${common[@]}" --split test \
    --n 10 --method random --out "$WS/samples/$name-random10"
  stage "score-$name-greedy" "$WS/scores/$name-greedy" $RDPP score "$WS/samples/$name-greedy" --workspace "$WS" \
    --metrics Bleu_4,METEOR,ROUGE_L,CIDEr --out "$WS/scores/$name-greedy"
  stage "score-$name-random10" "$WS/scores/$name-random10" $RDPP score "$WS/samples/$name-random10" --workspace "$WS" \
    --oracle --self-cider --diversity --metrics Bleu_4,METEOR,ROUGE_L,CIDEr --out "$WS/scores/$name-random10"
done

# The test photos as a user's own folder of photos (links named as COCO names them: the id is in the name).
$PY - "$REAL" "$WS/test-photos" <<'EOF'
import json, os, sys
real, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for im in json.load(open(os.path.join(real, "dataset_coco390.json")))["images"]:
    link = os.path.join(out, im["filename"])
    if im["split"] == "test" and not os.path.lexists(link):
        os.symlink(os.path.abspath(os.path.join(real, "images", im["filepath"], im["filename"])), link)
EOF
for model in "$WS/xe/xe" "$WS/finetune/dpp-m5"; do
  name=$(basename "$model")
  stage "caption-$name" "$WS/captions/$name-random5" $RDPP caption "$WS/test-photos" --from "$model" \
    --method random --n 5 --workspace "$WS" --device cpu --out "$WS/captions/$name-random5"
done

$RDPP ls --workspace "$WS"
$RDPP table real-photos --workspace "$WS" --licenses "$REAL/LICENSES.tsv" --sheet "$SHEET"
$RDPP compare "$WS/samples/xe-random10" "$WS/samples/scst-random10" "$WS/samples/dpp-m5-random10" \
  --labels "XE,SCST,R-DPP m=5" --workspace "$WS" --out "$WS/compare"
