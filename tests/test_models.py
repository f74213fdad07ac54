"""Every registered model: forward shape, backward, state-dict round trip, structure seeds, description."""
import math

import pytest
import torch

import pkmixer
from pkmixer.models.registry import model_entry

from test_contract import small_overrides

# the largest models run at depth 2 by default (same widths); full depth under -m slow
BIG = {"mixer_l32_224", "mixer_l16_224", "mixer_h14_224"}
ALL = pkmixer.list_models()


def _build(name: str, **overrides) -> torch.nn.Module:
    if name in BIG:
        overrides.setdefault("depth", 2)
    return pkmixer.create_model(name, **overrides)


def _has_random_structure(model: torch.nn.Module) -> bool:
    return any(n.endswith(("in_index", "out_index", "mask", "indices")) for n, _ in model.named_buffers())


def _structure(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: b for n, b in model.named_buffers() if n.endswith(("in_index", "out_index", "mask", "indices"))}


def _input(model: torch.nn.Module, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, model.in_chans, model.img_size, model.img_size)


def _check_model(name: str, **overrides) -> None:
    model = _build(name, **overrides)
    x = _input(model)
    out = model(x)
    assert out.shape == (2, model.num_classes)
    assert torch.isfinite(out).all()
    # the head starts at zero (Listing 1); give it weights so gradients reach every layer
    torch.nn.init.normal_(model.head.weight, std=0.1)
    model(x).square().mean().backward()
    for n, p in model.named_parameters():
        assert p.grad is not None, f"{n} got no gradient"
        assert torch.isfinite(p.grad).all(), n
        assert p.grad.abs().sum() > 0, f"{n} got a zero gradient"  # the stem and the first layer included

    # state dict round trip into a model with other random structure keeps permutations and masks
    model.eval()
    state = model.state_dict()
    other = _build(name, **overrides, structure_seed=123) if "structure_seed" in model_entry(name).accepted() \
        else _build(name, **overrides)
    other.load_state_dict(state)
    other.eval()
    for key, buf in _structure(model).items():
        assert torch.equal(dict(other.named_buffers())[key], buf)
    with torch.no_grad():
        assert torch.equal(other(x), model(x))


@pytest.mark.parametrize("name", ALL)
def test_registered_model(name):
    """Every registered model at a small size (tests/test_contract.py: S₀ = 16, 2 blocks, C = 8, ...)."""
    _check_model(name, **small_overrides(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_registered_model_at_its_size(name):
    """Every registered model at its registered size (the largest at depth 2; full depth below)."""
    _check_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BIG))
def test_big_model_full_depth(name):
    _check_model(name, depth=model_entry(name).defaults["depth"])


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith(("rp_", "swmlp_"))] + ["mixer_s16_224"])
def test_structure_seed(name):
    extra = {} if name.startswith(("rp_", "swmlp_")) else {"img_size": 64, "depth": 3, "rp_blocks": [0, 2]}
    a = _build(name, structure_seed=0, **extra)
    b = _build(name, structure_seed=0, **extra)
    c = _build(name, structure_seed=1, **extra)
    sa, sb, sc = _structure(a), _structure(b), _structure(c)
    assert sa and sa.keys() == sb.keys() == sc.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(sa[k].shape != sc[k].shape or not torch.equal(sa[k], sc[k]) for k in sa)


def test_only_chosen_blocks_are_rp():
    model = pkmixer.create_model("smixer_c64p4_32", depth=4, rp_blocks=[0, -1])
    assert [blk.token.mixing.permuted for blk in model.blocks] == [True, False, False, True]
    assert [blk.channel.mixing.permuted for blk in model.blocks] == [True, False, False, True]
    assert sum(1 for n, _ in model.named_buffers() if n.endswith("_index")) == 8


def test_published_sizes():
    """Tolstikhin et al. Table 1 sizes and parameter counts (timm's mixer_* agree)."""
    sizes = {name: pkmixer.create_model(name, depth=1) for name in ["mixer_s16_224"]}
    assert sizes["mixer_s16_224"].token_hidden == 256 and sizes["mixer_s16_224"].channel_hidden == 2048
    with torch.device("meta"):
        b16 = pkmixer.create_model("mixer_b16_224").info()
        s16 = pkmixer.create_model("mixer_s16_224").info()
    assert b16.params == 59_880_472  # "59.9M"
    assert s16.params == 18_528_264  # "18.5M"
    assert (b16.num_tokens, b16.embed_dim, b16.effective_width, b16.max_width) == (196, 768, 150528, 602112)
    assert b16.connections == pytest.approx(2.6e8, rel=0.01)  # Hayase & Karakida Table 1, Mixer-B/16


