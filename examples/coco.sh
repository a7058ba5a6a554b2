#!/usr/bin/env bash
# The full MSCOCO recipe of the paper (Karpathy split, ResNet-101 features, Att2in, XE then R-DPP).
#
# Needs: dataset_coco.json (Karpathy split) and the train2014 + val2014 images under one root
# (filepath/filename as in the JSON), ImageNet ResNet-101 weights as a local file (torchvision's
# resnet101-63fe2227.pth), one GPU (or several with torchrun), Java for METEOR / the PTB tokenizer.
#
# Sizes and times per stage (estimates for one recent GPU; not measured on this project's CI machine,
# which has no GPU — see docs/reproduction.md for what was measured):
#   prepro coco   123,287 images; features.h5 ~99 GB (14x14x2048 fp16 att + fc), captions.h5 ~70 MB,
#                 cider_df.h5 ~20 MB; ~1 h on one GPU with 8 loader workers (JPEG decoding bound)
#   train-xe      100 epochs x 113,287 training images, batch 50; ~4-6 min/epoch -> 7-10 h on one GPU,
#                 about 1/N of that with torchrun on N GPUs; checkpoints ~90 MB each
#   finetune      R-DPP m=5, 30 epochs; ~2x an XE epoch each (M samples + reward) -> ~3-5 h
#   sample        5,000 test images x 20 captions; minutes
#   score         oracle + self-CIDEr over 100,000 captions; METEOR dominates, ~5-10 min on CPU
set -euo pipefail

COCO=${COCO:-/data/coco}                   # holds dataset_coco.json and the images
WEIGHTS=${WEIGHTS:-$COCO/resnet101-63fe2227.pth}
GPUS=${GPUS:-1}
export RDPP_WORKSPACE=${RDPP_WORKSPACE:-runs}

launch() {  # single process, or DDP with torchrun over $GPUS GPUs
  if [ "$GPUS" -gt 1 ]; then torchrun --nproc-per-node "$GPUS" -m rdpp_cli "$@"; else rdpp "$@"; fi
}

# 1. Data: vocabulary (count > 5), captions clipped to 16 tokens, ResNet-101 14x14 att grid, CIDEr df.
rdpp prepro coco --karpathy-json "$COCO/dataset_coco.json" --images-root "$COCO" \
  --backbone resnet101 --att-size 14 --weights "$WEIGHTS" --device cuda --batch-size 32 --workers 8

# 2. Cross-entropy (paper: Adam 4e-4; validation greedy CIDEr-D each epoch, best.pt kept).
launch train-xe --preset paper --epochs 100 --batch-size 50 --lr 4e-4 --device cuda

# 3. RL fine-tuning from the XE model: R-DPP with M=5 (and the baselines for the tables).
launch finetune --reward dpp --m 5 --lr 5e-5 --epochs 30 --device cuda
XE=$(ls -d "$RDPP_WORKSPACE"/xe/*/ | tail -n 1)
launch finetune "$XE" --reward scst --lr 5e-5 --epochs 30 --device cuda
for m in 2 3 7; do launch finetune "$XE" --reward dpp --m "$m" --lr 5e-5 --epochs 30 --device cuda; done

# 4. Sample 20 captions per test image (the paper's Table 1 setting) and score them.
for model in "$RDPP_WORKSPACE"/finetune/*/; do
  rdpp sample "$model" --split test --n 20 --method random --device cuda
  rdpp score --oracle --self-cider --diversity
done
rdpp ls
