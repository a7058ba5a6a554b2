"""Consensus re-ranking against the nearest training images (`rdpp sample --select consensus`) and the
top-1 section of `rdpp score`: the neighbours and the ranking on a hand-made case, the kept set in rank
order, and the whole protocol end to end against pycocoevalcap run directly."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
from pycocoevalcap.bleu.bleu import Bleu

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.decoding.consensus import NeighbourConsensus, cosine_neighbours, top_m_sum
from rdpp_cli.decoding.select import Chooser, SelectConfig, consensus_select
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.cider import CiderD, DocFreq

import cider_reference as ref
from helpers import error_line, listing, model_artifact, rdpp, tiny_workspace, write_data

pytestmark = pytest.mark.usefixtures("one_thread")

# -- the hand-made case ------------------------------------------------------------------------------
# five training images (pooled features, captions); T1 and T3 are the same photo's features
WORDS = ["a", "cat", "dog", "grass", "on", "runs", "sleeps", "sofa", "UNK"]
TRAIN = [((1, 0, 0), ["a dog runs on grass", "a dog runs"]),
         ((1, 1, 0), ["a dog on grass"]),
         ((0, 1, 0), ["a cat sleeps on a sofa", "a cat sleeps"]),
         ((1, 1, 0), ["a dog on a sofa"]),
         ((0, 0, 1), ["a sofa"])]
QUERY, OTHER = (2, 1, 0), (0, 1, 0.5)  # a test and a val image (rows 5 and 6)
# cosine of QUERY with T0..T4: 2/√5 = .894, 3/√10 = .949, 1/√5 = .447, .949, 0 -> T1, T3 (tied with T1:
# the lower row first), T0, T2, T4. OTHER: 0, 1/√2.5 = .632, 1/√1.25 = .894, .632, .5/√1.25 = .447 -> T2, T1, T3.
CANDIDATES = ["a cat sleeps", "a dog on grass", "a dog runs on grass", "a dog on grass", "a dog on a sofa",
              "a dog runs", "a sofa"]


def _fc() -> np.ndarray:
    return np.array([f for f, _ in TRAIN] + [QUERY, OTHER], np.float64)


@pytest.fixture(scope="module")
def hand(tmp_path_factory) -> DataArtifact:
    fc = _fc()
    captions = [c for _, c in TRAIN] + [["a dog"], ["a cat"]]
    path = write_data(tmp_path_factory.mktemp("hand") / "data", WORDS, captions, ["train"] * 5 + ["test", "val"],
                      fc, fc[:, None, :])
    return DataArtifact.open(path)


def _tokens(captions: list[str], T: int = 8) -> np.ndarray:
    wid = {w: i + 1 for i, w in enumerate(WORDS)}
    out = np.zeros((1, len(captions), T), np.int64)
    for j, c in enumerate(captions):
        out[0, j, :len(c.split())] = [wid[w] for w in c.split()]
    return out


@pytest.mark.unit
def test_nearest_training_images_by_cosine_by_hand():
    fc = _fc()
    train, queries = fc[:5], fc[5:]
    rows, sims = cosine_neighbours(queries, [train], 3)
    assert rows.tolist() == [[1, 3, 0], [2, 1, 3]]
    np.testing.assert_allclose(sims, [[3 / math.sqrt(10), 3 / math.sqrt(10), 2 / math.sqrt(5)],
                                      [1 / math.sqrt(1.25), 1 / math.sqrt(2.5), 1 / math.sqrt(2.5)]], rtol=1e-6)
    # the same in blocks of any size: the merge keeps each query's k best, ties to the lower row
    for blocks in ([train[:1], train[1:4], train[4:]], [train[:2], train[2:]], list(train[:, None, :])):
        assert cosine_neighbours(queries, blocks, 3)[0].tolist() == [[1, 3, 0], [2, 1, 3]]
    # a training image is not its own neighbour: T0 (1, 0, 0) gets T1, T3 (.707), then T2 (0, tied with T4)
    assert cosine_neighbours(train[:1], [train], 3, exclude=np.array([0]))[0].tolist() == [[1, 3, 2]]
    # fewer rows than k: the missing places say so
    rows, sims = cosine_neighbours(queries[:1], [train[:2]], 3)
    assert rows.tolist() == [[1, 0, -1]] and sims[0, 2] == -np.inf


@pytest.mark.unit
def test_top_m_sum():
    scores = np.array([[3.0, 1.0, 2.0, 0.0], [5.0, 0.0, 0.0, 0.0]])
    assert top_m_sum(scores, 2).tolist() == [5.0, 5.0]
    assert top_m_sum(scores, 10).tolist() == [6.0, 5.0]


@pytest.mark.unit
def test_score_each_is_cider_d_against_each_reference_alone():
    rng = np.random.default_rng(0)
    refs = [rng.integers(1, 9, size=(k, 5)) for k in (3, 1, 4)]
    hyps = rng.integers(0, 9, size=(6, 5))
    index = np.array([0, 2, 2, 1, 0, 2])
    cider = CiderD(DocFreq.from_references(refs))
    each, counts = cider.score_each(hyps, refs, index)
    assert each.shape == (6, 4) and counts.tolist() == [3, 4, 4, 1, 3, 4]
    for h in range(6):
        alone = [cider.score(hyps[h:h + 1], [refs[index[h]][j:j + 1]])[0] for j in range(counts[h])]
        np.testing.assert_allclose(each[h, :counts[h]], alone, rtol=1e-12, atol=1e-12)
        assert (each[h, counts[h]:] == 0).all()
    np.testing.assert_allclose(cider.score(hyps, refs, index), each.sum(1) / counts, rtol=0, atol=0)


@pytest.mark.unit
def test_consensus_ranking_on_the_hand_case(hand):
    """Neighbours of the test image: T1, T3, T0, whose captions are "a dog on grass", "a dog on a sofa",
    "a dog runs on grass", "a dog runs". Consensus = sum of the m best CIDEr-D (training df, end token
    counted) against one of them alone; pycocoevalcap's CiderScorer gives the same numbers."""
    rc = NeighbourConsensus(hand, [5, 6], k=3, top_m=3, max_len=8)
    assert rc.neighbours[5].tolist() == [1, 3, 0] and rc.neighbours[6].tolist() == [2, 1, 3]
    neighbour_caps = ["a dog on grass", "a dog on a sofa", "a dog runs on grass", "a dog runs"]
    assert [hand.decode(r) for r in rc.references(5)] == neighbour_caps
    df, ref_len = ref.df_from_h5(hand.path / "cider_df.h5", WORDS)
    toks = _tokens(CANDIDATES)
    for m in (2, 3):
        rc.top_m = m
        got = rc.scores(toks, [5])[0]
        want = [np.sort(ref.cider_d([(c + " <eos>", [n + " <eos>"]) for n in neighbour_caps], df, ref_len))[-m:].sum()
                for c in CANDIDATES]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # "a cat sleeps" shares only "a" and the end token, which every training image has (idf 0): 0.
    # An exact copy of a neighbour caption scores 10 against it; the m best decide the rest.
    assert got[0] == 0 and got[6] > 0
    rc.top_m = 2  # "a dog runs" (10 + its 4.07 against "a dog runs on grass") beats "a dog on grass" (10 + 2.78)
    assert rc.scores(toks, [5])[0][5] > rc.scores(toks, [5])[0][1]
    rc.top_m = 3  # with a third caption "a dog on grass" (also close to "a dog on a sofa") overtakes it
    ranked = consensus_select(torch.from_numpy(toks), [5], 7, rc)
    # by score: 2 (16.85), 1 and its copy 3 (15.24), 5 (14.72), 4 (13.14), 6 (3.04), 0 (0); the copy last
    assert ranked.tolist() == [[2, 1, 5, 4, 6, 0, 3]]