def _eq14(info) -> float:
    """Ω per mixing layer of Eq. 14, with γ_token and γ_channel apart: (γ_t C S² + γ_c C² S) / 2 (γ = 1: S-Mixer)."""
    S, C = info.num_tokens, info.embed_dim
    gamma_t, gamma_c = info.gamma_token or 1.0, info.gamma_channel or 1.0
    return (gamma_t * C * S * S + gamma_c * C * C * S) / 2


def _eq14_applies(model) -> bool:
    """Eq. 14 counts blocks that keep S tokens with token MLPs of S inputs: not a first block that maps S₀ -> S,
    a pyramid, or grouped channels (an (S·G)-input token MLP). Untied token MLPs have as many weights as one."""
    return (model.info().family in ("MLP-Mixer", "S-Mixer") and set(model.token_schedule) == {model.grid_tokens}
            and model.token_mixing.groups == 1 and not model.token_mixing.options()["group_views"])


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith(("mixer_", "smixer_", "rp_mixer_", "rp_smixer_"))])
def test_registered_mixers_follow_eq14(name):
    """Ω = γ(CS² + C²S)/2 per layer for every registered Mixer it applies to; the others are the pyramid,
    grouped-channel and S₀ -> S models, whose own counts are checked in tests/test_ablations.py and below."""
    with torch.device("meta"):
        model = pkmixer.create_model(name)
    if not _eq14_applies(model):
        assert model.token_ablations or model.num_tokens != model.grid_tokens, name
        return
    info = model.info()
    assert info.connections == pytest.approx(_eq14(info), rel=1e-12)
    assert info.effective_width == info.num_tokens * info.embed_dim


@pytest.mark.parametrize("S, C, gamma", [(16, 24, 2.0), (30, 12, 1.0), (7, 5, 4.0)])
def test_connections_follow_eq14_after_a_token_projection(S, C, gamma):
    """Any S, square or not: the first block maps S₀ = 64 -> S (App. A.2.4), the second keeps S, and its effective
    layers (explicit matrices) have Ω = γ(CS² + C²S)/2 non-zeros on average (Eq. 14)."""
    from pkmixer.theory.effective import effective_mlp

    model = pkmixer.create_model("mixer_c64d3p4_32", depth=2, embed_dim=C, num_tokens=S, mlp_ratio=gamma)
    info = model.info()
    assert info.effective_width == S * C and info.num_tokens == S
    second = [layer for layer in effective_mlp(model.double().eval()).layers() if layer.name.startswith("blocks.1.")]
    assert len(second) == 4
    assert sum(layer.weight._nnz() for layer in second) / 4 == gamma * (C * S * S + C * C * S) / 2
    # the first block's token MLP reads S₀ = 64 tokens, so the model's mean Ω is not Eq. 14's
    assert info.connections != pytest.approx(_eq14(info))


def test_other_families_follow_eq13():
    s = pkmixer.create_model("smixer_c64p4_32").info()
    assert s.connections == (64 * 64 ** 2 + 64 ** 2 * 64) / 2  # S-Mixer: γ = 1
    sw = pkmixer.create_model("swmlp_m1619p4_32").info()
    assert sw.connections == pytest.approx(0.1 * 1619 ** 2, rel=0.01)  # Ω = p γ m² (Eq. 13)
    assert sw.density == pytest.approx(0.1, rel=0.01)


def test_sparse_and_masked_swmlp_agree():
    torch.manual_seed(0)
    a = pkmixer.create_model("swmlp_t4_28", weight_format="sparse")
    torch.manual_seed(0)
    b = pkmixer.create_model("swmlp_t4_28", weight_format="masked")
    x = torch.randn(3, 1, 28, 28)
    torch.nn.init.normal_(a.head.weight)
    b.head.weight.data.copy_(a.head.weight)
    ya, yb = a(x), b(x)
    # The two formats sum in different orders, and the logits reach ~90 with this head: fp32 rounding depends on
    # the CPU's kernels (AVX-512 gave 4e-5), so the tolerance scales with the logits; a wrong mask is off by O(1).
    scale = ya.abs().max().item()
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-5 * scale)
    assert a.info().params == b.info().params


def test_intermediates():
    model = pkmixer.create_model("mixer_c64d3p4_32").eval()
    x = _input(model)
    final, blocks = model.forward_intermediates(x)
    assert len(blocks) == 3 and all(t.shape == (2, 64, 64) for t in blocks)
    assert torch.equal(final, model.forward_features(x))
    mixing = model.forward_intermediates(x, where="mixing", intermediates_only=True)
    assert len(mixing) == 6 == len(model.feature_names("mixing"))
    # block output = channel-branch + (token-branch + block input): check block 0 by hand
    h = model.forward_stem(x)
    u = h + model.blocks[0].token.mixing(model.blocks[0].token.norm(h))
    assert torch.allclose(mixing[0], u - h, atol=1e-6)
    assert torch.allclose(blocks[0], u + mixing[1], atol=1e-6)
    assert len(model.forward_intermediates(x, indices=2, intermediates_only=True)) == 2
    sw = pkmixer.create_model("swmlp_t4_28").eval()
    feats = sw.forward_intermediates(torch.randn(2, 1, 28, 28), indices=[0, -1], where="mixing", intermediates_only=True)
    assert [f.shape for f in feats] == [(2, 784), (2, 784)]


