"""Each equivalence of the effective wide MLP against explicit dense matrices, in float64 (Sec. 3, 5)."""
import pytest
import torch
import torch.nn.functional as F

import pkmixer
from pkmixer.layers.pk import PKMixing, transpose_index
from pkmixer.layers.mlp import FcAct, Mlp
from pkmixer.theory.effective import (bare_smixer, bare_smixer_vec, block_diagonal, commutation_matrix,
                                      effective_mlp, kron_identity, mixer_monarch_factors, permutation_matrix,
                                      pk_effective_layers, unvec, vec)

from conftest import perturb_, rel_err

TOL = 1e-10


def test_vec_is_column_stacking():
    X = torch.arange(6.0).view(2, 3)  # [[0,1,2],[3,4,5]]
    assert vec(X).tolist() == [0, 3, 1, 4, 2, 5]
    assert torch.equal(unvec(vec(X), 2, 3), X)


@pytest.mark.parametrize("S,C", [(3, 5), (4, 4), (7, 2)])
def test_commutation_matrix(S, C):
    X = torch.randn(S, C, dtype=torch.float64)
    Jc = commutation_matrix(S, C).to_dense()
    assert torch.equal(Jc @ vec(X), vec(X.t()))
    assert torch.equal(Jc.t() @ Jc, torch.eye(S * C, dtype=torch.float64))
    # row-major storage of X is vec(Xᵀ) = J_c vec(X); transpose_index is J_c as a gather on storage
    assert torch.equal(X.reshape(-1), Jc @ vec(X))
    assert torch.equal(X.t().reshape(-1)[transpose_index(C, S)], X.reshape(-1))


def test_kron_identity_and_eq6():
    S, C = 4, 3
    W, V = torch.randn(S, S, dtype=torch.float64), torch.randn(C, C, dtype=torch.float64)
    X = torch.randn(S, C, dtype=torch.float64)
    assert torch.equal(kron_identity(C, W).to_dense(), torch.kron(torch.eye(C, dtype=torch.float64), W))
    assert rel_err(torch.kron(V.t().contiguous(), W) @ vec(X), vec(W @ X @ V)) < TOL  # Eq. 6
    Jc = commutation_matrix(S, C).to_dense()
    assert rel_err(Jc.t() @ kron_identity(S, V.t()).to_dense() @ Jc, torch.kron(V.t().contiguous(), torch.eye(S, dtype=torch.float64))) < TOL


@pytest.mark.parametrize("S,C", [(5, 3), (4, 6), (8, 8)])
def test_prop_3_2_bare_smixer(S, C):
    W, V = torch.randn(S, S, dtype=torch.float64), torch.randn(C, C, dtype=torch.float64)
    X = torch.randn(2, S, C, dtype=torch.float64)
    H = bare_smixer(X, W, V)
    assert rel_err(bare_smixer_vec(vec(X), W, V), vec(H)) < TOL


@pytest.mark.parametrize("S,C", [(5, 3), (6, 6)])
def test_cor_3_4_monarch(S, C):
    W, V = torch.randn(S, S, dtype=torch.float64), torch.randn(C, C, dtype=torch.float64)
    X = torch.randn(S, C, dtype=torch.float64)
    L, R, M = mixer_monarch_factors(W, V)
    M = M.to_dense()
    assert rel_err(F.gelu(M @ vec(X)), vec(F.gelu(W @ X @ V))) < TOL
    assert rel_err(M, torch.kron(V.t().contiguous(), W)) < TOL
    # L and R are block diagonal with S (resp. C) shared blocks
    assert torch.equal(R.to_dense()[:S, :S], W) and torch.equal(R.to_dense()[S:2 * S, S:2 * S], W)
    assert torch.equal(L.to_dense()[:C, :C], V.t())


