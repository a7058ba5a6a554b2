#!/usr/bin/env bash
# The README's "Your own dataset" commands, verbatim, on a CSV of captions and a folder of photos,
# with the wall time of each stage (docs/data.md quotes one run).
#
#   bash examples/own_dataset.sh KARPATHY_JSON IMAGES_ROOT WEIGHTS [WORKDIR]
#
# KARPATHY_JSON and IMAGES_ROOT stand in for a user's own data: the split file is written out as
# mine.csv (image,caption,split: one row per caption, image paths relative to the CSV), the way a
# researcher's own table looks, and the commands never see the JSON. WEIGHTS: a MobileNetV2
# ImageNet state_dict (torchvision's mobilenet_v2-b0353104.pth, or its features trunk). CPU
# settings in WORKDIR/runs/rdpp.yaml: 224-pixel images, a 7x7 grid, the small Att2in, 10 XE and 3
# R-DPP epochs. Needs Java (METEOR, the PTB tokenizer).
set -euo pipefail
json=$(realpath "$1"); images=$(realpath "$2"); weights=$(realpath "$3"); work=${4:-./own-dataset}
mkdir -p "$work/runs" "$work/new_photos" && cd "$work"
ln -sfn "$images" images
cp "$weights" mobilenet_v2.pth
python3 - "$json" <<'EOF'
import csv, json, sys
images = json.load(open(sys.argv[1]))["images"]
with open("mine.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["image", "caption", "split"])
    for im in images:
        path = "/".join(p for p in ("images", im.get("filepath", ""), im["filename"]) if p)
        w.writerows([path, s["raw"], im["split"]] for s in im["sentences"])
EOF
python3 - "$json" <<'EOF' | xargs -I{} cp {} new_photos/
import json, sys
images = [im for im in json.load(open(sys.argv[1]))["images"] if im["split"] == "test"][:3]
print("\n".join("/".join(p for p in ("images", im.get("filepath", ""), im["filename"]) if p) for im in images))
EOF
cat > runs/rdpp.yaml <<'EOF'
prepro_coco:
  image_size: 224
  att_size: 7
train_xe:
  preset: small
  epochs: 10
  batch_size: 10
finetune:
  epochs: 3
  batch_size: 10
EOF
export RDPP_NO_PROGRESS=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
timed() { local t0=$SECONDS; "$@" > "log.$2.txt" 2>&1; echo "$* : $(( SECONDS - t0 )) s"; }
timed rdpp prepro coco --captions mine.csv --backbone mobilenet_v2 --weights mobilenet_v2.pth
timed rdpp train-xe
timed rdpp finetune --reward dpp --m 5
timed rdpp sample --n 5 --method random
timed rdpp score --oracle --self-cider
timed rdpp caption new_photos/ --method random --n 5
tail -12 log.score.txt
