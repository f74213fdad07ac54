"""The token-mixing ablations of Mixer supp. A.1 against naive references, their refusals, their sizes, the
plain spelling that create_model and checkpoints use for the injected factories, and a short training run of
each registered ablation model."""
import inspect
import json

import pytest
import torch
import torch.nn.functional as F

import pkmixer
from pkmixer.analysis.cost import layer_costs, measured_macs
from pkmixer.cli import main
from pkmixer.layers.ablations import BatchedFcAct, BatchedMlp, GroupedTokenMixing
from pkmixer.layers.mlp import FcAct, Mlp
from pkmixer.layers.pk import PKMixing
from pkmixer.layers.token_mixing import GroupedTokens, TiedTokens, UntiedTokens
from pkmixer.models import Mixer
from pkmixer.models.convert import to_timm
from pkmixer.models.mixer import Pyramid, TokenProjectionSkip
from pkmixer.models.spellings import PLAIN_OPTIONS
from pkmixer.models.registry import model_entry
from pkmixer.models.resolution import enlarged_state_dict
from pkmixer.train import loop
from pkmixer.train.config import build_config

from conftest import perturb_, rel_err

TOL = 1e-12  # float64 comparisons
ABLATION_MODELS = [n for n in pkmixer.list_models() if model_entry(n).source == "Tolstikhin et al. 2021, supp. A.1"]
SMALL = dict(img_size=16, patch_size=4, in_chans=1, num_classes=5, embed_dim=8, depth=2, norm_eps=1e-5)  # S0 = 16


def small(**options) -> Mixer:
    return perturb_(Mixer(**{**SMALL, **options}).double().eval())


def test_registered_ablations():
    assert ABLATION_MODELS == ["mixer_grouped_t4_28", "mixer_pyramid_t4_28", "mixer_untied_t4_28", "mixer_views_t4_28"]
    assert {n: pkmixer.create_model(n).token_ablations for n in ABLATION_MODELS} == {
        "mixer_grouped_t4_28": ("channel_groups",), "mixer_pyramid_t4_28": ("token_schedule",),
        "mixer_untied_t4_28": ("untied_tokens",), "mixer_views_t4_28": ("channel_groups", "group_views")}
    assert pkmixer.create_model("mixer_t4_28").token_ablations == ()


# ---- each option against a naive reading of the seed --------------------------------------------------------


@pytest.mark.parametrize("block", ["mlp", "fc"])
def test_untied_equals_separate_mlps_per_channel(block):
    """C separate MLPs with independent weights, the c-th applied to column c of X (supp. A.1, "untying")."""
    model = small(block=block, token_mixing=UntiedTokens(), **({"mlp_ratio": 1.5} if block == "mlp" else {}))
    mixing = model.blocks[1].token.mixing
    assert isinstance(mixing, PKMixing) and isinstance(mixing.mlp, BatchedMlp if block == "mlp" else BatchedFcAct)
    S, C = 16, 8
    refs = []
    for c in range(C):
        ref = (Mlp(S, 24, S, torch.nn.GELU) if block == "mlp" else FcAct(S, None, S, torch.nn.GELU)).double()
        for lin, batched in zip(ref.linears(), mixing.mlp.linears()):
            lin.weight.data.copy_(batched.weight[c])
            lin.bias.data.copy_(batched.bias[c])
        refs.append(ref)
    X = torch.randn(3, S, C, dtype=torch.float64)
    expected = torch.stack([refs[c](X[:, :, c]) for c in range(C)], dim=2)  # column by column
    with torch.no_grad():
        assert rel_err(mixing(X), expected) < TOL
    first = mixing.mlp.linears()[0].weight
    assert not torch.equal(first[0], first[1])  # independent weights, not copies
    tied = sum(p.numel() for p in Mixer(**SMALL, block=block, **({"mlp_ratio": 1.5} if block == "mlp" else {}))
               .blocks[1].token.mixing.parameters())
    assert sum(p.numel() for p in mixing.parameters()) == C * tied  # "multiplying the number of parameters by C"


