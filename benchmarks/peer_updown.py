"""self-critical.pytorch's own ``UpDownModel`` holding the weights of an rdpp ``UpDown``: the
reference of tests/test_model_updown.py and benchmarks/models_speed.py.

``build(mods, model)`` makes the peer's module (``captioning.models.setup`` with ``--caption_model
updown`` and the sizes of ``model.config``) and loads rdpp's parameters into it under the peer's
names (``RDPP_TO_PEER``); ``UpDownPeer`` is benchmarks/peer.py's ``Peer`` (its ``LossWrapper``,
optimizer, XE and SCST steps, CiderD) around that module. The peer's code is found and imported by
benchmarks/peer.py (``find_repo``, ``modules``); nothing of it is changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402

# rdpp's UpDown parameter names -> the peer's UpDownModel's (its Sequential and core prefixes)
_PREFIX = {"embed.": "embed.0.", "fc_embed.": "fc_embed.0.", "att_embed.": "att_embed.0.",
           "att_lstm.": "core.att_lstm.", "lang_lstm.": "core.lang_lstm.",
           "h2att.": "core.attention.h2att.", "alpha_net.": "core.attention.alpha_net."}


def peer_name(name: str) -> str:
    """The peer's name of rdpp's parameter ``name`` (ctx2att and logit keep theirs)."""
    for ours, theirs in _PREFIX.items():
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def options(mods: peer.Modules, config, seq_per_img: int = 5, lr: float | None = None):
    """The peer's options for an UpDownModel of ``config``'s sizes (its defaults for the rest)."""
    c = config
    opt = mods.parse_opt([
        "--caption_model", "updown", "--seq_per_img", str(seq_per_img), "--train_sample_n", str(seq_per_img),
        "--max_length", str(c.seq_length), "--self_critical_after", "0", "--rnn_size", str(c.rnn_size),
        "--input_encoding_size", str(c.input_encoding_size), "--att_hid_size", str(c.att_hid_size),
        "--fc_feat_size", str(c.fc_feat_size), "--att_feat_size", str(c.att_feat_size),
        "--drop_prob_lm", str(c.drop_prob_lm), *(["--learning_rate", str(lr)] if lr is not None else [])])
    opt.vocab_size, opt.seq_length = c.vocab_size, c.seq_length
    return opt


def build(mods: peer.Modules, model, opt=None) -> torch.nn.Module:
    """The peer's UpDownModel with ``model``'s weights (copies), on its device and dtype."""
    opt = opt or options(mods, model.config)
    opt.vocab = {str(i): f"w{i}" for i in range(1, model.config.vocab_size + 1)}  # as tools/train.py
    ref = mods.models.setup(opt)
    del opt.vocab
    w = next(model.parameters())
    ref.to(device=w.device, dtype=w.dtype)
    theirs = {peer_name(k): v.detach().clone() for k, v in model.state_dict().items()}
    ref.load_state_dict(theirs)  # strict: every name maps, none is left over
    return ref


class UpDownPeer(peer.Peer):
    """benchmarks/peer.py's ``Peer`` (LossWrapper, optimizer, XE/SCST steps) on the peer's UpDownModel."""

    def __init__(self, mods: peer.Modules, rdpp_model, *, seq_per_img: int = 5, lr: float | None = None):
        opt = options(mods, rdpp_model.config, seq_per_img, lr)
        self._wrap(mods, opt, build(mods, rdpp_model, opt))
