"""The training reward on torch tensors (``metrics.cider.torch_kernel``, ``metrics.train_cider_torch``):
the numbers of the numpy path (``CiderD``, ``TrainCider``, ``self_cider_from_kernel``) to 1e-9, on CPU
tensors (tests/test_cuda.py repeats the comparison on a GPU)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.metrics.cider import CiderD, DocFreq
from rdpp_cli.metrics.cider.torch_kernel import TorchCiderD, gram_keys
from rdpp_cli.metrics.self_cider import self_cider_from_kernel
from rdpp_cli.metrics.train_cider import TrainCider, with_eos
from rdpp_cli.metrics import train_cider_torch as TT

from helpers import write_tiny_data

pytestmark = pytest.mark.unit


def _caps(rng, n: int, T: int, V: int, min_words: int = 0) -> np.ndarray:
    """n captions of up to T words over ids 1..V, 0-padded, with many repeated words (so that
    n-grams occur several times in one caption, which the clipping in CIDEr-D is about)."""
    c = rng.integers(1, V + 1, (n, T))
    c = np.where(rng.random((n, T)) < 0.35, 2, c)  # a frequent word: repeats within a caption
    words = rng.integers(min_words, T + 1, n)
    return np.where(np.arange(T)[None] < words[:, None], c, 0)


@pytest.fixture(scope="module")
def df() -> DocFreq:
    rng = np.random.default_rng(0)
    return DocFreq.from_references([_caps(rng, 5, 9, 12, 1) for _ in range(40)])


def test_gram_keys_are_the_keys_of_keys_py():
    caps = torch.tensor([[3, 1, 4, 1, 0, 9], [2, 7, 0, 0, 0, 0]])
    keys, ok = gram_keys(caps, base=10)
    assert keys[0, 0, :4].tolist() == [3, 1, 4, 1] and ok[0, 0].tolist() == [True] * 4 + [False] * 2
    assert keys[0, 2, 0] == 314 and keys[0, 3, 0] == 3141 and ok[0, 3].tolist() == [True] + [False] * 5
    assert ok[1, 1].tolist() == [True] + [False] * 5 and not ok[1, 2].any()
    # nothing after a caption's first 0 (the 9 of caption 0 is not a word)
    assert not ok[0, 0, 5]


def test_scores_and_kernels_equal_the_numpy_cider_d(df):
    rng = np.random.default_rng(1)
    B, M, k, T = 9, 4, 5, 9
    hyps = _caps(rng, B * M, T, 12)  # ids up to 12: within the df's id range, some never seen in it
    hyps[0] = 0  # an empty caption
    hyps[1] = hyps[2]  # two equal captions
    refs = np.stack([_caps(rng, k, T, 12, 1) for _ in range(B)])
    counts = np.array([5, 3, 5, 1, 4, 5, 2, 5, 5])
    index = np.repeat(np.arange(B), M)
    ref_list = [refs[b, :counts[b]] for b in range(B)]
    t = TorchCiderD(df)
    want = CiderD(df).score(hyps, ref_list, index)
    got = t.score(torch.from_numpy(hyps), torch.from_numpy(refs), torch.from_numpy(counts), torch.from_numpy(index))
    assert got.dtype == torch.float64 and want.max() > 1.0
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)
    caps = hyps.reshape(B, M, T)
    np.testing.assert_allclose(t.pairwise(torch.from_numpy(caps)).numpy(), CiderD(df).pairwise(caps),
                               rtol=1e-9, atol=1e-12)


def test_a_df_without_n_grams_gives_every_n_gram_the_full_idf():
    empty = DocFreq(np.zeros((0, 4), np.int64), np.zeros(0), num_docs=7)
    caps = np.array([[1, 2, 3, 0], [1, 2, 0, 0]])
    want = CiderD(empty).score(caps, [caps[1:2]] * 2, [0, 1])
    got = TorchCiderD(empty).score(torch.from_numpy(caps), torch.from_numpy(caps[None, 1:2]), torch.tensor([1]),
                                   torch.tensor([0, 0]))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> DataArtifact:
    return DataArtifact.open(write_tiny_data(Path(tmp_path_factory.mktemp("d")) / "tiny", n_train=16, n_val=6,
                                             n_test=2))


def test_the_training_reward_on_tensors_equals_train_cider(tiny):
    """q, the published-direction kernel S and scores against references, with the end token, on a
    real data artifact's df: captions that end, captions cut at the length limit, empty ones."""
    cider = TrainCider.for_data(tiny)
    dev = TT.DeviceTrainCider(cider, "cpu")
    rng = np.random.default_rng(2)
    L, B, M = tiny.seq_length, 6, 4
    samples = _caps(rng, B * M, L, tiny.vocab_size).reshape(B, M, L)
    samples[0, 0] = rng.integers(1, tiny.vocab_size + 1, L)  # cut at the limit: no end token
    samples[0, 1] = 0
    refs_list = tiny.references_ids(tiny.split_indices("train")[:B])
    refs, counts = TT.references_tensor(refs_list, "cpu")
    q_np, S_np = cider.score_and_pairwise(samples, refs_list)
    q, S = dev.score_and_pairwise(torch.from_numpy(samples), refs, counts)
    np.testing.assert_allclose(q.numpy(), q_np, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(S.numpy(), S_np, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dev.pairwise(torch.from_numpy(samples)).numpy(), cider.pairwise(samples), rtol=1e-9,
                               atol=1e-12)
    # the published direction differs from CiderD.pairwise's, so a flipped kernel would fail above
    assert not np.allclose(S_np, cider.cider.pairwise(cider.captions(samples)))
    hyps = samples.reshape(B * M, L)[:5]
    index = np.array([0, 3, 3, 5, 1])
    np.testing.assert_allclose(dev.score(torch.from_numpy(hyps), refs, counts, torch.from_numpy(index)).numpy(),
                               cider.score(hyps, refs_list, index), rtol=1e-9, atol=1e-12)


def test_with_eos_on_tensors_is_train_cider_with_eos():
    rng = np.random.default_rng(3)
    toks = _caps(rng, 30, 6, 9)
    toks[0] = [4, 0, 5, 0, 0, 0]  # nothing after the first 0
    toks[1] = [1, 2, 3, 4, 5, 6]
    for max_len in (4, 6, 8):
        assert np.array_equal(TT.with_eos(torch.from_numpy(toks), max_len, 99).numpy(), with_eos(toks, max_len, 99))


def test_self_cider_on_tensors_equals_the_numpy_one(tiny):
    cider = TrainCider.for_data(tiny)
    rng = np.random.default_rng(4)
    samples = _caps(rng, 5 * 4, tiny.seq_length, tiny.vocab_size, 2).reshape(5, 4, -1)
    samples[1] = samples[1, 0]  # four identical captions: diversity exactly 0
    samples[2] = 0  # four empty captions: an all-zero kernel, 0
    K = cider.pairwise(samples)
    got = TT.self_cider_from_kernel(torch.from_numpy(K)).numpy()
    np.testing.assert_allclose(got, self_cider_from_kernel(K), rtol=1e-9, atol=1e-12)
    assert got[1] == 0.0 and got[2] == 0.0 and got[0] > 0.3
    assert TT.self_cider_from_kernel(torch.ones(3, 1, 1, dtype=torch.float64)).tolist() == [0.0, 0.0, 0.0]
    # without a host synchronisation (Jacobi rotations, what the fast path and a GPU run): the same
    sync_free = TT.self_cider_from_kernel(torch.from_numpy(K), sync_free=True).numpy()
    np.testing.assert_allclose(sync_free, self_cider_from_kernel(K), rtol=1e-9, atol=1e-12)
    assert sync_free[1] == 0.0 and sync_free[2] == 0.0


@pytest.mark.parametrize("M", [2, 5, 8, 20])
def test_jacobi_eigh_and_pinv_are_lapacks(M):
    """``metrics.eigh`` (no host synchronisation) against LAPACK: eigenvalues to 1e-12 of the
    largest, the decomposition reassembles A, the pseudo-inverse to 1e-6 (ill-conditioned random
    matrices) and A P A = A, on PSD, indefinite, rank-1 and zero matrices."""
    from rdpp_cli.metrics.eigh import eigh, pinv_hermitian

    torch.manual_seed(M)
    X = torch.randn(16, M, M, dtype=torch.float64)
    A = X @ X.transpose(1, 2)
    A[0], A[1], A[2] = 0.0, 3.0, X[2] + X[2].T  # zero, rank 1, indefinite
    lam, V = eigh(A)
    want = torch.linalg.eigvalsh(A)
    scale = want.abs().amax(-1, keepdim=True).clamp(min=1.0)
    assert ((lam - want).abs() / scale).max() < 1e-12
    torch.testing.assert_close(V @ torch.diag_embed(lam) @ V.transpose(1, 2), A, rtol=0,
                               atol=1e-11 * float(scale.max()))
    P, P_want = pinv_hermitian(A), torch.linalg.pinv(A, hermitian=True)
    # random Gram matrices have condition numbers up to ~1e8 here: agreement is cond × float64 rounding
    assert ((P - P_want).abs().amax((1, 2)) / P_want.abs().amax((1, 2)).clamp(min=1e-300)).max() < 1e-6
    torch.testing.assert_close(A @ P @ A, A, rtol=0, atol=1e-8 * float(scale.max()))  # a Penrose condition
    assert torch.equal(P[0], torch.zeros(M, M, dtype=torch.float64))
    torch.testing.assert_close(P[1], torch.full((M, M), 1 / (3.0 * M * M), dtype=torch.float64), rtol=1e-12, atol=0)


def test_the_reference_table_holds_every_images_references(tiny):
    """Built once from captions.h5: a batch's rows are ``references_ids``, 0-padded to the table's
    k; the scores against them are the per-batch tensors' (the padding never counts)."""
    table = TT.ReferenceTable.for_data(tiny, "cpu")
    idx = np.array([3, 0, 7, 3, len(tiny.image_ids) - 1])
    refs, counts = table.take(idx)
    assert refs.dtype == torch.int64 and refs.shape == (5, table.refs.shape[1], tiny.seq_length)
    for b, r in enumerate(tiny.references_ids(idx)):
        assert int(counts[b]) == len(r) and np.array_equal(refs[b, :len(r)].numpy(), r)
        assert not refs[b, len(r):].any()
    assert TT.reference_table(tiny, "cpu") is TT.reference_table(tiny, "cpu")  # once per data artifact
    dev = TT.DeviceTrainCider(TrainCider.for_data(tiny), "cpu")
    hyps = torch.from_numpy(tiny.references_ids(idx[:1])[0][:1].astype(np.int64)).expand(5, -1)
    per_batch = TT.references_tensor(tiny.references_ids(idx), "cpu")
    torch.testing.assert_close(dev.score(hyps, refs, counts), dev.score(hyps, *per_batch), rtol=1e-15, atol=0)
