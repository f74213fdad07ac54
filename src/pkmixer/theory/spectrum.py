"""Singular values of random weights: sparse SW-MLPs against Mixers (Hayase & Karakida Sec. 4.3, App. D.1, Sec. 5.2).

* Marchenko-Pastur (Bai & Silverstein 2010). Everything here is about *singular values*. A (γn × n) matrix
  with i.i.d. N(0, 1/n) entries has min(γn, n) non-zero singular values whose empirical distribution tends to
  the density :func:`mp_pdf` on [|1 − √γ|, 1 + √γ], so the largest one tends to c_γ = 1 + √γ. A Mixer weight
  V ~ N(0, 1/C) of shape (γC × C) is such a matrix, and so are its effective weights: I ⊗ V and
  J₂ (I ⊗ V) J₁ have the singular values of V, each repeated (Sec. 4.3; Eq. 19).
* SW-MLP (Sec. 4.3): M ⊙ A of shape (γm × m), A ~ N(0, 1/m), M = 1/√p with probability p, else 0. With
  q = √(pm), λ_max² ≈ L₊ = c_γ² + 3 c_γ² √γ (1 − p)/q² (Eqs. 16-17), and at fixed Ω = γpm² (Eq. 13)
  (1 − p)/q² = γm/Ω − 1/m (Eq. 18): λ_max grows with the width m, while the Mixer's stays at c_γ (Fig. 4 right).
* The α-scaling of App. D.1 (Fig. S.1): m = Ω^{(1+α)/2}, p = Ω^{−α}; Z = M ⊙ W with W ~ N(0, 1) and a 0/1
  Bernoulli(p) mask; K = ZZᵀ divided by its mean diagonal entry; the singular values are √eig(K).

All numerics are float64 NumPy/SciPy; masks come from :func:`pkmixer.layers.sparse.sample_bernoulli_mask`,
so building a weight costs O(p·rows·cols).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import svds
from threadpoolctl import threadpool_limits

from ..errors import ConfigError, check_density, check_positive, check_positive_int
from ..layers.sparse import sample_bernoulli_mask
from .effective import kron_identity, permutation_matrix, spmm
from .width import parse_omega, width_summary

# full spectra need dense matrices: beyond this side an eigen/singular value decomposition takes minutes
MAX_DENSE_SIDE = 8192
# weights beyond this many stored entries (a sparse one's expected non-zeros) take too much time and memory
MAX_NNZ = 50_000_000
# Lanczos keeps a few dozen vectors as long as the weight's sides: beyond this side they take gigabytes
MAX_SIDE = 2**20


# ---- Marchenko-Pastur ------------------------------------------------------------------------------------


def c_gamma(gamma: float = 1.0) -> float:
    """c_γ = 1 + √γ, the largest singular value of a large (γn × n) N(0, 1/n) matrix (Sec. 4.3)."""
    return 1 + math.sqrt(check_positive("γ (gamma)", gamma))


def mp_edges(gamma: float = 1.0) -> tuple[float, float]:
    """Support [|1 − √γ|, 1 + √γ] of the Marchenko-Pastur singular-value density."""
    root = math.sqrt(check_positive("γ (gamma)", gamma))
    return abs(1 - root), 1 + root


def mp_pdf(s: np.ndarray | float, gamma: float = 1.0) -> np.ndarray:
    """Density of the non-zero singular values s of a (γn × n) N(0, 1/n) matrix as n → ∞.

    With t = s² and t± = (1 ± √γ)², the density of t is √((t₊ − t)(t − t₋)) / (2π min(γ, 1) t), hence
    f(s) = √((t₊ − s²)(s² − t₋)) / (π min(γ, 1) s) on the support, 0 elsewhere. It is bounded (at γ = 1 it is
    the quarter circle √(4 − s²)/π).
    """
    lo, hi = mp_edges(gamma)
    s = np.asarray(s, dtype=np.float64)
    t = s * s
    inside = (s > lo) & (s < hi)
    out = np.zeros_like(s)
    ts = t[inside]
    out[inside] = np.sqrt((hi**2 - ts) * (ts - lo**2)) / (np.pi * min(gamma, 1.0) * s[inside])
    return out


def mp_cdf(s: np.ndarray | float, gamma: float = 1.0, grid: int = 4097) -> np.ndarray:
    """Distribution function of :func:`mp_pdf`, integrated numerically on a grid s = lo + (hi−lo)(1 − cos θ)/2
    (dense at the edges, where the density has square-root behaviour); accurate to about 1e-7."""
    lo, hi = mp_edges(gamma)
    theta = np.linspace(0.0, np.pi, grid)
    nodes = lo + (hi - lo) * (1 - np.cos(theta)) / 2
    integrand = mp_pdf(nodes, gamma) * (hi - lo) * np.sin(theta) / 2  # f(s(θ)) ds/dθ
    cdf = np.concatenate([[0.0], np.cumsum((integrand[1:] + integrand[:-1]) / 2 * np.diff(theta))])
    return np.interp(np.asarray(s, dtype=np.float64), nodes, cdf / cdf[-1], left=0.0, right=1.0)


def kolmogorov_distance(singular_values: np.ndarray, gamma: float = 1.0) -> float:
    """sup_s |F_empirical(s) − F_MP(s)| over the non-zero singular values of a (γn × n) N(0, 1/n) sample."""
    s = np.sort(np.asarray(singular_values, dtype=np.float64))
    n = s.size
    if n == 0:
        raise ConfigError("kolmogorov_distance needs at least one singular value")
    F = mp_cdf(s, gamma)
    return float(max((np.arange(1, n + 1) / n - F).max(), (F - np.arange(n) / n).max()))


# ---- the L₊ approximation of the SW-MLP's largest singular value ---------------------------------------


def l_plus(m: int, density: float, gamma: float = 1.0) -> float:
    """L₊ = c_γ² + 3 c_γ² √γ (1 − p)/q² with q = √(pm) (Eq. 17, leading terms), so λ_max ≈ √L₊."""
    check_positive_int("m", m)
    p = check_density("density p", density)
    c = c_gamma(gamma)
    return c * c + 3 * c * c * math.sqrt(gamma) * (1 - p) / (p * m)


def fixed_omega_term(omega: str | int | float, m: float, gamma: float = 1.0) -> float:
    """(1 − p)/q² at fixed Ω, where p = Ω/(γm²): γm/Ω − 1/m, linear in m (Eq. 18)."""
    omega = float(parse_omega(omega))
    m = check_positive("m", m)
    return check_positive("γ (gamma)", gamma) * m / omega - 1 / m


def density_at_width(omega: str | int | float, m: int, gamma: float = 1.0) -> float:
    """p = Ω/(γm²) (Eq. 13). ConfigError when m is below the dense width √(Ω/γ) (p would exceed 1)."""
    omega = float(parse_omega(omega))
    check_positive_int("m", m)
    p = omega / (check_positive("γ (gamma)", gamma) * m * m)
    if p > 1:
        raise ConfigError(f"width m={m} is below the dense width √(Ω/γ) = {math.sqrt(omega / gamma):.4g}: p > 1")
    return p


# ---- random weights ----------------------------------------------------------------------------------------


def _rows(m: int, gamma: float) -> int:
    return max(1, round(check_positive("γ (gamma)", gamma) * m))


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    return torch.Generator().manual_seed(seed)


def check_weight_size(rows: int, cols: int, entries: float, what: str) -> None:
    """Refuse (ConfigError) a weight whose λ_max cannot be computed here, before it is drawn: more than
    :data:`MAX_NNZ` stored entries, a side beyond :data:`MAX_SIDE` (Lanczos' vectors), or a side under 8 (a
    dense SVD, :func:`largest_singular_value`) with the other beyond :data:`MAX_DENSE_SIDE`."""
    if entries > MAX_NNZ:
        raise ConfigError(f"{what} has about {entries:.3g} stored entries; the limit is {MAX_NNZ:.0e}")
    if max(rows, cols) > MAX_SIDE:
        raise ConfigError(f"{what} is {rows}×{cols}; the limit is {MAX_SIDE} per side")
    if min(rows, cols) < 8 and max(rows, cols) > MAX_DENSE_SIDE:
        raise ConfigError(f"{what} is {rows}×{cols}, too thin for Lanczos; a dense SVD takes at most "
                          f"{MAX_DENSE_SIDE} per side")


def _swmlp_size(m: int, density: float, gamma: float) -> tuple[int, float]:
    """(rows, p) of :func:`swmlp_weight`, its size checked."""
    check_positive_int("m", m)
    p = check_density("density p", density)
    rows = _rows(m, gamma)
    check_weight_size(rows, m, p * rows * m, f"an SW-MLP weight with m={m}, p={p:g}, γ={gamma:g}")
    return rows, p


def swmlp_weight(m: int, density: float, gamma: float = 1.0, seed: int = 0) -> sp.csr_matrix:
    """M ⊙ A of shape (round(γm) × m): A ~ N(0, 1/m), M = 1/√p w.p. p else 0 (Sec. 4.3), as a sparse matrix."""
    rows, p = _swmlp_size(m, density, gamma)
    g = _generator(seed)
    r, c = sample_bernoulli_mask(rows, m, p, g)
    values = torch.randn(r.numel(), generator=g, dtype=torch.float64) / math.sqrt(p * m)
    return sp.csr_matrix((values.numpy(), (r.numpy(), c.numpy())), shape=(rows, m))


def _mixer_size(C: int, gamma: float) -> None:
    check_positive_int("C", C)
    rows = _rows(C, gamma)
    check_weight_size(rows, C, rows * C, f"a Mixer weight with C={C}, γ={gamma:g}")


def mixer_weight(C: int, gamma: float = 1.0, seed: int = 0) -> np.ndarray:
    """A Mixer weight V ~ N(0, 1/C) of shape (round(γC) × C) (Sec. 4.3)."""
    _mixer_size(C, gamma)
    g = _generator(seed)
    return (torch.randn(_rows(C, gamma), C, generator=g, dtype=torch.float64) / math.sqrt(C)).numpy()


def pk_effective_weight(W: np.ndarray, n: int, random_perms: bool = True, seed: int = 0) -> np.ndarray:
    """The effective weight J₂ (I_n ⊗ W) J₁ of a PK layer (Def. 5.1, Eq. 19) as a dense matrix.

    J₁ and J₂ are uniformly random permutations of size n·in and n·out (an RP layer), or identities
    (``random_perms=False``: the bare Kronecker factor I_n ⊗ W).
    """
    check_positive_int("n", n)
    W = torch.as_tensor(np.asarray(W, dtype=np.float64))
    if W.ndim != 2 or W.numel() == 0:
        raise ConfigError(f"W must be a non-empty matrix, got shape {tuple(W.shape)}")
    out, inp = W.shape
    Z = kron_identity(n, W)
    if random_perms:
        g = _generator(seed)
        J1 = permutation_matrix(torch.randperm(n * inp, generator=g))
        J2 = permutation_matrix(torch.randperm(n * out, generator=g))
        Z = spmm(J2, Z, J1)
    return Z.to_dense().numpy()


# ---- singular values -------------------------------------------------------------------------------------


def singular_values(matrix: np.ndarray | sp.spmatrix) -> np.ndarray:
    """All singular values, largest first (dense SVD; refuses sides beyond MAX_DENSE_SIDE)."""
    if max(matrix.shape) > MAX_DENSE_SIDE:
        raise ConfigError(f"a full spectrum of a {matrix.shape[0]}×{matrix.shape[1]} matrix needs a dense SVD; "
                          f"the limit is {MAX_DENSE_SIDE} per side")
    dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix, dtype=np.float64)
    return np.linalg.svd(dense, compute_uv=False)


def largest_singular_value(matrix: np.ndarray | sp.spmatrix) -> float:
    """λ_max by Lanczos (ARPACK, deterministic start) - cheap for sparse weights; dense SVD for tiny sides."""
    if min(matrix.shape) < 8:
        return float(singular_values(matrix)[0])
    start = np.random.default_rng(0).standard_normal(min(matrix.shape))
    return float(svds(matrix, k=1, v0=start, tol=0, return_singular_vectors=False)[0])


def alpha_scaling_size(omega: str | int | float, alpha: float) -> tuple[int, float]:
    """(m, p) = (round(Ω^{(1+α)/2}), Ω^{−α}) of App. D.1, so that p·m² ≈ Ω; α must be ≥ 0."""
    omega = float(parse_omega(omega))
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise ConfigError(f"scaling index α must be a number ≥ 0, got {alpha!r}")
    return max(1, round(omega ** ((1 + alpha) / 2))), min(1.0, omega ** -alpha)


def alpha_scaling_singular_values(omega: str | int | float, alpha: float, seed: int = 0) -> np.ndarray:
    """Singular values (largest first) of the normalised sparse weight of App. D.1 at scaling index α ≥ 0.

    m = round(Ω^{(1+α)/2}), p = Ω^{−α}; Z = M ⊙ W (W ~ N(0, 1), M ~ Bernoulli(p) with 0/1 entries), and the
    values are √eig(K) for K = ZZᵀ / mean(diag(ZZᵀ)), so that their mean square is 1 for every α.
    """
    omega = float(parse_omega(omega))
    m, p = alpha_scaling_size(omega, alpha)
    if m > MAX_DENSE_SIDE:
        raise ConfigError(f"Ω={omega:g}, α={alpha:g} gives m={m}; the limit is {MAX_DENSE_SIDE}: lower Ω or α")
    g = _generator(seed)
    r, c = sample_bernoulli_mask(m, m, p, g)
    values = torch.randn(r.numel(), generator=g, dtype=torch.float64).numpy()
    Z = sp.csr_matrix((values, (r.numpy(), c.numpy())), shape=(m, m))
    kept = np.unique(r.numpy())  # a row without weights adds a zero row and column to K: a zero eigenvalue
    K = (Z[kept] @ Z[kept].T).toarray()  # at α = 1.5, Ω = 10³ about a sixth of the m rows
    scale = np.trace(K) / m
    if scale == 0:
        raise ConfigError(f"the mask at Ω={omega:g}, α={alpha:g}, seed={seed} kept no weight; raise Ω")
    # one BLAS thread: K has at most a few thousand rows (a sixth of m at α = 1.5, Ω = 10³), too few for more
    # threads to pay, and OpenBLAS's threads spin against other jobs where the cores are shared (a training sweep)
    with threadpool_limits(limits=1, user_api="blas"):
        eigenvalues = np.linalg.eigvalsh(K / scale)
    eigenvalues = np.concatenate([eigenvalues, np.zeros(m - len(kept))])
    return np.sqrt(np.clip(np.sort(eigenvalues), 0, None))[::-1]


# ---- sweeps ------------------------------------------------------------------------------------------------


def _seed_range(seeds: int) -> range:
    return range(check_positive_int("seeds", seeds))


def alpha_sweep(omega: str | int | float, alphas: Sequence[float], seeds: int = 5, seed: int = 0) -> list[dict]:
    """Rows alpha, m, p, lambda_max_mean, lambda_max_std of the App. D.1 scaling (Fig. S.1 right)."""
    omega = float(parse_omega(omega))
    if not alphas:
        raise ConfigError("alphas must list at least one scaling index α")
    rows = []
    for alpha in alphas:
        m, p = alpha_scaling_size(omega, alpha)
        tops = [alpha_scaling_singular_values(omega, alpha, seed + k)[0] for k in _seed_range(seeds)]
        rows.append({"alpha": float(alpha), "m": m, "p": p, "lambda_max_mean": float(np.mean(tops)),
                     "lambda_max_std": float(np.std(tops))})
    return rows


def default_widths(omega: str | int | float, gamma: float = 1.0, count: int = 6) -> list[int]:
    """``count`` widths spread geometrically from the dense SW-MLP width √(Ω/γ) (p = 1) to the Mixer's
    largest width (Ω/γ)^{2/3} (Eq. 15), rounded up so that p ≤ 1."""
    ratio = float(parse_omega(omega)) / check_positive("γ (gamma)", gamma)
    check_positive_int("count", count)
    return sorted({math.ceil(w - 1e-9) for w in np.geomspace(math.sqrt(ratio), ratio ** (2 / 3), count)})


def _sweep_sizes(omega: float, gamma: float, widths: Sequence[int] | None) -> list[tuple[int, float]]:
    """(m, p) of each width of :func:`lambda_max_sweep`, every weight's size checked before any is drawn."""
    widths = default_widths(omega, gamma) if widths is None else list(widths)
    if not widths:
        raise ConfigError("widths must list at least one width m")
    sizes = [(m, density_at_width(omega, m, gamma)) for m in widths]
    for m, p in sizes:
        _swmlp_size(m, p, gamma)
    return sizes


