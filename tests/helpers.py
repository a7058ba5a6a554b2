"""Plain helpers the test modules share: a tiny learnable data artifact, a workspace with it (and an XE
model), a small Att2in for a data artifact, CLI runners, and a stand-in for a user's weights file.

Fixtures live in ``tests/conftest.py``; test modules import these with ``from helpers import ...``
(pytest puts ``tests/`` on ``sys.path`` because it holds ``conftest.py``). No test module imports another.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import finish, prepare_output, write_manifest
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models import save_checkpoint, sequence_logprobs
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.registry import build

COLOURS = ["red", "blue", "green", "yellow"]
SHAPES = ["circle", "square", "triangle"]
TEMPLATES = ["a {c} {s}", "a {s} that is {c}", "{c} {s}", "a {c} {s} on a plain background", "one {c} {s}"]


class Crash(Exception):
    """Raised from an ``after_step`` hook to stop a run as a crash would."""


# -- data and workspaces ------------------------------------------------------------------------------

def write_tiny_data(path: Path, n_train: int = 24, n_val: int = 8, n_test: int = 4, grid: int = 4,
                    dim: int = 16, seed: int = 0, extra_captions: dict[int, int] | None = None,
                    templates: list[str] | None = None) -> Path:
    """A small data artifact whose captions follow from the features (colour, shape).

    Image i shows ``COLOURS[i % 4]`` and ``SHAPES[(i // 4) % 3]``; its att grid has the colour's and
    the shape's one-hot codes in a random cell plus noise; its references come from ``templates``
    (default: the five ``TEMPLATES``; ``extra_captions[i] = k`` gives image i k more, repeats of the
    first template). Written by :func:`write_data`.
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val + n_test
    words = sorted({w for t in TEMPLATES for w in t.replace("{c}", "").replace("{s}", "").split()}
                   | set(COLOURS) | set(SHAPES)) + ["UNK"]
    R = grid * grid
    att = rng.normal(0, 0.1, size=(n, R, dim)).astype(np.float32)
    captions = []
    for i in range(n):
        c, s = COLOURS[i % 4], SHAPES[(i // 4) % 3]
        cell = rng.integers(R)
        att[i, cell, COLOURS.index(c)] += 1.0
        att[i, cell, 4 + SHAPES.index(s)] += 1.0
        sents = [t.format(c=c, s=s) for t in (templates or TEMPLATES)]
        captions.append(sents + [sents[0]] * (extra_captions or {}).get(i, 0))
    split = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    return write_data(path, words, captions, split, att.mean(1), att, grid=grid)


def write_data(path: Path, words: list[str], captions: list[list[str]], split: list[str], fc: np.ndarray,
               att: np.ndarray, grid: int = 1, L: int = 8) -> Path:
    """A data artifact of the given images, as docs/architecture.md describes: image i has the
    reference ``captions[i]`` (words of ``words``, clipped to L in ``labels``), split ``split[i]``,
    id 1000 + i and features ``fc[i]``, ``att[i]`` (stored as float16); ``cider_df.h5`` is counted
    as self-critical.pytorch's prepro_ngrams.py does. Written with h5py and ``write_manifest``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    n = len(captions)
    wid = {w: i + 1 for i, w in enumerate(words)}
    labels, raw, starts, ends, lengths = [], [], [], [], []
    for sents in captions:
        starts.append(len(labels))
        for sent in sents:
            toks = sent.split()
            row = np.zeros(L, dtype=np.int32)
            row[:min(L, len(toks))] = [wid[w] for w in toks[:L]]
            labels.append(row)
            raw.append(sent)
            lengths.append(min(L, len(toks)))
        ends.append(len(labels))
    image_ids = np.arange(1000, 1000 + n, dtype=np.int64)
    (path / "vocab.json").write_text(json.dumps({"words": words}))
    with h5py.File(path / "captions.h5", "w") as f:
        f["labels"] = np.stack(labels)
        f["lengths"] = np.array(lengths, dtype=np.int32)
        f["label_start"] = np.array(starts, dtype=np.int64)
        f["label_end"] = np.array(ends, dtype=np.int64)
        f["image_ids"] = image_ids
        f["split"] = np.array([s.encode() for s in split], dtype="S5")
        f.create_dataset("raw", data=np.array(raw, dtype=object), dtype=h5py.string_dtype())
    with h5py.File(path / "features.h5", "w") as f:
        f["fc"] = np.asarray(fc).astype(np.float16)
        f["att"] = np.asarray(att).astype(np.float16)
        f["image_ids"] = image_ids
        f.attrs["backbone"] = "synthetic"
        f.attrs["att_size"] = grid
        f.attrs["dtype"] = "float16"
    # the training reward's df, counted as self-critical.pytorch's prepro_ngrams.py does: every
    # reference's word ids, not clipped, plus the end token (id V + 1), each n-gram once per image
    df: Counter = Counter()
    eos = len(words) + 1
    train = [i for i in range(n) if split[i] == "train"]
    for i in train:
        grams = set()
        for sent in raw[starts[i]:ends[i]]:
            toks = [wid[w] for w in sent.split()] + [eos]
            for k in range(1, 5):
                grams.update(tuple(toks[j:j + k]) for j in range(len(toks) - k + 1))
        df.update(grams)
    keys = sorted(df)
    with h5py.File(path / "cider_df.h5", "w") as f:
        f["ngrams"] = np.array([list(g) + [0] * (4 - len(g)) for g in keys], dtype=np.int32).reshape(-1, 4)
        f["df"] = np.array([df[g] for g in keys], dtype=np.float64)
        f.attrs["num_docs"] = len(train)
    write_manifest(path, "rdpp.data", {"source": "tiny-test", "images": n}, summary={"images": n})
    return path


def prepro_captions(root: Path, captions: dict[int, list[str]], splits: dict[int, str], *, tokens: bool,
                    max_length: int, batch_size: int) -> DataArtifact:
    """The real `prepro coco` on ``captions`` per image id (a Karpathy-format file; with ``tokens`` each
    sentence also gives its whitespace tokens, else prepro tokenizes the raw text) and imported att
    features of 4 regions x 8 (seeded), in ``root/data``."""
    from rdpp_cli.data.prepro import prepro_coco

    images = [{"filepath": "x", "filename": f"{i}.jpg", "cocoid": i, "split": splits[i],
               "sentences": [{"tokens": c.split(), "raw": c} if tokens else {"raw": c} for c in caps]}
              for i, caps in captions.items()]
    (root / "karpathy.json").write_text(json.dumps({"images": images}))
    with h5py.File(root / "feats.h5", "w") as f:
        f["att"] = np.random.default_rng(0).normal(size=(len(captions), 4, 8)).astype(np.float32)
        f["image_ids"] = np.array(list(captions))
    art = prepro_coco(root / "karpathy.json", out=root / "data", features_from=root / "feats.h5",
                      word_count_threshold=1, max_length=max_length, batch_size=batch_size)
    return DataArtifact(art)


def tiny_workspace(ws: Path, xe_epochs: int = 0) -> Path:
    """``ws`` with the tiny data artifact ``data/tiny-v1`` (16/6/2 images) and, for ``xe_epochs`` > 0,
    the small preset XE-trained on it for that many epochs (``xe/att2in-small-v1``)."""
    from rdpp_cli.training.xe import train_xe

    data = write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=6, n_test=2)
    if xe_epochs:
        train_xe(data, workspace=ws, preset="small", epochs=xe_epochs, batch_size=8, val_images=4, lr=2e-3,
                 device="cpu", seed=1)
    return ws


# -- models -------------------------------------------------------------------------------------------

def att2in_for(data: DataArtifact, size: int = 32, dropout: float = 0.0) -> Att2in:
    """An untrained Att2in of width ``size`` that fits ``data`` (seed torch first for fixed weights)."""
    return Att2in(Att2inConfig(vocab_size=data.vocab_size, input_encoding_size=size, rnn_size=size,
                               att_hid_size=size, att_feat_size=data.att_dim,
                               drop_prob_lm=dropout, seq_length=data.seq_length))


def model_artifact(ws: Path, data, *, group: str = "xe", name: str = "att2in", seed: int = 0):
    """A small untrained Att2in as a complete model artifact made from ``data`` (an Artifact)."""
    ds = DataArtifact(data)
    torch.manual_seed(seed)
    net = build("att2in", "small", vocab_size=ds.vocab_size, att_feat_size=ds.att_dim, seq_length=ds.seq_length,
                rnn_size=32, input_encoding_size=32, att_hid_size=32)
    cfg = {"stage": "xe" if group == "xe" else "finetune", "seed": seed}
    out = prepare_output(None, workspace=ws, group=group, name=name, kind="rdpp.model", config=cfg)
    save_checkpoint(out / "checkpoints" / "best.pt", net, ds.words)
    art = write_manifest(out, "rdpp.model", cfg, inputs=[data])
    finish(out)
    return art


def fit_captions(model: Att2in, att: torch.Tensor, seqs: torch.Tensor, steps: int, lr: float = 1e-2) -> torch.Tensor:
    """``steps`` Adam steps of teacher-forced cross-entropy on (att, seqs); the last step's loss."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        tok, mask = sequence_logprobs(model(att, seqs), seqs)
        loss = -tok.sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss


def state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The weights saved in a checkpoint file."""
    return torch.load(checkpoint, weights_only=True)["state_dict"]


def headless_mobilenet(path: Path) -> Path:
    """A random-init MobileNetV2 saved without its classifier, like an ImageNet trunk a user downloads; its
    batch-norm statistics are set on noise (at the initial ones, activations vanish in eval mode)."""
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.mobilenet_v2(weights=None)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # a plain average over the batches seen
    with torch.no_grad():
        net.train()(torch.rand(8, 3, 64, 64))
    state = net.state_dict()
    torch.save({k: v for k, v in state.items() if not k.startswith("classifier.")}, path)
    return path


# -- the command line ---------------------------------------------------------------------------------

def rdpp(*args, env: dict | None = None):
    """``rdpp ARGS`` in this process (a wide terminal, no progress bars); ``env`` adds variables."""
    return CliRunner().invoke(app, [str(a) for a in args],
                              env={"COLUMNS": "300", "RDPP_NO_PROGRESS": "1", **(env or {})})


def error_line(result) -> str:
    """The refusal: exit code 2 and one `error:` line, the last thing printed (after `using ...` lines)."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    errors = [k for k, ln in enumerate(lines) if ln.startswith("error:")]
    assert errors == [len(lines) - 1], result.output
    return lines[-1]


def failure_line(result, *fragments: str) -> str:
    """A failure of the disk or the OS, not of the input: exit 1 and one `error:` line, the last printed,
    holding ``fragments``, and no traceback."""
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], result.output
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[-1], lines[-1]
    return lines[-1]


def listing(root: Path) -> list[str]:
    """Every path under ``root`` (to show that a refused command wrote nothing), but the hashes a
    read remembers (``.rdpp-verified.json``, artifacts.verified): bookkeeping, never an artifact's file."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name != ".rdpp-verified.json") if root.exists() else []


# -- the peer (self-critical.pytorch) -----------------------------------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def peer_modules():
    """self-critical.pytorch's modules as tests/peer_loader.py loads them (its checkout: $SCP_REPO or
    ../shared/peers), or a pytest skip saying what is missing."""
    import pytest

    import peer_loader

    try:
        return peer_loader.modules(peer_loader.find_repo())
    except (SystemExit, ImportError) as e:
        pytest.skip(f"self-critical.pytorch's code is not here ({e})")


def assert_decodes_like_the_peer(model, ref, att, fc=None, att_mask=None) -> None:
    """``model``'s greedy and beam-3 captions of ``att`` equal those of the peer's module ``ref``
    (the same weights), and so do the chosen words' log-probs; the captions are real ones."""
    from rdpp_cli.decoding.decode import DecodeConfig, decode

    L = model.config.seq_length
    for cfg, opt in ((DecodeConfig(method="greedy", max_len=L), {"sample_method": "greedy"}),
                     (DecodeConfig(method="beam", beam=3, n=1, max_len=L),
                      {"sample_method": "greedy", "beam_size": 3, "sample_n": 1})):
        with torch.no_grad():
            ours = decode(model, att, cfg, att_mask=att_mask, fc=fc)  # unk_id None: the peer suppresses nothing
            fcs = fc if fc is not None else torch.zeros(att.shape[0], 1)
            seq, seq_lp = ref(fcs, att, att_mask, opt=opt, mode="sample")
        T = ours.tokens.shape[-1]
        assert ours.lengths.float().mean() > 1.5  # real captions, not a bare EOS
        assert torch.equal(seq[:, :T], ours.tokens[:, 0]) and not seq[:, T:].any(), cfg.method
        chosen = seq_lp.gather(2, seq.unsqueeze(2)).squeeze(2)[:, :T]
        words = seq[:, :T] > 0
        assert (chosen[words] - ours.logprobs[:, 0, :T][words]).abs().max() < 1e-5, cfg.method


# -- a tiny Hugging Face captioner (the `hf` extra) -----------------------------------------------------

def tiny_hf_captioner(path: Path, texts: list[str] | None = None, enc_dim: int = 16, dec_dim: int = 32,
                      layers: int = 2, dropout: float = 0.1, seed: int = 0, eos: bool = True, positions: int = 64,
                      embeddings: int | None = None) -> Path:
    """A tiny random ``VisionEncoderDecoderModel`` (a 2-layer ViT of 32x32 images in 8x8 patches,
    ``enc_dim`` wide, and a GPT-2 decoder with cross-attention, ``dec_dim`` wide) with a byte-level BPE
    tokenizer trained on ``texts`` (default: the tiny data's captions) and a ViT image processor,
    written with ``save_pretrained`` to ``path``. ``eos=False``: a tokenizer without an end token;
    ``positions``: the decoder's ``n_positions``; ``embeddings``: its ``vocab_size`` (default: the
    tokenizer's size)."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = texts or [t.format(c=c, s=s) for t in TEMPLATES for c in COLOURS for s in SHAPES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>"] if eos else ["<pad>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=360, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = (tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
            if eos else tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>"))
    torch.manual_seed(seed)
    enc = tf.ViTConfig(hidden_size=enc_dim, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=2 * enc_dim,
                       image_size=32, patch_size=8)
    start = fast.eos_token_id if eos else 0
    dec = tf.GPT2Config(vocab_size=embeddings or len(fast), n_positions=positions, n_embd=dec_dim, n_layer=layers, n_head=4,
                        add_cross_attention=True, is_decoder=True, bos_token_id=start, eos_token_id=fast.eos_token_id,
                        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    cfg = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = start, start, fast.eos_token_id
    model = tf.VisionEncoderDecoderModel(config=cfg)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    tf.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return Path(path)


def _tiny_wordpiece(texts: list[str] | None, extra: tuple[str, ...] = ()):
    """A BERT-style WordPiece tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK], then ``extra``) trained on
    ``texts`` (default: the tiny data's captions), lower-casing, as a ``PreTrainedTokenizerFast``."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    texts = texts or [t.format(c=c, s=s) for t in TEMPLATES for c in COLOURS for s in SHAPES]
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *extra]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=200, special_tokens=special))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                      sep_token="[SEP]", mask_token="[MASK]",
                                      additional_special_tokens=list(extra) or None)