def test_hidden_width_overrides():
    # γ replaces Table 1's explicit widths of an original variant; an explicit width wins on its own axis
    m = pkmixer.create_model("mixer_s16_224", img_size=32, patch_size=8, depth=1, mlp_ratio=2)
    assert (m.token_hidden, m.channel_hidden) == (32, 1024)
    m = pkmixer.create_model("mixer_c64d3p4_32", depth=1, token_hidden=7)
    assert (m.token_hidden, m.channel_hidden) == (7, 128)
    m = pkmixer.create_model("mixer_s16_224", img_size=32, patch_size=8, depth=1, channel_hidden=100)
    assert (m.token_hidden, m.channel_hidden) == (256, 100)
    with pytest.raises(pkmixer.ConfigError, match="no hidden layer"):
        pkmixer.create_model("smixer_c64p4_32", mlp_ratio=2)


def test_mixer_gelu_tanh_is_listing1s_activation():
    """act="gelu_tanh" is Flax's nn.gelu (Listing 1): the tanh approximation; the default stays the exact GELU."""
    exact = pkmixer.create_model("mixer_c64d3p4_32", depth=1).eval()
    tanh = pkmixer.create_model("mixer_c64d3p4_32", depth=1, act="gelu_tanh").eval()
    assert (exact.activation, tanh.activation) == ("gelu", "gelu_tanh")
    act = tanh.blocks[0].token.mixing.mlp.act
    assert isinstance(act, torch.nn.GELU) and act.approximate == "tanh"
    assert exact.blocks[0].channel.mixing.mlp.act.approximate == "none"
    z = torch.linspace(-4, 4, 101, dtype=torch.float64)
    flax_gelu = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))  # jax.nn.gelu
    assert torch.allclose(act(z), flax_gelu, rtol=0, atol=1e-15)
    tanh.load_state_dict(exact.state_dict())  # same parameters, another network
    torch.nn.init.normal_(exact.head.weight), tanh.head.weight.data.copy_(exact.head.weight)
    x = _input(exact)
    with torch.no_grad():
        assert not torch.allclose(exact(x), tanh(x), rtol=0, atol=1e-7)
    with pytest.raises(pkmixer.ConfigError, match="gelu_tanh"):
        pkmixer.create_model("mixer_c64d3p4_32", act="tanh")


def test_swmlp_has_no_head_norm_but_old_checkpoints_keep_theirs(tmp_path):
    """App. A.2.5: no LayerNorm before the classifier. A checkpoint records head_norm; one written before the
    option existed (no key) was a model with the norm, and loads as one."""
    from pkmixer.models.convert import import_checkpoint
    from pkmixer.checkpoint import read_checkpoint, save_model
    from pkmixer.models.restore import checkpoint_overrides, load_model

    new = pkmixer.create_model("swmlp_t4_28", depth=2)
    assert not new.head_norm and isinstance(new.norm, torch.nn.Identity) and "norm.weight" not in new.state_dict()
    with_norm = pkmixer.create_model("swmlp_t4_28", depth=2, head_norm=True)
    assert isinstance(with_norm.norm, torch.nn.LayerNorm)
    assert with_norm.info().params - new.info().params == 2 * new.width
    with pytest.raises(pkmixer.ConfigError, match="head_norm"):
        pkmixer.create_model("swmlp_t4_28", head_norm=1)
    x = torch.randn(2, 1, 28, 28)
    # a new checkpoint records head_norm=False among its arguments; it loads as the model it was, spec unchanged
    path = save_model(tmp_path / "new.pt", new)
    written = torch.load(path, weights_only=True)
    assert written["overrides"] == {"depth": 2} and written["arguments"]["head_norm"] is False
    assert load_model(path).spec == new.spec and not load_model(path).head_norm
    # an old-style checkpoint: a model with the final norm, saved without the key
    torch.nn.init.normal_(with_norm.head.weight)
    torch.nn.init.normal_(with_norm.norm.weight)
    old = torch.load(save_model(tmp_path / "tmp.pt", with_norm), weights_only=True)
    assert old["overrides"].pop("head_norm") is True
    del old["arguments"]  # a file from before the option existed recorded neither
    torch.save(old, tmp_path / "old.pt")
    assert read_checkpoint(tmp_path / "old.pt")["overrides"] == {"depth": 2}  # the file as written
    assert checkpoint_overrides("swmlp_t4_28", {"depth": 2}) == {"depth": 2, "head_norm": True}
    for loaded in (load_model(tmp_path / "old.pt"), import_checkpoint(tmp_path / "old.pt").model):
        assert loaded.head_norm and torch.equal(loaded.norm.weight, with_norm.norm.weight)
        with torch.no_grad():
            assert torch.equal(loaded.eval()(x), with_norm.eval()(x))
        # written again, it states the norm explicitly
        again = torch.load(save_model(tmp_path / "again.pt", loaded, overwrite=True), weights_only=True)
        assert again["overrides"]["head_norm"] is True


