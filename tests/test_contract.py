"""The model contract (pkmixer.models.contract, docs/architecture.md): every registered model, at a small size,
follows it - equals its effective wide MLP in float64 and has analytic MACs equal to torch's FLOP counter -, and a
family defined and registered here, in the test, works with the effective MLP, cost accounting, weight pictures
and CKA without any change to those modules."""
import inspect

import numpy as np
import pytest
import torch
from torch import nn

import pkmixer
from pkmixer.analysis.cka import cka_matrix
from pkmixer.analysis.cost import layer_costs, measured_macs, model_cost
from pkmixer.analysis.visualize import effective_pattern, visualize
from pkmixer.layers.ablations import GroupedTokenMixing
from pkmixer.layers.pk import PKMixing
from pkmixer.layers.sparse import SparseLinear
from pkmixer.models import Mixer, ModelInfo, ShallowMLP, SWMLP, contract, registry
from pkmixer.models.features import check_where, select_indices
from pkmixer.models.mixer import Pyramid
from pkmixer.models.registry import model_entry
from pkmixer.theory.effective import (EffectiveLinear, EffectiveMLP, EffectiveResidual, effective_mlp, kron_identity,
                                      unvec, vec, vec_layer_norm)

from conftest import perturb_, rel_err

ALL = pkmixer.list_models()
TOL = 1e-10


def _default(entry, key):
    return entry.defaults.get(key, inspect.signature(entry.cls).parameters[key].default)


def small_overrides(name: str) -> dict:
    """At most ~10⁴ effective connections per layer for any registered model, whatever its size: S₀ = 16
    patches, 2 blocks, C = 8 (a Mixer) or m = 64 / 40 (an SW-MLP), 8x8 images (a shallow MLP). The options a
    variant sets (explicit hidden widths, S ≠ S₀, a pyramid, an SW-MLP width) are kept, at small values."""
    entry = model_entry(name)
    d = entry.defaults
    if issubclass(entry.cls, Mixer):
        out = dict(img_size=4 * _default(entry, "patch_size"), depth=2, embed_dim=8)
        out.update({k: v for k, v in (("token_hidden", 6), ("channel_hidden", 12)) if d.get(k) is not None})
        if isinstance(d.get("num_tokens"), Pyramid):
            out["num_tokens"] = Pyramid(16, 9)  # a supp. A.1 pyramid: S = 16, then 9
        elif d.get("num_tokens") is not None:
            out["num_tokens"] = 20  # S₀ = 16 -> S = 20: the App. A.2.4 skip layer
        return out
    if issubclass(entry.cls, SWMLP):
        out = dict(img_size=4 * _default(entry, "patch_size"), depth=2, embed_dim=4, density=0.3)
        if d.get("width") is not None:
            out["width"] = 40  # d₀ = 64 -> m = 40: the sparse input layer
        return out
    if issubclass(entry.cls, ShallowMLP):
        return dict(img_size=8)
    raise AssertionError(f"{name}: a family with no small size here; add one to small_overrides")


def test_every_registered_model_has_a_small_size():
    for name in ALL:
        with torch.device("meta"):
            info = pkmixer.create_model(name, **small_overrides(name)).info()
        assert info.connections <= 10_000, name


@pytest.mark.parametrize("name", ALL)
def test_follows_the_contract(name):
    model = pkmixer.create_model(name, **small_overrides(name)).eval()
    assert isinstance(model, contract.ModelFamily)
    assert set(contract.rows_per_image(model)) <= set(model.modules())
    x = torch.randn(2, model.in_chans, model.img_size, model.img_size)
    for where in ("block", "mixing"):
        feats = model.forward_intermediates(x, where=where, intermediates_only=True)
        assert len(feats) == len(model.feature_names(where)) and all(f.shape[0] == 2 for f in feats)
    for mixing in (m for m in model.modules() if isinstance(m, (PKMixing, GroupedTokenMixing))):
        assert isinstance(mixing, contract.PKLayer) and isinstance(mixing.mlp, contract.MixingMlp)


