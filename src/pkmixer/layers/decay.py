"""Which parameters weight decay applies to: by role, as each layer declares, not by tensor rank.

A layer with parameters of its own says which of them are weights, in a class attribute ``decayed_parameters``
(names); torch's linear and convolution layers decay ``weight``, its norm layers nothing. A model may also
exclude names through timm's ``no_weight_decay()`` convention. A layer that declares nothing is an error, not a
guess. The layers store their tensors so that timm's rule (``timm.optim.create_optimizer_v2``: no decay for
tensors of one dimension, for names ending in ``.bias`` and for ``no_weight_decay()``) picks the same set: the
SW-MLP's kept weights are a (1, nnz) row, and the untied token-mixing bias, (n, out), is named ``bias``
(tests/test_timm_conventions.py builds timm's optimiser for every registered model).
"""
from __future__ import annotations

from torch import nn

BUILTIN_ROLES: dict[type[nn.Module], tuple[str, ...]] = {
    nn.Linear: ("weight",), nn.Conv1d: ("weight",), nn.Conv2d: ("weight",),
    nn.LayerNorm: (), nn.GroupNorm: (), nn.BatchNorm1d: (), nn.BatchNorm2d: (),
}


def decayed_parameters(model: nn.Module) -> set[str]:
    """The full names of the parameters of ``model`` that weight decay applies to."""
    excluded = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    return weights_by_role(model) - excluded


def weights_by_role(model: nn.Module) -> set[str]:
    """The full names of the parameters that their layers declare weights (``decayed_parameters`` before a
    model's own ``no_weight_decay()``)."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        own = [name for name, _ in module.named_parameters(recurse=False)]
        if not own:
            continue
        roles = getattr(module, "decayed_parameters", None)
        if roles is None:
            roles = next((r for cls, r in BUILTIN_ROLES.items() if type(module) is cls), None)
        if roles is None:
            raise TypeError(f"{type(module).__name__} has parameters ({', '.join(own)}) but does not declare which "
                            "of them weight decay applies to (a decayed_parameters class attribute)")
        names.update(f"{prefix}.{name}" if prefix else name for name in own if name in roles)
    return names