def _mixing(axis, S_in, S_out, C, kind, perms, hidden=None):
    g = torch.Generator().manual_seed(1)
    n_in, n_out = (S_in, S_out) if axis == "token" else (C, C)
    mlp = Mlp(n_in, hidden, n_out, torch.nn.Identity) if kind == "mlp" else FcAct(n_in, None, n_out, torch.nn.Identity)
    other = C if axis == "token" else S_in
    return perturb_(PKMixing(mlp, axis, other, n_in, n_out, perms=perms, generator=g).double())


def test_normal_token_mixing_is_I_kron_W():
    S, C = 5, 3
    mix = _mixing("token", S, S, C, "fc", None)
    (layer,) = pk_effective_layers(mix, "t", S, S, C)
    W = mix.mlp.fc.weight.detach()
    assert torch.equal(layer.weight.to_dense(), torch.kron(torch.eye(C, dtype=torch.float64), W))  # Eq. 8
    assert layer.density == pytest.approx(1 / C)


def test_normal_channel_mixing_is_V_kron_I():
    S, C = 5, 3
    mix = _mixing("channel", S, S, C, "fc", None)
    (layer,) = pk_effective_layers(mix, "c", S, S, C)
    Vt = mix.mlp.fc.weight.detach()  # Linear computes X Vᵀ... i.e. X V with V = weightᵀ
    assert torch.equal(layer.weight.to_dense(), torch.kron(Vt, torch.eye(S, dtype=torch.float64)))  # Eq. 7
    assert layer.density == pytest.approx(1 / S)


@pytest.mark.parametrize("axis", ["token", "channel"])
@pytest.mark.parametrize("S,C", [(4, 6), (5, 5)])
def test_eq19_rp_layer(axis, S, C):
    """J₂ (I ⊗ W) J₁ has W's singular values, each repeated; it equals the layer on every input."""
    mix = _mixing(axis, S, S, C, "fc", ("random", "random"))
    (layer,) = pk_effective_layers(mix, "rp", S, S, C)
    E = layer.weight.to_dense()
    J1, J2 = mix.gather_indices()
    Jc = commutation_matrix(S, C).to_dense()
    n = mix.other
    W = mix.mlp.fc.weight.detach()
    expected = Jc.t() @ permutation_matrix(J2).to_dense() @ torch.kron(torch.eye(n, dtype=torch.float64), W) \
        @ permutation_matrix(J1).to_dense() @ Jc
    assert torch.equal(E, expected)
    sv_E = torch.linalg.svdvals(E)
    sv_W = torch.linalg.svdvals(W).repeat_interleave(n)
    assert rel_err(sv_E, sv_W.sort(descending=True).values) < TOL
    X = torch.randn(3, S, C, dtype=torch.float64)
    out = mix(X)  # (3, S, C) with identity activation: a linear map plus the repeated bias
    assert rel_err(layer(vec(X)), vec(out)) < TOL
    # an RP layer is not block diagonal: its effective weight differs from the normal layer's
    assert not torch.equal(E, torch.kron(torch.eye(n, dtype=torch.float64), W) if axis == "token" else
                           torch.kron(W, torch.eye(n, dtype=torch.float64)))


@pytest.mark.parametrize("axis", ["token", "channel"])
@pytest.mark.parametrize("J1", ["identity", "commutation", "random"])
@pytest.mark.parametrize("J2", ["identity", "commutation", "random"])
def test_pk_layer_any_permutations(axis, J1, J2):
    """Def. 5.1 with J₁, J₂ each identity, commutation or random: layer == J₂ (I ⊗ W) J₁ on storage."""
    S, C = 4, 6
    mix = _mixing(axis, S, S, C, "mlp", (J1, J2), hidden=5)
    X = torch.randn(3, S, C, dtype=torch.float64)
    n, k = mix.other, mix.in_features
    storage = {"identity": lambda v, r, c: v, "commutation": lambda v, r, c: v.view(-1, r, c).transpose(1, 2).reshape(len(v), -1)}
    flat = X.reshape(3, -1)
    rows_in = (S, C)
    y = storage[J1](flat, *rows_in) if J1 != "random" else flat[:, mix.in_index]
    h = mix.mlp(y.view(3, n, k)).reshape(3, -1)
    z = storage[J2](h, n, mix.out_features) if J2 != "random" else h[:, mix.out_index]
    assert rel_err(mix(X).reshape(3, -1), z) < TOL
    layers = pk_effective_layers(mix, "pk", S, S, C)
    act = mix.mlp.act
    with torch.no_grad():
        assert rel_err(unvec(layers[1](act(layers[0](vec(X)))), S, C), mix(X)) < TOL
    assert mix.permuted == ("random" in (J1, J2))
    persistent = set(mix.state_dict()) - {k for k in mix.state_dict() if k.startswith("mlp.")}
    assert persistent == {name for name, kind in (("in_index", J1), ("out_index", J2)) if kind == "random"}


