"""Implicit L1 regularisation of the Kronecker parameterisation, checked numerically (Hayase & Karakida
Prop. 3.3, Eq. 11, App. B.4, Lemma B.1).

For V ∈ R^{C×C}, W ∈ R^{S×S} and a loss L on B ∈ R^{SC×SC},

    min_{V,W} L(V⊗W) + λ/2 (‖V‖²_F + ‖W‖²_F)  ≥  min_B L(B) + λ̃ ‖B‖₁,   λ̃ = λ/(CS),

where ‖B‖₁ is the entry-wise L1 norm. The proof (Lemma B.1 with m = C², n = S²) holds point by point: for any V, W

    ‖V⊗W‖₁ = ‖V‖₁‖W‖₁ ≤ CS ‖V‖_F‖W‖_F = CS ‖V⊗W‖_F ≤ CS (‖V‖²_F + ‖W‖²_F)/2          (Hölder, then AM-GM)

so the Kronecker objective at any (V, W) is at least the L1 objective at B = V⊗W, which is at least the L1
minimum. The linear S-Mixer computes vec(WXV) = (Vᵀ⊗W) vec(X) (Eq. 6); V ↦ Vᵀ keeps every norm, so the
statement is written with V⊗W as in the paper.

The demonstration uses a regression problem: rows x_i, y_i ∈ R^{SC}, L(B) = (1/2N) Σ_i ‖y_i − B x_i‖², data
from a sparse Kronecker ground truth plus noise, all in float64. The non-convex Kronecker problem is solved
from several random starts (trust-region Newton on exact derivatives), keeping the best. The convex L1
problem is solved by FISTA with adaptive restart to a certified accuracy: with G = XᵀX/N ≻ 0 (N ≥ SC) the
objective is μ-strongly convex, μ = λ_min(G), and a prox-gradient step B⁺ = prox(B − ∇L(B)/L_G), L_G = λ_max(G),
satisfies objective(B⁺) − min ≤ 2‖(B − B⁺)·L_G‖²_F / μ.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.optimize

from ..errors import ConfigError, check_density, check_positive_int

GRAD_TOL = 1e-10  # the Kronecker solver stops when the norm of its gradient is below this
NEWTON_POLISH = 5  # at most this many value-free Newton steps after the trust-region solve
PROX_TOL = 1e-11  # FISTA stops when the prox-gradient residual is below this
# λ and the label noise at most: the objectives square the labels and weigh squared weights by λ, and beyond
# this their float64 values overflow
MAX_SCALE = 1e100


def _check_nonnegative(name: str, value: object) -> float:
    """λ or the label noise: in [0, MAX_SCALE]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SCALE:
        raise ConfigError(f"{name} must be a finite number ≥ 0 and at most {MAX_SCALE:.0e}, got {value!r}")
    return float(value)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be an integer ≥ 0, got {seed!r}")
    return seed


def _as_dict(fit: object) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(fit).items()}


@dataclass(frozen=True)
class RegressionProblem:
    """Inputs X (N, SC) and targets Y (N, SC) as rows; the model is y ≈ B x with B ∈ R^{SC×SC}."""

    X: np.ndarray
    Y: np.ndarray
    S: int
    C: int

    def __post_init__(self) -> None:
        d = self.S * self.C
        if self.X.ndim != 2 or self.X.shape != self.Y.shape or self.X.shape[1] != d:
            raise ConfigError(f"X and Y must both have shape (N, S·C = {d}), got {self.X.shape} and {self.Y.shape}")

    def loss(self, B: np.ndarray) -> float:
        """L(B) = (1/2N) Σ ‖y_i − B x_i‖²."""
        return float(0.5 * np.sum((self.Y - self.X @ B.T) ** 2) / len(self.X))

    def gradient(self, B: np.ndarray) -> np.ndarray:
        """∇L(B) = B G − R with G = XᵀX/N, R = YᵀX/N: (SC, SC)."""
        return (B @ self.X.T - self.Y.T) @ self.X / len(self.X)

    def l1_objective(self, B: np.ndarray, lam: float) -> float:
        """L(B) + λ̃ ‖B‖₁ with λ̃ = λ/(CS) (right side of Eq. 11)."""
        return self.loss(B) + lam / (self.C * self.S) * float(np.abs(B).sum())

    def kronecker_objective(self, V: np.ndarray, W: np.ndarray, lam: float) -> float:
        """L(V⊗W) + λ/2 (‖V‖²_F + ‖W‖²_F) (left side of Eq. 11)."""
        return self.loss(np.kron(V, W)) + lam / 2 * float(np.sum(V**2) + np.sum(W**2))

    def least_squares(self) -> np.ndarray:
        """The unregularised minimiser of L: (SC, SC)."""
        return np.linalg.lstsq(self.X, self.Y, rcond=None)[0].T


