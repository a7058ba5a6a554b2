"""self-critical.pytorch's own steps in the benchmark's process: the speed reference of
benchmarks/models_speed.py.

Its code is loaded by tests/peer_loader.py, which the tests that compare the models against the peer use
too (``find_repo``, ``modules``, ``build``: the peer's ``Att2in2Model``, ``UpDownModel`` or
``TransformerModel`` holding an rdpp model's weights under the peer's names, ``NAMES``). ``Peer`` adds
its ``LossWrapper``, ``utils.build_optimizer`` and tools/train.py's step order, its SCST step (its
``get_self_critical_reward`` with its pinned ``CiderD`` over document frequencies made by its own
``prepro_ngrams.get_doc_freq``) and the published R-DPP step composed from its parts
(benchmarks/README.md, "The reference is the peer's own code").

Where the checkout is: ``find_repo`` (benchmarks/README.md, "Pointing at your own checkout"). The
checkout is only read: the document-frequency pickle goes to a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:  # the loader lives with the tests, which import it without a path of theirs
    sys.path.append(str(ROOT / "tests"))
from peer_loader import (BUFFERS, DEFAULT_PLACES, HOW, NAMES, PEER_CLASS, PEER_DIR, Modules, build,  # noqa: E402,F401
                         find_repo, modules, options, peer_labels)


def xe_labels(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rdpp's labels (B, n, L) in the layout of the peer's ``DataLoader.get_batch``: labels (B, n, L+2)
    with a BOS column first and room for the EOS; masks over the words, the EOS and the BOS column."""
    B, n, L = labels.shape
    lab = labels.new_zeros(B, n, L + 2)
    lab[:, :, 1:L + 1] = labels
    nonzero = (lab != 0).sum(2) + 2
    mask = (torch.arange(L + 2, device=labels.device) < nonzero.unsqueeze(-1)).float()
    return lab, mask


