"""`rdpp train-xe`: the command made from ``XEOptions``; the work is ``rdpp_cli.training.xe.train_xe``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.models.registry import MODELS, model_spec
from rdpp_cli.training.options import XEOptions

_DEFAULT = model_spec(XEOptions.__dataclass_fields__["model"].default).title
_OTHERS = " or ".join(s.title for s in MODELS.values() if s.title != _DEFAULT)

command = command_for(XEOptions, "rdpp_cli.training.xe:train_xe", f"""Train a captioner ({_DEFAULT}; --model: {_OTHERS}) with cross-entropy (teacher forcing, 5 captions per image) on a data artifact.

    Validates each epoch by greedy decoding scored with CIDEr-D; keeps best.pt and last.pt.

    Rerunning the same command continues an interrupted run.

    Multi-GPU: torchrun --nproc-per-node N -m rdpp_cli train-xe ...

    Example: rdpp train-xe --preset small --epochs 15
    """)
