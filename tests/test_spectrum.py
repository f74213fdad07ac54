"""Spectra of random weights against random-matrix theory (Sec. 4.3 Eqs. 16-18, App. D.1, Sec. 5.2 Eq. 19)."""
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.integrate import quad

from pkmixer.errors import ConfigError
from pkmixer.layers.mlp import FcAct
from pkmixer.layers.pk import PKMixing
from pkmixer.theory.effective import pk_effective_layers
from pkmixer.analysis.plots import plot_lambda_max, plot_spectrum
from pkmixer.theory.spectrum import (alpha_scaling_singular_values, alpha_sweep, c_gamma, default_widths,
                                     density_at_width, fixed_omega_term, kolmogorov_distance, l_plus,
                                     lambda_max_sweep, largest_singular_value, mixer_weight, mp_cdf, mp_edges,
                                     mp_pdf, pk_effective_weight, singular_values, spectrum_report, swmlp_weight)


@pytest.mark.parametrize("gamma", [1.0, 4.0])
def test_mixer_weight_top_singular_value_is_c_gamma(gamma):
    V = mixer_weight(1000, gamma, seed=1)
    assert V.shape == (int(gamma * 1000), 1000)
    assert V.std() == pytest.approx(1 / math.sqrt(1000), rel=0.01)  # N(0, 1/C)
    assert largest_singular_value(V) == pytest.approx(c_gamma(gamma), rel=0.05)
    assert c_gamma(gamma) == 1 + math.sqrt(gamma) == mp_edges(gamma)[1]


def test_lanczos_top_singular_value_matches_dense_svd():
    W = swmlp_weight(300, 0.05, gamma=2.0, seed=3)
    assert W.shape == (600, 300)
    assert largest_singular_value(W) == pytest.approx(singular_values(W)[0], rel=1e-10)


def test_swmlp_mask_and_scale():
    m, p = 800, 0.1
    W = swmlp_weight(m, p, seed=0)
    assert W.nnz / m**2 == pytest.approx(p, rel=0.05)  # Bernoulli(p) mask
    # M ⊙ A with M ∈ {0, 1/√p}, A ~ N(0, 1/m): every entry has variance 1/m
    assert (W.data**2).sum() / m**2 == pytest.approx(1 / m, rel=0.05)
    assert (swmlp_weight(m, p, seed=0) != W).nnz == 0 and (swmlp_weight(m, p, seed=1) != W).nnz > 0


@pytest.mark.parametrize("shape,n", [((6, 4), 5), ((3, 7), 4), ((5, 5), 3)])
def test_pk_effective_weight_keeps_singular_values(shape, n):
    W = np.random.default_rng(0).standard_normal(shape)
    expected = np.sort(np.repeat(np.linalg.svd(W, compute_uv=False), n))[::-1]
    for random_perms in (True, False):
        Z = pk_effective_weight(W, n, random_perms=random_perms, seed=2)
        assert Z.shape == (n * shape[0], n * shape[1])
        s = singular_values(Z)[: expected.size]
        assert np.abs(s - expected).max() < 1e-10
    # the permutations really are random: the effective weight is not block diagonal
    assert not np.allclose(pk_effective_weight(W, n), pk_effective_weight(W, n, random_perms=False))


def test_rp_layer_effective_weight_has_singular_values_of_w():
    S, C = 6, 5
    g = torch.Generator().manual_seed(0)
    mixing = PKMixing(FcAct(S, None, S), "token", C, S, S, perms=("random", "random"), generator=g).double()
    (layer,) = pk_effective_layers(mixing, "token", S, S, C)  # J_cᵀ P(J₂) (I ⊗ W) P(J₁) J_c  (Eq. 19)
    W = mixing.mlp.fc.weight.detach().numpy()
    expected = np.sort(np.repeat(np.linalg.svd(W, compute_uv=False), C))[::-1]
    assert np.abs(singular_values(layer.weight.to_dense().numpy()) - expected).max() < 1e-10