def lambda_max_sweep(omega: str | int | float, gamma: float = 1.0, widths: Sequence[int] | None = None,
                     seeds: int = 3, seed: int = 0) -> list[dict]:
    """λ_max of SW-MLP weights against width at fixed Ω (Fig. 4 right).

    One row per width m, with p = Ω/(γm²), q = √(pm), the empirical λ_max of each of ``seeds`` draws
    (``lambda_max_draws``; draw k uses seed ``seed + k`` at every width) with their mean and std, the prediction
    ``sqrt_l_plus`` = √L₊ (Eqs. 17-18) and the Mixer's ``c_gamma`` = 1 + √γ.
    """
    omega, gamma = float(parse_omega(omega)), check_positive("γ (gamma)", gamma)
    rows = []
    for m, p in _sweep_sizes(omega, gamma, widths):
        tops = [largest_singular_value(swmlp_weight(m, p, gamma, seed + k)) for k in _seed_range(seeds)]
        rows.append({"m": m, "p": p, "q": math.sqrt(p * m), "lambda_max_draws": [float(t) for t in tops],
                     "lambda_max_mean": float(np.mean(tops)),
                     "lambda_max_std": float(np.std(tops)), "sqrt_l_plus": math.sqrt(l_plus(m, p, gamma)),
                     "c_gamma": c_gamma(gamma)})
    return rows