class Peer:
    """The peer's module of an rdpp model with its weights (``build``), its LossWrapper and its
    optimizer (``utils.build_optimizer``: Adam at lr 4e-4 unless ``lr``), in train mode, on one device."""

    def __init__(self, mods: Modules, rdpp_model, *, seq_per_img: int = 5, lr: float | None = None):
        self.mods, self.opt = mods, options(mods, rdpp_model, seq_per_img=seq_per_img, lr=lr)
        self.model = build(mods, rdpp_model, self.opt)
        self.lw = mods.LossWrapper(self.model, self.opt)
        self.optimizer = mods.misc.build_optimizer(self.model.parameters(), self.opt)
        self.lw.train()

    # -- XE -------------------------------------------------------------------------------------------

    def xe_loss(self, fc, att, labels, masks, gts) -> torch.Tensor:
        """``LossWrapper``'s XE path (``sc_flag`` off), as tools/train.py calls it, ``.mean()``ed."""
        out = self.lw(fc, att, labels, masks, None, gts, torch.arange(0, len(gts)), False, False, False)
        return out["loss"].mean()

    def _clip_and_step(self, loss: torch.Tensor) -> float:
        loss.backward()
        if self.opt.grad_clip_value != 0:
            getattr(torch.nn.utils, f"clip_grad_{self.opt.grad_clip_mode}_")(self.model.parameters(),
                                                                              self.opt.grad_clip_value)
        self.optimizer.step()
        return loss.item()

    def xe_step(self, fc, att, labels, masks, gts) -> float:
        """One step of tools/train.py's loop on a batch (without its loader and its prints)."""
        self.optimizer.zero_grad()
        return self._clip_and_step(self.xe_loss(fc, att, labels, masks, gts))

    # -- the reward ------------------------------------------------------------------------------------

    def init_reward(self, train_refs: list[np.ndarray]) -> None:
        """The peer's CiderD over the document frequencies of ``train_refs`` (per image, (n, L) word
        ids, 0-padded) as ``prepro_ngrams.py`` makes them: each reference's ids and the end token
        '0' (``wtoi['<eos>'] = 0``), counted once per image; ``ref_len`` the number of images. Set
        as the module's ``CiderD_scorer``, which ``init_scorer`` would load from data/<name>.p."""
        refs_idxs = [[" ".join([str(int(w)) for w in r if w != 0] + ["0"]) for r in img] for img in train_refs]
        ngram_idxs, count_refs = self.mods.prepro_ngrams.get_doc_freq(refs_idxs, {})
        self._tmp = tempfile.TemporaryDirectory(prefix="rdpp-peer-")  # removed with this Peer
        stem = Path(self._tmp.name) / "bench-train-idxs"
        with open(f"{stem}.p", "wb") as f:
            self.mods.misc.pickle_dump({"document_frequency": ngram_idxs, "ref_len": count_refs}, f)
        self.mods.rewards.CiderD_scorer = self.mods.rewards.CiderD(df=str(stem))

    def self_critical_reward(self, greedy_res, gts, gen_result) -> np.ndarray:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the mean score each call
            return self.mods.rewards.get_self_critical_reward(greedy_res, gts, gen_result, self.opt)

    # -- SCST ------------------------------------------------------------------------------------------

    def scst_step(self, fc, att, gts, sync=lambda: None) -> dict[str, float]:
        """``LossWrapper.forward``'s ``sc_flag`` branch, call for call, with a clock between the
        calls, then the peer's update: seconds of decoding, of the reward and of the backward."""
        opt = self.opt
        t0 = time.perf_counter()
        self.model.eval()
        with torch.no_grad():
            greedy_res, _ = self.model(fc, att, None, mode="sample",
                                       opt={"sample_method": opt.sc_sample_method, "beam_size": opt.sc_beam_size})
        self.model.train()
        gen_result, sample_logprobs = self.model(fc, att, None, opt={
            "sample_method": opt.train_sample_method, "beam_size": opt.train_beam_size,
            "sample_n": opt.train_sample_n}, mode="sample")
        sync()
        t1 = time.perf_counter()
        g = [gts[_] for _ in torch.arange(0, len(gts)).tolist()]
        reward = self.self_critical_reward(greedy_res, g, gen_result)
        reward = torch.from_numpy(reward).to(sample_logprobs)
        t2 = time.perf_counter()
        self.optimizer.zero_grad()  # (no gradient since the last step: the sampling pass only builds the graph)
        self._clip_and_step(self.lw.rl_crit(sample_logprobs, gen_result.data, reward, reduction="mean").mean())
        sync()
        return {"decode": t1 - t0, "reward": t2 - t1, "backward": time.perf_counter() - t2, "words": mean_words(gen_result)}

    # -- the published R-DPP step ----------------------------------------------------------------------

    def cider_scores(self, hyps: np.ndarray, refs: list[list[str]]) -> np.ndarray:
        """The peer's ``CiderD.compute_score`` of each hypothesis row against ``refs[i]`` (strings)."""
        res = [{"image_id": i, "caption": [self.mods.rewards.array_to_str(h)]} for i, h in enumerate(hyps)]
        _, scores = self.mods.rewards.CiderD_scorer.compute_score({i: refs[i] for i in range(len(hyps))}, res)
        return np.asarray(scores)

    def dpp_weights(self, caps: list[np.ndarray], gts: list[np.ndarray]):
        """q (B, M), the kernel S (B, M, M) and the weights (B, M) of M caption sets (B, T) each, the
        published R-DPP way: q from M CiderD calls against the references, S from M(M+1)/2 CiderD
        calls (caption j against caption i as the only reference), L = diag(q) S diag(q),
        w = (sign(L⁻¹) ∘ L) 1 / M with ``np.linalg.inv``."""
        B, M = len(caps[0]), len(caps)
        ref_strs = [[self.mods.rewards.array_to_str(r) for r in g] for g in gts]
        q = np.stack([self.cider_scores(c, ref_strs) for c in caps], 1)
        S = np.zeros((B, M, M))
        for i in range(M):
            as_ref = [[self.mods.rewards.array_to_str(r)] for r in caps[i]]
            for j in range(i, M):
                S[:, i, j] = S[:, j, i] = self.cider_scores(caps[j], as_ref)
        L = S * q[:, :, None] * q[:, None, :]
        Linv = np.linalg.inv(L + 1e-10 * np.eye(M)[None])
        return q, S, (np.sign(Linv) * L).sum(-1) / M

    def dpp_step(self, fc, att, gts, M: int, sync=lambda: None) -> dict[str, float]:
        """The published R-DPP step on the peer's modules: M separate sampling calls of the model in
        train mode (``mode='sample'``, ``sample_method='sample'``), the weights above on the CPU, the
        peer's ``RewardCriterion`` of each set with its weights, averaged, then the peer's update."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad()
        self.model.train()
        draws = [self.model(fc, att, None, opt={"sample_method": "sample"}, mode="sample") for _ in range(M)]
        sync()
        t1 = time.perf_counter()
        _, _, w = self.dpp_weights([seq.cpu().numpy() for seq, _ in draws], gts)
        t2 = time.perf_counter()
        loss = 0.0
        for i, (seq, logprobs) in enumerate(draws):
            wi = torch.from_numpy(w[:, i]).to(logprobs).unsqueeze(1).expand_as(seq)
            loss = loss + self.lw.rl_crit(logprobs, seq, wi, reduction="mean")
        self._clip_and_step(loss / M)
        sync()
        t3 = time.perf_counter()
        return {"decode": t1 - t0, "reward": t2 - t1, "backward": t3 - t2,
                "words": float(np.mean([mean_words(s) for s, _ in draws]))}


def mean_words(seqs) -> float:
    """Mean words per caption of (N, T) ids (up to the first 0)."""
    s = np.asarray(seqs.cpu() if torch.is_tensor(seqs) else seqs)
    return float((s > 0).cumprod(-1).sum(-1).mean())

