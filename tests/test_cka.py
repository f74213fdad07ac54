"""Mini-batch linear CKA (Nguyen et al. 2021 Sec. 3.1(2); Hayase & Karakida Sec. 3.4) against a plain numpy
transcription of the unbiased HSIC₁ formula, and on registered models."""
import copy
import json

import numpy as np
import pytest
import torch

import pkmixer
from pkmixer.analysis.cka import MinibatchCKA, cka_matrix, minibatch_cka, plot_cka
from pkmixer.errors import ConfigError

TOL = 1e-10


def ref_hsic1(X: np.ndarray, Y: np.ndarray) -> float:
    """The unbiased HSIC₁ of linear kernels, written out from the formula (no centring, no rescaling)."""
    n = X.shape[0]
    K, L = X @ X.T, Y @ Y.T
    np.fill_diagonal(K, 0.0)
    np.fill_diagonal(L, 0.0)
    one = np.ones(n)
    return float((np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2))
                  - 2.0 / (n - 2) * one @ K @ L @ one) / (n * (n - 3)))


def ref_cka(batches) -> float:
    """CKA = mean HSIC₁(K, L) / √(mean HSIC₁(K, K) · mean HSIC₁(L, L)) over (X, Y) numpy batches."""
    xy = np.mean([ref_hsic1(x, y) for x, y in batches])
    xx = np.mean([ref_hsic1(x, x) for x, _ in batches])
    yy = np.mean([ref_hsic1(y, y) for _, y in batches])
    return float(xy / np.sqrt(xx * yy))


def torch_batches(batches):
    return [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]


def related_batches(rng, n_batches=3, n=16, dx=7, dy=5, noise=1.0):
    """Y depends on X linearly plus noise: CKA clearly between 0 and 1."""
    A = rng.standard_normal((dx, dy))
    out = []
    for _ in range(n_batches):
        x = rng.standard_normal((n, dx))
        out.append((x, x @ A + noise * rng.standard_normal((n, dy))))
    return out


@pytest.mark.parametrize("n", [4, 5, 32])
def test_single_batch_equals_reference(n):
    rng = np.random.default_rng(n)
    x, y = related_batches(rng, 1, n)[0]
    x = x + 3.0  # a mean offset: the code centres, the reference does not; HSIC₁ is shift invariant
    got = minibatch_cka(torch_batches([(x, y)]))
    assert abs(got - ref_cka([(x, y)])) < TOL
    assert 0 < got < 1


def test_one_dimensional_features():
    rng = np.random.default_rng(10)
    batches = [(rng.standard_normal(9), rng.standard_normal((9, 2))) for _ in range(2)]
    reference = ref_cka([(x[:, None], y) for x, y in batches])
    assert abs(minibatch_cka(torch_batches(batches)) - reference) < TOL


def test_several_batches_average_hsic():
    rng = np.random.default_rng(1)
    batches = related_batches(rng, 2, 10)
    (x1, y1), (x2, y2) = batches
    manual = (ref_hsic1(x1, y1) + ref_hsic1(x2, y2)) / np.sqrt(
        (ref_hsic1(x1, x1) + ref_hsic1(x2, x2)) * (ref_hsic1(y1, y1) + ref_hsic1(y2, y2)))
    got = minibatch_cka(torch_batches(batches))
    assert abs(got - manual) < TOL
    # averaging HSIC is not averaging per-batch CKA
    assert abs(got - np.mean([ref_cka([b]) for b in batches])) > 1e-3


def test_self_similarity_is_one():
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((12, 9)) for _ in range(3)]
    assert abs(minibatch_cka(torch_batches([(x, x) for x in xs])) - 1) < TOL


def test_invariant_to_orthogonal_transform_and_isotropic_scaling():
    rng = np.random.default_rng(3)
    batches = related_batches(rng, 3, 16, dx=6)
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    base = minibatch_cka(torch_batches(batches))
    rotated = minibatch_cka(torch_batches([(x @ Q, y) for x, y in batches]))
    scaled = minibatch_cka(torch_batches([(7.5 * x, 0.01 * y) for x, y in batches]))
    assert abs(rotated - base) < TOL and abs(scaled - base) < TOL
    assert abs(minibatch_cka(torch_batches([(x, x @ Q) for x, _ in batches])) - 1) < TOL


def test_independent_features_near_zero():
    rng = np.random.default_rng(4)
    batches = [(rng.standard_normal((64, 3)), rng.standard_normal((64, 3))) for _ in range(60)]
    got = minibatch_cka(torch_batches(batches))
    assert abs(got - ref_cka(batches)) < TOL
    assert abs(got) < 0.05


def test_large_mean_offset_is_removed_before_the_gram_matrix():
    rng = np.random.default_rng(9)
    batches = related_batches(rng, 3, 16)
    shifted = minibatch_cka(torch_batches([(x + 1e6, y - 1e6) for x, y in batches]))
    assert abs(shifted - ref_cka(batches)) < 1e-8


