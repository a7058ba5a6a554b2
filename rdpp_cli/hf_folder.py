"""Reading and writing a Hugging Face image captioner's ``save_pretrained`` folder: what both
``data`` (``prepro --backbone hf:DIR``: its vision encoder) and ``models`` (``--model hf --hf-model
DIR``: its text decoder) read, so it sits below both (docs/architecture.md, "Layers").

Three kinds of folder are image captioners rdpp reads (``KINDS``), told apart by config.json's
``model_type``:

- ``vision-encoder-decoder``: a ``VisionEncoderDecoderModel``, any vision encoder with any decoder
  transformers runs with cross-attention (GPT-2, BERT, RoBERTa...): ``encoder`` / ``decoder``;
- ``blip``: a ``BlipForConditionalGeneration``: ``vision_model`` / ``text_decoder`` (cross-attention);
- ``git``: a ``GitForCausalLM``: ``git.image_encoder`` / the rest (the image's tokens, projected,
  come before the text in one causal decoder).

The vision encoder's last hidden states (B, R, D) are what every kind's decoder reads, so they are
a data artifact's att features (``vision_encoder``).

``transformers`` is imported only when a folder is read (the ``hf`` extra, ``pip install 'rdpp[hf]'``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rdpp_cli.errors import RdppError

INSTALL = "pip install 'rdpp[hf]'"
# config.json's model_type -> (kind, the transformers class that loads the folder)
KINDS = {"vision-encoder-decoder": ("ved", "VisionEncoderDecoderModel"),
         "blip": ("blip", "BlipForConditionalGeneration"),
         "git": ("git", "GitForCausalLM")}
CAPTIONERS = "a VisionEncoderDecoderModel, BlipForConditionalGeneration or GitForCausalLM"


def require_transformers():
    """The ``transformers`` module; RdppError naming the extra to install without it."""
    try:
        import transformers
    except ImportError:
        raise RdppError(f"--model hf needs the transformers package, which is not installed; {INSTALL}") from None
    return transformers


def folder_kind(path: Path, option: str) -> str:
    """The kind (``KINDS``) of the captioner in ``path``; RdppError for a folder that holds none."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise RdppError(f"{option}{path} has no config.json; pass a folder written by save_pretrained of {CAPTIONERS}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise RdppError(f"{option}{path}: config.json cannot be read ({e}); pass a save_pretrained folder") from None
    kind = KINDS.get(cfg.get("model_type"))
    if kind is None:
        raise RdppError(f"{option}{path} holds a {cfg.get('model_type')!r} model, not an image captioner rdpp reads "
                        f"({CAPTIONERS}); pass the folder of one such as nlpconnect/vit-gpt2-image-captioning")
    archs = cfg.get("architectures") or [kind[1]]
    if kind[0] == "blip" and kind[1] not in archs:
        raise RdppError(f"{option}{path} holds a {archs[0]}, not a BlipForConditionalGeneration (a captioner); "
                        "pass the folder of one such as Salesforce/blip-image-captioning-base")
    if kind[0] == "ved":
        dec = cfg.get("decoder", {})
        tf = require_transformers()
        known = tf.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        if dec.get("model_type") not in known or not dec.get("add_cross_attention", False):
            raise RdppError(f"{option}{path}: its decoder ({dec.get('model_type')!r}) is not a causal language model "
                            "with cross-attention; pass a folder whose decoder has add_cross_attention=True")
    return kind[0]


def load_errors() -> tuple[type[BaseException], ...]:
    """What loading a damaged save_pretrained folder raises: a file missing or unreadable, JSON cut
    short, a safetensors file whose header or data is cut short (``SafetensorError``)."""
    from safetensors import SafetensorError

    return OSError, ValueError, RuntimeError, SafetensorError


def model_class(kind: str):
    """The transformers class of a folder of ``kind``."""
    tf = require_transformers()
    return getattr(tf, next(c for k, c in KINDS.values() if k == kind))


def read_folder(path: str | Path, option: str = "--hf-model ") -> tuple[Any, Any, str]:
    """(model in eval mode, tokenizer, kind) of a captioner's save_pretrained folder; RdppError for
    a folder that is not one, or a tokenizer without an end token (``option`` names where it came from)."""
    path = Path(path)
    if not path.is_dir():
        raise RdppError(f"{option}{path} is not a folder; pass the save_pretrained folder of {CAPTIONERS}")
    kind = folder_kind(path, option)
    tf = require_transformers()
    try:
        model = model_class(kind).from_pretrained(path)
        tok = tf.AutoTokenizer.from_pretrained(path)
    except load_errors() as e:  # a file missing, cut short or damaged (a truncated model.safetensors)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RdppError(f"{option}{path} cannot be loaded ({first[:200]}); pass a complete save_pretrained folder "
                        "with its tokenizer") from None
    if end_token(kind, model.config, tok) is None:
        raise RdppError(f"{option}{path}: its tokenizer has no end token (eos_token) and its config no "
                        "eos_token_id; set one in tokenizer_config.json")
    return model.eval(), tok, kind


