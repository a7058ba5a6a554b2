#!/usr/bin/env bash
# The full MSCOCO recipe of the paper (Karpathy split, ResNet-101 features, Att2in, XE then R-DPP).
#
# Needs: dataset_coco.json (Karpathy split) and the train2014 + val2014 images under one root
# (filepath/filename as in the JSON), ImageNet ResNet-101 weights as a local file (torchvision's
# resnet101-63fe2227.pth), one GPU (or several with torchrun), Java for METEOR / the PTB tokenizer.
#
# Sizes and times per stage, measured on one NVIDIA H200 machine (16 cores, 128 GB; 2026-11-26):
# `benchmarks/data.py --xe-epoch --device cuda --rows 10000` ran whole XE epochs of `rdpp train-xe`
# at the paper preset over 10,000 COCO-shaped feature rows (8.1 GB), data loading included:
# 1,093-1,373 images/s from the page cache, 889-1,469 from that machine's disk after dropping the
# caches (0, 2, 4 workers; docs/data.md). RL step rates from `benchmarks/models_speed.py --model att2in --device cuda`.
#   prepro coco   123,287 images; features.h5 99.5 GB (196x2048 fp16 att + fc, 0.81 MB an image; --dtype
#                 float32: 199 GB), captions.h5 ~70 MB, cider_df.h5 ~20 MB; the text side (vocabulary,
#                 labels, df) under 1 min and 2 GB (benchmarks/data.py); features ~1 h on one GPU with 8
#                 loader workers (JPEG decoding bound; an estimate, not measured)
#   train-xe      100 epochs x 113,287 training images (91.4 GB of features read per epoch), batch 50,
#                 --workers 2: 1,180-1,470 images/s with loading -> 77-96 s/epoch -> 2.1-2.7 h. Keeping
#                 the features in the page cache wants ~96 GB of free RAM; a slower disk than that
#                 machine's bounds the epoch at 113,287 / its random-read images/s. 1/N of that with
#                 torchrun on N GPUs while the disk keeps up; checkpoints ~90 MB each
#   finetune      --preset paper: 100 epochs of 113,287 images, batch 128; the step bounds it, not the
#                 loader: R-DPP m=5 ~870 images/s (SCST ~810; measured at batch 50, on-policy) ->
#                 2.2-2.3 min/epoch -> 3.6-3.9 h per model
#   sample        5,000 test images x 20 captions; about a minute
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
launch train-xe --preset paper --epochs 100 --batch-size 50 --lr 4e-4 --device cuda --workers 2

# 3. RL fine-tuning from the XE model with the authors' settings (--preset paper: 100 epochs, batch
#    128, Adam 5e-4 x0.8 every 15 epochs; docs/rewards.md): R-DPP with M=5, and the baselines.
launch finetune --preset paper --reward dpp --m 5 --device cuda --workers 2
XE=$(ls -d "$RDPP_WORKSPACE"/xe/*/ | tail -n 1)
launch finetune "$XE" --preset paper --reward scst --device cuda --workers 2
for m in 2 3 7; do launch finetune "$XE" --preset paper --reward dpp --m "$m" --device cuda --workers 2; done

# 4. Sample 20 captions per test image (the paper's Table 1 setting) and score them.
for model in "$RDPP_WORKSPACE"/finetune/*/; do
  rdpp sample "$model" --split test --n 20 --method random --device cuda
  rdpp score --oracle --self-cider --diversity
done
rdpp ls
