#!/usr/bin/env bash
# The full MSCOCO recipe of the paper (Karpathy split, ResNet-101 features, Att2in, XE then R-DPP).
#
# Needs: dataset_coco.json (Karpathy split) and the train2014 + val2014 images under one root
# (filepath/filename as in the JSON), ImageNet ResNet-101 weights as a local file (torchvision's
# resnet101-63fe2227.pth), one GPU (or several with torchrun), Java for METEOR / the PTB tokenizer.
#
# Sizes and times per stage. Step rates: one NVIDIA H200, synthetic inputs at the paper's shapes
# (benchmarks/train.py, benchmarks/finetune.py --device cuda). Loader rates: benchmarks/data.py on this
# project's shared 2-core CPU under load 10-16 (not final; the lead replaces them with the GPU machine's
# `benchmarks/data.py --xe-epoch` run): warm (rows in the page cache) ~1,400-1,600 images/s on a fraction
# of one core; cold (that machine's virtual disk) 560-770 images/s. With --workers the reading overlaps
# the step, so an epoch takes 113,287 images / the slower of the two rates (docs/data.md):
#   prepro coco   123,287 images; features.h5 99.5 GB (196x2048 fp16 att + fc, 0.81 MB an image; --dtype
#                 float32: 199 GB), captions.h5 ~70 MB, cider_df.h5 ~20 MB; the text side (vocabulary,
#                 labels, df) under 1 min and 2 GB; features ~1 h on one GPU with 8 loader workers (JPEG
#                 decoding bound; estimate)
#   train-xe      100 epochs x 113,287 training images (91.4 GB of features read per epoch), batch 50;
#                 step 1,300-1,700 images/s. Warm (>= ~96 GB of RAM left for the page cache, from the 2nd
#                 epoch on): 71-87 s/epoch -> 2-2.4 h. From disk: 113,287 / its images/s for random 0.81 MB
#                 reads (560-770/s above: 2.5-3.4 min/epoch -> 4.1-5.6 h). 1/N of that with torchrun on N
#                 GPUs while the disk keeps up; checkpoints ~90 MB each
#   finetune      --preset paper: 100 epochs of 113,287 images, batch 128; step ~1,100 images/s for R-DPP
#                 m=5 (SCST ~900; measured at batch 50): warm 1.7-2.1 min/epoch -> 2.9-3.5 h per model;
#                 from the disk above 2.5-3.4 min/epoch -> 4.1-5.6 h
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