@pytest.mark.unit
def test_the_chooser_keeps_the_top_n_in_rank_order(hand):
    cfg = SelectConfig("consensus", candidates=7, neighbours=3).check(5)
    chooser = Chooser(cfg, 5, hand, 8, images=[5, 6])
    dec = SimpleNamespace(tokens=torch.from_numpy(np.concatenate([_tokens(CANDIDATES), _tokens(CANDIDATES[::-1])])))
    kept = chooser(dec, [5, 6])
    assert kept[0].tolist() == [2, 1, 5, 4, 6]  # the first is the top-1
    # image 6 (neighbours T2, T1, T3: cats and sofas) ranks the same captions otherwise
    scores = chooser.ranker.scores(dec.tokens[1:].numpy(), [6])[0]
    distinct = [j for j in range(7) if CANDIDATES[::-1][j] not in CANDIDATES[::-1][:j]]
    want = sorted(distinct, key=lambda j: (-scores[j], j))[:5]
    assert kept[1].tolist() == want
    assert CANDIDATES[::-1][want[0]] != CANDIDATES[kept[0][0]]  # its own top-1, not "a dog runs on grass"
    assert chooser.seconds > 0


@pytest.mark.unit
def test_consensus_settings():
    cfg = SelectConfig("consensus", candidates=100).check(5)
    assert (cfg.quality, cfg.neighbours, cfg.tag()) == ("neighbours", 60, "consensus-k60")
    assert cfg.settings() == {"neighbours": 60, "consensus_top_m": 125}
    assert SelectConfig("dpp").check(5).settings() == {}
    for kw, match in ((dict(method="dpp", neighbours=10), "--neighbours is the number of training images"),
                      (dict(method="consensus", quality="logprob"), "--select consensus ranks by neighbours"),
                      (dict(method="consensus", neighbours=0), "--neighbours 0 must be at least 1")):
        with pytest.raises(ValueError, match=match):
            SelectConfig(**kw).check(5)