@pytest.mark.parametrize("scale,dtype", [(1e-20, torch.float32), (1e-150, torch.float64), (1e150, torch.float64)])
def test_extreme_scales_give_the_same_cka(scale, dtype):
    rng = np.random.default_rng(5)
    batches = related_batches(rng, 3, 16)
    base = minibatch_cka([(torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)) for x, y in batches])
    tiny = minibatch_cka([((scale * torch.from_numpy(x)).to(dtype), torch.from_numpy(y).to(dtype)) for x, y in batches])
    assert np.isfinite(tiny)
    assert abs(tiny - base) < (1e-6 if dtype == torch.float32 else TOL)


def test_one_batch_scaled_differently_is_not_renormalised():
    """A layer keeps one scale across batches: scaling a single batch changes the CKA exactly as the formula says."""
    rng = np.random.default_rng(6)
    batches = related_batches(rng, 2, 12)
    changed = [batches[0], (10.0 * batches[1][0], batches[1][1])]
    assert abs(minibatch_cka(torch_batches(changed)) - ref_cka(changed)) < TOL
    assert abs(ref_cka(changed) - ref_cka(batches)) > 1e-3


def test_constant_features():
    rng = np.random.default_rng(7)
    # constant in one batch only: that batch adds exactly 0 to the self-HSIC of X, no NaN
    x_const = np.full((7, 4), 0.1)  # its batch mean is not exactly 0.1 in floating point
    assert np.abs(x_const - x_const.mean(0)).max() > 0
    batches = [(x_const, rng.standard_normal((7, 3))), (rng.standard_normal((7, 4)), rng.standard_normal((7, 3)))]
    assert abs(ref_hsic1(x_const, x_const)) < 1e-14
    assert abs(minibatch_cka(torch_batches(batches)) - ref_cka(batches)) < TOL
    # constant over all examples: CKA is undefined, and the error names the layer
    acc = MinibatchCKA(["blocks.0", "blocks.1"], ["fc"])
    for _ in range(2):
        acc.update([torch.randn(7, 4), torch.full((7, 2, 3), 0.1, dtype=torch.float64)], [torch.randn(7, 5)])
    with pytest.raises(ConfigError, match="'blocks.1' of model A has constant features"):
        acc.result()
    # variation at the level of float64 round-off (one ulp of 1.0) also counts as constant
    ulps = np.nextafter(1.0, 2.0) - 1.0
    acc = MinibatchCKA(["x"], ["noise"])
    for _ in range(2):
        acc.update([torch.from_numpy(1.0 + ulps * rng.integers(0, 3, size=(7, 4)))], [torch.randn(7, 5)])
    with pytest.raises(ConfigError, match="'x' of model A has constant"):
        acc.result()


def test_matrix_accumulator_matches_pairs():
    rng = np.random.default_rng(8)
    batches = related_batches(rng, 3, 10)
    z = [rng.standard_normal((10, 2, 2)) for _ in batches]
    acc = MinibatchCKA(["x", "z"], ["y", "x"])
    for (x, y), zz in zip(batches, z):
        acc.update([torch.from_numpy(x), torch.from_numpy(zz)], [torch.from_numpy(y), torch.from_numpy(x)])
    got = acc.result()
    assert got.shape == (2, 2) and got.dtype == np.float64
    flat_z = [zz.reshape(10, -1) for zz in z]
    expected = [[ref_cka([(x, y) for x, y in batches]), 1.0],
                [ref_cka([(zz, y) for zz, (_, y) in zip(flat_z, batches)]),
                 ref_cka([(zz, x) for zz, (x, _) in zip(flat_z, batches)])]]
    assert np.abs(got - np.array(expected)).max() < TOL
    assert (acc.n_batches, acc.n_examples) == (3, 30)


def test_bad_input():
    with pytest.raises(ConfigError, match="at least 4 examples"):
        minibatch_cka([(torch.randn(3, 5), torch.randn(3, 5))])
    with pytest.raises(ConfigError, match="no mini-batch"):
        minibatch_cka([])
    acc = MinibatchCKA(["a"], ["b"])
    with pytest.raises(ConfigError, match="expected features of 1 layers"):
        acc.update([torch.randn(8, 2)] * 2, [torch.randn(8, 2)])
    with pytest.raises(ConfigError, match="have shape"):
        acc.update([torch.randn(8, 2)], [torch.randn(6, 2)])
    with pytest.raises(ConfigError, match="NaN"):
        acc.update([torch.full((8, 2), float("nan"))], [torch.randn(8, 2)])


# ---- models ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return pkmixer.create_model("mixer_t4_28"), pkmixer.create_model("swmlp_t4_28")