def make_problem(S: int = 3, C: int = 3, n_samples: int = 200, noise: float = 0.1, truth_density: float = 0.5,
                 seed: int = 0) -> RegressionProblem:
    """x_i ~ N(0, I_SC), y_i = (V₀⊗W₀) x_i + noise·ε_i; V₀, W₀ Gaussian with a Bernoulli(truth_density) mask,
    so the truth is both Kronecker and sparse (density ≈ truth_density²)."""
    S, C = check_positive_int("S", S), check_positive_int("C", C)
    if check_positive_int("n_samples", n_samples) < S * C:
        raise ConfigError(f"n_samples must be at least S·C = {S * C} so that least squares is unique, got {n_samples}")
    noise, truth_density = _check_nonnegative("noise", noise), check_density("truth_density", truth_density)
    rng = np.random.default_rng(_check_seed(seed))

    def sparse_factor(k: int) -> np.ndarray:
        mask = rng.random((k, k)) < truth_density
        mask.flat[rng.integers(k * k)] = True  # never all zero
        return rng.standard_normal((k, k)) * mask

    B_true = np.kron(sparse_factor(C), sparse_factor(S))  # (SC, SC)
    X = rng.standard_normal((n_samples, S * C))
    return RegressionProblem(X, X @ B_true.T + noise * rng.standard_normal(X.shape), S, C)


def kronecker_l1_chain(V: np.ndarray, W: np.ndarray) -> dict[str, float]:
    """The steps of the bound for one (V, W): ‖V⊗W‖₁ = ‖V‖₁‖W‖₁ ≤ CS‖V‖_F‖W‖_F ≤ CS(‖V‖²_F + ‖W‖²_F)/2.

    Equalities: Hölder when all |V_ij| are equal and all |W_kl| are equal, AM-GM when ‖V‖_F = ‖W‖_F.
    """
    C, S = V.shape[0], W.shape[0]
    return {"kron_l1": float(np.abs(np.kron(V, W)).sum()),
            "l1_product": float(np.abs(V).sum() * np.abs(W).sum()),
            "holder": C * S * float(np.linalg.norm(V) * np.linalg.norm(W)),
            "am_gm": C * S * float(np.sum(V**2) + np.sum(W**2)) / 2}


@dataclass(frozen=True)
class KroneckerFit:
    V: np.ndarray  # (C, C)
    W: np.ndarray  # (S, S)
    objective: float  # L(V⊗W) + λ/2 (‖V‖² + ‖W‖²), the best over the restarts
    grad_norm: float  # ‖∇_{V,W} objective‖ at (V, W)

    def as_dict(self) -> dict:
        return _as_dict(self)