@pytest.mark.unit
def test_more_neighbours_than_training_images_is_one_line(hand):
    with pytest.raises(RdppError, match="--neighbours 5: data artifact .* has 4 training images an image can take"):
        NeighbourConsensus(hand, [0, 5], k=5)  # image 0 is a training image: 4 others
    assert NeighbourConsensus(hand, [5], k=5).neighbours[5].tolist() == [1, 3, 0, 2, 4]


# -- end to end: rdpp sample --select consensus, then rdpp score ---------------------------------------

FAST = "Bleu_1,Bleu_4,ROUGE_L,CIDEr"


def _expected_choice(data: Path, image_id: int, candidates: list[str], k: int, n: int) -> list[int]:
    """The n candidates of highest consensus, computed directly: cosine of the fc features (numpy),
    CIDEr-D of pycocoevalcap's scorer with the training df, every neighbour caption as the single
    reference (fewer than 8 words: an end token); distinct captions first, ties in decoding order."""
    with h5py.File(data / "captions.h5") as f:
        ids, split = f["image_ids"][...].tolist(), f["split"][...]
        start, end, raw = f["label_start"][...], f["label_end"][...], f["raw"][...].astype(str)
    with h5py.File(data / "features.h5") as f:
        fc = f["fc"][...].astype(np.float64)
    fc /= np.linalg.norm(fc, axis=1, keepdims=True)
    train = np.flatnonzero(split == b"train")
    near = train[np.argsort(-(fc[train] @ fc[ids.index(image_id)]), kind="stable")[:k]]
    neighbour_caps = [c for r in near for c in raw[start[r]:end[r]]]
    words = json.loads((data / "vocab.json").read_text())["words"]
    df, ref_len = ref.df_from_h5(data / "cider_df.h5", words)
    eos = lambda c: c + " <eos>" if len(c.split()) < 8 else c  # noqa: E731
    score = [ref.cider_d([(eos(c), [eos(r)]) for r in neighbour_caps], df, ref_len).sum() for c in candidates]
    distinct = [j for j, c in enumerate(candidates) if c not in candidates[:j]]
    return sorted(distinct, key=lambda j: (-round(score[j], 9), j))[:n]


