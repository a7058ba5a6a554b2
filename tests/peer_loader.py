"""self-critical.pytorch's own code, unmodified, loaded into this process: its modules (``modules``,
from the checkout that ``find_repo`` finds) and its module of an rdpp model's kind (``build``:
``captioning.models.setup`` makes its ``Att2in2Model``, ``UpDownModel`` or ``TransformerModel`` with
its own option defaults, holding a copy of the rdpp model's weights under the peer's names,
``NAMES``).

The tests that compare the models against the peer import it from here (``tests/`` is on their path);
benchmarks/peer.py imports it from here too and adds the peer's steps (benchmarks/README.md, "The
reference is the peer's own code"). Where the checkout is: ``find_repo`` (benchmarks/README.md,
"Pointing at your own checkout"). The checkout is only read.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PEER_DIR = "self-critical.pytorch-4c48a33"
DEFAULT_PLACES = (ROOT.parent / "shared" / "peers" / PEER_DIR, ROOT / ".peer" / PEER_DIR)
HOW = ("point --peer-repo (or $SCP_REPO) at a checkout of ruotianluo/self-critical.pytorch with its cider "
       "submodule (git clone --recursive ...; benchmarks/README.md), and pip install yacs six")

# rdpp's parameter names -> the peer's, by prefix: Att2in2Model's and UpDownModel's Sequential (``embed.0``) and
# core prefixes (``core.*``, ``core.attention.*``); ctx2att and logit keep their names
ATTENTION = {"h2att.": "core.attention.h2att.", "alpha_net.": "core.attention.alpha_net."}
PREFIXES = {"att2in": {"embed.": "embed.0.", "att_embed.": "att_embed.0.", "a2c.": "core.a2c.", "i2h.": "core.i2h.",
                       "h2h.": "core.h2h.", **ATTENTION},
            "updown": {"embed.": "embed.0.", "fc_embed.": "fc_embed.0.", "att_embed.": "att_embed.0.",
                       "att_lstm.": "core.att_lstm.", "lang_lstm.": "core.lang_lstm.", **ATTENTION}}


def prefixed(kind: str):
    """rdpp's parameter name -> the peer's, for ``kind``'s prefixes."""
    table = PREFIXES[kind]
    return lambda name: next((theirs + name[len(ours):] for ours, theirs in table.items() if name.startswith(ours)),
                             name)


def transformer_name(name: str) -> str:
    """``att_embed`` is the first module of the peer's att_embed Sequential, the encoder-decoder lives
    under ``model.``, attention projections q/k/v/o are ``linears.0-3``, the sublayer norms
    ``sublayer.j.norm`` with parameters a_2/b_2, the word embedding ``tgt_embed.0.lut`` and the
    output layer ``generator.proj``."""
    if name.startswith("att_embed."):
        return "att_embed.0." + name.split(".", 1)[1]
    if name == "embed.weight":
        return "model.tgt_embed.0.lut.weight"
    if name.startswith("generator."):
        return "model.generator.proj." + name.split(".", 1)[1]
    name = re.sub(r"\.([qkvo])\.", lambda m: f".linears.{'qkvo'.index(m[1])}.", name)
    name = re.sub(r"\.norms\.(\d+)\.", r".sublayer.\1.norm.", name)
    return "model." + re.sub(r"norm\.bias$", "norm.b_2", re.sub(r"norm\.weight$", "norm.a_2", name))


# per rdpp model: the peer's class and the peer's name of each rdpp parameter
PEER_CLASS = {"att2in": "Att2in2Model", "updown": "UpDownModel", "transformer": "TransformerModel"}
NAMES = {"att2in": prefixed("att2in"), "updown": prefixed("updown"), "transformer": transformer_name}
BUFFERS = {"model.tgt_embed.1.pe"}  # the peer Transformer's positional table: not a parameter of rdpp's



def find_repo(path: str | os.PathLike | None = None) -> Path:
    """The peer checkout: ``path``, else ``$SCP_REPO``, else the first of ``DEFAULT_PLACES`` that
    exists. SystemExit saying how to point at one when there is none or it is not a checkout."""
    given = path or os.environ.get("SCP_REPO")
    candidates = [Path(given)] if given else [p for p in DEFAULT_PLACES if p.is_dir()]
    if not candidates:
        raise SystemExit(f"no self-critical.pytorch checkout found (looked at $SCP_REPO, "
                         f"{', '.join(map(str, DEFAULT_PLACES))}); {HOW}, or pass --no-peer")
    repo = candidates[0].resolve()
    need = [repo / "captioning" / "models" / "AttModel.py", repo / "captioning" / "modules" / "loss_wrapper.py",
            repo / "cider" / "pyciderevalcap" / "ciderD" / "ciderD_scorer.py", repo / "scripts" / "prepro_ngrams.py"]
    missing = [str(p.relative_to(repo)) for p in need if not p.is_file()]
    if missing:
        raise SystemExit(f"{repo} is not a self-critical.pytorch checkout with its cider submodule "
                         f"(missing {', '.join(missing)}); {HOW}")
    return repo