def kronecker_derivatives(problem: RegressionProblem, lam: float
                          ) -> tuple[Callable[[np.ndarray], float], Callable[[np.ndarray], np.ndarray],
                                     Callable[[np.ndarray], np.ndarray]]:
    """Value, gradient and Hessian of θ = (vec V, vec W) ↦ L(V⊗W) + λ/2 ‖θ‖², vec row-major: (C² + S²,).

    The rearrangement B̂[(i₁, j₁), (i₂, j₂)] = B[i₁S + i₂, j₁S + j₂] maps V⊗W to v wᵀ (Van Loan & Pitsianis), in
    which L(B) = ½ b̂ᵀĤb̂ − r̂ᵀb̂ + const with b̂ = v ⊗ w, Ĥ = I ⊗ G and r̂ = vec R rearranged (G = XᵀX/N, R = YᵀX/N).
    """
    S, C, N = problem.S, problem.C, len(problem.X)
    i1, j1, i2, j2 = np.meshgrid(range(C), range(C), range(S), range(S), indexing="ij")
    perm = ((i1 * S + i2) * S * C + j1 * S + j2).reshape(-1)  # B.reshape(-1)[perm] = B̂.reshape(-1)
    H = np.kron(np.eye(S * C), problem.X.T @ problem.X / N)[np.ix_(perm, perm)]  # (C²S², C²S²)
    r = (problem.Y.T @ problem.X / N).reshape(-1)[perm]  # (C²S²,)
    const = float(np.sum(problem.Y**2)) / (2 * N)

    def split(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        v, w = theta[: C * C], theta[C * C:]
        return v, w, np.outer(v, w).reshape(-1)  # b̂ = v ⊗ w

    def value(theta: np.ndarray) -> float:
        b = split(theta)[2]
        return float(0.5 * b @ H @ b - r @ b + const + lam / 2 * theta @ theta)

    def gradient(theta: np.ndarray) -> np.ndarray:
        v, w, b = split(theta)
        D = (H @ b - r).reshape(C * C, S * S)  # ∇L in rearranged coordinates
        return np.concatenate([D @ w, D.T @ v]) + lam * theta

    def hessian(theta: np.ndarray) -> np.ndarray:
        v, w, b = split(theta)
        D = (H @ b - r).reshape(C * C, S * S)
        J = np.hstack([np.kron(np.eye(C * C), w[:, None]), np.kron(v[:, None], np.eye(S * S))])  # ∂b̂/∂θ
        cross = np.block([[np.zeros((C * C, C * C)), D], [D.T, np.zeros((S * S, S * S))]])
        return J.T @ H @ J + cross + lam * np.eye(len(theta))

    return value, gradient, hessian


def solve_kronecker(problem: RegressionProblem, lam: float, restarts: int = 8, seed: int = 0) -> KroneckerFit:
    """min_{V,W} L(V⊗W) + λ/2 (‖V‖²_F + ‖W‖²_F) from ``restarts`` random starts, keeping the best.

    The problem has C² + S² unknowns, so each start runs a trust-region Newton method (scipy ``trust-exact``) on
    the exact derivatives of :func:`kronecker_derivatives`, then value-free Newton steps: near the optimum the
    objective cannot resolve changes below its round-off, but the gradient can (a least-squares solve copes with
    the singular Hessian of λ = 0, where (aV, W/a) is a valley of minima).
    """
    lam = _check_nonnegative("lam", lam)
    check_positive_int("restarts", restarts)
    S, C = problem.S, problem.C
    value, gradient, hessian = kronecker_derivatives(problem, lam)
    rng = np.random.default_rng(_check_seed(seed))
    best = None
    for _ in range(restarts):
        start = np.concatenate([rng.standard_normal(C * C) / math.sqrt(C), rng.standard_normal(S * S) / math.sqrt(S)])
        theta = scipy.optimize.minimize(value, start, jac=gradient, hess=hessian, method="trust-exact",
                                        options={"gtol": GRAD_TOL, "maxiter": 1000}).x
        for _ in range(NEWTON_POLISH):
            g = gradient(theta)
            step = np.linalg.lstsq(hessian(theta), -g, rcond=None)[0]
            if np.linalg.norm(gradient(theta + step)) >= np.linalg.norm(g):
                break
            theta = theta + step
        V, W = theta[: C * C].reshape(C, C), theta[C * C:].reshape(S, S)
        fit = KroneckerFit(V, W, problem.kronecker_objective(V, W, lam), float(np.linalg.norm(gradient(theta))))
        if best is None or fit.objective < best.objective:
            best = fit
    return best


@dataclass(frozen=True)
class L1Fit:
    B: np.ndarray  # (SC, SC)
    objective: float  # L(B) + λ̃ ‖B‖₁
    residual: float  # prox-gradient residual ‖(B_prev − B)·L_G‖_F; 0 exactly at the optimum
    gap_bound: float  # certified bound on objective − minimum, 2·residual²/μ
    iterations: int

    def as_dict(self) -> dict:
        return _as_dict(self)


def _soft_threshold(B: np.ndarray, t: float) -> np.ndarray:
    return np.sign(B) * np.maximum(np.abs(B) - t, 0.0)


def solve_l1(problem: RegressionProblem, lam: float, max_iter: int = 100_000) -> L1Fit:
    """min_B L(B) + λ̃ ‖B‖₁, λ̃ = λ/(CS), by FISTA with gradient-based restart, to residual ≤ PROX_TOL."""
    lam_tilde = _check_nonnegative("lam", lam) / (problem.C * problem.S)
    eig = np.linalg.eigvalsh(problem.X.T @ problem.X / len(problem.X))
    mu, lipschitz = float(eig[0]), float(eig[-1])
    step = 1.0 / lipschitz

    def prox_step(B: np.ndarray) -> np.ndarray:
        return _soft_threshold(B - step * problem.gradient(B), step * lam_tilde)

    d = problem.S * problem.C
    B = Z = np.zeros((d, d))
    momentum = 1.0
    for iteration in range(1, max_iter + 1):
        B_next = prox_step(Z)
        if np.linalg.norm(Z - B_next) * lipschitz <= PROX_TOL:
            break
        if np.sum((Z - B_next) * (B_next - B)) > 0:  # momentum points uphill: restart
            momentum = 1.0
        momentum_next = (1 + math.sqrt(1 + 4 * momentum**2)) / 2
        Z = B_next + (momentum - 1) / momentum_next * (B_next - B)
        B, momentum = B_next, momentum_next
    B_final = prox_step(B_next)
    residual = float(np.linalg.norm(B_next - B_final)) * lipschitz
    gap_bound = 2 * residual**2 / mu if mu > 0 else math.inf
    return L1Fit(B_final, problem.l1_objective(B_final, lam), residual, gap_bound, iteration)


def zero_fraction(B: np.ndarray, threshold: float) -> float:
    """Fraction of entries with |B_ij| ≤ threshold."""
    return float(np.mean(np.abs(B) <= threshold))


def implicit_l1_report(S: int = 3, C: int = 3, lam: float = 0.5, n_samples: int = 200, noise: float = 0.1,
                       seed: int = 0, restarts: int = 8, zero_tol: float = 1e-3) -> dict:
    """Both sides of Prop. 3.3 on one regression problem, the middle term L1(V⊗W), and the sparsity of the
    Kronecker, L1 and least-squares solutions: the fraction of entries below ``zero_tol`` times the largest
    least-squares entry (one threshold for all three). ``holds`` allows for the certified L1 solver error only."""
    zero_tol = check_density("zero_tol", zero_tol)
    problem = make_problem(S, C, n_samples, noise, seed=seed)
    kron = solve_kronecker(problem, lam, restarts, seed)
    l1 = solve_l1(problem, lam)
    B_kron, B_ls = np.kron(kron.V, kron.W), problem.least_squares()
    l1_at_kron = problem.l1_objective(B_kron, lam)
    slack = l1.gap_bound + 1e-12 * max(1.0, abs(l1.objective))  # solver error and float rounding
    steps = (kron.objective >= l1_at_kron - slack, l1_at_kron >= l1.objective - slack)
    first, second = ("≥" if ok else "<" for ok in steps)
    threshold = zero_tol * float(np.abs(B_ls).max())
    return {
        "S": S, "C": C, "lam": float(lam), "lam_tilde": float(lam) / (C * S), "n_samples": n_samples,
        "noise": float(noise), "seed": seed, "restarts": restarts,
        "kronecker_objective": kron.objective,
        "l1_objective_at_kronecker": l1_at_kron,
        "l1_objective": l1.objective,
        "margin": kron.objective - l1.objective,
        "least_squares_loss": problem.loss(B_ls),
        "kronecker_grad_norm": kron.grad_norm,
        "l1_residual": l1.residual,
        "l1_gap_bound": l1.gap_bound,
        "zero_fraction_kronecker": zero_fraction(B_kron, threshold),
        "zero_fraction_l1": zero_fraction(l1.B, threshold),
        "zero_fraction_least_squares": zero_fraction(B_ls, threshold),
        "holds": all(steps),
        "verdict": (f"{'holds' if all(steps) else 'violated'}: Kronecker+L2 {kron.objective:.6g} {first} "
                    f"L1 at V⊗W {l1_at_kron:.6g} {second} min L1 {l1.objective:.6g}"),
    }