def test_cka_matrix_of_a_model_with_itself(models):
    mixer, _ = models
    mixer.train()
    batches = [(torch.randn(8, 1, 28, 28), torch.zeros(8)) for _ in range(2)]  # (input, label) tuples
    result = cka_matrix(mixer, mixer, batches)
    names = mixer.feature_names("mixing")
    assert result.names_a == result.names_b == names
    assert result.matrix.shape == (len(names), len(names))
    assert np.abs(np.diag(result.matrix) - 1).max() < 1e-12
    assert np.abs(result.matrix - result.matrix.T).max() < 1e-12
    assert abs(result.diagonal_mean - 1) < 1e-12
    assert (result.n_examples, result.n_batches) == (16, 2)
    assert mixer.training  # mode restored


def test_cka_matrix_mixer_vs_swmlp(models, tmp_path):
    mixer, swmlp = models
    batches = [torch.randn(8, 1, 28, 28) for _ in range(2)]
    result = cka_matrix(mixer, swmlp, batches, layers_a=[0, "blocks.3.channel", -1], layers_b=None,
                        labels=("mixer_t4_28", "swmlp_t4_28"))
    assert result.names_a == ["blocks.0.token", "blocks.3.channel"]  # sorted, duplicates merged
    assert result.names_b == swmlp.feature_names("mixing")
    assert result.matrix.shape == (2, len(result.names_b)) and result.diagonal_mean is None
    assert np.all(result.matrix > -1e-9) and np.all(result.matrix < 1 + 1e-9)
    json.dumps(result.as_dict())
    block = cka_matrix(mixer, swmlp, batches, where="block")
    assert block.matrix.shape == (len(mixer.feature_names()), len(swmlp.feature_names()))
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml")):
        path = plot_cka(result, tmp_path / f"cka{suffix}")
        assert path.read_bytes().startswith(magic)


def test_cka_matrix_bad_input(models, tmp_path):
    mixer, swmlp = models
    x = [torch.randn(8, 1, 28, 28)]
    with pytest.raises(ConfigError, match="out of range"):
        cka_matrix(mixer, swmlp, x, layers_a=[8])
    with pytest.raises(ConfigError, match="unknown layer of model B 'blocks.9'"):
        cka_matrix(mixer, swmlp, x, layers_b=["blocks.9"])
    with pytest.raises(ConfigError, match="non-empty list"):
        cka_matrix(mixer, swmlp, x, layers_a=[])
    with pytest.raises(ConfigError, match="where must be"):
        cka_matrix(mixer, swmlp, x, where="token")
    with pytest.raises(ConfigError, match="at least 4 examples"):
        cka_matrix(mixer, swmlp, [torch.randn(3, 1, 28, 28)])
    dead = copy.deepcopy(mixer)
    with torch.no_grad():
        for p in dead.blocks[1].token.mixing.parameters():
            p.zero_()  # the branch outputs zeros for every input
    with pytest.raises(ConfigError, match="layer 'blocks.1.token' of dead has constant features over all 8"):
        cka_matrix(mixer, dead, x, labels=("mixer", "dead"))
    assert cka_matrix(mixer, dead, x, layers_b=[0, 1, 3]).matrix.shape == (8, 3)  # leaving it out works
    result = cka_matrix(mixer, mixer, x, layers_a=[0], layers_b=[0])
    with pytest.raises(ConfigError, match="png or .svg"):
        plot_cka(result, tmp_path / "cka.pdf")


def test_cka_from_stored_grams_is_the_cka_of_the_models():
    """What a run stores when it finishes (feature_grams) gives the CKA that the two models give directly: the
    fig2 report computes CKA from stored Gram matrices, never from checkpoints."""
    from pkmixer.analysis.cka import cka_from_grams, feature_grams

    torch.manual_seed(0)
    a = pkmixer.create_model("mixer_t4_28", img_size=8, patch_size=2, depth=2, embed_dim=8).double()
    b = pkmixer.create_model("swmlp_t4_28", img_size=8, patch_size=2, depth=4, embed_dim=8, width=128,
                             density=0.25).double()
    batches = list(torch.randn(3, 6, 1, 8, 8, dtype=torch.float64))
    direct = cka_matrix(a, b, batches, where="mixing")
    names_a, grams_a = feature_grams(a, batches)
    names_b, grams_b = feature_grams(b, batches)
    assert grams_a.shape == (4, 3, 6, 6) and names_a == direct.names_a and names_b == direct.names_b
    assert np.abs(cka_from_grams(names_a, grams_a, names_b, grams_b) - direct.matrix).max() < 1e-12
    stored = cka_from_grams(names_a, grams_a.astype(np.float32), names_b, grams_b.astype(np.float32))
    assert np.abs(stored - direct.matrix).max() < 1e-5  # the probe stores float32
    with pytest.raises(ConfigError, match="not of the same mini-batches"):
        cka_from_grams(names_a, grams_a[:, :2], names_b, grams_b)