def _tiny_vision(cls, dim: int, layers: int):
    """A tiny vision config of ``cls`` (ViT, BLIP, GIT): 32x32 images in 8x8 patches."""
    return cls(hidden_size=dim, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=2 * dim,
               image_size=32, patch_size=8)


def tiny_bert_captioner(path: Path, texts: list[str] | None = None, enc_dim: int = 16, dec_dim: int = 32,
                        layers: int = 2, dropout: float = 0.1, seed: int = 0, positions: int = 64) -> Path:
    """A tiny random ``VisionEncoderDecoderModel``: a ViT as ``tiny_hf_captioner``'s and a BERT decoder
    (``BertLMHeadModel``, ``is_decoder`` and ``add_cross_attention``) with a WordPiece tokenizer; the
    captions start with [CLS] and end with [SEP]."""
    import transformers as tf

    tok = _tiny_wordpiece(texts)
    torch.manual_seed(seed)
    dec = tf.BertConfig(vocab_size=len(tok), hidden_size=dec_dim, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=2 * dec_dim, max_position_embeddings=positions, is_decoder=True,
                        add_cross_attention=True, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    cfg = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(_tiny_vision(tf.ViTConfig, enc_dim, layers), dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = tok.cls_token_id, tok.pad_token_id, tok.sep_token_id
    tf.VisionEncoderDecoderModel(config=cfg).save_pretrained(path)
    tok.save_pretrained(path)
    tf.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return Path(path)


def tiny_blip_captioner(path: Path, texts: list[str] | None = None, enc_dim: int = 16, dec_dim: int = 32,
                        layers: int = 2, dropout: float = 0.1, seed: int = 0, positions: int = 64) -> Path:
    """A tiny random ``BlipForConditionalGeneration`` (BlipConfig with tiny vision and text configs)
    with a WordPiece tokenizer holding BLIP's [DEC] start token; captions end with [SEP]."""
    import transformers as tf

    tok = _tiny_wordpiece(texts, extra=("[DEC]",))
    dec_id = tok.convert_tokens_to_ids("[DEC]")
    torch.manual_seed(seed)
    text = tf.BlipTextConfig(vocab_size=len(tok), hidden_size=dec_dim, num_hidden_layers=layers, num_attention_heads=4,
                             intermediate_size=2 * dec_dim, max_position_embeddings=positions, encoder_hidden_size=enc_dim,
                             hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, bos_token_id=dec_id,
                             sep_token_id=tok.sep_token_id, pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
    vision = _tiny_vision(tf.BlipVisionConfig, enc_dim, layers)
    cfg = tf.BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16)
    tf.BlipForConditionalGeneration(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    tf.BlipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return Path(path)


def tiny_git_captioner(path: Path, texts: list[str] | None = None, enc_dim: int = 16, dec_dim: int = 32,
                       layers: int = 2, dropout: float = 0.1, seed: int = 0, positions: int = 64) -> Path:
    """A tiny random ``GitForCausalLM`` (GitConfig with a tiny vision config) with a WordPiece
    tokenizer; captions start with [CLS] and end with [SEP], as GIT's do."""
    import transformers as tf

    tok = _tiny_wordpiece(texts)
    torch.manual_seed(seed)
    cfg = tf.GitConfig(vision_config=_tiny_vision(tf.GitVisionConfig, enc_dim, layers).to_dict(), vocab_size=len(tok),
                       hidden_size=dec_dim, num_hidden_layers=layers, num_attention_heads=4, intermediate_size=2 * dec_dim,
                       max_position_embeddings=positions, hidden_dropout_prob=dropout,
                       attention_probs_dropout_prob=dropout, pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id,
                       eos_token_id=tok.sep_token_id)
    tf.GitForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    tf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(path)
    return Path(path)


def fit_hf_captions(model, att, captions: list[str], steps: int = 40) -> None:
    """Fit an ``HFCaptioner``'s decoder for ``steps`` Adam steps to one caption per image of ``att``
    (teacher forcing, in train mode; left in eval mode), so that its captions end with the end token."""
    bridge = model.bridge(["a"], 8)
    labels = bridge.tokenizer(captions, add_special_tokens=False)["input_ids"]
    seqs = torch.zeros(len(captions), max(map(len, labels)), dtype=torch.long)
    for i, ids in enumerate(labels):
        seqs[i, :len(ids)] = torch.from_numpy(bridge.rdpp_of_ids(ids))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        lp, mask = model.token_logprobs(att, seqs)
        opt.zero_grad()
        (-lp.sum() / mask.sum()).backward()
        opt.step()
    model.eval()


TINY_CAPTIONERS = {"gpt2": tiny_hf_captioner, "bert": tiny_bert_captioner, "blip": tiny_blip_captioner,
                   "git": tiny_git_captioner}
def drawn_xe_dropout(monkeypatch) -> None:
    """Make the eager XE step draw its dropout before its pass as the fast XE step does
    (``FastPath.xe_dropout``: ``draw_dropout`` at the label width), so that an eager run and a fast
    run of the same seed take the same masks and can be compared number for number."""
    from rdpp_cli.training import fast as F

    monkeypatch.setattr(F.Steps, "xe_dropout", F.FastPath.xe_dropout)


def scoring_att2in(data: DataArtifact, out: Path) -> dict:
    """The weights of an Att2in of width 32 (dropout 0.3) trained eagerly on ``data`` (the tiny set)
    until its greedy captions score (val CIDEr-D > 0; 8 epochs of 4 images, a few seconds)."""
    from rdpp_cli.training.loop import TrainingRecipe
    from rdpp_cli.training.options import TrainLoopOptions
    from rdpp_cli.training.xe import XELoss

    torch.manual_seed(0)
    model = att2in_for(data, 32, 0.3).train()
    opts = TrainLoopOptions(epochs=8, batch_size=4, lr=1e-2, val_images=0, device="cpu", seed=0)
    TrainingRecipe(stage="xe", model=model, data=data, out_dir=out, opts=opts, step_fn=XELoss(),
                   inputs=[data.artifact], manifest_config={}).run()
    return {k: v.clone() for k, v in model.state_dict().items()}


class WrappedFile:
    """A file object passed through to ``f`` (a context manager too), for a test to override ``write``
    with a fault: a lost write, a full disk."""

    def __init__(self, f):
        self._f = f

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)
