"""Sparse, Kronecker, Monarch and PK layers against explicit matrices."""
import math

import pytest
import torch

from pkmixer.errors import ConfigError
from pkmixer.layers.mlp import FcAct
from pkmixer.layers.pk import PKMixing, inverse_permutation, random_permutation
from pkmixer.layers.sparse import MaskedLinear, SparseLinear, sample_bernoulli_mask
from pkmixer.layers.structured import KroneckerLinear, MonarchLinear
from pkmixer.theory.effective import structured_weight

from conftest import rel_err


@pytest.mark.parametrize("p", [1.0, 0.5, 0.05, 1 / 256])
def test_bernoulli_mask_statistics(p):
    rows, cols = sample_bernoulli_mask(300, 400, p, torch.Generator().manual_seed(0))
    n, total = rows.numel(), 300 * 400
    assert abs(n - p * total) < 5 * math.sqrt(total * p * (1 - p)) + 1  # binomial count, 5 sigma
    flat = rows * 400 + cols
    assert torch.all(flat[1:] > flat[:-1])  # distinct, row-major order
    assert rows.max() < 300 and cols.max() < 400
    if p < 1:  # ones spread over all rows and columns alike
        per_row = torch.bincount(rows, minlength=300).float()
        assert abs(per_row.mean() - 400 * p) < 5 * math.sqrt(400 * p / 300) + 0.5


def test_bernoulli_mask_is_seeded():
    a = sample_bernoulli_mask(50, 60, 0.1, torch.Generator().manual_seed(3))
    b = sample_bernoulli_mask(50, 60, 0.1, torch.Generator().manual_seed(3))
    c = sample_bernoulli_mask(50, 60, 0.1, torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not (a[0].shape == c[0].shape and torch.equal(a[1], c[1]))


def test_bernoulli_mask_scales_with_ones_not_area():
    rows, _ = sample_bernoulli_mask(200_000, 200_000, 2e-6, torch.Generator().manual_seed(0))  # 4e10 cells
    assert 60_000 < rows.numel() < 100_000


@pytest.mark.parametrize("p", [0.0, 1.5, -0.1])
def test_density_outside_unit_interval(p):
    with pytest.raises(ConfigError, match="density"):
        SparseLinear(4, 4, p, torch.Generator())


def test_sparse_and_masked_are_the_same_map():
    torch.manual_seed(5)
    masked = MaskedLinear(40, 30, 0.2, torch.Generator().manual_seed(1))
    torch.manual_seed(5)
    sparse = SparseLinear(40, 30, 0.2, torch.Generator().manual_seed(1))
    with torch.no_grad():
        masked.bias.normal_()
        sparse.bias.copy_(masked.bias)
    assert torch.equal(masked.dense_weight(), sparse.dense_weight())
    assert sparse.values.numel() == masked.nnz == int(masked.mask.sum())
    assert not any(p.numel() == 40 * 30 for p in sparse.parameters())  # nothing dense is stored
    x = torch.randn(6, 40, requires_grad=True)
    ym, ys = masked(x), sparse(x)
    assert rel_err(ys, ym) < 1e-6
    explicit = x @ masked.dense_weight().t() + masked.bias
    assert rel_err(ym, explicit) < 1e-6
    g = torch.randn_like(ym)
    gx_m, = torch.autograd.grad(ym, x, g, retain_graph=True)
    gx_s, = torch.autograd.grad(ys, x, g, retain_graph=True)
    assert rel_err(gx_s, gx_m) < 1e-6
    ym.backward(g)
    ys.backward(g)
    assert rel_err(sparse.values.grad, masked.weight.grad[masked.mask]) < 1e-6
    assert torch.all(masked.weight.grad[~masked.mask] == 0)  # masked entries never move


def test_sparsity_aware_init():
    lin = SparseLinear(2000, 500, 0.05, torch.Generator().manual_seed(0))
    assert lin.values.std().item() == pytest.approx(1 / math.sqrt(0.05 * 2000), rel=0.05)
    x = torch.randn(256, 2000)
    assert lin(x).var().item() == pytest.approx(1.0, rel=0.1)  # unit fan-in variance after masking


def test_kronecker_layer_is_V_kron_W():
    layer = KroneckerLinear(3, 5).double()
    x = torch.randn(4, 15, dtype=torch.float64)
    M = torch.kron(layer.V.detach(), layer.W.detach())
    assert rel_err(layer(x), x @ M.t()) < 1e-12
    assert torch.equal(structured_weight(layer), M)


def test_monarch_layer_matches_explicit_product():
    layer = MonarchLinear(4, 6).double()
    x = torch.randn(3, 24, dtype=torch.float64)
    M = structured_weight(layer)
    assert rel_err(layer(x), x @ M.t()) < 1e-12
    # Monarch is strictly more general than Kronecker: free blocks give a matrix no V ⊗ W equals
    V_W = torch.kron(layer.L[0].detach(), layer.R[0].detach())
    assert rel_err(V_W, M) > 1e-3


def test_monarch_with_shared_blocks_is_kronecker():
    """Cor. 3.4: shared blocks R_i = W, L_j = V give V ⊗ W."""
    mon, kron = MonarchLinear(4, 6).double(), KroneckerLinear(4, 6).double()
    with torch.no_grad():
        mon.R.copy_(kron.W.expand_as(mon.R))
        mon.L.copy_(kron.V.expand_as(mon.L))
    x = torch.randn(5, 24, dtype=torch.float64)
    assert rel_err(mon(x), kron(x)) < 1e-12


def test_permutations_are_uniform_bijections():
    g = torch.Generator().manual_seed(0)
    idx = random_permutation(10, g)
    assert sorted(idx.tolist()) == list(range(10)) and idx.dtype == torch.int64
    assert torch.equal(idx[inverse_permutation(idx)], torch.arange(10))
    # position of element 0 over many draws is uniform (chi-square with 9 dof, generous bound)
    counts = torch.zeros(10)
    for _ in range(2000):
        counts[(random_permutation(10, g) == 0).nonzero()] += 1
    chi2 = ((counts - 200) ** 2 / 200).sum().item()
    assert chi2 < 40


def test_rp_mixing_keeps_buffers_not_matrices():
    mix = PKMixing(FcAct(7, None, 7), "token", 5, 7, 7, perms=("random", "random"),
                   generator=torch.Generator().manual_seed(0))
    buffers = dict(mix.named_buffers())
    assert set(buffers) == {"in_index", "out_index"}  # no derived copies: the gathers read these
    assert all(b.dtype == torch.int64 and b.numel() == 35 for b in buffers.values())
    assert torch.equal(buffers["in_index"].sort().values, torch.arange(35))
    assert mix(torch.randn(2, 7, 5)).shape == (2, 7, 5)