class Modules:
    """The peer's modules, imported from ``repo`` (once per process: they are top-level packages)."""

    def __init__(self, repo: Path):
        for p in (repo / "cider", repo):  # rewards.py appends the relative "cider": make it absolute
            if str(p) not in sys.path:
                sys.path.insert(0, str(p))
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):  # "cider or coco-caption missing" when pycocoevalcap is absent
                import captioning.models as models
                import captioning.utils.misc as misc
                import captioning.utils.opts as opts
                import captioning.utils.rewards as rewards
                from captioning.modules.loss_wrapper import LossWrapper
        except ImportError as e:
            raise SystemExit(f"the peer's code at {repo} does not import ({e}); {HOW}") from e
        if not hasattr(rewards, "CiderD"):
            raise SystemExit(f"the peer's CiderD did not import from {repo / 'cider'}; {HOW}")
        loaded = Path(models.__file__).resolve()
        if repo not in loaded.parents:
            raise SystemExit(f"the module 'captioning' came from {loaded}, not from {repo}: "
                             f"run the benchmark in a fresh process")
        self.repo, self.models, self.misc, self.opts, self.rewards, self.LossWrapper = (
            repo, models, misc, opts, rewards, LossWrapper)
        spec = importlib.util.spec_from_file_location("prepro_ngrams", repo / "scripts" / "prepro_ngrams.py")
        self.prepro_ngrams = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.prepro_ngrams)


_LOADED: dict[Path, Modules] = {}


def modules(repo: Path) -> Modules:
    if repo not in _LOADED:
        if _LOADED:
            raise SystemExit(f"a second peer checkout ({repo}) in one process; {next(iter(_LOADED))} is loaded")
        _LOADED[repo] = Modules(repo)
    return _LOADED[repo]


def options(mods: Modules, model, *, max_length: int | None = None, seq_per_img: int = 5, lr: float | None = None):
    """The peer's options for its module of ``model``'s kind and sizes (its defaults for the rest).
    The Transformer's sizes have no flags: its ``TransformerModel`` reads ``opt.N_enc``, ``N_dec``,
    ``d_model``, ``d_ff``, ``num_att_heads``, ``dropout`` (as its transformer.yml sets them)."""
    from rdpp_cli.models.registry import model_name

    c, kind = model.config, model_name(model)
    argv = ["--seq_per_img", str(seq_per_img), "--train_sample_n", str(seq_per_img), "--self_critical_after", "0",
            "--max_length", str(max_length or c.seq_length), "--att_feat_size", str(c.att_feat_size),
            "--drop_prob_lm", str(c.drop_prob_lm), *(["--learning_rate", str(lr)] if lr is not None else [])]
    if kind == "transformer":
        sizes = {"caption_model": "transformer", "num_layers": c.N_enc, "input_encoding_size": c.d_model,
                 "rnn_size": c.d_ff, "fc_feat_size": c.att_feat_size}  # fc: unused
    else:
        sizes = {"caption_model": {"att2in": "att2in2"}.get(kind, kind), "rnn_size": c.rnn_size,
                 "input_encoding_size": c.input_encoding_size, "att_hid_size": c.att_hid_size,
                 "fc_feat_size": c.fc_feat_size if kind == "updown" else c.att_feat_size}  # fc: unused by Att2in2
    saved, sys.argv = sys.argv, ["train.py", *argv, *(x for k, v in sizes.items() for x in (f"--{k}", str(v)))]
    try:
        opt = mods.opts.parse_opt()  # the peer's option parser reads sys.argv
    finally:
        sys.argv = saved
    if kind == "transformer":
        opt.N_enc, opt.N_dec, opt.d_model, opt.d_ff = c.N_enc, c.N_dec, c.d_model, c.d_ff
        opt.num_att_heads, opt.dropout = c.num_att_heads, c.dropout
    opt.vocab_size, opt.seq_length = c.vocab_size, c.seq_length
    return opt


def build(mods: Modules, model, opt=None, *, max_length: int | None = None) -> torch.nn.Module:
    """The peer's module of ``model``'s kind, built by its ``models.setup`` from ``opt`` (default:
    ``options``), holding a copy of ``model``'s weights (every name mapped, none left over), on its
    device and dtype, in its mode. ``max_length``: the peer's decoding length."""
    from rdpp_cli.models.registry import model_name

    opt = opt or options(mods, model, max_length=max_length)
    opt.vocab = {str(i): f"w{i}" for i in range(1, model.config.vocab_size + 1)}  # as tools/train.py: loader.get_vocab()
    ref = mods.models.setup(opt)
    del opt.vocab
    w = next(model.parameters())
    ref.to(device=w.device, dtype=w.dtype)
    to_peer, state = NAMES[model_name(model)], ref.state_dict()
    ours = {to_peer(k): v.detach().clone() for k, v in model.state_dict().items()}
    unknown, left = set(ours) - set(state), set(state) - set(ours) - BUFFERS
    if unknown or left:
        raise KeyError(f"rdpp's parameters {sorted(unknown)} have no place in the peer's module; "
                       f"the peer's {sorted(left)} are not set")
    state.update(ours)
    ref.load_state_dict(state)
    # its DBS calls self.repeat_tensor, a method no model defines: the peer's utils.repeat_tensors, which it means
    ref.repeat_tensor = importlib.import_module("captioning.models.utils").repeat_tensors
    return ref.train(model.training)



def peer_labels(seqs: torch.Tensor) -> torch.Tensor:
    """rdpp's seqs (N, L) as the peer's teacher-forcing input ``labels[..., :-1]``: BOS, then the words."""
    return torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1)
