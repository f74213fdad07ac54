"""β-LASSO (pkmixer.train.lasso; Neyshabur 2020, Alg. 1): each step equals the algorithm's formula written out,
acts on the decayed weights only, lets a zeroed weight come back, stays out of stacked runs, and sparsifies a
real run, which resumes to the same weights."""
import pytest
import torch
from torch import nn

from pkmixer.checkpoint import read_checkpoint
from pkmixer.errors import ConfigError
from pkmixer.experiments.probes import run_probes
from pkmixer.train import loop
from pkmixer.train.config import OptimConfig, build_config
from pkmixer.train.engine import build_optimizer
from pkmixer.models.registry import create_model
from pkmixer.train.lasso import kept_fraction, lasso_weights
from pkmixer.train.stack import member_optims

LAM, BETA, LR = 0.01, 5.0, 0.1


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(6, 4)
    with torch.no_grad():
        model.weight[0, :3] = torch.tensor([0.02, -0.04, 0.3])  # near the threshold βλ = 0.05, and far
    return model


def test_the_classifier_is_left_out():
    model = create_model("swmlp_t4_28", weight_format="masked")
    weights = {id(p) for p in lasso_weights(model)}
    assert id(model.head.weight) not in weights and id(model.head.bias) not in weights
    assert id(model.blocks[0].linears[0].weight) in weights and id(model.blocks[0].norm.weight) not in weights


def _step(model: nn.Module, optim: OptimConfig, x: torch.Tensor) -> None:
    opt = build_optimizer(optim, model)
    opt.zero_grad()
    model(x).square().sum().backward()
    opt.step()


def test_one_step_is_the_algorithm_written_out():
    """w ← w − η(∇ℓ + λ sign w), then w ⊙ 1{|w| ≥ βλ} for the weight; the bias takes the plain step."""
    model, x = _model(), torch.randn(5, 6)
    w, b = model.weight.detach().clone(), model.bias.detach().clone()
    model(x).square().sum().backward()
    gw, gb = model.weight.grad.clone(), model.bias.grad.clone()
    model.zero_grad()
    _step(model, OptimConfig(lr=LR, momentum=0.0, nesterov=False, lasso=LAM, lasso_beta=BETA), x)
    expect = w - LR * (gw + LAM * torch.sign(w))
    expect = expect * (expect.abs() >= BETA * LAM)
    assert torch.allclose(model.weight.detach(), expect, atol=0, rtol=1e-6)
    assert torch.equal(model.weight == 0, expect == 0)
    assert torch.allclose(model.bias.detach(), b - LR * gb, atol=0, rtol=1e-6)
    assert (model.weight == 0).any() and (expect != 0).any()


def test_off_and_beta_zero():
    """λ = 0 is the plain optimiser, bit for bit; β = 0 is LASSO by subgradient, which zeroes nothing by itself."""
    x = torch.randn(5, 6)
    plain, off = _model(), _model()
    _step(plain, OptimConfig(lr=LR), x)
    _step(off, OptimConfig(lr=LR, lasso=0.0), x)
    assert torch.equal(plain.weight, off.weight)
    lasso = _model()
    w = lasso.weight.detach().clone()
    lasso(x).square().sum().backward()
    g = lasso.weight.grad.clone()
    lasso.zero_grad()
    _step(lasso, OptimConfig(lr=LR, momentum=0.0, nesterov=False, lasso=LAM, lasso_beta=0.0), x)
    assert torch.allclose(lasso.weight.detach(), w - LR * (g + LAM * torch.sign(w)), atol=0, rtol=1e-6)


def test_a_zeroed_weight_can_come_back():
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = build_optimizer(OptimConfig(lr=1.0, momentum=0.0, nesterov=False, lasso=LAM, lasso_beta=BETA), model)
    model.weight.grad = torch.tensor([[-1.0]])  # sign(0) = 0: the step is the gradient's alone, 1.0 > βλ
    opt.step()
    assert float(model.weight.detach()) == 1.0


def test_with_adamw_the_penalty_goes_through_the_optimiser():
    """Hooks on the step: AdamW sees ∇ℓ + λ sign w, as torch's AdamW on that gradient would."""
    x = torch.randn(5, 6)
    ours, ref = _model(), _model()
    _step(ours, OptimConfig(name="adamw", lr=LR, lasso=LAM, lasso_beta=0.0), x)
    ref(x).square().sum().backward()
    with torch.no_grad():
        ref.weight.grad += LAM * torch.sign(ref.weight)
    torch.optim.AdamW([{"params": [ref.weight], "weight_decay": 0.0}, {"params": [ref.bias], "weight_decay": 0.0}],
                      lr=LR).step()
    assert torch.allclose(ours.weight, ref.weight, atol=1e-7)


def test_refused_where_it_cannot_run():
    with pytest.raises(ConfigError, match="β-LASSO"):
        member_optims(OptimConfig(lasso=LAM), 2)
    for key in ("optim.lasso", "optim.lasso_beta"):
        with pytest.raises(ConfigError, match=key):
            build_config(None, {key: -1.0})


def test_kept_fraction():
    assert kept_fraction([torch.tensor([0.0, 1.0]), torch.zeros(2, 3)]) == 0.125
    assert kept_fraction([]) == 1.0


DIGITS = {"data.name": "digits", "data.batch_size": 32, "data.train_subset": 256, "data.test_subset": 128,
          "model.name": "swmlp_t4_28", "model.img_size": 8, "model.patch_size": 2, "model.in_chans": 1,
          "model.density": 1.0, "model.depth": 1, "optim.lr": 0.05, "optim.lasso": 2e-4, "optim.lasso_beta": 50.0,
          "schedule.epochs": 2, "run.progress": False}


def quiet(_: str) -> None:
    pass


def test_a_run_sparsifies_and_resumes_to_the_same_weights(tmp_path):
    """A dense SW-MLP trained with β-LASSO ends with a fraction of its weights (the ``kept`` probe), and one epoch,
    then a resumed second, ends where two straight epochs do: the hooks carry no state of their own."""
    whole = loop.train(build_config(None, DIGITS), tmp_path / "whole", log=quiet)
    assert whole["status"] == "finished"
    kept = run_probes(tmp_path / "whole", ["kept"], log=quiet)["kept"]
    assert 0.0 < kept["kept_fraction"] < 0.9
    loop.train(build_config(None, DIGITS), tmp_path / "pieces", stop_after=1, log=quiet)
    loop.train(None, tmp_path / "pieces", resume=True, log=quiet)
    a = read_checkpoint(tmp_path / "whole" / "checkpoints" / "latest.pt")["state_dict"]
    b = read_checkpoint(tmp_path / "pieces" / "checkpoints" / "latest.pt")["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_runs_without_it_keep_their_record_keys():
    """The two keys are left out of a normalised config at their off values, so runs recorded before they existed
    keep their keys (pkmixer.experiments.records.run_key); on, λ is part of the key."""
    from pkmixer.experiments.sweep import _normalized

    assert not {"lasso", "lasso_beta"} & set(_normalized(build_config(None, {}))["optim"])
    on = _normalized(build_config(None, {"optim.lasso": 1e-5}))["optim"]
    assert on["lasso"] == 1e-5 and "lasso_beta" not in on
