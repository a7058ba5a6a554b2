"""self-critical.pytorch's code path today (ruotianluo/ImageCaptioning.pytorch, the repository
self-critical.pytorch now points to, ``captioning/``), rewritten here for the benchmarks' reference
sides: the same modules, the same tensor operations in the same order, on rdpp's weights.

- ``Att2in2``: ``models/AttModel.py``'s ``Att2in2Model`` (``AttModel`` + ``Att2in2Core`` +
  ``Attention``). Teacher forcing (``_forward``) embeds the att features and projects the attention
  keys **once per image** (``_prepare_feature``), then repeats them for the image's captions
  (``utils.repeat_tensors``: a copy per caption), and runs the core, the output layer and its
  log-softmax step by step into a preallocated ``outputs`` tensor. Sampling (``_sample``) does the
  same with ``sample_n`` copies and keeps the full log-softmax of every step (``seqLogprobs``).
- ``language_model_criterion`` / ``reward_criterion``: ``modules/losses.py``'s
  ``LanguageModelCriterion`` and ``RewardCriterion``; ``clip_gradient``: ``utils/misc.py``.
- ``CiderD``: ruotianluo/cider's ``ciderD_scorer.py`` as self-critical.pytorch calls it for the
  reward (``CiderD(df='coco-train-idxs')``: document frequencies and the number of training images
  from ``prepro_ngrams.py``'s pickle, pure Python); ``array_to_str``: ``utils/rewards.py`` (a
  caption's ids up to and including the first 0, so the end token is scored like a word).
- ``self_critical_reward``: ``utils/rewards.py``'s ``get_self_critical_reward`` (samples and greedy
  captions scored in one ``CiderD`` call, advantage = sample − greedy of its image).

Only what the benchmarks run is kept (no scheduled sampling, beam search, att masks or BatchNorm).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from pycocoevalcap.cider.cider_scorer import precook

# ----------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------


class Attention(nn.Module):
    def __init__(self, rnn_size: int, att_hid_size: int):
        super().__init__()
        self.rnn_size, self.att_hid_size = rnn_size, att_hid_size
        self.h2att = nn.Linear(rnn_size, att_hid_size)
        self.alpha_net = nn.Linear(att_hid_size, 1)

    def forward(self, h, att_feats, p_att_feats, att_masks=None):
        att_size = att_feats.numel() // att_feats.size(0) // att_feats.size(-1)
        att = p_att_feats.view(-1, att_size, self.att_hid_size)
        att_h = self.h2att(h)
        att_h = att_h.unsqueeze(1).expand_as(att)
        dot = att + att_h
        dot = torch.tanh(dot)
        dot = dot.view(-1, self.att_hid_size)
        dot = self.alpha_net(dot)
        dot = dot.view(-1, att_size)
        weight = F.softmax(dot, dim=1)
        if att_masks is not None:
            weight = weight * att_masks.view(-1, att_size).float()
            weight = weight / weight.sum(1, keepdim=True)
        att_feats_ = att_feats.view(-1, att_size, att_feats.size(-1))
        return torch.bmm(weight.unsqueeze(1), att_feats_).squeeze(1)


class Att2in2Core(nn.Module):
    def __init__(self, input_encoding_size, rnn_size, att_hid_size, drop_prob_lm):
        super().__init__()
        self.rnn_size = rnn_size
        self.a2c = nn.Linear(rnn_size, 2 * rnn_size)
        self.i2h = nn.Linear(input_encoding_size, 5 * rnn_size)
        self.h2h = nn.Linear(rnn_size, 5 * rnn_size)
        self.dropout = nn.Dropout(drop_prob_lm)
        self.attention = Attention(rnn_size, att_hid_size)

    def forward(self, xt, fc_feats, att_feats, p_att_feats, state, att_masks=None):
        att_res = self.attention(state[0][-1], att_feats, p_att_feats, att_masks)
        all_input_sums = self.i2h(xt) + self.h2h(state[0][-1])
        sigmoid_chunk = torch.sigmoid(all_input_sums.narrow(1, 0, 3 * self.rnn_size))
        in_gate = sigmoid_chunk.narrow(1, 0, self.rnn_size)
        forget_gate = sigmoid_chunk.narrow(1, self.rnn_size, self.rnn_size)
        out_gate = sigmoid_chunk.narrow(1, self.rnn_size * 2, self.rnn_size)
        in_transform = all_input_sums.narrow(1, 3 * self.rnn_size, 2 * self.rnn_size) + self.a2c(att_res)
        in_transform = torch.max(in_transform.narrow(1, 0, self.rnn_size),
                                 in_transform.narrow(1, self.rnn_size, self.rnn_size))
        next_c = forget_gate * state[1][-1] + in_gate * in_transform
        next_h = out_gate * torch.tanh(next_c)
        output = self.dropout(next_h)
        return output, (next_h.unsqueeze(0), next_c.unsqueeze(0))


def repeat_tensors(n, x):
    """``utils.repeat_tensors``: (B, ...) -> (B*n, ...), each row repeated n times (a copy)."""
    if torch.is_tensor(x):
        x = x.unsqueeze(1)
        x = x.expand(-1, n, *([-1] * len(x.shape[2:])))
        return x.reshape(x.shape[0] * n, *x.shape[2:])
    if isinstance(x, (list, tuple)):
        return [repeat_tensors(n, _) for _ in x]
    return x


class Att2in2(nn.Module):
    """``Att2in2Model``; module names as upstream (``embed.0``, ``att_embed.0``, ``core.*``)."""

    def __init__(self, vocab_size, input_encoding_size, rnn_size, att_hid_size, att_feat_size, drop_prob_lm,
                 seq_length=16):
        super().__init__()
        self.vocab_size, self.rnn_size, self.seq_length = vocab_size, rnn_size, seq_length
        self.num_layers = 1
        self.embed = nn.Sequential(nn.Embedding(vocab_size + 1, input_encoding_size), nn.ReLU(),
                                   nn.Dropout(drop_prob_lm))
        self.fc_embed = lambda x: x
        self.att_embed = nn.Sequential(nn.Linear(att_feat_size, rnn_size), nn.ReLU(), nn.Dropout(drop_prob_lm))
        self.logit = nn.Linear(rnn_size, vocab_size + 1)
        self.ctx2att = nn.Linear(rnn_size, att_hid_size)
        self.core = Att2in2Core(input_encoding_size, rnn_size, att_hid_size, drop_prob_lm)

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.num_layers, bsz, self.rnn_size),
                weight.new_zeros(self.num_layers, bsz, self.rnn_size))

    def _prepare_feature(self, fc_feats, att_feats, att_masks):
        fc_feats = self.fc_embed(fc_feats)
        att_feats = self.att_embed(att_feats)
        p_att_feats = self.ctx2att(att_feats)
        return fc_feats, att_feats, p_att_feats, att_masks

    def get_logprobs_state(self, it, fc_feats, att_feats, p_att_feats, att_masks, state):
        xt = self.embed(it)
        output, state = self.core(xt, fc_feats, att_feats, p_att_feats, state, att_masks)
        return F.log_softmax(self.logit(output), dim=1), state

    def _forward(self, fc_feats, att_feats, seq, att_masks=None):
        """Teacher forcing: seq (B, n, L) with the BOS column first; log-probs (B*n, L, V+1)."""
        batch_size = fc_feats.size(0)
        if seq.ndim == 3:
            seq = seq.reshape(-1, seq.shape[2])
        seq_per_img = seq.shape[0] // batch_size
        state = self.init_hidden(batch_size * seq_per_img)
        outputs = fc_feats.new_zeros(batch_size * seq_per_img, seq.size(1), self.vocab_size + 1)
        p_fc_feats, p_att_feats, pp_att_feats, p_att_masks = self._prepare_feature(fc_feats, att_feats, att_masks)
        if seq_per_img > 1:
            p_fc_feats, p_att_feats, pp_att_feats, p_att_masks = repeat_tensors(
                seq_per_img, [p_fc_feats, p_att_feats, pp_att_feats, p_att_masks])
        for i in range(seq.size(1)):
            it = seq[:, i].clone()
            if i >= 1 and seq[:, i].sum() == 0:
                break
            output, state = self.get_logprobs_state(it, p_fc_feats, p_att_feats, pp_att_feats, p_att_masks, state)
            outputs[:, i] = output
        return outputs

    def _sample(self, fc_feats, att_feats, att_masks=None, sample_method="greedy", sample_n=1, generator=None):
        """Greedy or multinomial sampling (temperature 1): seq (B*n, L) and seqLogprobs (B*n, L, V+1),
        the full log-softmax of every step (0 after a caption ended), with gradients when enabled."""
        batch_size = fc_feats.size(0)
        state = self.init_hidden(batch_size * sample_n)
        p_fc_feats, p_att_feats, pp_att_feats, p_att_masks = self._prepare_feature(fc_feats, att_feats, att_masks)
        if sample_n > 1:
            p_fc_feats, p_att_feats, pp_att_feats, p_att_masks = repeat_tensors(
                sample_n, [p_fc_feats, p_att_feats, pp_att_feats, p_att_masks])
        seq = fc_feats.new_full((batch_size * sample_n, self.seq_length), 0, dtype=torch.long)
        seqLogprobs = fc_feats.new_zeros(batch_size * sample_n, self.seq_length, self.vocab_size + 1)
        for t in range(self.seq_length + 1):
            if t == 0:
                it = fc_feats.new_full([batch_size * sample_n], 0, dtype=torch.long)
            logprobs, state = self.get_logprobs_state(it, p_fc_feats, p_att_feats, pp_att_feats, p_att_masks, state)
            if t == self.seq_length:
                break
            it = sample_next_word(logprobs, sample_method, generator)
            if t == 0:
                unfinished = it != 0
            else:
                it[~unfinished] = 0
                logprobs = logprobs * unfinished.unsqueeze(1).float()
                unfinished = unfinished * (it != 0)
            seq[:, t] = it
            seqLogprobs[:, t] = logprobs
            if unfinished.sum() == 0:
                break
        return seq, seqLogprobs


def sample_next_word(logprobs, sample_method, generator=None):
    """``CaptionModel.sample_next_word`` (temperature 1). ``Categorical(logits=...).sample()`` is
    ``torch.multinomial(probs, 1)``; the latter takes the benchmark's generator."""
    if sample_method == "greedy":
        _, it = torch.max(logprobs.data, 1)
        return it.view(-1).long()
    probs = F.softmax(logprobs.detach(), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


RDPP_TO_UPSTREAM = {
    "embed.weight": "embed.0.weight", "att_embed.weight": "att_embed.0.weight", "att_embed.bias": "att_embed.0.bias",
    "ctx2att.weight": "ctx2att.weight", "ctx2att.bias": "ctx2att.bias", "logit.weight": "logit.weight",
    "logit.bias": "logit.bias",
    **{f"{k}.{p}": f"core.{k}.{p}" for k in ("a2c", "i2h", "h2h") for p in ("weight", "bias")},
    **{f"{k}.{p}": f"core.attention.{k}.{p}" for k in ("h2att", "alpha_net") for p in ("weight", "bias")},
}


def from_rdpp(model) -> Att2in2:
    """An upstream Att2in2 with the weights of rdpp's Att2in ``model`` (same device and dtype)."""
    c = model.config
    ref = Att2in2(c.vocab_size, c.input_encoding_size, c.rnn_size, c.att_hid_size, c.att_feat_size,
                  c.drop_prob_lm, c.seq_length)
    w = next(model.parameters())
    ref.to(device=w.device, dtype=w.dtype)
    ref.load_state_dict({RDPP_TO_UPSTREAM[k]: v.detach().clone() for k, v in model.state_dict().items()})
    return ref


# ----------------------------------------------------------------------------------------------
# losses and the gradient clip
# ----------------------------------------------------------------------------------------------

def language_model_criterion(input, target, mask):
    if target.ndim == 3:
        target = target.reshape(-1, target.shape[2])
        mask = mask.reshape(-1, mask.shape[2])
    target = target[:, :input.size(1)]
    mask = mask[:, :input.size(1)].to(input)
    output = -input.gather(2, target.unsqueeze(2)).squeeze(2) * mask
    return torch.sum(output) / torch.sum(mask)


def reward_criterion(input, seq, reward):
    input = input.gather(2, seq.unsqueeze(2)).squeeze(2).reshape(-1)
    reward = reward.reshape(-1)
    mask = (seq > 0).to(input)
    mask = torch.cat([mask.new(mask.size(0), 1).fill_(1), mask[:, :-1]], 1).reshape(-1)
    output = -input * reward * mask
    return torch.sum(output) / torch.sum(mask)


def clip_gradient(optimizer, grad_clip):
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                param.grad.data.clamp_(-grad_clip, grad_clip)


def xe_labels(labels):
    """The loader's ``labels`` (B, n, L+2): BOS column, the words, an EOS column; and ``masks``
    (words + the EOS, and the BOS column)."""
    B, n, L = labels.shape
    lab = labels.new_zeros(B, n, L + 2)
    lab[:, :, 1:L + 1] = labels
    nonzero = (lab != 0).sum(2) + 2
    mask = (torch.arange(L + 2, device=labels.device) < nonzero.unsqueeze(-1)).float()
    return lab, mask


# ----------------------------------------------------------------------------------------------
# the reward: CiderD with the training document frequencies, end token counted
# ----------------------------------------------------------------------------------------------

def array_to_str(arr) -> str:
    out = ""
    for i in range(len(arr)):
        out += str(arr[i]) + " "
        if arr[i] == 0:
            break
    return out.strip()


def doc_freq(refs_per_image: list[list[str]]) -> dict:
    """``prepro_ngrams.py``: each n-gram (n = 1..4) of an image's reference strings counted once per image."""
    df: dict = defaultdict(float)
    for refs in refs_per_image:
        for ngram in {ng for ref in refs for ng in precook(ref, 4)}:
            df[ngram] += 1
    return df


def _sim(vec_hyp, vec_ref, norm_hyp, norm_ref, length_hyp, length_ref, n, sigma):
    delta = float(length_hyp - length_ref)
    val = np.array([0.0 for _ in range(n)])
    for nn_ in range(n):
        for (ngram, count) in vec_hyp[nn_].items():
            val[nn_] += min(vec_hyp[nn_][ngram], vec_ref[nn_][ngram]) * vec_ref[nn_][ngram]
        if (norm_hyp[nn_] != 0) and (norm_ref[nn_] != 0):
            val[nn_] /= (norm_hyp[nn_] * norm_ref[nn_])
        val[nn_] *= np.e ** (-(delta ** 2) / (2 * sigma ** 2))
    return val


class CiderD:
    """``CiderD(df=...)`` with a fixed df: ``compute_score(gts, res)`` -> (mean, scores)."""

    def __init__(self, document_frequency: dict, num_images: int, n: int = 4, sigma: float = 6.0):
        self.document_frequency = document_frequency
        self.ref_len = np.log(float(num_images))
        self.n, self.sigma = n, sigma

    def _counts2vec(self, cnts):
        vec = [defaultdict(float) for _ in range(self.n)]
        length = 0
        norm = [0.0 for _ in range(self.n)]
        for (ngram, term_freq) in cnts.items():
            df = np.log(max(1.0, self.document_frequency[ngram]))
            n = len(ngram) - 1
            vec[n][ngram] = float(term_freq) * (self.ref_len - df)
            norm[n] += pow(vec[n][ngram], 2)
            if n == 1:
                length += term_freq
        norm = [np.sqrt(n) for n in norm]
        return vec, norm, length

    def compute_score(self, gts: dict, res: list[dict]):
        crefs, ctest = [], []
        for r in res:
            crefs.append([precook(ref, self.n) for ref in gts[r["image_id"]]])
            ctest.append(precook(r["caption"][0], self.n))
        scores = []
        for test, refs in zip(ctest, crefs):
            vec, norm, length = self._counts2vec(test)
            score = np.zeros((len(refs), self.n))
            for rid, ref in enumerate(refs):
                vec_ref, norm_ref, length_ref = self._counts2vec(ref)
                score[rid] += _sim(vec, vec_ref, norm, norm_ref, length, length_ref, self.n, self.sigma)
            score_avg = np.mean(score, 1)
            score_avg = np.sum(score_avg) / len(refs)
            scores.append(score_avg * 10.0)
        return np.mean(np.array(scores)), np.array(scores)


def cider_scores(scorer: CiderD, hyps: np.ndarray, gts: list[list[str]], ref_index) -> np.ndarray:
    """CIDEr-D of each hypothesis row (ids, 0-padded) against ``gts[ref_index[i]]`` in one call."""
    res = [{"image_id": i, "caption": [array_to_str(h)]} for i, h in enumerate(hyps)]
    _, scores = scorer.compute_score({i: gts[j] for i, j in enumerate(ref_index)}, res)
    return scores


def self_critical_reward(scorer: CiderD, greedy_res, data_gts: list[list[str]], gen_result) -> np.ndarray:
    """``get_self_critical_reward`` (CIDEr weight 1): (B*n, L) advantages, repeated over the steps."""
    batch_size = len(data_gts)
    gen_result_size = gen_result.shape[0]
    seq_per_img = gen_result_size // batch_size
    gen = gen_result.data.cpu().numpy()
    greedy = greedy_res.data.cpu().numpy()
    index = np.concatenate([np.arange(gen_result_size) // seq_per_img, np.arange(batch_size)])
    hyps = list(gen) + list(greedy)
    scores = cider_scores(scorer, hyps, data_gts, index)
    scores = scores[:gen_result_size].reshape(batch_size, seq_per_img) - scores[-batch_size:][:, np.newaxis]
    scores = scores.reshape(gen_result_size)
    return np.repeat(scores[:, np.newaxis], gen.shape[1], 1)