def naive_grouped(X: torch.Tensor, G: int, mlp, S_out: int, views: torch.Tensor | None = None) -> torch.Tensor:
    """Supp. A.1 written out for one X ∈ R^{S×C}: G views (rows g::G of A) or G neighbouring columns per vector."""
    S, C = X.shape
    if views is None:
        columns = [torch.cat([X[:, k * G + g] for g in range(G)]) for k in range(C // G)]
    else:
        view = [X @ views[g::G].t() for g in range(G)]  # G maps R^C -> R^{C/G} applied to every token: (S, C/G)
        columns = [torch.cat([view[g][:, k] for g in range(G)]) for k in range(C // G)]
    XG = torch.stack(columns, dim=1)  # (S·G, C/G)
    YG = torch.stack([mlp[k](XG[:, k]) if isinstance(mlp, list) else mlp(XG[:, k]) for k in range(C // G)], dim=1)
    Y = torch.empty(S_out, C, dtype=X.dtype)
    for k in range(C // G):
        for g in range(G):
            Y[:, k * G + g] = YG[g * S_out:(g + 1) * S_out, k]
    return Y


@pytest.mark.parametrize("views", [False, True])
@pytest.mark.parametrize("G,S_out,untied", [(2, 16, False), (4, 16, False), (4, 9, False), (2, 9, True)])
def test_grouped_and_views_equal_the_naive_reshape(G, S_out, untied, views):
    model = small(token_mixing=GroupedTokens(G, views=views, untied=untied), num_tokens=Pyramid(S_out, S_out),
                  mlp_ratio=1.5)
    mixing = model.blocks[0].token.mixing
    assert isinstance(mixing, GroupedTokenMixing) and (mixing.views is not None) == views
    assert (mixing.other, mixing.in_features, mixing.out_features) == (8 // G, 16 * G, S_out * G)
    if untied:  # one MLP per group of channels: the k-th as a plain Mlp
        mlp = []
        for k in range(8 // G):
            ref = Mlp(16 * G, int(1.5 * S_out * G), S_out * G, torch.nn.GELU).double()
            for lin, batched in zip(ref.linears(), mixing.mlp.linears()):
                lin.weight.data.copy_(batched.weight[k])
                lin.bias.data.copy_(batched.bias[k])
            mlp.append(ref)
    else:
        mlp = mixing.mlp
    X = torch.randn(2, 16, 8, dtype=torch.float64)
    A = None if not views else mixing.views.weight
    with torch.no_grad():
        expected = torch.stack([naive_grouped(x, G, mlp, S_out, A) for x in X])
        assert rel_err(mixing(X), expected) < TOL


def test_one_group_is_the_normal_token_mixing():
    mlp = Mlp(16, 20, 9, torch.nn.GELU).double()
    X = torch.randn(3, 16, 8, dtype=torch.float64)
    grouped, normal = GroupedTokenMixing(mlp, 8, 1, 16, 9), PKMixing(mlp, "token", 8, 16, 9)
    with torch.no_grad():
        assert rel_err(grouped(X), normal(X)) < TOL


def test_pyramid_shapes_and_projection_skips():
    model = small(depth=4, num_tokens=Pyramid(16, 9, 9, 4), mlp_ratio=2.0)
    skips = [blk.token.skip for blk in model.blocks]
    assert skips[0] is None and skips[2] is None  # S unchanged: identity skip
    assert [(s.proj.in_features, s.proj.out_features) for s in (skips[1], skips[3])] == [(16, 9), (9, 4)]
    assert [blk.token.mixing.mlp.fc1.out_features for blk in model.blocks] == [32, 18, 18, 8]  # D_S = γ·S_out
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        final, feats = model.forward_intermediates(x)
        branches = model.forward_intermediates(x, where="mixing", intermediates_only=True)
        assert [tuple(f.shape) for f in feats] == [(2, 16, 8), (2, 9, 8), (2, 9, 8), (2, 4, 8)]
        assert [tuple(f.shape[1:]) for f in branches] == [(16, 8), (16, 8), (9, 8), (9, 8), (9, 8), (9, 8), (4, 8),
                                                          (4, 8)]
        assert final.shape == (2, 4, 8) and model(x).shape == (2, 5)
        # the skip of a reducing block is LN(W̃ X) (App. A.2.4, S.15), added to the token branch
        sub, h = model.blocks[1].token, feats[0]
        W = sub.skip.proj.weight  # (9, 16)
        skip = F.layer_norm(torch.einsum("ts,bsc->btc", W, h), (8,), sub.skip.norm.weight, sub.skip.norm.bias, 1e-5)
        assert rel_err(sub(h), skip + sub.mixing(sub.norm(h))) < TOL
        assert rel_err(sub(h), skip + branches[2]) < TOL
    info = model.info()
    assert info.tokens_per_block == (16, 9, 9, 4) and info.num_tokens == 16 and info.effective_width == 16 * 8
    # project_first (the plain num_tokens=16, token_schedule=[16, 4]) puts the App. A.2.4 skip in block 0 even
    # when S = S0, as num_tokens=S does
    with_skip = small(depth=2, num_tokens=Pyramid(16, 4, project_first=True), mlp_ratio=2.0)
    assert all(isinstance(blk.token.skip, TokenProjectionSkip) for blk in with_skip.blocks)
    assert pkmixer.create_model("mixer_t4_28", img_size=16, depth=2, num_tokens=16, token_schedule=[16, 4]) \
        .blocks[0].token.skip is not None


# ---- the injected factories and their plain spelling ----------------------------------------------------------


def test_the_signature_holds_no_ablation_switches():
    """Mixer takes the supp. A.1 options as objects (token_mixing=, num_tokens=Pyramid(...)), not as keywords;
    create_model still accepts the keywords of the earlier signature (configs, CLI --set, checkpoints)."""
    params = inspect.signature(Mixer).parameters
    assert not set(PLAIN_OPTIONS) & set(params) and params["token_mixing"].default == TiedTokens()
    assert set(PLAIN_OPTIONS) <= set(model_entry("mixer_t4_28").accepted())
    with pytest.raises(TypeError):
        Mixer(**SMALL, untied_tokens=True)


# each registered ablation model and the plain overrides of mixer_t4_28 that built it before the factories
PLAIN_SPELLINGS = {
    "mixer_untied_t4_28": dict(untied_tokens=True),
    "mixer_grouped_t4_28": dict(channel_groups=4),
    "mixer_views_t4_28": dict(channel_groups=4, group_views=True),
    "mixer_pyramid_t4_28": dict(token_schedule=(49, 49, 25, 16)),
}


@pytest.mark.parametrize("name", ABLATION_MODELS)
def test_registered_ablation_is_its_plain_spelling(name):
    """Same modules, state-dict keys, shapes and (under one seed) values as the plain overrides build."""
    torch.manual_seed(0)
    registered = pkmixer.create_model(name, embed_dim=16)
    torch.manual_seed(0)
    plain = pkmixer.create_model("mixer_t4_28", embed_dim=16, **PLAIN_SPELLINGS[name])
    a, b = registered.state_dict(), plain.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert repr(registered) == repr(plain) and registered.token_ablations == plain.token_ablations
    assert plain.spec.overrides == {"embed_dim": 16, **PLAIN_SPELLINGS[name]}


@pytest.mark.parametrize("name,overrides,mixing", [
    ("mixer_t4_28", dict(untied_tokens=True), UntiedTokens()),
    ("mixer_t4_28", dict(channel_groups=4, untied_tokens=True), GroupedTokens(4, untied=True)),
    ("mixer_t4_28", dict(group_views=True), GroupedTokens(1, views=True)),
    ("mixer_views_t4_28", dict(channel_groups=2), GroupedTokens(2, views=True)),  # the entry's views are kept
    ("mixer_views_t4_28", dict(group_views=False, channel_groups=1), TiedTokens()),
    ("mixer_untied_t4_28", dict(untied_tokens=False), TiedTokens()),
    ("rp_smixer_t4_28", dict(untied_tokens=True), UntiedTokens()),
])
def test_plain_options_update_the_entry_s_factory(name, overrides, mixing):
    with torch.device("meta"):
        assert pkmixer.create_model(name, **overrides).token_mixing == mixing


@pytest.mark.parametrize("overrides,tokens,project_first", [
    (dict(token_schedule=(49, 25, 25, 9)), (49, 25, 25, 9), False),
    (dict(num_tokens=36, token_schedule=(36, 25, 25, 9)), (36, 25, 25, 9), True),  # num_tokens: skip in block 0
])
def test_plain_token_schedule_is_a_pyramid(overrides, tokens, project_first):
    with torch.device("meta"):
        model = pkmixer.create_model("mixer_t4_28", **overrides)
        assert model.token_schedule == tokens and model.spec.overrides == overrides
        assert (model.blocks[0].token.skip is not None) == (project_first or tokens[0] != 49)
        # a token_schedule override replaces the pyramid entry's, None drops it
        assert pkmixer.create_model("mixer_pyramid_t4_28", token_schedule=(36, 25, 25, 9)).token_schedule == \
            (36, 25, 25, 9)
        assert pkmixer.create_model("mixer_pyramid_t4_28", token_schedule=None).token_schedule == (49,) * 4


def test_factory_overrides_are_recorded_plain_and_checkpoints_load(tmp_path):
    """A factory given to create_model is recorded in model.spec (so in a checkpoint, which loads with
    weights_only=True) in the plain spelling, and the file rebuilds the same model."""
    from pkmixer.checkpoint import save_model
    from pkmixer.models.restore import load_model

    model = pkmixer.create_model("mixer_t4_28", embed_dim=16, token_mixing=GroupedTokens(2, views=True, untied=True),
                                 num_tokens=Pyramid(49, 36, 36, 25))
    assert model.spec.overrides == {"embed_dim": 16, "untied_tokens": True, "channel_groups": 2, "group_views": True,
                                    "num_tokens": None, "token_schedule": (49, 36, 36, 25)}
    torch.nn.init.normal_(model.head.weight, std=0.1)
    loaded = load_model(save_model(tmp_path / "m.pt", model)).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))
    assert loaded.token_mixing == model.token_mixing and loaded.token_schedule == model.token_schedule


# ---- refusals -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build,needle", [
    (lambda: GroupedTokens(0), "channel_groups must be a positive integer"),
    (lambda: GroupedTokens(2, views=1), "group_views must be true or false"),
    (lambda: GroupedTokens(2, untied="yes"), "untied_tokens must be true or false"),
    (lambda: Pyramid(9, 16), "non-increasing positive integers"),
    (lambda: Pyramid(), "non-increasing positive integers"),
    (lambda: Pyramid(16, 9, project_first=1), "project_first must be true or false"),
    (lambda: Mixer(**SMALL, token_mixing=GroupedTokens(3)), "channel_groups G=3 must divide embed_dim C=8"),
    (lambda: Mixer(**SMALL, token_mixing="untied"), "token_mixing must be a token-mixing factory"),
    (lambda: Mixer(**SMALL, token_mixing=GroupedTokens(2), rp_blocks="all"), "without rp_blocks"),
    (lambda: Mixer(**{**SMALL, "depth": 3}, num_tokens=Pyramid(16, 9)), "lists 2 token counts for depth=3"),
])
def test_bad_factories(build, needle):
    with pytest.raises(pkmixer.ConfigError, match=needle):
        build()


@pytest.mark.parametrize("options,needle", [
    ({"channel_groups": 3}, "channel_groups G=3 must divide embed_dim C=64"),
    ({"channel_groups": 0}, "channel_groups must be a positive integer"),
    ({"untied_tokens": "yes"}, "untied_tokens must be true or false"),
    ({"group_views": 1}, "group_views must be true or false"),
    ({"channel_groups": 4, "rp_blocks": "all"}, "use it without rp_blocks"),
    ({"group_views": True, "rp_blocks": [0]}, "use it without rp_blocks"),
    ({"token_schedule": [49, 25]}, "token_schedule must list depth=4 non-increasing positive integers"),
    ({"token_schedule": [49, 25, 36, 16]}, "token_schedule must list depth=4"),
    ({"token_schedule": [49, 25, 0, 0]}, "token_schedule must list depth=4"),
    ({"token_schedule": [49, 25, 16, 9.0]}, "token_schedule must list depth=4"),
    ({"token_schedule": "49"}, "token_schedule must list depth=4"),
    ({"token_schedule": [49, 25, 16, 9], "num_tokens": 36}, "starts at 49 tokens but num_tokens is 36"),
])
def test_bad_options(options, needle):
    with pytest.raises(pkmixer.ConfigError, match=needle):
        pkmixer.create_model("mixer_t4_28", **options)


def test_bad_option_on_the_command_line(capsys):
    assert main(["effective", "mixer_grouped_t4_28", "--set", "embed_dim=30"]) == 2
    err = capsys.readouterr().err.strip()
    assert "channel_groups G=4 must divide embed_dim C=30" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("name", ABLATION_MODELS)
def test_listing1_tools_refuse_ablations(name):
    model = pkmixer.create_model(name)
    with pytest.raises(pkmixer.ConfigError, match="supp. A.1"):
        to_timm(model)
    with pytest.raises(pkmixer.ConfigError, match="supp. A.1"):
        enlarged_state_dict(model, 2)


# ---- sizes -------------------------------------------------------------------------------------------------------


def test_info_matches_hand_counts():
    C, D_C = 64, 128
    base = C * 16 + C + C * 10 + 10 + 2 * C  # stem, head, final LayerNorm
    per_block = 4 * C + (C * D_C + D_C + D_C * C + C)  # two LayerNorms and the channel MLP

    def mlp_params(i, d, o):
        return i * d + d + d * o + o

    def channel_nnz(S):
        return [S * C * D_C, S * D_C * C]

    cases = {
        # name: (params, nnz of each hidden linear map of the effective MLP, tokens per block)
        "mixer_t4_28": (base + 4 * (per_block + mlp_params(49, 98, 49)),
                        4 * ([C * 49 * 98, C * 98 * 49] + channel_nnz(49)), (49,) * 4),
        "mixer_untied_t4_28": (base + 4 * (per_block + C * mlp_params(49, 98, 49)),
                               4 * ([C * 49 * 98, C * 98 * 49] + channel_nnz(49)), (49,) * 4),
        "mixer_grouped_t4_28": (base + 4 * (per_block + mlp_params(196, 392, 196)),  # S·G = 196, D_S = γ·S·G
                                4 * ([16 * 196 * 392, 16 * 392 * 196] + channel_nnz(49)), (49,) * 4),
        "mixer_views_t4_28": (base + 4 * (per_block + C * C + mlp_params(196, 392, 196)),  # + A ∈ R^{C×C}
                              4 * ([49 * C * C, 16 * 196 * 392, 16 * 392 * 196] + channel_nnz(49)), (49,) * 4),
        "mixer_pyramid_t4_28": (base + 4 * per_block + 2 * mlp_params(49, 98, 49)
                                + mlp_params(49, 50, 25) + 25 * 49 + 2 * C  # 49 -> 25, skip W̃ and its LayerNorm
                                + mlp_params(25, 32, 16) + 16 * 25 + 2 * C,  # 25 -> 16
                                2 * ([C * 49 * 98, C * 98 * 49] + channel_nnz(49)) + [C * 49 * 50, C * 50 * 25]
                                + channel_nnz(25) + [C * 25 * 32, C * 32 * 16] + channel_nnz(16), (49, 49, 25, 16)),
    }
    for name, (params, nnz, tokens) in cases.items():
        info = pkmixer.create_model(name).info()
        assert info.params == params, name
        assert info.mixing_layers == len(nnz) and info.connections == pytest.approx(sum(nnz) / len(nnz)), name
        assert (info.num_tokens, info.effective_width, info.tokens_per_block) == (49, 49 * C, tokens), name
        assert info.gamma_token == 2.0 and info.max_width == 2 * 49 * C, name
    assert pkmixer.create_model("mixer_views_t4_28", channel_groups=2).info().gamma_token == 2.0  # D_S / (S·G)


@pytest.mark.parametrize("name", ABLATION_MODELS)
def test_analytic_macs_equal_flop_counter(name):
    with torch.device("meta"):
        model = pkmixer.create_model(name)
    assert sum(layer.macs for layer in layer_costs(model)) == measured_macs(model)


# ---- training ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ABLATION_MODELS)
def test_each_ablation_takes_a_training_step(name, tmp_path):
    """The quick counterpart of test_each_ablation_trains: one step of the harness (one epoch of one batch)."""
    cfg = build_config(None, {"data.name": "synthetic", "model.name": name, "model.embed_dim": 16,
                              "data.train_subset": 32, "data.test_subset": 32, "data.batch_size": 32,
                              "optim.name": "adamw", "optim.lr": 0.003, "schedule.epochs": 1, "run.progress": False})
    summary = loop.train(cfg, tmp_path / "run", log=lambda _: None)
    assert summary["status"] == "finished"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and 0 < rows[0]["train_loss"] < float("inf")


@pytest.mark.slow  # three epochs of each ablation model
@pytest.mark.parametrize("name", ABLATION_MODELS)
def test_each_ablation_trains(name, tmp_path):
    """Mixer supp. A.1's options train in the harness: three epochs on the synthetic task lower the loss."""
    cfg = build_config(None, {"data.name": "synthetic", "model.name": name, "model.embed_dim": 16,
                              "data.train_subset": 320, "data.test_subset": 200, "data.batch_size": 32,
                              "optim.name": "adamw", "optim.lr": 0.003, "schedule.epochs": 3, "run.progress": False})
    summary = loop.train(cfg, tmp_path / "run", log=lambda _: None)
    assert summary["status"] == "finished"
    losses = [json.loads(line)["train_loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[0] > losses[1] > losses[2]
    assert summary["final_test_error"] < 0.8  # 10 classes: chance is 0.9
