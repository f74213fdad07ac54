"""A registered model against its explicit effective wide MLP (Hayase & Karakida Sec. 3, Prop. 3.2, Cor. 3.4,
Eq. 19): what ``pkmixer effective`` prints. The model is built in float64 with its head drawn non-zero, the
effective MLP is built from it by :func:`pkmixer.theory.effective.effective_mlp`, and both run on the same
Gaussian inputs."""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError
from ..models.registry import create_model
from ..theory.effective import effective_mlp

# explicit sparse matrices in float64 beyond this many non-zeros take too long and too much memory
MAX_EFFECTIVE_NNZ = 50_000_000


def check_effective_size(name: str, overrides: dict[str, Any]) -> Any:
    """The model's :class:`~pkmixer.models.info.ModelInfo` (built on the meta device: no memory), refused when its
    effective MLP has more non-zeros than explicit matrices can hold (:data:`MAX_EFFECTIVE_NNZ`)."""
    with torch.device("meta"):
        info = create_model(name, **overrides).info()
    check_effective_nnz(info, name, "; shrink it, e.g. --set depth=2 --set embed_dim=32 --set img_size=32")
    return info


def check_effective_nnz(info, what: str, hint: str = "; use a smaller model") -> None:
    """Refuse a model whose effective MLP has more non-zeros than explicit matrices can hold."""
    total = info.connections * info.mixing_layers
    if total > MAX_EFFECTIVE_NNZ:
        raise ConfigError(f"{what} has about {total:.2g} effective connections, too many for explicit matrices "
                          f"(limit {MAX_EFFECTIVE_NNZ:.0e}){hint}")


def effective_check(name: str, overrides: dict[str, Any], batch: int = 4, seed: int = 0) -> dict[str, Any]:
    """Build ``name`` with ``overrides`` (seeded, float64, eval mode, a non-zero head) and its effective MLP, run
    both on ``batch`` Gaussian inputs: ``{"model", "overrides", "effective_width", "relative_error", "layers":
    [{"name", "shape", "nnz", "density"}, ...]}``."""
    info = check_effective_size(name, overrides)
    torch.manual_seed(seed)
    model = create_model(name, **overrides).double().eval()
    torch.nn.init.normal_(model.head.weight, std=model.head.in_features ** -0.5)  # non-zero logits to compare
    x = torch.randn(batch, model.in_chans, model.img_size, model.img_size, dtype=torch.float64)
    eff = effective_mlp(model)
    with torch.no_grad():
        ours, wide = model(x), eff(x)
    rel = float((wide - ours).norm() / ours.norm())
    layers = [{"name": l.name, "shape": list(l.weight.shape), "nnz": int(l.weight._nnz()), "density": l.density}
              for l in eff.layers()]
    return {"model": name, "overrides": overrides, "effective_width": info.effective_width, "relative_error": rel,
            "layers": layers}
