"""R-DPP (or SCST, or the mean baseline) in a training loop of your own, with rdpp_cli.objective.

A tiny GRU captioner with its own vocabulary and special tokens (pad, bos, eos), on random "image
features", is trained briefly with cross-entropy on a handful of text references, then fine-tuned with
the objective of ``rdpp finetune``: each step samples m captions per image, and the API turns them
(token ids in the model's vocabulary plus its decode function) and their log-probabilities into the
per-caption weights and the loss. Runs on a CPU in a few seconds:

    python examples/own_loop.py                       # R-DPP, m = 5
    python examples/own_loop.py --reward scst --m 3   # SCST against the greedy caption

The last line printed is a JSON summary (tests/test_objective_example.py reads it). docs/api.md
explains the API.
"""

from __future__ import annotations

import argparse
import json
import math
import random

import torch
from torch import nn

from rdpp_cli.objective import Objective, tokenize

REFERENCES = {  # image id -> captions as people write them
    "red-circle": ["A red circle.", "A circle that is red.", "Red circle on a plain background.", "One red circle."],
    "blue-square": ["A blue square.", "A square that is blue.", "Blue square on a plain background.",
                    "One blue square."],
    "green-triangle": ["A green triangle.", "A triangle that is green.", "Green triangle on a plain background.",
                       "One green triangle."],
    "red-square": ["A red square.", "A square that is red.", "Red square on a plain background.", "One red square."],
    "blue-circle": ["A blue circle.", "A circle that is blue.", "Blue circle on a plain background.",
                    "One blue circle."],
    "green-square": ["A green square.", "A square that is green.", "Green square on a plain background.",
                     "One green square."],
}
PAD, BOS, EOS = 0, 1, 2  # the model's own special tokens
MAX_LEN = 8