@pytest.mark.parametrize("gamma", [0.25, 1.0, 4.0])
def test_mp_density_integrates_to_one(gamma):
    lo, hi = mp_edges(gamma)
    total, _ = quad(lambda s: float(mp_pdf(s, gamma)), lo, hi, limit=200)
    assert total == pytest.approx(1.0, abs=1e-8)
    mid = (lo + hi) / 2
    assert mp_cdf(mid, gamma) == pytest.approx(quad(lambda s: float(mp_pdf(s, gamma)), lo, mid)[0], abs=1e-6)
    assert mp_cdf(lo - 0.1, gamma) == 0 and mp_cdf(hi + 0.1, gamma) == 1
    assert mp_pdf(hi + 0.1, gamma) == 0 and mp_pdf(lo / 2, gamma) == 0


def test_mp_density_quarter_circle_at_gamma_one():
    s = np.linspace(0.1, 1.9, 7)
    assert np.allclose(mp_pdf(s, 1.0), np.sqrt(4 - s**2) / np.pi)


@pytest.mark.parametrize("n,gamma", [(600, 1.0), (300, 4.0), (800, 0.25)])
def test_mp_matches_gaussian_spectrum(n, gamma):
    s = singular_values(mixer_weight(n, gamma, seed=0))  # (γn × n), N(0, 1/n): min(γn, n) values
    assert s.size == min(round(gamma * n), n)
    assert kolmogorov_distance(s, gamma) < 0.02
    wrong = 2.0 if gamma != 2.0 else 1.0
    assert kolmogorov_distance(s, wrong) > 0.1  # the distance does tell laws apart


def test_swmlp_lambda_max_grows_with_width_at_fixed_omega():
    omega = 2**14  # dense width √Ω = 128
    rows = lambda_max_sweep(omega, widths=[128, 256, 512, 1024], seeds=4)
    for r in rows:  # each draw's value, whose mean and std the row reports
        assert len(r["lambda_max_draws"]) == 4
        assert (np.mean(r["lambda_max_draws"]), np.std(r["lambda_max_draws"])) == \
            pytest.approx((r["lambda_max_mean"], r["lambda_max_std"]))
    tops = [r["lambda_max_mean"] for r in rows]
    assert all(b > a for a, b in zip(tops, tops[1:])), tops
    assert tops[-1] - tops[0] > 0.1
    assert [r["p"] for r in rows] == pytest.approx([omega / m**2 for m in (128, 256, 512, 1024)])
    assert all(r["c_gamma"] == 2.0 for r in rows)
    # √L₊ grows with m too (Eq. 18)
    predicted = [r["sqrt_l_plus"] for r in rows]
    assert all(b > a for a, b in zip(predicted, predicted[1:]))


@pytest.mark.parametrize("gamma", [1.0, 2.0])
def test_sqrt_l_plus_predicts_lambda_max(gamma):
    m, p = 1000, 0.05  # q = √(pm) ≈ 7
    empirical = np.mean([largest_singular_value(swmlp_weight(m, p, gamma, seed)) for seed in range(3)])
    assert math.sqrt(l_plus(m, p, gamma)) == pytest.approx(empirical, rel=0.1)
    assert math.sqrt(l_plus(m, p, gamma)) > c_gamma(gamma)


def test_l_plus_formula_and_fixed_omega_term():
    m, p, gamma = 400, 0.2, 3.0
    c = 1 + math.sqrt(gamma)
    assert l_plus(m, p, gamma) == pytest.approx(c**2 + 3 * c**2 * math.sqrt(gamma) * (1 - p) / (p * m))
    assert l_plus(m, 1.0, gamma) == pytest.approx(c**2)  # dense: the Marchenko-Pastur edge
    omega = p * gamma * m**2  # Eq. 13
    assert density_at_width(omega, m, gamma) == pytest.approx(p)
    assert fixed_omega_term(omega, m, gamma) == pytest.approx((1 - p) / (p * m))  # Eq. 18