@pytest.mark.parametrize("name", ALL)
def test_equals_its_effective_mlp(name):
    """Prop. 3.2 / Eq. 19 / Cor. 3.4 for every registered model: the model is its effective wide MLP (float64),
    whose hidden layers are the ones info() counts, with Ω non-zeros each on average."""
    model = perturb_(pkmixer.create_model(name, **small_overrides(name)).double().eval())
    x = torch.randn(3, model.in_chans, model.img_size, model.img_size, dtype=torch.float64)
    eff = effective_mlp(model)
    with torch.no_grad():
        assert rel_err(eff(x), model(x)) < TOL
    info, layers = model.info(), eff.layers()
    assert len(layers) == info.mixing_layers and all(layer.weight.is_sparse for layer in layers)
    assert sum(layer.weight._nnz() for layer in layers) / len(layers) == pytest.approx(info.connections, rel=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_macs_equal_the_flop_counter(name):
    """Analytic MACs (the layers' declarations) against torch's FlopCounterMode, on the meta device; torch does
    not count sparse products, which cost their kept weights."""
    with torch.device("meta"):
        model = pkmixer.create_model(name, **small_overrides(name))
    costs = layer_costs(model)
    assert sum(c.macs for c in costs if c.kind != "sparse") == measured_macs(model)
    sparse = [m for m in model.modules() if isinstance(m, SparseLinear)]
    assert sum(c.macs for c in costs if c.kind == "sparse") == sum(m.nnz for m in sparse)
    assert model_cost(model).macs == sum(c.macs for c in costs)


# ---- a family defined here ------------------------------------------------------------------------------------


class TokenDense(nn.Module):
    """W X + b 1ᵀ on (B, S, C): one Dense over the tokens, a layer that only declares the contract."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(tokens, tokens) / tokens ** 0.5)
        self.bias = nn.Parameter(torch.zeros(tokens))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, S, C) -> (B, S, C)
        return torch.einsum("ts,bsc->btc", self.weight, x) + self.bias[:, None]

    def matmul_cost(self) -> tuple[str, int, int, int]:
        S = self.weight.shape[0]
        return "linear", S, S, S * S

    def dense_weight(self) -> torch.Tensor:
        return self.weight


class DenseTokenMixer(nn.Module):
    """A one-block family: per-patch stem, x + φ(W LN(x)) over tokens, mean pooling and a head; effective MLP
    vec(X) -> vec(X) + φ((I_C ⊗ W) vec(LN X) + b ⊗ 1)."""

    def __init__(self, *, img_size: int = 16, patch_size: int = 4, in_chans: int = 3, num_classes: int = 5,
                 embed_dim: int = 6) -> None:
        super().__init__()
        self.img_size, self.in_chans, self.num_classes = img_size, in_chans, num_classes
        self.tokens, self.embed_dim = (img_size // patch_size) ** 2, embed_dim
        self.stem = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)
        self.token = TokenDense(self.tokens)
        self.act = nn.GELU()
        self.head = nn.Linear(embed_dim, num_classes)

    def _stem(self, x):
        return self.stem(x).flatten(2).transpose(1, 2)  # (B, S, C)

    def _block(self, x):
        branch = self.act(self.token(self.norm(x)))
        return x + branch, branch

    def forward_features(self, x):
        return self._block(self._stem(x))[0]

    def forward_head(self, x, pre_logits=False):
        x = x.mean(1)
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))

    def feature_names(self, where="block"):
        return ["blocks.0" if check_where(where) == "block" else "blocks.0.token"]

    def forward_intermediates(self, x, indices=None, *, where="block", norm=False, intermediates_only=False):
        select_indices(1, indices)
        y, branch = self._block(self._stem(x))
        out = [branch if where == "mixing" else y]
        return out if intermediates_only else (y, out)

    def info(self):
        S, C = self.tokens, self.embed_dim
        return ModelInfo(family="dense token mixer", params=sum(p.numel() for p in self.parameters()),
                         num_tokens=S, embed_dim=C, gamma_token=None, gamma_channel=None, depth=1, mixing_layers=1,
                         connections=float(C * S * S), effective_width=S * C, max_width=S * C, density=1 / C)

    def effective_mlp(self):
        S, C = self.tokens, self.embed_dim
        W = contract.dense_weight(self.token).double()
        layer = EffectiveLinear("blocks.0.token", kron_identity(C, W), self.token.bias.detach().double().repeat(C),
                                self.act)
        return EffectiveMLP(lambda images: vec(self._stem(images)),
                            [EffectiveResidual(vec_layer_norm(self.norm, S, C), [layer])],
                            lambda x: self.forward_head(unvec(x, S, C)))

    def rows_per_image(self):
        return {self.stem: self.tokens, self.token: self.embed_dim}

    def patch_unit_weights(self):
        return self.stem.weight

    def token_unit_weights(self, block):
        if block != 0:
            raise pkmixer.ConfigError(f"block must be 0, got {block!r}")
        return self.token.weight


@pytest.fixture
def toy_family(monkeypatch):
    """DenseTokenMixer as one registry entry, for this test only."""
    name = "toy_dense_16"
    monkeypatch.setitem(registry._REGISTRY, name, registry.ModelEntry(
        name, DenseTokenMixer, {"img_size": 16, "embed_dim": 6}, "one block of dense token mixing", "tests"))
    return name


def test_a_new_family_works_with_the_theory_and_the_analysis(toy_family, tmp_path):
    model = perturb_(pkmixer.create_model(toy_family).double().eval())
    assert isinstance(model, contract.ModelFamily) and model.spec.name == toy_family
    S, C = 16, 6
    # the effective MLP: I_C ⊗ W on vec(X), density 1/C (Eq. 8), equal to the model
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64)
    eff = effective_mlp(model)
    with torch.no_grad():
        assert rel_err(eff(x), model(x)) < TOL
    (layer,) = eff.layers()
    assert torch.equal(layer.weight.to_dense(), torch.kron(torch.eye(C, dtype=torch.float64), model.token.weight))
    # cost: the stem once per patch, W once per channel, the head once; torch's counter agrees
    costs = {c.name: c for c in layer_costs(model)}
    assert (costs["stem"].rows, costs["token"].rows, costs["head"].rows) == (S, C, 1)
    assert costs["token"].macs == C * S * S and sum(c.macs for c in costs.values()) == measured_macs(model)
    report = model_cost(model.float())
    assert report.model == "DenseTokenMixer" and report.connections == C * S * S
    # weight pictures: the sparsity pattern of I_C ⊗ W, the token units (4x4 images) and the patch units
    name, pattern = effective_pattern(model.double())
    assert name == "blocks.0.token" and np.array_equal(pattern, np.kron(np.eye(C), np.ones((S, S))))
    for kind, options in [("sparsity", {}), ("token-units", {"num_units": 4}), ("patch-units", {})]:
        assert visualize(kind, tmp_path / f"{kind}.png", model=model, **options).stat().st_size > 1000
    # CKA against a registered family, through forward_intermediates only
    other = pkmixer.create_model("smixer_t4_28", img_size=16, in_chans=3, depth=1, embed_dim=8)
    batches = [torch.randn(8, 3, 16, 16) for _ in range(2)]
    result = cka_matrix(model.float(), other, batches, where="mixing")
    assert result.names_a == ["blocks.0.token"] and result.matrix.shape == (1, 2)
    assert np.all(np.isfinite(result.matrix)) and abs(cka_matrix(model, model, batches).matrix[0, 0] - 1) < 1e-9


def test_what_breaks_the_contract_is_named():
    with pytest.raises(pkmixer.ConfigError, match="model contract.*Linear lacks effective_mlp"):
        model_cost(nn.Linear(2, 2))
    with pytest.raises(pkmixer.ConfigError, match="model B \\(Linear\\) lacks feature_names"):
        cka_matrix(DenseTokenMixer(), nn.Linear(2, 2), [torch.randn(4, 3, 16, 16)])
    with pytest.raises(TypeError, match="no effective MLP for Linear"):
        effective_mlp(nn.Linear(2, 2))

    class Undeclared(DenseTokenMixer):
        def rows_per_image(self):
            return {}

    with pytest.raises(pkmixer.ConfigError, match="Conv2d runs once per output position"):
        layer_costs(Undeclared())
    with pytest.raises(pkmixer.ConfigError, match="token-mixing units need a model with token mixing"):
        visualize("token-units", "t.png", model=pkmixer.create_model("swmlp_t4_28", depth=1))


def test_the_theory_and_the_analysis_name_no_model_or_layer_class():
    """effective.py, cost.py, visualize.py and cka.py read models through the contract only."""
    import ast
    import pathlib

    import pkmixer.layers.ablations, pkmixer.layers.mlp, pkmixer.layers.pk, pkmixer.layers.sparse  # noqa: E401
    import pkmixer.layers.structured
    import pkmixer.models.mixer, pkmixer.models.shallow, pkmixer.models.swmlp  # noqa: E401

    classes = {name for module in (pkmixer.layers.ablations, pkmixer.layers.mlp, pkmixer.layers.pk,
                                   pkmixer.layers.sparse, pkmixer.layers.structured, pkmixer.models.mixer,
                                   pkmixer.models.shallow, pkmixer.models.swmlp)
               for name, obj in vars(module).items() if inspect.isclass(obj) and obj.__module__ == module.__name__}
    assert {"Mixer", "SWMLP", "ShallowMLP", "PKMixing", "GroupedTokenMixing", "SparseLinear"} <= classes
    root = pathlib.Path(pkmixer.__file__).parent
    for path in ("theory/effective.py", "analysis/cost.py", "analysis/visualize.py", "analysis/cka.py"):
        tree = ast.parse((root / path).read_text())
        named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        named |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not named & classes, (path, named & classes)