def end_token(kind: str, config, tokenizer) -> int | None:
    """The end token's id: BLIP's and GIT's text ``sep_token_id`` (what their ``generate`` stops at),
    else the tokenizer's eos token, else the decoder config's ``eos_token_id``."""
    if kind == "blip":
        return config.text_config.sep_token_id
    if kind == "git":
        return getattr(tokenizer, "sep_token_id", None) or config.eos_token_id
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos is not None else getattr(config.decoder, "eos_token_id", None)


def start_token(kind: str, config, tokenizer) -> int:
    """The first input of every caption: BLIP's text ``bos_token_id``, GIT's ``bos_token_id`` (else its
    tokenizer's [CLS]), a VisionEncoderDecoderModel's ``decoder_start_token_id`` (else its decoder's
    bos, else the end token): what each kind's ``generate`` starts with."""
    if kind == "blip":
        return int(config.text_config.bos_token_id)
    if kind == "git":
        return int(config.bos_token_id if config.bos_token_id is not None else tokenizer.cls_token_id)
    start = config.decoder_start_token_id
    if start is None:
        start = config.decoder.bos_token_id if config.decoder.bos_token_id is not None else end_token(kind, config,
                                                                                                    tokenizer)
    return int(start)


def text_config(kind: str, config):
    """The config of the folder's text decoder."""
    return config.decoder if kind == "ved" else config.text_config if kind == "blip" else config


def vision_config(kind: str, config):
    """The config of the folder's vision encoder."""
    return config.encoder if kind == "ved" else config.vision_config


def positions(text_cfg) -> int:
    """The most positions the text decoder embeds (``n_positions`` or ``max_position_embeddings``)."""
    return int(getattr(text_cfg, "n_positions", None) or text_cfg.max_position_embeddings)


def vision_encoder(model: Any, kind: str) -> nn.Module:
    """The vision encoder of a captioner (its forward takes ``pixel_values`` and returns
    ``last_hidden_state``: what the decoder reads)."""
    return model.encoder if kind == "ved" else model.vision_model if kind == "blip" else model.git.image_encoder


def read_back(out: Path, model, tokenizer) -> None:
    """``LostWrite`` naming the file unless the folder ``out``, just saved from ``model`` and
    ``tokenizer``, loads back as them: every tensor equal, the same generation config and vocabulary
    (a write the disk lost while reporting success is found before the folder is renamed into place)."""
    from rdpp_cli.artifacts.files import LostWrite

    tf = require_transformers()
    lost = "(a write was lost although it reported success); nothing was replaced"
    try:
        again = type(model).from_pretrained(out)
        tok = tf.AutoTokenizer.from_pretrained(out)
    except load_errors() as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise LostWrite(5, f"read back after writing, it does not load ({first[:160]}) {lost}", str(out)) from None
    theirs, mine = again.state_dict(), model.state_dict()
    bad = [k for k, v in mine.items() if k not in theirs or not torch.equal(v, theirs[k])]
    if bad:
        raise LostWrite(5, f"read back after writing, {len(bad)} of {len(mine)} tensors differ from those written "
                           f"(such as {bad[0]}) {lost}", str(out / "model.safetensors"))
    if again.generation_config.to_dict() != model.generation_config.to_dict():
        raise LostWrite(5, f"read back after writing, its generation settings differ from those written {lost}",
                        str(out / "generation_config.json"))
    if tok.get_vocab() != tokenizer.get_vocab():
        raise LostWrite(5, f"read back after writing, its tokenizer differs from the one written {lost}", str(out))


def weights_sha256(folder: str | Path) -> str | None:
    """sha256 of a save_pretrained folder's weights file (its first ``*.safetensors``, else ``*.bin``;
    None without one): what a data artifact made with ``--backbone hf:DIR`` records as
    ``weights_sha256``, and what tells one encoder from another of the same config."""
    from rdpp_cli.artifacts import sha256_file

    files = sorted(Path(folder).glob("*.safetensors")) or sorted(Path(folder).glob("*.bin"))
    return sha256_file(files[0]) if files else None


def check_same_encoder(folder: str | Path, want: str | None, made: str, option: str) -> None:
    """RdppError unless ``folder``'s weights file has the sha256 ``want`` (None: nothing recorded,
    nothing to compare) that ``made`` (the data artifact or model whose features came from it) records."""
    got = weights_sha256(folder) if want else None
    if want and got != want:
        raise RdppError(f"{option}{folder}: its weights (sha256 {(got or 'none')[:12]}…) are not those of the vision "
                        f"encoder {made} was made with ({want[:12]}…), so the att features came from another "
                        "encoder; pass that folder, or make the data with this one (--backbone hf:DIR)")


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's files as text (what ``save_pretrained`` writes), for a checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text() for p in Path(tmp).iterdir() if p.is_file()}


def tokenizer_from_files(files: dict[str, str]):
    """The tokenizer ``tokenizer_files`` saved."""
    tf = require_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        return tf.AutoTokenizer.from_pretrained(tmp)