@pytest.mark.parametrize("head_norm", [False, True])
def test_swmlp_equals_its_effective_mlp_with_and_without_head_norm(head_norm):
    from pkmixer.theory.effective import effective_mlp

    from conftest import perturb_, rel_err

    model = perturb_(pkmixer.create_model("swmlp_t4_28", depth=2, head_norm=head_norm).double().eval())
    x = torch.randn(3, 1, 28, 28, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(effective_mlp(model)(x), model(x)) < 1e-10


def test_table1_states_the_three_gammas_of_mixer_bw():
    """Table 1's Ω 2.6e8 and max width 6.2e5 imply γ ≈ 4.1, Table S.3's caption says γ = 4, App. C.3 (ours)
    4.57: the table1 report states all three with the Ω and width each gives."""
    from pkmixer.experiments import get_preset
    from pkmixer.experiments.presets.table1 import bw_gamma_readings

    table, s3, c3 = bw_gamma_readings()
    S, C = 256, 588
    assert table["gamma_from_omega"] == pytest.approx(2.6e8 / ((C * S * S + C * C * S) / 2), abs=1e-3) == 4.093
    assert table["gamma_from_width"] == pytest.approx(4.119, abs=1e-3) and round(table["gamma"], 1) == 4.1
    assert (s3["gamma"], s3["omega"], s3["max_width"]) == (4.0, 254_091_264, 602_112)  # Table S.3's Ω
    # γ = 4.57 with D_S, D_C rounded down gives App. C.5's Ω = 290 217 984 exactly
    assert (c3["gamma"], c3["omega"], c3["max_width"]) == (4.57, 290_217_984, 687_872)
    base = {"dataset": "imagenet", "P": 16, "S": 196, "C": 768, "gamma": 4.0, "blocks": 12, "max_width": 602112,
            "omega": 2.6e8, "connections": 1.0, "status": "finished"}
    rows = [{**base, "model": "Mixer-B/16", "run": "b", "seed": 0, "final_test_error": 0.24},
            {**base, "model": "Mixer-B-W", "run": "w", "seed": 0, "final_test_error": 0.23, "max_width": 687872}]
    analysis = get_preset("table1").analyze(rows, None, "paper")
    assert analysis.numbers["Mixer-B-W γ, Table 1"].endswith("imply γ ≈ 4.09 (from Ω) and 4.12 (from the width)")
    assert analysis.numbers["Mixer-B-W γ, Table S.3 caption"] == "γ = 4: Ω 2.541e+08, max width 6.021e+05"
    assert analysis.numbers["Mixer-B-W γ, App. C.3 (this run)"] == "γ = 4.57: Ω 2.902e+08, max width 6.879e+05"
    assert len(analysis.tables["table1_bw_gamma"]) == 3 and "γ ≈ 4.1" in analysis.verdict
    cifar = [{**r, "model": m} for r, m in zip(rows, ("Mixer-SS/8", "Mixer-SS-W"))]
    assert not any("γ" in k for k in get_preset("table1").analyze(cifar, None, "paper").numbers)


def _module_imports(path, top_level_only: bool) -> set[str]:
    """The modules of pkmixer.models that a file of the package imports (relative imports)."""
    import ast

    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {a.name for a in node.names}
    return found


def test_the_models_package_imports_in_one_direction():
    """The registry (naming and creation), the zoo, the build budget, the timm glue and the weights import each
    other in one direction: no module of pkmixer.models reaches itself through module-level imports, and the
    models' timm mixin (timm_api) imports no registry at all, not even inside a function."""
    from pathlib import Path

    folder = Path(pkmixer.models.__file__).parent
    graph = {p.stem: _module_imports(p, top_level_only=True) for p in folder.glob("*.py") if p.stem != "__init__"}

    def reach(start, seen):
        for nxt in graph.get(start, ()):
            if nxt not in seen:
                seen.add(nxt)
                reach(nxt, seen)
        return seen

    assert [m for m in graph if m in reach(m, set())] == []
    assert not {"registry", "zoo", "timm_registry", "weights"} & _module_imports(folder / "timm_api.py", False)
    assert "zoo" not in _module_imports(folder / "registry.py", False)  # the zoo registers into the registry
