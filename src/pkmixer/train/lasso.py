"""β-LASSO (Neyshabur 2020, "Towards Learning Convolutions from Scratch", Alg. 1): the dynamic-sparsity baseline
Hayase & Karakida compare a wider Mixer with (Sec. 5.3, Table 1).

Each update of a weight w takes the L1 penalty's subgradient with the loss's gradient, then zeroes the small
weights:

    w ← step(w, ∇ℓ(w) + λ·sign(w)),        w ← w ⊙ 1{|w| ≥ β·λ},

where ``step`` is the run's optimiser (Alg. 1 writes a plain gradient step, w − η·(...)), λ is ``optim.lasso`` and β
``optim.lasso_beta`` (β = 0 is LASSO by subgradient). A zeroed weight is not frozen: a later gradient can move it
past the threshold again. The penalty and the threshold act on the weights the run decays
(:func:`pkmixer.layers.decay.decayed_parameters`) but the classifier's (:func:`lasso_weights`): not on biases or
norms, and not on a head that starts at zero (timm's convention, which these models keep), whose first small steps
the threshold would undo. They are hooks on the optimiser's step, so its state dict, the checkpoints and a resumed
run are those of the optimiser alone.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..layers.decay import decayed_parameters


def lasso_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights β-LASSO acts on: the decayed parameters of ``model`` but its classifier's (timm's
    ``get_classifier``, where the model has one)."""
    head = model.get_classifier() if hasattr(model, "get_classifier") else None
    skip = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    names = decayed_parameters(model)
    return [p for n, p in model.named_parameters() if n in names and p.requires_grad and id(p) not in skip]


def attach_beta_lasso(optimizer: torch.optim.Optimizer, weights: Sequence[torch.Tensor], lam: float,
                      beta: float) -> None:
    """Make every ``optimizer.step()`` a β-LASSO step on ``weights`` with penalty ``lam`` (λ) and threshold
    factor ``beta`` (β); nothing with ``lam`` = 0."""
    if lam <= 0 or not weights:
        return
    weights = list(weights)
    threshold = beta * lam

    @torch.no_grad()
    def add_subgradient(opt, args, kwargs) -> None:
        for w in weights:
            if w.grad is not None:
                w.grad.add_(torch.sign(w), alpha=lam)

    @torch.no_grad()
    def zero_small(opt, args, kwargs) -> None:
        for w in weights:
            w.masked_fill_(w.abs() < threshold, 0.0)

    optimizer.register_step_pre_hook(add_subgradient)
    if threshold > 0:
        optimizer.register_step_post_hook(zero_small)


def kept_fraction(weights: Sequence[torch.Tensor]) -> float:
    """The fraction of non-zero entries among ``weights``: what β-LASSO has left of a dense network."""
    total = sum(w.numel() for w in weights)
    return sum(int(torch.count_nonzero(w)) for w in weights) / total if total else 1.0