MODEL_CASES = [
    ("smixer_c64p4_32", dict(depth=2, embed_dim=12)),  # S = 64 ≠ C = 12
    ("smixer_c64p4_32", dict(depth=2, embed_dim=10, num_tokens=20)),  # S0 = 64 -> S = 20, skip layer
    ("rp_smixer_c64p4_32", dict(depth=3, embed_dim=10, num_tokens=7)),
    ("mixer_c64d3p4_32", dict(depth=2, embed_dim=9)),  # γ = 2
    ("mixer_c64d3p4_32", dict(depth=2, embed_dim=9, mlp_ratio=(0.5, 3.0))),  # γ_token ≠ γ_channel
    ("rp_mixer_c64p4_32", dict(depth=2, embed_dim=8, num_tokens=11, mlp_ratio=1.5)),
    ("mixer_s16_224", dict(img_size=48, patch_size=8, depth=3, embed_dim=16, token_hidden=10, channel_hidden=24,
                           rp_blocks=[1])),  # Fig. S.4: a single RP block
    ("smixer_t4_28", dict(depth=2, act="relu")),
    ("swmlp_t4_28", dict(depth=2)),
    ("swmlp_m4096d6p4_32", dict(embed_dim=4, width=300, depth=2, density=0.1)),
    ("swmlp_m4096d6p4_32", dict(embed_dim=4, width=200, depth=2, density=0.2, weight_format="masked")),
    # the token-mixing ablations of Mixer supp. A.1, alone and combined (S0 = 16 at 16 px)
    ("mixer_untied_t4_28", dict(img_size=16, depth=2, embed_dim=6)),
    ("mixer_grouped_t4_28", dict(img_size=16, depth=2, embed_dim=8)),
    ("mixer_views_t4_28", dict(img_size=16, depth=2, embed_dim=8)),
    ("mixer_pyramid_t4_28", dict(img_size=16, depth=3, embed_dim=6, token_schedule=(12, 9, 4))),  # 16 -> 12 -> 9 -> 4
    ("smixer_t4_28", dict(img_size=16, depth=2, embed_dim=6, untied_tokens=True, channel_groups=2)),
    ("rp_mixer_c64p4_32", dict(img_size=16, depth=3, embed_dim=6, untied_tokens=True, token_schedule=(20, 9, 9))),
    ("mixer_views_t4_28", dict(img_size=16, depth=2, embed_dim=8, untied_tokens=True, token_schedule=(16, 9))),
    ("shallow_dense_28", {}),
    ("shallow_kronecker_28", {}),
    ("shallow_monarch_28", dict(factors=(49, 16))),
]


@pytest.mark.parametrize("name,overrides", MODEL_CASES)
def test_model_equals_its_effective_mlp(name, overrides):
    model = perturb_(pkmixer.create_model(name, **overrides).double().eval())
    x = torch.randn(3, model.in_chans, model.img_size, model.img_size, dtype=torch.float64)
    eff = effective_mlp(model)
    with torch.no_grad():
        assert rel_err(eff(x), model(x)) < TOL
    # every effective layer is an explicit sparse matrix with the density the model reports
    info = model.info()
    layers = eff.layers()
    assert all(layer.weight.is_sparse for layer in layers)
    if info.family in ("S-Mixer", "MLP-Mixer"):
        assert sum(layer.weight._nnz() for layer in layers) / len(layers) == pytest.approx(info.connections, rel=0.05)


