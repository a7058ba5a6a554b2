"""self-critical.pytorch's XE code path (ruotianluo/ImageCaptioning.pytorch, ``captioning/``),
rewritten on rdpp's weights: a correctness reference for benchmarks/train.py and the layout peer.py
maps rdpp's weights into, never timed (the benchmarks time the peer's own modules, peer.py).

- ``Att2in2``: ``models/AttModel.py``'s ``Att2in2Model`` (``AttModel`` + ``Att2in2Core`` +
  ``Attention``). Teacher forcing (``_forward``) embeds the att features and projects the attention
  keys **once per image** (``_prepare_feature``), then repeats them for the image's captions
  (``utils.repeat_tensors``: a copy per caption), and runs the core, the output layer and its
  log-softmax step by step into a preallocated ``outputs`` tensor.
- ``language_model_criterion``: ``modules/losses.py``'s ``LanguageModelCriterion``; ``xe_labels``:
  the loader's labels with their BOS and EOS columns and masks.

Only what the benchmarks run is kept (no sampling, scheduled sampling, beam search, att masks or
BatchNorm).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

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
# the loss and the labels
# ----------------------------------------------------------------------------------------------

def language_model_criterion(input, target, mask):
    if target.ndim == 3:
        target = target.reshape(-1, target.shape[2])
        mask = mask.reshape(-1, mask.shape[2])
    target = target[:, :input.size(1)]
    mask = mask[:, :input.size(1)].to(input)
    output = -input.gather(2, target.unsqueeze(2)).squeeze(2) * mask
    return torch.sum(output) / torch.sum(mask)


def xe_labels(labels):
    """The loader's ``labels`` (B, n, L+2): BOS column, the words, an EOS column; and ``masks``
    (words + the EOS, and the BOS column)."""
    B, n, L = labels.shape
    lab = labels.new_zeros(B, n, L + 2)
    lab[:, :, 1:L + 1] = labels
    nonzero = (lab != 0).sum(2) + 2
    mask = (torch.arange(L + 2, device=labels.device) < nonzero.unsqueeze(-1)).float()
    return lab, mask
