"""self-critical.pytorch's own ``TransformerModel`` (``--caption_model transformer``) holding the
weights of an rdpp ``Transformer``: the reference of tests/test_model_transformer.py and
benchmarks/models_speed.py (``TransformerPeer``: benchmarks/peer.py's ``Peer``,
its ``LossWrapper``, optimizer, XE and SCST steps, around it).

The peer's option parser has no flags for the Transformer's sizes: its ``TransformerModel`` reads
``opt.N_enc``, ``N_dec``, ``d_model``, ``d_ff``, ``num_att_heads`` and ``dropout`` (what its
configs/transformer/transformer.yml sets), so they are set on the parsed options here; every other
option keeps the parser's default. Checkout and imports: benchmarks/peer.py (``find_repo``,
``modules``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer import Modules, Peer, find_repo, modules  # noqa: E402

__all__ = ["peer_name", "options", "peer_transformer", "TransformerPeer", "peer_labels", "find_repo", "modules"]


def peer_name(name: str) -> str:
    """The peer's name of an rdpp ``Transformer`` parameter: ``att_embed`` is the first module of the
    peer's att_embed Sequential, the encoder-decoder lives under ``model.``, attention projections
    q/k/v/o are ``linears.0-3``, the sublayer norms ``sublayer.j.norm`` with parameters a_2/b_2,
    the word embedding ``tgt_embed.0.lut`` and the output layer ``generator.proj``."""
    if name.startswith("att_embed."):
        return "att_embed.0." + name.split(".", 1)[1]
    if name == "embed.weight":
        return "model.tgt_embed.0.lut.weight"
    if name.startswith("generator."):
        return "model.generator.proj." + name.split(".", 1)[1]
    name = re.sub(r"\.([qkvo])\.", lambda m: f".linears.{'qkvo'.index(m[1])}.", name)
    name = re.sub(r"\.norms\.(\d+)\.", r".sublayer.\1.norm.", name)
    name = re.sub(r"norm\.weight$", "norm.a_2", name)
    name = re.sub(r"norm\.bias$", "norm.b_2", name)
    return "model." + name


def options(mods: Modules, config, *, max_length: int | None = None, seq_per_img: int = 5,
            lr: float | None = None):
    """The peer's options for a TransformerModel of ``config``'s sizes (its defaults for the rest).
    ``max_length``: the peer's decoding length (default the config's seq_length)."""
    c = config
    opt = mods.parse_opt([
        "--caption_model", "transformer", "--max_length", str(max_length or c.seq_length),
        "--att_feat_size", str(c.att_feat_size), "--fc_feat_size", str(c.att_feat_size),  # fc: unused
        "--drop_prob_lm", str(c.drop_prob_lm), "--num_layers", str(c.N_enc),
        "--input_encoding_size", str(c.d_model), "--rnn_size", str(c.d_ff),
        "--seq_per_img", str(seq_per_img), "--train_sample_n", str(seq_per_img), "--self_critical_after", "0",
        *(["--learning_rate", str(lr)] if lr is not None else [])])
    opt.N_enc, opt.N_dec, opt.d_model, opt.d_ff = c.N_enc, c.N_dec, c.d_model, c.d_ff
    opt.num_att_heads, opt.dropout = c.num_att_heads, c.dropout
    opt.vocab_size, opt.seq_length = c.vocab_size, c.seq_length
    return opt


def peer_transformer(mods: Modules, model, *, max_length: int | None = None, opt=None):
    """The peer's ``TransformerModel`` built by its ``models.setup`` with ``model``'s config (or
    ``opt``, from ``options``) and a copy of its weights, on its device and dtype, in ``model``'s
    mode. ``max_length``: the peer's decoding length (default the config's seq_length)."""
    c = model.config
    opt = opt or options(mods, c, max_length=max_length)
    opt.vocab = {str(i): f"w{i}" for i in range(1, c.vocab_size + 1)}  # as tools/train.py: loader.get_vocab()
    peer = mods.models.setup(opt)
    del opt.vocab
    w = next(model.parameters())
    peer.to(device=w.device, dtype=w.dtype)
    state = peer.state_dict()
    ours = {peer_name(k): v.detach().clone() for k, v in model.state_dict().items()}
    unknown = set(ours) - set(state)
    if unknown:
        raise KeyError(f"rdpp parameters with no place in the peer's TransformerModel: {sorted(unknown)}")
    left = set(state) - set(ours) - {"model.tgt_embed.1.pe"}  # the peer's positional table: a buffer
    if left:
        raise KeyError(f"peer parameters rdpp's Transformer does not set: {sorted(left)}")
    state.update(ours)
    peer.load_state_dict(state)
    return peer.train(model.training)


def peer_labels(seqs: torch.Tensor) -> torch.Tensor:
    """rdpp's seqs (N, L) as the peer's teacher-forcing input ``labels[..., :-1]``: BOS, then the words."""
    return torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1)


class TransformerPeer(Peer):
    """benchmarks/peer.py's ``Peer`` (LossWrapper, optimizer, XE/SCST steps) on the peer's TransformerModel."""

    def __init__(self, mods: Modules, rdpp_model, *, seq_per_img: int = 5, lr: float | None = None):
        opt = options(mods, rdpp_model.config, seq_per_img=seq_per_img, lr=lr)
        self._wrap(mods, opt, peer_transformer(mods, rdpp_model, opt=opt))
