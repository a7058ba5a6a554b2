"""How captions are decoded, declared once: ``DecodingOptions`` and ``DecodeConfig``.

``DecodingOptions`` holds the decoding settings a user chooses (method, temperature, top-k, top-p,
beam, groups, diversity lambda, length norm, max length, UNK allowed) as option fields
(rdpp_cli.options): `rdpp sample` and `rdpp caption` inherit them, so these fields are their
command-line options, ``--config`` keys and keyword arguments. ``DecodeConfig`` is the decoder's
config (``rdpp_cli.decoding.decode``): the same fields plus what the caller decides, ``n`` (the
captions decoded per image) and ``unk_id`` (the word never emitted). A stage makes one from its
options with ``DecodingOptions.decode_config``; training and tests make one directly
(``DecodeConfig(method="greedy", max_len=16)``). No torch here: the CLI builds its commands from
these classes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rdpp_cli.errors import RdppError
from rdpp_cli.options import Options, finite, option

METHODS = ("greedy", "beam", "random", "topk", "nucleus", "dbs")
DECODING_CLI = {"rich_help_panel": "Decoding"}  # --help shows these options in a panel of their own
MAX_LEN = 16  # most words per caption when neither the caller nor the model says (the data stage's default)
# The coldest temperature sampling takes. Decoding divides float32 log-probs by it: below about
# |log p| / 3.4e38 (float32's largest number) every word's tempered log-prob overflows to -inf and no
# word can be drawn. The most probable word's log p is at least -log(vocabulary), so 1e-37 keeps it
# finite for any vocabulary up to e**34 words, and sampling that cold is greedy.
MIN_TEMPERATURE = 1e-37

# What each method uses for a setting that is not given, as a function of the config, in this
# order (docs/decoding.md says where each comes from): top-k 10 (Fan et al., 2018, who introduced
# top-k sampling); nucleus p = 0.9 (Holtzman et al., 2020); beam search: n beams, at least 3
# (self-critical.pytorch's n captions by beam search; bw 3 for one caption); diverse beam search:
# one group per caption (self-critical.pytorch's `sample_n_method dbs`) with one beam each
# (Vijayakumar et al.'s G = B), or as many as n needs when one of the two is given; λ = 0.5 (both).
DEFAULTS: dict[str, dict] = {
    "topk": {"top_k": lambda c: 10},
    "nucleus": {"top_p": lambda c: 0.9},
    "beam": {"beam": lambda c: max(c.n, 3)},
    "dbs": {"groups": lambda c: -(-c.n // c.beam) if c.beam else c.n, "beam": lambda c: -(-c.n // max(c.groups, 1))},
}


def decoding_option(default: Any, help: str, **kw: Any) -> Any:
    """A decoding option, shown in ``--help``'s "Decoding" panel."""
    return option(default, help, cli=DECODING_CLI, **kw)


def method_option(default: str) -> Any:
    """``--method``; each stage picks its default (sample: random, caption: beam, the decoder: greedy).
    Checked with the other settings by ``DecodeConfig.check`` (one line naming the methods)."""
    return decoding_option(default, f"One of: {', '.join(METHODS)}.")


@dataclass
class DecodingOptions(Options):
    """The decoding options `rdpp sample` and `rdpp caption` share (docs/decoding.md#methods).
    Settings left None take the method's defaults (``DEFAULTS``) when the config is checked."""

    method: str = method_option("greedy")
    temperature: float = decoding_option(1.0, "Softmax temperature for random/topk/nucleus.", check=finite)
    top_k: int | None = decoding_option(None, "k for --method topk (default 10).")
    top_p: float | None = decoding_option(None, "p for --method nucleus (default 0.9).")
    beam: int | None = decoding_option(None, "Beam width, per group for dbs (default: beam max(n, 3); dbs 1).")
    groups: int | None = decoding_option(None, "Groups for diverse beam search (default: n).")
    diversity_lambda: float = decoding_option(0.5, "Hamming penalty between dbs groups.")
    length_norm: float = decoding_option(0.0, "Beam ranking by score / length**alpha.")
    max_len: int | None = decoding_option(None, "Most words per caption (default: the caption length the model "
                                          "was trained with).")
    # recorded as the decoder's unk_id (None when UNK is allowed)
    allow_unk: bool = decoding_option(False, "Let captions contain UNK (suppressed by default).", identity=False,
                                      record=False)

    def decode_config(self, n: int, max_len: int | None = None, unk_id: int | None = None) -> DecodeConfig:
        """The decoder's checked config for these options: ``n`` captions decoded per image, at most
        ``max_len`` words when the option is not given (else 16), ``unk_id`` never emitted unless
        ``allow_unk``; the method's defaults filled in. RdppError (one line) for settings that make
        no sense."""
        given = {f.name: getattr(self, f.name) for f in dataclasses.fields(DecodingOptions)}
        given["max_len"] = self.max_len if self.max_len is not None else max_len
        try:
            return DecodeConfig(**given, n=n, unk_id=None if self.allow_unk else unk_id).check()
        except ValueError as e:
            raise RdppError(str(e)) from None


@dataclass
class DecodeConfig(DecodingOptions):
    """The decoder's config: the decoding options, and what the caller decides."""

    n: int = 1  # captions decoded per image (beam/dbs: the n best of the final beams; n <= beam*groups)
    unk_id: int | None = None  # a word id never emitted (UNK suppression); None: every word allowed

    def check(self) -> DecodeConfig:
        """Fill the method's defaults for settings left as None (docs/decoding.md); raise ValueError
        with one clear line when the settings make no sense."""
        if self.method not in METHODS:
            raise ValueError(f"unknown decoding method '{self.method}'; use one of {', '.join(METHODS)}")
        if self.max_len is None:
            self.max_len = MAX_LEN
        for name, value in DEFAULTS.get(self.method, {}).items():
            if getattr(self, name) is None:
                setattr(self, name, value(self))
        if self.n < 1:
            raise ValueError(f"--n must be at least 1 (got {self.n})")
        if self.max_len < 1:
            raise ValueError(f"--max-len must be at least 1 (got {self.max_len})")
        if self.method in ("random", "topk", "nucleus") and not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0 (got {self.temperature}); use --method greedy for 0")
        if self.method in ("random", "topk", "nucleus") and self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"--temperature {self.temperature:g} is below {MIN_TEMPERATURE:g}, where the "
                             f"log-probs divided by it leave float32's range; use --method greedy "
                             f"(what sampling that cold gives)")
        if self.method == "topk" and self.top_k < 1:
            raise ValueError(f"--method topk needs --top-k ≥ 1 (got {self.top_k})")
        if self.method == "nucleus" and not 0 < self.top_p <= 1:
            raise ValueError(f"--method nucleus needs 0 < --top-p ≤ 1 (got {self.top_p})")
        if self.method in ("beam", "dbs"):
            groups = self.groups if self.method == "dbs" else 1
            if self.beam < 1 or groups < 1:
                raise ValueError(f"--beam and --groups must be ≥ 1 (got {self.beam}, {groups})")
            width = self.beam * groups
            if self.n > width:
                raise ValueError(f"--n {self.n} is more than the {width} beams of --method {self.method}; "
                                 f"raise --beam{' or --groups' if self.method == 'dbs' else ''} or lower --n")
            if self.length_norm < 0:
                raise ValueError(f"--length-norm must be ≥ 0 (got {self.length_norm})")
        return self

    def to_dict(self) -> dict:
        """The settings a manifest records (``allow_unk`` is there as ``unk_id``)."""
        return self.recorded()
