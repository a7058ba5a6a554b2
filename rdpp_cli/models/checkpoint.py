"""Model checkpoints: weights + constructor arguments + vocabulary, loadable with weights_only=True.

A checkpoint is a plain dict ``{"model": "att2in", "model_class": "Att2in", "model_config": {...},
"state_dict": {...}, "vocab": [words], **extra}`` (extra: epoch, val_cider, ...), so a model
artifact is usable on its own: ``model`` is the registry name (``rdpp_cli.models.registry``; older
checkpoints have only ``model_class``, which finds the same entry), ``model_config`` the arguments
of its config dataclass.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rdpp_cli.artifacts.manifest import atomic_write
from rdpp_cli.errors import RdppError
from rdpp_cli.models.registry import MODELS, model_name, spec_of_class


def _plain(obj: Any) -> Any:
    """Only what ``torch.load(weights_only=True)`` accepts: dicts, lists, tensors, numbers, strings."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {(k if isinstance(k, (str, int)) else str(k)): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):  # numpy arrays
        return obj.tolist()
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint (plain types only)")


def save_checkpoint(path: Path | str, model: nn.Module, vocab: list[str], **extra: Any) -> None:
    """Write the checkpoint atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "module", model)  # unwrap DistributedDataParallel
    if not own_vocabulary(model) and len(vocab) != model.config.vocab_size:
        raise ValueError(f"vocab has {len(vocab)} words but the model's vocab_size is {model.config.vocab_size}")
    ckpt = {
        "model": model_name(model),
        "model_class": type(model).__name__,
        "model_config": dataclasses.asdict(model.config),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "vocab": list(vocab),
        **_plain(extra),
    }
    atomic_write(path, lambda f: torch.save(ckpt, f))


def own_vocabulary(model: nn.Module) -> bool:
    """Whether ``model`` has a vocabulary of its own (a tokenizer's; ``models.bridge``): its
    checkpoint's ``vocab`` is then the words of the data it was trained on, not its output ids."""
    return hasattr(model, "bridge")


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint dict (weights_only); RdppError when missing, corrupt or not an rdpp checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise RdppError(f"checkpoint {path} does not exist; train a model with `rdpp train-xe`")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle errors, truncated zip, ...
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RdppError(f"checkpoint {path} cannot be read ({first}); it is corrupt or not a torch checkpoint; "
                        "retrain or restore it") from None
    if not isinstance(ckpt, dict) or not {"model_class", "model_config", "state_dict", "vocab"} <= ckpt.keys():
        raise RdppError(f"checkpoint {path} is not an rdpp model checkpoint (needs model_class, model_config, "
                        "state_dict, vocab)")
    bad = non_finite_tensor(ckpt["state_dict"])
    if bad is not None:
        raise RdppError(f"checkpoint {path} holds NaN or infinity in {bad}: the file is damaged (rdpp never saves "
                        "such weights); run `rdpp verify` to see what changed, then restore the file or retrain")
    return ckpt


def non_finite_tensor(tensors: dict) -> str | None:
    """The name of the first floating-point tensor in ``tensors`` holding NaN or infinity, else None."""
    floats = [(k, v) for k, v in tensors.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        return None
    ok = torch.stack([torch.isfinite(v).all() for _, v in floats])
    return None if bool(ok.all()) else floats[int((~ok).nonzero()[0])][0]


def check_fits_data(ckpt: dict, data: Any, where: str, todo: str) -> None:
    """RdppError unless the checkpoint was made for ``data``'s vocabulary (the same words, in the
    same order) and ``att`` feature size: the one check of ``train-xe --init-from``, ``finetune``
    and ``sample``. ``data``: a DataArtifact (``words``, ``att_dim``, ``path``); ``where`` names the
    checkpoint, ``todo`` says what to do instead."""
    vocab = list(ckpt["vocab"])
    if vocab != list(data.words):
        same = " (as many, but other words or another order)" if len(vocab) == len(data.words) else ""
        raise RdppError(f"{where}: its vocabulary ({len(vocab)} words) is not the one of data artifact {data.path} "
                        f"({len(data.words)} words){same}; {todo}")
    att = ckpt["model_config"].get("att_feat_size")
    if att != data.att_dim:
        raise RdppError(f"{where}: made for {att}-d att features but data artifact {data.path} has "
                        f"{data.att_dim}-d; {todo}")
    spec = spec_of_class(ckpt.get("model_class", ""))
    fc = ckpt["model_config"].get("fc_feat_size")
    if spec is not None and spec.cls.uses_fc and fc is not None and fc != data.fc_dim:
        raise RdppError(f"{where}: made for {fc}-d fc features but data artifact {data.path} has "
                        f"{data.fc_dim}-d; {todo}")


def model_from_checkpoint(ckpt: dict, where: str = "checkpoint") -> nn.Module:
    """The model of ``ckpt``, built from its registry entry and config. Keys of ``model_config``
    that the config no longer has (such as the ``fc_feat_size`` older Att2in checkpoints record)
    are dropped."""
    name = ckpt["model_class"]
    spec = spec_of_class(name)
    if spec is None:
        raise RdppError(f"{where}: unknown model class {name!r}; this rdpp knows "
                        f"{', '.join(s.class_name for s in MODELS.values())}")
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    model = spec.cls(spec.config_cls(**{k: v for k, v in ckpt["model_config"].items() if k in fields}))
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as e:
        first = (str(e).splitlines() or [""])[0]
        raise RdppError(f"{where}: weights do not fit its model_config ({first}); the checkpoint is corrupt") from None
    return model


def checkpoint_model_name(ckpt: dict) -> str:
    """The registry name of the model a checkpoint holds ("att2in" for one older than the name)."""
    if ckpt.get("model"):
        return str(ckpt["model"])
    spec = spec_of_class(ckpt.get("model_class", ""))
    return spec.name if spec is not None else str(ckpt.get("model_class"))


def load_model(path: Path | str, device: str | torch.device = "cpu") -> tuple[nn.Module, list[str], dict]:
    """(model in eval mode on ``device``, its vocabulary, the raw checkpoint dict)."""
    ckpt = load_checkpoint(path, map_location="cpu")
    model = model_from_checkpoint(ckpt, where=str(path))
    if not own_vocabulary(model) and len(ckpt["vocab"]) != model.config.vocab_size:
        raise RdppError(f"checkpoint {path}: vocab has {len(ckpt['vocab'])} words but the model expects "
                        f"{model.config.vocab_size}; the checkpoint is corrupt")
    return model.to(device).eval(), list(ckpt["vocab"]), ckpt