def test_effective_mlp_detects_a_wrong_permutation():
    """The comparison can fail: corrupting one frozen permutation breaks the equivalence."""
    model = perturb_(pkmixer.create_model("rp_smixer_c64p4_32", depth=2, embed_dim=8).double().eval())
    eff = effective_mlp(model)
    idx = model.blocks[1].token.mixing.in_index
    idx[[0, 1]] = idx[[1, 0]]
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(eff(x), model(x)) > 1e-6


def _ablation_token_mixing(**options):
    model = perturb_(pkmixer.create_model("mixer_t4_28", img_size=16, depth=1, embed_dim=8, **options).double())
    return model.blocks[0].token.mixing


def test_untied_token_mixing_is_block_diagonal_with_distinct_blocks():
    """Mixer supp. A.1 untied: blockdiag(W⁽¹⁾, ..., W⁽ᶜ⁾) on vec(X) instead of I_C ⊗ W."""
    mixing = _ablation_token_mixing(untied_tokens=True)
    fc1, fc2 = pk_effective_layers(mixing, "t", 16, 16, 8)
    W1, W2 = mixing.mlp.fc1.weight.detach(), mixing.mlp.fc2.weight.detach()  # (C, D_S, S), (C, S, D_S)
    assert torch.equal(fc1.weight.to_dense(), torch.block_diag(*W1))
    assert torch.equal(fc2.weight.to_dense(), torch.block_diag(*W2))
    assert torch.equal(block_diagonal(W1).to_dense(), torch.block_diag(*W1))
    assert fc1.density == pytest.approx(1 / 8)


@pytest.mark.parametrize("G", [2, 4])
def test_grouped_token_mixing_is_I_kron_W_on_vec(G):
    """Grouping stacks G neighbouring columns, the column-major reshape: vec(X_G) = vec(X), so the effective
    weight is I_{C/G} ⊗ W_G with no permutation at all, density G/C."""
    mixing = _ablation_token_mixing(channel_groups=G)
    fc1, fc2 = pk_effective_layers(mixing, "t", 16, 16, 8)
    I = torch.eye(8 // G, dtype=torch.float64)
    assert torch.equal(fc1.weight.to_dense(), torch.kron(I, mixing.mlp.fc1.weight.detach()))
    assert torch.equal(fc2.weight.to_dense(), torch.kron(I, mixing.mlp.fc2.weight.detach()))
    assert fc1.density == pytest.approx(G / 8)
    X = torch.randn(3, 16, 8, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(unvec(fc2(fc1(vec(X))), 16, 8), mixing(X)) < TOL


def test_views_are_a_dense_A_kron_I_layer_before_the_grouped_one():
    mixing = _ablation_token_mixing(channel_groups=4, group_views=True, token_schedule=[9])
    views, fc1, fc2 = pk_effective_layers(mixing, "t", 16, 9, 8)
    A = mixing.views.weight.detach()  # (C, C): token x -> A x
    assert views.name == "t.views" and views.bias is None and views.act is None
    assert torch.equal(views.weight.to_dense(), torch.kron(A, torch.eye(16, dtype=torch.float64)))  # Eq. 6
    assert torch.equal(fc1.weight.to_dense(), torch.kron(torch.eye(2, dtype=torch.float64),
                                                          mixing.mlp.fc1.weight.detach()))
    X = torch.randn(3, 16, 8, dtype=torch.float64)
    with torch.no_grad():
        assert rel_err(unvec(fc2(fc1(views(vec(X)))), 9, 8), mixing(X)) < TOL
