"""`rdpp finetune`: the command made from ``FinetuneOptions``; the work is ``rdpp_cli.training.finetune.finetune``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.training.options import FinetuneOptions

command = command_for(FinetuneOptions, "rdpp_cli.training.finetune:finetune", """Fine-tune an XE model with RL: R-DPP (diverse and accurate), SCST, or XE + lam x CIDEr.

    Each step samples --m captions per image from the policy (dropout on, replayed in the loss),
    scores them with CIDEr-D (training df, the end token counted, as the published code) and, for
    R-DPP, with pairwise CIDEr-D among them, and follows the policy gradient. Validates each epoch
    (greedy CIDEr-D, and mean CIDEr-D / self-CIDEr of 5 samples per val image).

    --preset paper: the published COCO settings of the XE model's architecture (docs/training.md).

    Rerunning the same command continues an interrupted run.

    Multi-GPU: torchrun --nproc-per-node N -m rdpp_cli finetune --samples 5 ...

    Example: rdpp finetune --reward dpp --m 5
    """)