def _mixer_pair(omega: str | int | float, gamma: float) -> tuple[int, int]:
    """(C, S) of :func:`mixer_baseline`, both weights' sizes checked before either is drawn."""
    summary = width_summary(omega, gamma)
    for side in (summary.C, summary.S):
        _mixer_size(side, gamma)
    return summary.C, summary.S


def mixer_baseline(omega: str | int | float, gamma: float = 1.0, seeds: int = 3, seed: int = 0) -> dict:
    """λ_max of the Mixer's channel weight V (γC × C) and token weight W (γS × S) at its widest pair (C, S)
    for Ω (Eq. 15), averaged over ``seeds`` draws; the effective weights I ⊗ V, I ⊗ W share them."""
    C, S = _mixer_pair(omega, gamma)
    channel = [largest_singular_value(mixer_weight(C, gamma, seed + k)) for k in _seed_range(seeds)]
    token = [largest_singular_value(mixer_weight(S, gamma, seed + seeds + k)) for k in _seed_range(seeds)]
    return {"C": C, "S": S, "m": C * S, "p": (1 / C + 1 / S) / 2, "lambda_max_channel": float(np.mean(channel)),
            "lambda_max_token": float(np.mean(token)), "c_gamma": c_gamma(gamma)}


def spectrum_report(omega: str | int | float = 2**16, gamma: float = 1.0, widths: Sequence[int] | None = None,
                    seeds: int = 3, seed: int = 0) -> dict:
    """Fig. 4 right as data: {"omega", "gamma", "c_gamma", "mixer": :func:`mixer_baseline`,
    "rows": :func:`lambda_max_sweep`}; every weight's size is checked before any is drawn."""
    omega, gamma = float(parse_omega(omega)), check_positive("γ (gamma)", gamma)
    _mixer_pair(omega, gamma)
    _sweep_sizes(omega, gamma, widths)
    _seed_range(seeds)
    return {"omega": omega, "gamma": gamma, "c_gamma": c_gamma(gamma),
            "mixer": mixer_baseline(omega, gamma, seeds, seed),
            "rows": lambda_max_sweep(omega, gamma, widths, seeds, seed)}