def test_alpha_scaling_lambda_max_grows_with_alpha():
    rows = alpha_sweep(1000, [0.0, 0.4, 0.8], seeds=3)
    assert [r["m"] for r in rows] == [32, 126, 501]
    assert [r["p"] for r in rows] == pytest.approx([1.0, 1000**-0.4, 1000**-0.8])
    tops = [r["lambda_max_mean"] for r in rows]
    assert all(b > a for a, b in zip(tops, tops[1:])), tops
    assert tops[0] == pytest.approx(2.0, rel=0.1)  # α = 0 is the dense case: the edge 2 of Q/c
    s = alpha_scaling_singular_values(1000, 0.5, seed=0)
    assert np.mean(s**2) == pytest.approx(1.0)  # K is normalised by its mean diagonal entry
    assert np.all(np.diff(s) <= 0)


def test_alpha_scaling_singular_values_are_those_of_the_whole_weight():
    """Rows of Z without weights are left out of the eigen-decomposition (zeros added back): the values are the
    singular values of the whole normalised Z, with as many zeros as empty rows."""
    from pkmixer.theory.spectrum import _generator, alpha_scaling_size
    from pkmixer.layers.sparse import sample_bernoulli_mask

    m, p = alpha_scaling_size(100, 1.0)  # m = 100, p = 0.01: most rows are empty
    g = _generator(3)
    r, c = sample_bernoulli_mask(m, m, p, g)
    Z = np.zeros((m, m))
    Z[r.numpy(), c.numpy()] = torch.randn(r.numel(), generator=g, dtype=torch.float64).numpy()
    whole = np.linalg.svd(Z / math.sqrt(np.trace(Z @ Z.T) / m), compute_uv=False)
    got = alpha_scaling_singular_values(100, 1.0, seed=3)
    assert got.shape == (m,) and np.abs(got - whole).max() < 1e-7
    assert (got == 0).sum() >= m - len(np.unique(r.numpy()))


def test_default_widths_span_dense_to_mixer_max():
    widths = default_widths(2**18, gamma=1.0)
    assert widths[0] == 512 and widths[-1] == 4096 and len(widths) == 6
    assert all(density_at_width(2**18, m) <= 1 for m in widths)


def test_spectrum_report_and_plots(tmp_path):
    report = spectrum_report(2**12, seeds=2)
    assert report["c_gamma"] == 2.0 and report["omega"] == 4096
    assert [r["m"] for r in report["rows"]] == default_widths(2**12)
    mixer = report["mixer"]
    assert (mixer["C"], mixer["S"]) == (16, 16)
    assert mixer["lambda_max_channel"] < report["rows"][-1]["lambda_max_mean"]
    png = plot_lambda_max(report, tmp_path / "lmax.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    svg = plot_spectrum(singular_values(mixer_weight(200)), 1.0, tmp_path / "sub" / "hist.svg")
    assert b"<svg" in svg.read_bytes()[:1000]


@pytest.mark.parametrize("call", [
    lambda: swmlp_weight(0, 0.5),
    lambda: swmlp_weight(100, 0.0),
    lambda: swmlp_weight(100, 1.5),
    lambda: swmlp_weight(100, 0.5, gamma=0),
    lambda: swmlp_weight(100, 0.5, seed=1.5),
    lambda: swmlp_weight(10**6, 1.0),  # too many non-zeros
    lambda: mixer_weight(10, gamma=-1.0),
    lambda: density_at_width(2**14, 100),  # below the dense width 128
    lambda: lambda_max_sweep(2**14, widths=[]),
    lambda: lambda_max_sweep(2**14, widths=[256], seeds=0),
    lambda: alpha_scaling_singular_values(1000, -0.5),
    lambda: alpha_sweep(1000, []),
    lambda: pk_effective_weight(np.ones(3), 2),
    lambda: plot_spectrum(np.array([]), 1.0, "spectrum.png"),
    lambda: default_widths(2**14, count=0),
    lambda: alpha_scaling_singular_values(10**4, 1.0),  # m = 10⁴ beyond the dense limit
    lambda: alpha_scaling_singular_values("2**x", 0.5),
    lambda: singular_values(sp.csr_matrix((10_000, 10))),
    lambda: l_plus(100, 0.0),
    lambda: kolmogorov_distance(np.array([]), 1.0),
    lambda: plot_spectrum(np.ones(3), 1.0, "spectrum.jpg"),
])
def test_bad_input_raises_config_error(call):
    with pytest.raises(ConfigError):
        call()
