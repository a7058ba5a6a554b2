"""models.checkpoint.check_fits_data: the one vocabulary / feature-size check of train-xe --init-from,
finetune and sample (their stage tests check that each refuses a mismatched model)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import check_fits_data

pytestmark = pytest.mark.unit

DATA = SimpleNamespace(words=["a", "dog", "runs", "UNK"], att_dim=6, path=Path("runs/data/toy-v1"))


def ckpt(words, att=6):
    return {"vocab": list(words), "model_config": {"att_feat_size": att, "fc_feat_size": 99}}


def test_a_checkpoint_of_the_data_passes():
    check_fits_data(ckpt(DATA.words), DATA, "m", "do x")  # fc size is not Att2in's input: not checked


def test_another_vocabulary_is_one_line_naming_both_sizes():
    with pytest.raises(RdppError) as e:
        check_fits_data(ckpt(["a", "dog", "UNK"]), DATA, "model runs/xe/att2in-v1", "sample with the model's data")
    assert str(e.value) == ("model runs/xe/att2in-v1: its vocabulary (3 words) is not the one of data artifact "
                            "runs/data/toy-v1 (4 words); sample with the model's data")


def test_the_same_number_of_other_words_is_refused_too():
    with pytest.raises(RdppError) as e:
        check_fits_data(ckpt(["a", "runs", "dog", "UNK"]), DATA, "best.pt", "fine-tune on its data")
    assert str(e.value) == ("best.pt: its vocabulary (4 words) is not the one of data artifact runs/data/toy-v1 "
                            "(4 words) (as many, but other words or another order); fine-tune on its data")


def test_another_att_feature_size_is_refused():
    with pytest.raises(RdppError) as e:
        check_fits_data(ckpt(DATA.words, att=2048), DATA, "--init-from x.pt", "start from scratch")
    assert str(e.value) == ("--init-from x.pt: made for 2048-d att features but data artifact runs/data/toy-v1 has "
                            "6-d; start from scratch")


def test_another_fc_feature_size_is_refused_for_a_model_that_reads_fc():
    data = SimpleNamespace(**vars(DATA), fc_dim=6)
    updown = {**ckpt(DATA.words), "model_class": "UpDown"}
    with pytest.raises(RdppError) as e:
        check_fits_data(updown, data, "best.pt", "sample with the model's data")
    assert str(e.value) == ("best.pt: made for 99-d fc features but data artifact runs/data/toy-v1 has 6-d; "
                            "sample with the model's data")
    check_fits_data({**ckpt(DATA.words), "model_class": "Att2in"}, data, "best.pt", "x")  # Att2in reads no fc
