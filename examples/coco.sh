#!/usr/bin/env bash
# The full MSCOCO recipe of the paper (Karpathy split, ResNet-101 features, Att2in, XE then R-DPP).
#
# Needs: dataset_coco.json (Karpathy split) and the train2014 + val2014 images under one root
# (filepath/filename as in the JSON), ImageNet ResNet-101 weights as a local file (torchvision's
# resnet101-63fe2227.pth), one GPU (or several with torchrun), Java for METEOR / the PTB tokenizer.
#
# Sizes and times per stage. Step rates were measured on one NVIDIA H200 with synthetic inputs at the
# paper's shapes (benchmarks/train.py, benchmarks/finetune.py --device cuda); reading the features from
# disk (~0.8 MB per image) is not in them and decides the epoch time on most disks:
#   prepro coco   123,287 images; features.h5 ~99 GB (14x14x2048 fp16 att + fc), captions.h5 ~70 MB,
#                 cider_df.h5 ~20 MB; ~1 h on one GPU with 8 loader workers (JPEG decoding bound; estimate)
#   train-xe      100 epochs x 113,287 training images, batch 50; the step runs at 1,300-1,700 images/s
#                 (~80 s of compute per epoch), so ~1.5-3 min/epoch at 0.5-1 GB/s of feature reads
#                 -> 2.5-5 h on one GPU, about 1/N of that with torchrun on N GPUs; checkpoints ~90 MB each
#   finetune      --preset paper: 100 epochs of 113,287 images in batches of 128; the step ran at ~1,100
#                 images/s for R-DPP m=5 (SCST ~900) at batch 50 -> ~2-3 min/epoch, 3.5-5 h per model
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
launch train-xe --preset paper --epochs 100 --batch-size 50 --lr 4e-4 --device cuda

# 3. RL fine-tuning from the XE model with the authors' settings (--preset paper: 100 epochs, batch
#    128, Adam 5e-4 x0.8 every 15 epochs; docs/rewards.md): R-DPP with M=5, and the baselines.
launch finetune --preset paper --reward dpp --m 5 --device cuda
XE=$(ls -d "$RDPP_WORKSPACE"/xe/*/ | tail -n 1)
launch finetune "$XE" --preset paper --reward scst --device cuda
for m in 2 3 7; do launch finetune "$XE" --preset paper --reward dpp --m "$m" --device cuda; done

# 4. Sample 20 captions per test image (the paper's Table 1 setting) and score them.
for model in "$RDPP_WORKSPACE"/finetune/*/; do
  rdpp sample "$model" --split test --n 20 --method random --device cuda
  rdpp score --oracle --self-cider --diversity
done
rdpp ls
