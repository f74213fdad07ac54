"""Prop. 3.3 (implicit L1 of the Kronecker parameterisation, App. B.4): the bound on regression problems, the
solvers against closed forms and optimality conditions, and each step of the norm inequality."""
import json
import math

import numpy as np
import pytest
import torch

from pkmixer.errors import ConfigError
from pkmixer.theory.regularization import (RegressionProblem, implicit_l1_report, kronecker_derivatives,
                                           kronecker_l1_chain, make_problem, solve_kronecker, solve_l1)


def rearrange(B: np.ndarray, S: int, C: int) -> np.ndarray:
    """Van Loan-Pitsianis rearrangement (SC, SC) -> (C², S²) that maps V ⊗ W to vec(V) vec(W)ᵀ."""
    return B.reshape(C, S, C, S).transpose(0, 2, 1, 3).reshape(C * C, S * S)


def whitened_problem(S: int, C: int, n: int = 40, seed: int = 0) -> RegressionProblem:
    """XᵀX/N = I exactly, so L(B) = ½‖B − R‖²_F + L(R) with R = YᵀX/N: both problems have closed forms."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((n, S * C)))
    return RegressionProblem(math.sqrt(n) * Q, rng.standard_normal((n, S * C)), S, C)


def autograd_kronecker_objective(problem: RegressionProblem, lam: float):
    X, Y = torch.from_numpy(problem.X), torch.from_numpy(problem.Y)
    C, S = problem.C, problem.S

    def objective(theta: torch.Tensor) -> torch.Tensor:
        V, W = theta[: C * C].reshape(C, C), theta[C * C:].reshape(S, S)
        return 0.5 * (Y - X @ torch.kron(V, W).T).pow(2).sum() / len(X) + lam / 2 * theta.pow(2).sum()

    return objective


def test_rearrangement_maps_kronecker_to_outer_product():
    rng = np.random.default_rng(0)
    V, W = rng.standard_normal((2, 2)), rng.standard_normal((3, 3))
    assert np.allclose(rearrange(np.kron(V, W), S=3, C=2), np.outer(V.reshape(-1), W.reshape(-1)))


@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_derivatives_match_autograd(lam):
    problem = make_problem(S=3, C=2, n_samples=20, seed=3)
    value, gradient, hessian = kronecker_derivatives(problem, lam)
    theta = np.random.default_rng(1).standard_normal(4 + 9)
    objective = autograd_kronecker_objective(problem, lam)
    t = torch.from_numpy(theta)
    assert abs(value(theta) - float(objective(t))) < 1e-12
    assert np.abs(gradient(theta) - torch.func.grad(objective)(t).numpy()).max() < 1e-12
    assert np.abs(hessian(theta) - torch.func.hessian(objective)(t).numpy()).max() < 1e-12


def test_norm_chain_on_random_matrices():
    rng = np.random.default_rng(2)
    for C, S in [(2, 3), (3, 3), (4, 2)]:
        V, W = rng.standard_normal((C, C)), 3 * rng.standard_normal((S, S))
        chain = kronecker_l1_chain(V, W)
        assert abs(chain["kron_l1"] - chain["l1_product"]) < 1e-12 * chain["kron_l1"]
        assert chain["l1_product"] < chain["holder"] < chain["am_gm"]  # both strict off the equality case
        assert chain["kron_l1"] == pytest.approx(np.abs(np.kron(V, W)).sum())
        assert chain["am_gm"] == pytest.approx(C * S * (np.sum(V**2) + np.sum(W**2)) / 2)


def test_norm_chain_is_tight_at_its_equality_case():
    """Equal |V_ij|, equal |W_kl| (Hölder) and ‖V‖_F = ‖W‖_F (AM-GM): every step is an equality, so the two
    objectives of Eq. 11 agree at V⊗W."""
    rng = np.random.default_rng(3)
    C, S = 2, 3
    V = 1.5 * rng.choice([-1.0, 1.0], size=(C, C))  # ‖V‖_F = 1.5 C
    W = 1.5 * C / S * rng.choice([-1.0, 1.0], size=(S, S))  # ‖W‖_F = 1.5 C
    chain = kronecker_l1_chain(V, W)
    for key in ("l1_product", "holder", "am_gm"):
        assert chain[key] == pytest.approx(chain["kron_l1"], rel=1e-12)
    problem = make_problem(S=S, C=C, n_samples=30, seed=0)
    assert problem.kronecker_objective(V, W, 0.4) == pytest.approx(problem.l1_objective(np.kron(V, W), 0.4), rel=1e-12)
    V2 = V.copy()
    V2[0, 0] *= 2  # unequal magnitudes: strictly above
    assert problem.kronecker_objective(V2, W, 0.4) > problem.l1_objective(np.kron(V2, W), 0.4) + 1e-3


@pytest.mark.parametrize("lam", [0.05, 0.5, 3.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_bound_holds_with_converged_solvers(lam, seed):
    report = implicit_l1_report(S=3, C=3, lam=lam, n_samples=60, seed=seed, restarts=4)
    assert report["holds"] and report["verdict"].startswith("holds: ")
    assert f"{report['kronecker_objective']:.6g}" in report["verdict"]
    assert report["lam_tilde"] == pytest.approx(lam / 9)
    assert report["kronecker_grad_norm"] < 1e-9 and report["l1_residual"] < 1e-9 and report["l1_gap_bound"] < 1e-15
    assert report["kronecker_objective"] >= report["l1_objective_at_kronecker"] - 1e-12
    assert report["l1_objective_at_kronecker"] >= report["l1_objective"] - 1e-12
    assert report["margin"] == pytest.approx(report["kronecker_objective"] - report["l1_objective"])
    assert report["zero_fraction_l1"] >= report["zero_fraction_least_squares"]
    json.dumps(report)


@pytest.mark.parametrize("lam", [0.1, 2.0])
def test_solvers_satisfy_optimality_conditions(lam):
    problem = make_problem(S=2, C=3, n_samples=40, seed=4)
    l1 = solve_l1(problem, lam)
    lam_tilde = lam / 6
    grad = (l1.B @ problem.X.T - problem.Y.T) @ problem.X / len(problem.X)  # ∇L(B), written out
    nonzero = l1.B != 0
    assert np.abs(grad[nonzero] + lam_tilde * np.sign(l1.B[nonzero])).max() < 1e-9  # KKT on the support
    assert np.abs(grad[~nonzero]).max() <= lam_tilde + 1e-9  # KKT off the support
    assert nonzero.any() and (~nonzero).any()
    kron = solve_kronecker(problem, lam, restarts=4)
    theta = torch.from_numpy(np.concatenate([kron.V.reshape(-1), kron.W.reshape(-1)]))
    assert float(torch.func.grad(autograd_kronecker_objective(problem, lam))(theta).norm()) < 1e-9
    assert np.linalg.norm(kron.V) == pytest.approx(np.linalg.norm(kron.W), rel=1e-8)  # balanced at a stationary point
    json.dumps(kron.as_dict())
    json.dumps(l1.as_dict())


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.5])
def test_closed_forms_on_whitened_design(lam):
    S, C = 3, 2
    problem = whitened_problem(S, C)
    R = problem.Y.T @ problem.X / len(problem.X)  # the least-squares B
    base = problem.loss(R)
    lam_tilde = lam / (C * S)
    # L1: entry-wise soft thresholding of R
    l1_min = base + np.sum(np.where(np.abs(R) <= lam_tilde, R**2 / 2, lam_tilde * np.abs(R) - lam_tilde**2 / 2))
    assert solve_l1(problem, lam).objective == pytest.approx(l1_min, abs=1e-12)
    # Kronecker: the best rank-one rearrangement with its top singular value shrunk by λ
    sigma = np.linalg.svd(rearrange(R, S, C), compute_uv=False)[0]
    kron_min = base + 0.5 * np.sum(R**2) - 0.5 * max(sigma - lam, 0.0) ** 2
    assert solve_kronecker(problem, lam, restarts=4).objective == pytest.approx(kron_min, abs=1e-12)
    assert kron_min >= l1_min


def test_lambda_zero_gives_least_squares():
    problem = make_problem(S=3, C=2, n_samples=30, noise=0.2, seed=5)
    B_ls = np.linalg.lstsq(problem.X, problem.Y, rcond=None)[0].T
    ls = 0.5 * np.sum((problem.Y - problem.X @ B_ls.T) ** 2) / 30
    assert solve_l1(problem, 0.0).objective == pytest.approx(ls, rel=1e-12)
    assert solve_kronecker(problem, 0.0, restarts=4).objective >= ls  # V⊗W is a constrained B
    # noiseless Kronecker data: both sides reach the least-squares optimum, 0
    exact = make_problem(S=3, C=2, n_samples=30, noise=0.0, seed=5)
    report = implicit_l1_report(S=3, C=2, lam=0.0, n_samples=30, noise=0.0, seed=5, restarts=4)
    assert abs(report["least_squares_loss"]) < 1e-20
    assert abs(report["kronecker_objective"]) < 1e-20 and abs(report["l1_objective"]) < 1e-20
    assert exact.loss(exact.least_squares()) < 1e-20


def test_bad_input():
    with pytest.raises(ConfigError, match="S must be a positive integer"):
        make_problem(S=0)
    with pytest.raises(ConfigError, match="n_samples must be at least S·C = 9"):
        make_problem(S=3, C=3, n_samples=8)
    with pytest.raises(ConfigError, match="noise"):
        make_problem(noise=-1.0)
    with pytest.raises(ConfigError, match="truth_density"):
        make_problem(truth_density=0.0)
    with pytest.raises(ConfigError, match="seed"):
        make_problem(seed=-1)
    problem = make_problem(S=2, C=2, n_samples=10)
    for lam in (-0.1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ConfigError, match="lam must be a finite number"):
            solve_l1(problem, lam)
        with pytest.raises(ConfigError, match="lam must be a finite number"):
            solve_kronecker(problem, lam)
    with pytest.raises(ConfigError, match="restarts"):
        solve_kronecker(problem, 0.1, restarts=0)
    with pytest.raises(ConfigError, match="zero_tol"):
        implicit_l1_report(zero_tol=2.0)
    with pytest.raises(ConfigError, match=r"shape \(N, S·C = 4\)"):
        RegressionProblem(np.zeros((5, 4)), np.zeros((5, 3)), 2, 2)
