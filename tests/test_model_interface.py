"""The model interface (models/base.py, models/registry.py) and the XE recipe's pieces that every
model shares: the state reordering of beam search, dropout masks, the step-at-a-time pass,
scheduled sampling, label smoothing, the Noam schedule and the reward table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rdpp_cli.errors import RdppError
from rdpp_cli.models import MODELS, CaptionModel, DropoutMasks, model_spec, select_rows, sequence_logprobs
from rdpp_cli.models.base import stepwise_logprobs
from rdpp_cli.training.loop import noam_factor
from rdpp_cli.models.registry import PRESETS as MODEL_PRESETS
from rdpp_cli.models.registry import STAGES
from rdpp_cli.training.options import XEOptions
from rdpp_cli.training.reward_table import REWARDS
from rdpp_cli.training.xe import XELoss, smoothed_nll, xe_loss

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def _tiny(name: str = "att2in", dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    spec = model_spec(name)
    return spec.build("small", vocab_size=11, att_feat_size=6, fc_feat_size=6, seq_length=5, drop_prob_lm=dropout)


def test_every_registered_model_has_the_interface_sizes_and_both_stages_recipes():
    for name, spec in MODELS.items():
        if spec.folder_option:  # read from a pretrained folder: tests/test_model_hf.py builds a tiny one
            assert all(callable(getattr(spec.cls, m, None)) for m in
                       ("encode", "expand", "init_state", "step", "token_logprobs", "draw_dropout", "from_folder")), name
            assert isinstance(spec.cls.uses_fc, bool) and isinstance(spec.cls.supports_fast, bool), name
        else:
            model = _tiny(name)
            assert isinstance(model, CaptionModel), name
            assert type(model).__name__ == spec.class_name and isinstance(model.config, spec.config_cls), name
        assert set(spec.sizes) == set(MODEL_PRESETS), name
        assert set(spec.recipes) == set(STAGES), name
        assert all(set(spec.recipes[stage]) == set(MODEL_PRESETS) for stage in STAGES), name


def test_an_unknown_model_or_preset_is_one_line():
    with pytest.raises(RdppError, match=r"--model 'showtell' is not a model rdpp knows; use one of att2in"):
        model_spec("showtell")
    with pytest.raises(RdppError, match=r"--preset 'huge' is not a preset of --model att2in; use one of paper, small"):
        model_spec("att2in").config("huge", vocab_size=3)


def test_select_rows_reorders_every_tensor_of_any_nested_state():
    a = torch.arange(6.0).view(3, 2)
    state = (a, (a * 10, [a + 100]))
    out = select_rows(state, torch.tensor([2, 2, 0]))
    assert out[0].tolist() == [[4, 5], [4, 5], [0, 1]]
    assert out[1][0].tolist() == [[40, 50], [40, 50], [0, 10]]
    assert out[1][1][0].tolist() == [[104, 105], [104, 105], [100, 101]]
    with pytest.raises(TypeError):
        select_rows({"h": a}, torch.tensor([0]))


def test_dropout_masks_slice_steps_and_interleave_reference_rows_per_image():
    image = {"att": torch.ones(2, 3, 4)}
    samples = DropoutMasks(image, {"e": torch.arange(2 * 3 * 4.0).view(6, 4, 1)})  # 2 images x 3 samples, 4 steps
    refs = DropoutMasks({}, {"e": -torch.arange(2 * 2 * 4.0).view(4, 4, 1) - 1})  # 2 images x 2 references
    assert samples.steps == 4 and samples.att is image["att"]
    assert samples.at(1)["e"].squeeze(1).tolist() == [1, 5, 9, 13, 17, 21]
    both = samples.with_rows_before(refs, 2)
    # image 0: reference rows 0, 1, then sample rows 0, 1, 2; image 1: reference rows 2, 3, then samples 3, 4, 5
    firsts = both.row["e"][:, 0, 0].tolist()
    assert firsts == [-1, -5, 0, 4, 8, -9, -13, 12, 16, 20]
    assert samples.rows(torch.tensor([5, 0])).row["e"][:, 0, 0].tolist() == [20, 0]


def test_the_step_at_a_time_pass_is_the_models_one_pass():
    m = _tiny().eval()
    att, seqs = torch.randn(2, 4, 6), torch.tensor([[[3, 4, 0], [5, 0, 0]], [[1, 2, 3], [7, 7, 0]]])
    full = m(att, seqs)
    steps = stepwise_logprobs(m, att, seqs)
    assert steps.shape == full.shape
    assert torch.allclose(steps, full, atol=1e-6)


def test_label_smoothing_is_the_kl_to_the_smoothed_target_as_self_critical_pytorch_computes_it():
    torch.manual_seed(0)
    logprobs = torch.randn(3, 4, 6).log_softmax(-1)
    seqs = torch.tensor([[2, 3, 0], [4, 0, 0], [1, 1, 5]])
    eps = 0.2
    # LabelSmoothing of the peer: true_dist = eps/(size-1) everywhere, 1-eps at the target; KLDiv summed over
    # the vocabulary, masked, summed
    target = torch.cat([seqs, seqs.new_zeros(3, 1)], 1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float)
    true = torch.full_like(logprobs, eps / 5).scatter_(2, target.unsqueeze(2), 1 - eps)
    expected = (F.kl_div(logprobs, true, reduction="none").sum(-1) * mask).sum()
    total, tokens = smoothed_nll(logprobs, seqs, eps)
    assert tokens.item() == 9
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)
    nll, _ = smoothed_nll(logprobs, seqs, 0.0)
    token_logp, _ = sequence_logprobs(logprobs, seqs)
    assert nll.item() == pytest.approx(-token_logp.sum().item(), rel=1e-6)


def test_scheduled_sampling_probability_follows_the_published_train_loop():
    # self-critical.pytorch train.py: after epoch start, ss = min(0.05 * ((epoch - start) // 5), 0.25)
    opts = XEOptions(ss_start=0, ss_every=5, ss_step=0.05, ss_max=0.25)
    assert [opts.ss_prob(e) for e in (0, 4, 5, 9, 10, 24, 25, 40)] == pytest.approx(
        [0, 0, 0.05, 0.05, 0.1, 0.2, 0.25, 0.25])
    assert XEOptions(ss_start=-1).ss_prob(30) == 0.0
    assert XEOptions(model="att2in", preset="paper").with_preset().ss_start == 0  # run_att.sh
    assert XEOptions(model="att2in", preset="small").with_preset().ss_start == -1


class _Batch:
    def __init__(self, att, labels, epoch=0):
        self.att, self.labels, self.att_mask, self.fc, self.epoch = att, labels, None, None, epoch


def test_with_probability_zero_the_xe_step_is_todays_and_with_one_it_feeds_the_models_words():
    m = _tiny(dropout=0.0).train()
    att = torch.randn(2, 4, 6)
    labels = torch.tensor([[[3, 4, 0], [5, 0, 0]], [[1, 2, 3], [7, 7, 0]]])
    batch = _Batch(att, labels)
    plain = xe_loss(m, batch)
    loss, logs = XELoss(lambda e: 0.0)(m, batch)
    assert loss.item() == plain.item() and logs == {}
    # ss = 1: every word after the first is the model's own draw; seeded, it is a different loss
    torch.manual_seed(1)
    sampled, logs = XELoss(lambda e: 1.0, log_ss=True)(m, batch)
    assert logs == {"ss_prob": 1.0} and sampled.item() != pytest.approx(plain.item(), rel=1e-4)
    # label smoothing alone: the full pass, KL to the smoothed target (the NLL at 0 smoothing)
    smooth, _ = XELoss(lambda e: 0.0, label_smoothing=0.1)(m, batch)
    assert smooth.item() != pytest.approx(plain.item(), rel=1e-4)
    assert XELoss(lambda e: 0.0, label_smoothing=1e-12)(m, batch)[0].item() == pytest.approx(plain.item(), rel=1e-5)


def test_the_noam_factor_warms_up_linearly_then_decays_as_the_inverse_square_root():
    f = noam_factor(512, 4)
    # step s (1-based) = 1..4 warm up: s * 4^-1.5 / sqrt(512); then s^-0.5 / sqrt(512)
    assert [f(s - 1) for s in (1, 2, 4, 16)] == pytest.approx(
        [1 / 8 / math.sqrt(512), 2 / 8 / math.sqrt(512), 0.5 / math.sqrt(512), 0.25 / math.sqrt(512)])


def test_every_reward_has_a_weight_function_that_turns_scores_into_weights():
    q = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    g = torch.tensor([1.5], dtype=torch.float64)
    K = torch.eye(3, dtype=torch.float64).unsqueeze(0) * 10
    expected = {"dpp": None, "scst": [-0.5, 0.5, 1.5], "scst-mean": [-1.5, 0.0, 1.5], "xe-cider": [-0.5, 0.5, 1.5]}
    for name, r in REWARDS.items():
        w, logs = r.weight_fn()(q, g, K, "none")
        assert w.shape == (1, 3) and "reward" in logs, name
        if expected[name] is not None:
            assert w[0].tolist() == pytest.approx(expected[name]), name
    # R-DPP with a diagonal kernel: L = diag(10 q^2), Linv diagonal and positive: w_i = 10 q_i^2 / 3
    w, _ = REWARDS["dpp"].weight_fn()(q, None, K, "none")
    assert w[0].tolist() == pytest.approx([10 / 3, 40 / 3, 90 / 3])
    w, _ = REWARDS["dpp"].weight_fn()(q, None, K, "mean")
    assert w[0].tolist() == pytest.approx([10 / 3 - 140 / 9, 40 / 3 - 140 / 9, 30 - 140 / 9])
    assert [REWARDS[r].run_name(5, "none", 5.0) for r in REWARDS] == ["dpp-m5", "scst", "scst-mean", "xe-cider-l5"]