@pytest.mark.integration
def test_sample_consensus_then_score_reports_top1_oracle_and_diversity(tmp_path):
    ws = tiny_workspace(tmp_path / "ws")
    data = ws / "data" / "tiny-v1"
    model = model_artifact(ws, read_artifact(data, "rdpp.data"))
    before = listing(ws)
    r = rdpp("sample", "--select", "consensus", "--neighbours", "17", "--workspace", ws, "--device", "cpu")
    assert "--neighbours 17: data artifact" in error_line(r) and "has 16 training images" in error_line(r)
    assert listing(ws) == before  # refused before any folder
    r = rdpp("sample", "--select", "consensus", "--candidates", "12", "--n", "3", "--neighbours", "4",
             "--keep-candidates", "--workspace", ws, "--device", "cpu")
    assert r.exit_code == 0, r.output
    art = read_artifact(ws / "samples" / f"{model.name}.random-c12.consensus-k4-n3-v1", "rdpp.samples")
    assert {k: art.config[k] for k in ("select", "candidates", "quality", "neighbours", "consensus_top_m")} == \
        {"select": "consensus", "candidates": 12, "quality": "neighbours", "neighbours": 4, "consensus_top_m": 125}
    recs = json.loads((art.path / "samples.json").read_text())
    assert len(recs) == 2
    for rec in recs:
        assert rec["captions"] == [rec["candidates"][j] for j in rec["chosen"]]
        assert rec["chosen"] == _expected_choice(data, rec["image_id"], rec["candidates"], 4, 3)

    r = rdpp("score", "--oracle", "--diversity", "--metrics", FAST, "--workspace", ws)
    assert r.exit_code == 0, r.output
    assert "top-1 (first caption)" in r.output
    scores = read_artifact(ws / "scores" / art.name, "rdpp.scores")
    s = json.loads((scores.path / "scores.json").read_text())
    with h5py.File(data / "captions.h5") as f:
        row = {int(i): k for k, i in enumerate(f["image_ids"][...])}
        start, end, raw = f["label_start"][...], f["label_end"][...], f["raw"][...].astype(str)
    refs = [list(raw[start[row[x["image_id"]]]:end[row[x["image_id"]]]]) for x in recs]
    caps = [x["captions"] for x in recs]  # plain lower-case words: PTB leaves them as they are
    df, ref_len = ref.corpus_df(refs)
    per = np.stack(ref.per_caption(caps, refs, df, ref_len))
    assert s["top1"]["CIDEr"] == pytest.approx(per[:, 0].mean(), abs=1e-12)
    assert s["oracle"]["CIDEr"] == pytest.approx(per.max(1).mean(), abs=1e-12)
    bleu, _ = Bleu(4).compute_score({i: refs[i] for i in range(2)}, {i: [caps[i][0]] for i in range(2)}, verbose=0)
    assert s["top1"]["Bleu_1"] == pytest.approx(bleu[0], abs=1e-12)
    assert s["diversity"]["div2"] == pytest.approx(np.mean([ref.div_n(c, 2) for c in caps]), abs=1e-12)
    assert s["diversity"]["div1"] is not None and s["diversity"]["mbleu4"] is not None
    assert s["settings"]["top1"] and scores.config["top1"] is True
    table = pd.read_csv(scores.path / "per_image.csv")
    np.testing.assert_allclose(table["CIDEr_top1"], per[:, 0], atol=1e-12)
    assert scores.manifest["summary"]["top1_CIDEr"] == pytest.approx(per[:, 0].mean(), abs=1e-12)

    # any samples: --top1 asks for it; without it a JSON file of captions has no top-1 section
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps([{"image_id": x["image_id"], "captions": x["captions"][::-1]} for x in recs]))
    for flags, name in ((["--top1"], "plain-v1"), ([], "plain-v2")):
        r = rdpp("score", plain, "--data", data, "--metrics", "CIDEr", *flags, "--workspace", ws)
        assert r.exit_code == 0, r.output
        got = json.loads((ws / "scores" / name / "scores.json").read_text())["top1"]
        assert got == ({"CIDEr": pytest.approx(per[:, 2].mean(), abs=1e-12)} if flags else {})