class TinyCaptioner(nn.Module):
    """A GRU decoder whose state starts from the image's feature vector."""

    def __init__(self, feat_dim: int, vocab: int, hidden: int = 64) -> None:
        super().__init__()
        self.init = nn.Linear(feat_dim, hidden)
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def teacher_forced(self, feats: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probs (N, T) of ``tokens`` (N, T) given the features (N, F)."""
        h = torch.tanh(self.init(feats))
        prev = torch.full_like(tokens[:, 0], BOS)
        out = []
        for t in range(tokens.shape[1]):
            h = self.cell(self.embed(prev), h)
            out.append(torch.log_softmax(self.out(h), -1).gather(1, tokens[:, t:t + 1]))
            prev = tokens[:, t]
        return torch.cat(out, 1)

    def sample(self, feats: torch.Tensor, greedy: bool = False, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Captions (N, MAX_LEN) with EOS then PAD, each token's log-prob (N, MAX_LEN) with grad, and
        the mask of the tokens drawn (the EOS included)."""
        h = torch.tanh(self.init(feats))
        prev = torch.full((feats.shape[0],), BOS, dtype=torch.long)
        alive = torch.ones(feats.shape[0], dtype=torch.bool)
        ids, logps, mask = [], [], []
        for _ in range(MAX_LEN):
            h = self.cell(self.embed(prev), h)
            logp = torch.log_softmax(self.out(h), -1)
            tok = logp.argmax(-1) if greedy else torch.multinomial(logp.exp().detach(), 1, generator=generator)[:, 0]
            tok = torch.where(alive, tok, torch.full_like(tok, PAD))
            ids.append(tok)
            logps.append(logp.gather(1, tok[:, None])[:, 0])
            mask.append(alive.float())
            alive = alive & (tok != EOS)
            prev = tok
        return torch.stack(ids, 1), torch.stack(logps, 1), torch.stack(mask, 1)


def model_vocabulary() -> list[str]:
    words = sorted({w for caps in REFERENCES.values() for c in caps for w in tokenize(c)})
    return ["<pad>", "<bos>", "<eos>"] + words


def make_decode(vocab: list[str]):
    def decode(ids: list[int]) -> str:  # like a tokenizer's decode(ids, skip_special_tokens=True)
        words = []
        for i in ids:
            if i == EOS:
                break
            if i > EOS:
                words.append(vocab[i])
        return (" ".join(words).capitalize() + ".") if words else ""
    return decode


def xe_step(model, opt, feats, keys, vocab, rng: random.Random) -> float:
    """One cross-entropy step on one random reference per image."""
    w2i = {w: i for i, w in enumerate(vocab)}
    rows = [[w2i[w] for w in tokenize(rng.choice(REFERENCES[k]))][:MAX_LEN - 1] + [EOS] for k in keys]
    tokens = torch.tensor([r + [PAD] * (MAX_LEN - len(r)) for r in rows])
    logp = model.teacher_forced(feats, tokens)
    loss = -(logp * (tokens != PAD)).sum() / (tokens != PAD).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def rl_step(model, opt, objective: Objective, feats, keys, decode, gen) -> dict:
    """One fine-tuning step with the API: sample m per image, weights and loss, one update."""
    m = objective.m
    ids, token_logp, mask = model.sample(feats.repeat_interleave(m, 0), generator=gen)  # image-major rows
    greedy = None
    if objective.spec.greedy:  # SCST's baseline: the greedy caption, no gradient
        with torch.no_grad():
            greedy = model.sample(feats, greedy=True)[0]
    out = objective.step(keys, ids.view(len(keys), m, -1), token_logp, mask, decode=decode, greedy=greedy)
    opt.zero_grad()
    out.loss.backward()
    opt.step()
    # the same captions as text give the same weights: CIDEr-D is computed on the words
    again = objective.weights(keys, out.captions, greedy=None if greedy is None else [decode(g) for g in
                                                                                      greedy.tolist()])
    return {"loss": out.loss.item(), "weights_diff": float((again.weights - out.weights).abs().max()), **out.logs}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reward", default="dpp", choices=["dpp", "scst", "scst-mean"])
    ap.add_argument("--m", type=int, default=5)
    ap.add_argument("--xe-steps", type=int, default=60)
    ap.add_argument("--rl-steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng, gen = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    keys = list(REFERENCES)
    feats = torch.randn(len(keys), 16, generator=gen)  # one random "image feature" vector per image
    vocab = model_vocabulary()
    model = TinyCaptioner(16, len(vocab))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xe = [xe_step(model, opt, feats, keys, vocab, rng) for _ in range(args.xe_steps)]
    print(f"cross-entropy: {xe[0]:.3f} -> {xe[-1]:.3f} over {args.xe_steps} steps")

    objective = Objective.from_references(REFERENCES, reward=args.reward, m=args.m, max_len=MAX_LEN)
    for g in opt.param_groups:
        g["lr"] = args.lr
    decode = make_decode(vocab)
    logs = []
    for step in range(args.rl_steps):
        logs.append(rl_step(model, opt, objective, feats, keys, decode, gen))
        if step % 10 == 0 or step == args.rl_steps - 1:
            print(f"step {step:3d}  loss {logs[-1]['loss']:+.4f}  sample CIDEr-D {logs[-1]['sample_cider']:.3f}"
                  + (f"  self-CIDEr {logs[-1]['self_cider']:.3f}" if "self_cider" in logs[-1] else ""))
    k = max(1, min(10, args.rl_steps // 2))
    summary = {
        "reward": args.reward, "m": args.m, "xe_loss": [xe[0], xe[-1]],
        "sample_cider_first": sum(x["sample_cider"] for x in logs[:k]) / k,
        "sample_cider_last": sum(x["sample_cider"] for x in logs[-k:]) / k,
        "self_cider_first": sum(x.get("self_cider", 0.0) for x in logs[:k]) / k,
        "self_cider_last": sum(x.get("self_cider", 0.0) for x in logs[-k:]) / k,
        "losses_finite": all(math.isfinite(x["loss"]) for x in logs),
        "max_weights_diff": max(x["weights_diff"] for x in logs),
        "greedy": {key: decode(g) for key, g in zip(keys, model.sample(feats, greedy=True)[0].tolist())},
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
