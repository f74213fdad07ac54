"""Every fast path against its reference path (docs/performance.md), and a smoke test of the benchmark code.

Fast paths: the per-patch stem as one matrix product (``PatchConv``) against ``nn.Conv2d``; token mixing as a left multiplication (``Mlp.forward_left``, ``FcAct.forward_left``) against
timm's transpose + Linear; the RP gather's inverse-permutation backward (``PermuteColumns``) against
``index_select``'s autograd; the CSR SW-MLP layer against the dense-masked layer and the COO product; the
chunked mask sampler against the one-shot sampler; the bmm Kronecker layer against an explicit V ⊗ W; the C
LayerNorm over few channels (``NarrowLayerNorm``) against ``nn.LayerNorm``, its builds at three x86-64 levels
against each other, and its traced, scripted, exported and compiled forms against the eager one.
Correctness only: nothing here is timed.
"""
import copy
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import pkmixer
from pkmixer.layers.patch import PatchConv
from pkmixer.layers.mlp import NARROW_COLUMNS, FcAct, Mlp, columns_back, columns_first, left_linear, left_mm
from pkmixer.layers.pk import PermuteColumns, PKMixing, permute_columns
from pkmixer.layers.sparse import MaskedLinear, SparseLinear, sample_bernoulli_mask
from pkmixer.layers.structured import KroneckerLinear
from pkmixer.models.convert import to_timm

from conftest import assert_one_node_traced_scripted_exported, build_kernel_at, perturb_, rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F64 = torch.float64


def _grads(out: torch.Tensor, g: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out, tensors, g))


# ---- the per-patch stem ------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_chans,out_chans,patch,size,bias", [(1, 8, 4, 28, True), (3, 87, 4, 32, True),
                                                                 (3, 16, 16, 224, False), (2, 5, 3, 10, True)])
def test_patch_conv_is_the_convolution(in_chans, out_chans, patch, size, bias):
    """Output, input and parameter gradients equal nn.Conv2d's (kernel = stride) in float64, a remainder row and
    column dropped as the convolution drops them (size 10, patch 3); the state dicts are interchangeable."""
    torch.manual_seed(0)
    ours = PatchConv(in_chans, out_chans, patch, bias=bias).double()
    ref = torch.nn.Conv2d(in_chans, out_chans, patch, stride=patch, bias=bias).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, in_chans, size, size, dtype=F64, requires_grad=True)
    y, y_ref = ours(x), ref(x)
    assert y.shape == y_ref.shape and torch.allclose(y, y_ref, atol=1e-12)
    g = torch.randn_like(y)
    for a, b in zip(_grads(y, g, [x, *ours.parameters()]), _grads(y_ref, g, [x, *ref.parameters()])):
        assert torch.allclose(a, b, atol=1e-11)
    # channels-last in memory: the models' flatten(2).transpose(1, 2) to (B, S0, C) is contiguous without a copy
    assert y.flatten(2).transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("name", ["smixer_t4_28", "swmlp_t4_28"])
def test_models_stem_is_the_convolution_in_float32(name):
    """A model with its stem as a plain nn.Conv2d gives the same outputs within float32 rounding."""
    torch.manual_seed(0)
    model = pkmixer.create_model(name)
    perturb_(model)
    plain = copy.deepcopy(model)
    conv = torch.nn.Conv2d(model.stem.in_channels, model.stem.out_channels, model.stem.kernel_size,
                           stride=model.stem.stride)
    conv.load_state_dict(model.stem.state_dict())
    plain.stem = conv
    x = torch.randn(4, 1, 28, 28)
    assert isinstance(model.stem, PatchConv) and rel_err(model(x), plain(x)) < 1e-5


# ---- token mixing as a left multiplication ---------------------------------------------------------------

# both formulations of forward_left: sequence-first GEMMs over narrow columns, batched products over wide ones
COLUMNS = [4, NARROW_COLUMNS - 1, NARROW_COLUMNS, 20]


@pytest.mark.parametrize("n", COLUMNS)
@pytest.mark.parametrize("kind", ["mlp", "fc"])
def test_forward_left_is_transposed_forward(kind, n):
    mlp = (Mlp(7, 11, 5) if kind == "mlp" else FcAct(7, None, 5)).double()
    perturb_(mlp)
    x = torch.randn(3, 7, n, dtype=F64, requires_grad=True)  # (B, in, n)
    ref = mlp(x.transpose(1, 2)).transpose(1, 2)
    out = mlp.forward_left(x)
    assert out.shape == (3, 5, n) and rel_err(out, ref) < 1e-14
    g = torch.randn_like(ref)
    params = [x, *mlp.parameters()]
    for a, b in zip(_grads(out, g, params), _grads(ref, g, params)):
        assert rel_err(a, b) < 1e-13


@pytest.mark.parametrize("n", COLUMNS)
def test_left_linear_without_bias(n):
    lin = torch.nn.Linear(6, 3, bias=False).double()
    x = torch.randn(2, 6, n, dtype=F64)
    ref = lin(x.transpose(1, 2)).transpose(1, 2)
    assert rel_err(left_linear(lin.weight, lin.bias, x), ref) < 1e-14
    assert rel_err(columns_back(left_mm(lin.weight, lin.bias, columns_first(x)), 2), ref) < 1e-14  # the sequence-first GEMM


@pytest.mark.parametrize("channels", [5, NARROW_COLUMNS])
def test_normal_token_mixing_uses_left_multiplication_and_matches_reference(channels):
    mix = PKMixing(Mlp(6, 12, 6), "token", channels, 6, 6).double()
    perturb_(mix)
    x = torch.randn(2, 6, channels, dtype=F64, requires_grad=True)
    ref = mix.mlp(x.transpose(1, 2)).transpose(1, 2)
    out = mix(x)
    # batched products keep the (B, S, C) layout; sequence-first GEMMs return a strided view
    assert out.is_contiguous() == (channels >= NARROW_COLUMNS) and rel_err(out, ref) < 1e-14
    g = torch.randn_like(out)
    for a, b in zip(_grads(out, g, [x, *mix.parameters()]), _grads(ref, g, [x, *mix.parameters()])):
        assert rel_err(a, b) < 1e-13


def test_other_mlp_modules_keep_the_transposed_path():
    """A mixing MLP without forward_left (e.g. a plain nn.Linear) still runs, through transposes."""
    lin = torch.nn.Linear(6, 4).double()
    mix = PKMixing(lin, "token", 5, 6, 4).double()
    x = torch.randn(2, 6, 5, dtype=F64)
    assert rel_err(mix(x), lin(x.transpose(1, 2)).transpose(1, 2)) < 1e-14


def test_mixer_gradients_match_timm():
    """The whole fast forward/backward against timm's MlpMixer with the same weights (float64)."""
    ours = perturb_(pkmixer.create_model("mixer_s16_224", img_size=64, depth=2, num_classes=7), 0.05).double()
    theirs = to_timm(ours).double()
    x = torch.randn(2, 3, 64, 64, dtype=F64)
    y = torch.tensor([1, 5])
    F.cross_entropy(ours(x), y).backward()
    F.cross_entropy(theirs(x), y).backward()
    ours_grads = [p.grad for p in ours.parameters()]
    theirs_grads = [p.grad for p in theirs.parameters()]
    assert [a.shape for a in ours_grads] == [b.shape for b in theirs_grads]  # to_timm maps them one to one
    scale = torch.cat([b.reshape(-1) for b in theirs_grads]).norm()
    for a, b in zip(ours_grads, theirs_grads):  # against the whole gradient's norm: some are ~0 (1e-17), e.g.
        assert (a - b).norm() < 1e-10 * scale  # a token fc2 bias, shifting all channels alike before a LayerNorm


@pytest.mark.parametrize("name", ["mixer_t4_28", "rp_smixer_t4_28"])
def test_residual_stream_is_contiguous(name):
    """The stem's output is made contiguous once, so no LayerNorm copies its input (or its gradient)."""
    model = pkmixer.create_model(name)
    seen = []
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.register_forward_pre_hook(lambda mod, args: seen.append(args[0].is_contiguous()))
    model(torch.randn(2, 1, 28, 28))
    assert len(seen) == 2 * model.depth + 1 and all(seen)


# ---- RP gathers -------------------------------------------------------------------------------------------

def test_permute_columns_matches_index_select():
    idx = torch.randperm(30, generator=torch.Generator().manual_seed(1))
    x = torch.randn(4, 30, dtype=F64, requires_grad=True)
    g = torch.randn(4, 30, dtype=F64)
    out, ref = PermuteColumns.apply(x, idx), x.index_select(1, idx)
    assert torch.equal(out, ref)
    assert torch.equal(*(torch.autograd.grad(o, x, g)[0] for o in (out, ref)))  # a gather: exact
    assert torch.autograd.gradcheck(lambda t: PermuteColumns.apply(t, idx), (x,))
    # the operator TorchScript calls: the same values, forward and backward
    op = torch.ops.pkmixer.permute_columns(x, idx)
    assert torch.equal(op, ref) and torch.equal(torch.autograd.grad(op, x, g)[0], g[:, torch.argsort(idx)])
    assert torch.equal(permute_columns(x, idx), ref)


@pytest.mark.parametrize("rows, m", [(128, 1024), (5, 37), (0, 9)])
def test_permute_columns_kernel_moves_what_torch_moves(one_thread, rows, m):
    """With one thread the RP gathers run the C kernel: forward and backward the bits of torch.gather and scatter_
    (strided inputs too, and an empty batch); with two threads, or native=False, torch's operators run; an index
    out of range makes the kernel refuse, and torch's gather raises."""
    from pkmixer.layers import pk

    if pk._kernel() is None:
        pytest.skip("no C kernel on this machine: needs a C compiler (cc)")
    idx = torch.randperm(m, generator=torch.Generator().manual_seed(0))
    x = torch.randn(m, rows).t().requires_grad_()  # a transposed (rows, m) view
    g = torch.randn(rows, m)
    assert pk.kernel_applies(x, idx)
    got = permute_columns(x, idx)
    want = torch.gather(x, 1, idx.expand(rows, -1))
    assert torch.equal(got, want)
    assert torch.equal(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(want, x, g)[0])
    assert torch.equal(permute_columns(x, idx, False), want)
    torch.set_num_threads(2)
    assert not pk.kernel_applies(x, idx)
    torch.set_num_threads(1)
    bad = idx.clone()
    bad[0] = m
    assert pk._native("pkmixer_gather_columns", x.detach(), bad) is None
    with pytest.raises(RuntimeError):
        permute_columns(torch.randn(max(rows, 1), m), bad)


def test_rp_mixing_follows_loaded_permutations_and_copies():
    a, b = (PKMixing(FcAct(6, None, 6), "token", 5, 6, 6, perms=("random", "random"),
                     generator=torch.Generator().manual_seed(seed)).double() for seed in (0, 1))
    with torch.no_grad():
        b.mlp.fc.weight.copy_(a.mlp.fc.weight)
        b.mlp.fc.bias.copy_(a.mlp.fc.bias)
    x = torch.randn(2, 6, 5, dtype=F64)
    before = a(x)
    a.load_state_dict(b.state_dict())
    assert not torch.equal(a(x), before) and torch.equal(a(x), b(x))
    assert torch.equal(copy.deepcopy(a)(x), b(x))


@pytest.mark.parametrize("axis", ["token", "channel"])
def test_rp_mixing_matches_explicit_gathers(axis):
    mix = PKMixing(Mlp(6, 8, 6) if axis == "token" else Mlp(5, 8, 5), axis, 5 if axis == "token" else 6,
                   6 if axis == "token" else 5, 6 if axis == "token" else 5, perms=("random", "random"),
                   generator=torch.Generator().manual_seed(0)).double()
    perturb_(mix)
    x = torch.randn(3, 6, 5, dtype=F64, requires_grad=True)
    B = x.shape[0]
    y = x.reshape(B, -1).index_select(1, mix.in_index).view(B, mix.other, mix.in_features)
    ref = mix.mlp(y).reshape(B, -1).index_select(1, mix.out_index).view(x.shape)
    out = mix(x)
    assert torch.equal(out, ref)
    g = torch.randn_like(out)
    for a, b in zip(_grads(out, g, [x, *mix.parameters()]), _grads(ref, g, [x, *mix.parameters()])):
        assert rel_err(a, b) < 1e-14


# ---- SW-MLP: CSR against dense-masked and COO ---------------------------------------------------------------

def _pair(n_in: int, n_out: int, p: float, dtype: torch.dtype = F64) -> tuple[MaskedLinear, SparseLinear]:
    torch.manual_seed(5)
    masked = MaskedLinear(n_in, n_out, p, torch.Generator().manual_seed(1)).to(dtype)
    torch.manual_seed(5)
    sparse = SparseLinear(n_in, n_out, p, torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        masked.bias.normal_()
        sparse.bias.copy_(masked.bias)
    return masked, sparse


@pytest.mark.parametrize("n_in, n_out, p", [(40, 30, 0.2), (30, 50, 1.0), (64, 64, 1 / 64), (9, 7, 0.02)])
@pytest.mark.parametrize("dtype, tol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_csr_linear_matches_dense_masked(n_in, n_out, p, dtype, tol):
    masked, sparse = _pair(n_in, n_out, p, dtype)
    x = torch.randn(2, 3, n_in, dtype=dtype, requires_grad=True)  # leading dims are flattened and restored
    out, ref = sparse(x), masked(x)
    assert out.shape == (2, 3, n_out) and rel_err(out, ref) < tol
    g = torch.randn_like(ref)
    gx, gv, gb = torch.autograd.grad(out, [x, sparse.values, sparse.bias], g)
    rx, rw, rb = torch.autograd.grad(ref, [x, masked.weight, masked.bias], g)
    assert rel_err(gx, rx) < tol and rel_err(gb, rb) < tol
    if sparse.nnz:
        assert rel_err(gv, rw[masked.mask]) < tol


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_csr_linear_runs_in_the_values_dtype_under_bf16_autocast(device):
    """Under bf16 autocast the CSR products run with autocast off on fp32 operands (MKL has no bf16 CSR product;
    cuSPARSE refuses fp32 CSR with the bf16 output gradient autocast brings back): forward and backward equal
    the same products without autocast, given the same bf16 output gradient."""
    masked, sparse = _pair(40, 30, 0.2, torch.float32)
    sparse = sparse.to(device)
    x = torch.randn(8, 40, device=device, requires_grad=True)
    g = torch.randn(8, 30, device=device).to(torch.bfloat16)
    with torch.autocast(device, torch.bfloat16):
        out = sparse(x)
    got = torch.autograd.grad(out, [x, sparse.values], g.to(out.dtype))
    ref_out = sparse(x)
    ref = torch.autograd.grad(ref_out, [x, sparse.values], g.float())
    assert out.dtype == torch.float32 and torch.equal(out, ref_out)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    from pkmixer.layers.sparse import csr_gradients  # a bf16 output gradient, inside autocast, as the bench met it
    values, pattern = sparse.values.detach().reshape(-1), sparse.csr_pattern()
    with torch.autocast(device, torch.bfloat16):
        direct = csr_gradients(g, x.detach(), values, pattern, True, True)
    for a, b in zip(direct, csr_gradients(g.float(), x.detach(), values, pattern, True, True), strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b)


def test_csr_linear_matches_coo_product():
    _, sparse = _pair(50, 40, 0.1)
    x = torch.randn(6, 50, dtype=F64, requires_grad=True)
    coo = torch.sparse.mm(sparse.sparse_weight(), x.t()).t() + sparse.bias
    assert rel_err(sparse(x), coo) < 1e-14
    g = torch.randn_like(coo)
    grads = [torch.autograd.grad(y, [x, sparse.values], g) for y in (sparse(x), coo)]
    for a, b in zip(*grads):
        assert rel_err(a, b) < 1e-13


def test_csr_pattern_follows_loaded_indices_and_moves_with_the_layer():
    _, a = _pair(20, 20, 0.3)
    torch.manual_seed(1)
    b = SparseLinear(20, 20, 0.3, torch.Generator().manual_seed(9)).double()
    x = torch.randn(3, 20, dtype=F64)
    a.load_state_dict(b.state_dict())  # another mask, another number of kept weights
    assert a.nnz == b.nnz and rel_err(a(x), b(x)) < 1e-14
    assert not any(name.startswith("csr_") for name in a.state_dict())  # derived, not state
    pattern, moved = a.csr_pattern(), a.to(torch.float32).csr_pattern()
    assert all(torch.equal(getattr(pattern, f), getattr(moved, f)) for f in ("crow", "col", "t_crow", "t_col", "t_perm"))
    assert rel_err(copy.deepcopy(a)(x.float()), b(x).float()) < 1e-6


def test_sparse_linear_loads_the_one_dimensional_values_of_earlier_versions():
    _, a = _pair(20, 20, 0.3)
    state = a.state_dict()
    old = {**state, "values": state["values"].reshape(-1)}  # (nnz,), as earlier versions stored it
    _, b = _pair(20, 20, 0.3)
    with torch.no_grad():
        b.values.zero_()
    b.load_state_dict(old)
    assert b.values.shape == (1, a.nnz) and torch.equal(b.values, a.values)


def test_sparse_layer_memory_grows_with_kept_weights_not_area():
    """m = 200 000: a dense m×m temporary would need 160 GB; the CSR path trains in kilobytes."""
    lin = SparseLinear(200_000, 200_000, 1e-6, torch.Generator().manual_seed(0))
    x = torch.randn(2, 200_000, requires_grad=True)
    lin(x).square().sum().backward()
    assert lin.values.grad.shape == lin.values.shape and x.grad.shape == x.shape
    assert 20_000 < lin.nnz < 60_000


def _one_shot_mask(rows, cols, p, generator):
    """The sampler as it was before chunking (the reference)."""
    total, log_q = rows * cols, math.log1p(-p)
    chunks, last = [], -1
    while True:
        n = int(1.05 * p * (total - last)) + 64
        u = 1.0 - torch.rand(n, generator=generator, dtype=F64)
        gaps = torch.floor(torch.log(u) / log_q).clamp_(max=total) + 1
        pos = last + torch.cumsum(gaps, 0)
        inside = pos < total
        chunks.append(pos[inside].long())
        if not bool(inside.all()):
            break
        last = int(pos[-1])
    flat = torch.cat(chunks)
    return flat // cols, flat % cols


@pytest.mark.parametrize("chunk", [1, 7, 1000, 1 << 22])
@pytest.mark.parametrize("p", [0.5, 0.01])
def test_chunked_mask_sampler_draws_the_same_mask(chunk, p):
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    ref = _one_shot_mask(120, 90, p, g1)
    out = sample_bernoulli_mask(120, 90, p, g2, chunk=chunk)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    assert torch.equal(g1.get_state(), g2.get_state())  # the next layer's mask is unchanged too


# ---- Kronecker ----------------------------------------------------------------------------------------------

def test_kronecker_bmm_gradients_match_explicit_product():
    layer = KroneckerLinear(3, 5).double()
    x = torch.randn(4, 15, dtype=F64, requires_grad=True)
    ref = x @ torch.kron(layer.V, layer.W).t()
    out = layer(x)
    assert rel_err(out, ref) < 1e-14
    g = torch.randn_like(out)
    params = [x, layer.V, layer.W]
    for a, b in zip(_grads(out, g, params), _grads(ref, g, params)):
        assert rel_err(a, b) < 1e-13


# ---- the benchmark code itself --------------------------------------------------------------------------------

# section g (pkmixer train's epoch against a hand-written loop) takes about 10 s even at toy sizes: slow tier
@pytest.mark.parametrize("sections", ["abdefhn", pytest.param("abdefgw", marks=pytest.mark.slow)])
def test_benchmark_smoke_run_writes_its_json(tmp_path, sections):
    """Sections a, b, d, e, f, h, n (or g and w) at toy sizes through the real runner, then the JSON schema; sections
    h and w (GPU projections) outside smoke mode on the CPU are refused in one line."""
    sys.path.insert(0, ROOT)
    try:
        from benchmarks import run as bench
    finally:
        sys.path.remove(ROOT)
    out = tmp_path / "res"
    assert bench.main(["--mode", "smoke", "--sections", sections, "--threads", "1", "--no-compile",
                       "--out-dir", str(out), "--name", "toy"]) == 0
    result = json.loads((out / "toy.json").read_text())
    assert result["schema"] == "pkmixer-bench/1" and set(result["sections"]) == set(sections)
    assert {"cpu_model", "cpu_cores", "torch_threads", "torch"} <= set(result["machine"])
    if sys.platform.startswith("linux"):  # glibc: a CPU run keeps freed memory in the heap
        assert result["machine"]["heap"].startswith("freed memory kept")
    train = [r for r in result["sections"]["a"]["rows"] if r["kind"] == "train"][0]
    assert train["times"]["ours"]["median_s"] > 0 and train["speedup_eager"] > 0
    assert all(0 < r["fraction_of_sgemm"] for r in result["sections"]["f"]["rows"])
    assert "rp_overhead" in result["sections"]["b"]["rows"][0]
    if "g" in sections:
        engine = {r["case"].split(",")[0]: r for r in result["sections"]["g"]["rows"]}
        assert all(r["ratio"] > 0 and r["pkmixer_ms_per_step"] > 0 for r in engine.values())
    if "h" in sections:
        h = result["sections"]["h"]
        assert {r["model"] for r in h["rows"]} == {"S-Mixer", "SW-MLP"}
        assert all(r["train_images_per_s"] > 0 and r["projected_gpu_hours"] > 0 for r in h["rows"])
        assert sum(p["gpu_hours"] for p in h["projection"]) == pytest.approx(
            sum(r["projected_gpu_hours"] for r in h["rows"]))
        assert bench.main(["--sections", "h", "--out-dir", str(out)]) == 2
        from pkmixer.analysis.cost import measured_macs
        from pkmixer.models.registry import create_model
        for r in h["rows"]:  # the forward MACs per image behind the fraction of matmul throughput
            assert r["macs_per_image"] == measured_macs(create_model(r["name"], num_classes=10, **r["options"]))
    if "n" in sections:
        n = result["sections"]["n"]
        assert {r["family"] for r in n["rows"]} == {"S-Mixer", "RP S-Mixer"}
        assert [r["per_flop_vs_square"] for r in n["rows"] if r["C"] == r["S"]] == [1.0, 1.0]
        for r in n["rows"]:  # the paired ratio lies within its quartiles
            q1, q3 = r["per_flop_vs_square_quartiles"]
            assert q1 <= r["per_flop_vs_square"] <= q3 and r["per_flop_vs_square_of_medians"] > 0
        own = n["own_products"]
        assert own["products"] > 0 and own["step_over_products"] > 0 and own["step_over_products_of_medians"] > 0
        parts = own["step_parts"]  # the kernel runs where the model is fused, else its calls take no time
        assert parts["products_s"] > 0 and (parts["kernel_s"] > 0) == own["fused"]
        timed_s = own["times"]["step, parts timed"]["median_s"]  # each part is timed inside these steps
        assert parts["products_s"] + parts["kernel_s"] < timed_s
    if "w" in sections:
        rows = result["sections"]["w"]["rows"]  # the compiled cases are for the GPU
        assert [(w["case"], w["stack_sizes"]) for w in rows] == [("eager", [1]), ("stacked", [2])]
        for w in rows:  # two seeds of one point: one stack of 2 in the stacked case
            assert w["runs"] == 2 and w["status"] == {"finished": 2}
            assert w["wall_2_epochs_s"] > 0 and w["wall_1_epoch_s"] > 0
        assert bench.main(["--sections", "w", "--out-dir", str(out)]) == 2
    assert all("met" in t for t in result["targets"])
    assert (out / "toy.md").read_text().startswith("# pkmixer benchmarks")
    again = ["--mode", "smoke", "--sections", "e", "--out-dir", str(out), "--name", "toy"]
    assert bench.main(again) == 2  # never overwrites


def test_paired_ratio_is_the_median_of_round_by_round_ratios():
    """paired_ratio divides round r's time by round r's: a numerator twice the denominator in every round while the
    rounds' clock drifts threefold gives 2 exactly, quartiles included; otherwise the median and quartiles of the
    per-round ratios; the two lists must be of one length. interleaved_rounds times each case once a round."""
    sys.path.insert(0, ROOT)
    try:
        from benchmarks.common import Settings, interleaved_rounds, paired_ratio
    finally:
        sys.path.remove(ROOT)
    clock = [1.0, 3.0, 1.0, 3.0, 3.0]
    assert paired_ratio([2 * c for c in clock], clock) == {"median": 2.0, "q1": 2.0, "q3": 2.0}
    assert paired_ratio([3.0, 2.0, 1.0], [1.0, 1.0, 1.0]) == {"median": 2.0, "q1": 1.0, "q3": 3.0}
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    calls = []
    settings = Settings(mode="smoke", device="cpu", dtype="float32", threads=1, warmup=1, repeats=3, compile=False)
    rounds = interleaved_rounds({"x": lambda: calls.append("x"), "y": lambda: calls.append("y")}, settings)
    assert {k: len(v) for k, v in rounds.items()} == {"x": 3, "y": 3}
    assert calls == ["x", "y", "y", "x", "x", "y", "y", "x"]  # warm-up included, each round one case later


@pytest.mark.parametrize("C, S", [(8, 87), (87, 8)])
def test_section_n_layer_norm_formulations_equal_torchs(C, S):
    """Every LayerNorm formulation section n times is torch's LayerNorm (values and the three gradients), each read
    in its own layout: a timing of one that computed something else would compare nothing."""
    sys.path.insert(0, ROOT)
    try:
        from benchmarks.narrow import LAYER_NORMS, LAYOUTS
    finally:
        sys.path.remove(ROOT)
    g = torch.Generator().manual_seed(0)
    x, grad, w, b = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in
                     ((4, S, C), (4, S, C), (C,), (C,)))
    ref = None
    for name, f in LAYER_NORMS.items():
        layout = LAYOUTS.get(name, lambda t: t.detach().clone())
        xs, gs = layout(x).requires_grad_(), layout(grad)
        ws, bs = w.clone().requires_grad_(), b.clone().requires_grad_()
        y = f(xs, ws, bs)
        y.backward(gs)
        back = (lambda t: t) if name not in LAYOUTS else (lambda t: t.t().reshape(x.shape))
        got = (back(y), back(xs.grad), ws.grad, bs.grad)
        ref = got if ref is None else ref
        for a, r in zip(got, ref):
            assert rel_err(a, r) < 1e-12, name


@pytest.mark.slow  # a process that imports torch and pkmixer
def test_benchmark_memory_probe_runs_in_a_subprocess():
    spec = {"model": "swmlp", "options": {"img_size": 8, "patch_size": 4, "embed_dim": 16, "density": 0.25,
                                          "depth": 1}, "batch": 2, "steps": 1, "threads": 1, "device": "cpu",
            "dtype": "float32"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memprobe", json.dumps(spec)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["ok"] and answer["trains"] and answer["peak_bytes"] >= 0 and answer["kept_weights"] > 0


# ---- LayerNorm over few channels: the C kernel -------------------------------------------------------------

def _norm_pair(C: int, eps: float = 1e-6) -> tuple[torch.nn.Module, torch.nn.LayerNorm]:
    from pkmixer.layers.norm import NarrowLayerNorm

    ours, ref = NarrowLayerNorm(C, eps), torch.nn.LayerNorm(C, eps=eps)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def _close(a: torch.Tensor, r: torch.Tensor, tol: float = 1e-5) -> bool:
    """Within ``tol`` of r's largest entry (an input gradient over one channel is 0 up to torch's rounding)."""
    return float((a - r).abs().max()) <= tol * max(1.0, float(r.abs().max()))


def _kernel_or_skip():
    from pkmixer.layers.norm import _kernel

    if _kernel() is None:
        pytest.skip("no C kernel on this machine: needs a C compiler (cc)")


@pytest.mark.parametrize("C", range(1, 16))
@pytest.mark.parametrize("shape", [(6, 37), (50,), (2, 3, 5)])
def test_narrow_layer_norm_equals_torchs(one_thread, C, shape):
    """NarrowLayerNorm (the C kernel, one thread, float32) is nn.LayerNorm within float32 rounding: values and the
    gradients of input, weight and bias, for every width the kernel has code for (1 to 15, all that models use it for)
    and any leading shape. Over two channels the
    input gradient is 0 but for ε (the normalised row is ±1), so both kernels give only rounding there."""
    from pkmixer.layers.norm import NarrowLayerNorm, kernel_applies

    _kernel_or_skip()
    ours, ref = _norm_pair(C)
    assert isinstance(ours, NarrowLayerNorm)
    x = torch.randn(*shape, C, requires_grad=True)
    grad = torch.randn(*shape, C)
    assert kernel_applies(x, ours.weight, ours.bias)
    got, want = ours(x), ref(x)
    assert (got - want).abs().max() < 1e-5
    pairs = list(zip(_grads(got, grad, [x, ours.weight, ours.bias]), _grads(want, grad, [x, ref.weight, ref.bias])))
    if C == 1:  # x̂ = 0: the input and weight gradients are 0, exactly in the kernel, up to rounding in torch's
        assert not pairs[0][0].any() and not pairs[1][0].any()
        pairs = pairs[2:]
    for a, r in pairs[0 if C > 2 else 1:]:
        assert _close(a, r)


def test_narrow_layer_norm_takes_any_layout_and_empty_batches(one_thread):
    _kernel_or_skip()
    ours, ref = _norm_pair(8)
    x = torch.randn(5, 8, 20).transpose(1, 2).requires_grad_()  # a strided (5, 20, 8) view
    grad = torch.randn(5, 20, 8).transpose(0, 1).contiguous().transpose(0, 1)
    got, want = ours(x), ref(x)
    assert (got - want).abs().max() < 1e-5
    for a, r in zip(_grads(got, grad, [x, ours.weight]), _grads(want, grad, [x, ref.weight])):
        assert _close(a, r)
    empty = torch.zeros(0, 8, requires_grad=True)
    assert ours(empty).shape == (0, 8)
    ours(empty).sum().backward()
    assert empty.grad.shape == (0, 8) and ours.weight.grad is not None


def test_layer_norm_factory_keeps_torchs_module_from_16_channels_and_the_state_dict():
    from pkmixer.layers.norm import NARROW_NORM, NarrowLayerNorm, layer_norm

    assert type(layer_norm(NARROW_NORM, 1e-6)) is torch.nn.LayerNorm
    narrow = layer_norm(NARROW_NORM - 1, 1e-5)
    assert isinstance(narrow, NarrowLayerNorm) and narrow.eps == 1e-5
    plain = torch.nn.LayerNorm(NARROW_NORM - 1, eps=1e-5)
    assert narrow.state_dict().keys() == plain.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(narrow.state_dict().values(), plain.state_dict().values()))


def test_narrow_layer_norm_runs_torchs_kernel_elsewhere(one_thread):
    """More than one thread, float64, or no kernel: exactly torch's LayerNorm."""
    from pkmixer.layers.norm import kernel_applies, narrow_layer_norm

    ours, ref = _norm_pair(4)
    x = torch.randn(3, 7, 4)
    torch.set_num_threads(2)
    assert not kernel_applies(x, ours.weight, ours.bias)
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))
    torch.set_num_threads(1)
    x64 = x.double()
    assert torch.equal(narrow_layer_norm(x64, ours.weight.double(), ours.bias.double(), 1e-6),
                       F.layer_norm(x64, (4,), ours.weight.double(), ours.bias.double(), 1e-6))


def test_narrow_layer_norm_backward_after_a_thread_change_and_second_derivatives(one_thread):
    """A backward run with another thread count than its forward, and a second derivative (create_graph), go
    through torch's operators and agree with nn.LayerNorm's."""
    _kernel_or_skip()
    ours, ref = _norm_pair(6)
    x = torch.randn(9, 6, requires_grad=True)
    grad = torch.randn(9, 6)
    y = ours(x)
    torch.set_num_threads(2)
    try:
        got = _grads(y, grad, [x, ours.weight, ours.bias])
    finally:
        torch.set_num_threads(1)
    for a, r in zip(got, _grads(ref(x), grad, [x, ref.weight, ref.bias])):
        assert _close(a, r)
    hvp = []
    for norm, weight in ((ours, ours.weight), (ref, ref.weight)):
        gx, = torch.autograd.grad((norm(x) ** 3).sum(), [x], create_graph=True)
        hvp.append(torch.autograd.grad((gx * grad).sum(), [x, weight]))
    for a, r in zip(*hvp):
        assert _close(a, r, 1e-4)


def test_narrow_layer_norm_is_one_node_when_traced_scripted_and_exported(one_thread):
    """torch.fx, TorchScript and torch.export keep the kernel (one node or operator), so that they compute
    exactly what the eager module does."""
    _kernel_or_skip()
    assert_one_node_traced_scripted_exported(torch.nn.Sequential(_norm_pair(8)[0]), torch.randn(4, 10, 8),
                                             "narrow_layer_norm")


def test_a_narrow_mixer_traces_scripts_exports_and_stacks(one_thread):
    """A C = 4 S-Mixer (its LayerNorms NarrowLayerNorm): FX, TorchScript and torch.export give exactly the eager
    outputs; its stacked form (torch's LayerNorm per member) gives each member's within float rounding."""
    import warnings

    from pkmixer.layers.norm import NarrowLayerNorm
    from pkmixer.train.stack import stack_models

    _kernel_or_skip()
    members = [perturb_(pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=4, num_tokens=20))
               for _ in range(2)]
    model = members[0].eval()
    assert sum(isinstance(m, NarrowLayerNorm) for m in model.modules()) == 6  # 2 per block, the skip, the head
    assert model.fuse_sublayers  # its sublayers' norms run in the fused kernel (tests/test_fused_sublayers.py)
    x = torch.randn(3, 1, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    with torch.no_grad():
        want = model(x)
        for other in (torch.fx.symbolic_trace(model), scripted, torch.export.export(model, (x,)).module()):
            assert torch.equal(other(x), want)
        stacked = stack_models(members).eval()
        both = stacked(x.unsqueeze(0).expand(2, -1, -1, -1, -1))
        for k, member in enumerate(members):
            assert _close(both[k], member(x))


@pytest.mark.slow  # torch.compile builds C++ (about 20 s)
def test_narrow_layer_norm_compiled_equals_eager(one_thread):
    _kernel_or_skip()
    norm = _norm_pair(8)[0]
    compiled = torch.compile(norm)
    x = torch.randn(4, 10, 8, requires_grad=True)
    grad = torch.randn(4, 10, 8)
    got, want = compiled(x), norm(x)
    assert torch.equal(got, want)
    for a, r in zip(_grads(got, grad, [x, norm.weight]), _grads(want, grad, [x, norm.weight])):
        assert torch.equal(a, r)


def test_layer_norm_kernel_is_bit_identical_across_x86_levels(tmp_path):
    """The kernel built for the baseline x86-64, for x86-64-v3 and for this machine's level gives the same bits
    (fixed summation order, no fused multiply-adds)."""
    import ctypes

    from pkmixer import kernels

    outputs = []
    for level in ([], ["-march=x86-64-v3"], list(kernels._flags()[len(kernels._BASE_FLAGS):])):
        so = build_kernel_at(tmp_path, "layer_norm", level)
        so.pkmixer_layer_norm_forward.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_ssize_t] * 2 + [ctypes.c_float]
        so.pkmixer_layer_norm_backward.argtypes = [ctypes.c_void_p] * 8 + [ctypes.c_ssize_t] * 2 + [ctypes.c_float]
        found = []
        for n in (7, 12):  # rows one at a time, and in lanes (from 8 channels up)
            g = torch.Generator().manual_seed(0)
            x, w, b, grad = (torch.randn(*s, generator=g) for s in ((300, n), (n,), (n,), (300, n)))
            y, gx = torch.empty_like(x), torch.empty_like(x)
            gw, gb = torch.empty(n), torch.empty(n)
            assert so.pkmixer_layer_norm_forward(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), None,
                                                 None, 300, n, 1e-6) == 0
            assert so.pkmixer_layer_norm_backward(grad.data_ptr(), x.data_ptr(), None, None, w.data_ptr(),
                                                  gx.data_ptr(), gw.data_ptr(), gb.data_ptr(), 300, n, 1e-6) == 0
            found += [y, gx, gw, gb]
        assert so.pkmixer_layer_norm_forward(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), None, None,
                                             300, 16, 1e-6) == 1  # refuses widths it has no copy for
        outputs.append(found)
    for other in outputs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outputs[0], other))


@pytest.mark.parametrize("C", [8, 12, 15])
def test_layer_norm_kernel_gives_a_row_the_same_bits_in_lanes_and_alone(C):
    """From 8 channels up the kernel normalises rows eight at a time, one per lane, and the rows left over one at a
    time: a row's output and input gradient are the same bits either way (moved by one row, each of 9 rows goes
    the other way); the weight and bias gradients, summed in another order, agree within rounding."""
    from pkmixer.layers.norm import _backward, _forward

    _kernel_or_skip()
    g = torch.Generator().manual_seed(C)
    x, w, b, grad = (torch.randn(*s, generator=g) for s in ((9, C), (C,), (C,), (9, C)))
    y, mean, rstd = _forward(x, w, b, 1e-6, moments=True)
    moved, moved_mean, moved_rstd = _forward(x.roll(1, 0), w, b, 1e-6, moments=True)
    assert torch.equal(moved.roll(-1, 0), y) and torch.equal(moved_mean.roll(-1, 0), mean)
    assert torch.equal(moved_rstd.roll(-1, 0), rstd)
    for stats in ((mean, rstd), (moved_mean, moved_rstd), (None, None)):
        shift = 1 if stats[0] is moved_mean else 0
        gx, gw, gb = _backward(grad.roll(shift, 0), x.roll(shift, 0), w, 1e-6, *stats)
        want = _backward(grad, x, w, 1e-6, mean, rstd)
        assert torch.equal(gx.roll(-shift, 0), want[0])
        assert torch.allclose(gw, want[1], rtol=1e-6, atol=1e-6) and torch.allclose(gb, want[2], rtol=1e-6, atol=1e-6)


def test_kernel_build_says_why_it_is_unavailable(monkeypatch, tmp_path):
    """The switch, a missing compiler, a failed build and an unwritable cache each give None with a warning that
    names the reason, once; a run's environment line names it without a warning; nothing is left half-written in
    the cache."""
    import warnings

    from pkmixer import kernels

    cases = [({"PKMIXER_NATIVE_KERNELS": "0"}, "PKMIXER_NATIVE_KERNELS=0"),
             ({"CC": "no-such-compiler-pkmixer"}, "no C compiler"),
             ({"CC": "false"}, "no C compiler")]  # `false --version` fails
    if kernels._compiler() is not None:
        cases.append(({"PKMIXER_KERNEL_CACHE": str(tmp_path / "file" / "kernels")}, "cannot build under"))
    (tmp_path / "file").write_text("not a directory")
    for env, reason in cases:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            kernels._loaded.cache_clear()
            m.setattr(kernels, "_warned", set())
            assert reason in kernels.describe("layer_norm")  # without a warning
            with pytest.warns(RuntimeWarning, match=reason):
                assert kernels.load("layer_norm") is None
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                assert kernels.load("layer_norm") is None  # warned once
    kernels._loaded.cache_clear()
    monkeypatch.setenv("PKMIXER_KERNEL_CACHE", str(tmp_path / "fresh"))
    if kernels._compiler() is not None:
        assert kernels.load("layer_norm") is not None
        assert [p.suffix for p in (tmp_path / "fresh").iterdir()] == [".so"]
    kernels._loaded.cache_clear()


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("objdump") is None,
                    reason="needs valgrind and objdump")
def test_kernel_counts_adds_up_the_instructions_by_kind(tmp_path, monkeypatch):
    """benchmarks.kernel_counts on two small layouts: every instruction in one kind, vector arithmetic in both entry
    points, the packed rows' forward with more instructions per vector than rows of 64 channels; the JSON written
    once (a second run onto it: exit 2, the file unchanged); a missing tool: one line, exit 2."""
    sys.path.insert(0, ROOT)
    try:
        from benchmarks import kernel_counts
    finally:
        sys.path.remove(ROOT)
    monkeypatch.setattr(kernel_counts, "LAYOUTS", ((64, 64, 0, 1), (8, 512, 16, 32)))
    out = tmp_path / "counts.json"
    assert kernel_counts.main(["--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        for direction in ("forward", "backward"):
            counted = row[direction]
            assert sum(counted["by_kind"].values()) == counted["instructions"] > 0
            assert counted["by_kind"]["vector arithmetic"] > 0
    wide, packed = (row["forward"]["instructions"] / row["vectors"] for row in rows)
    assert packed > wide
    before = out.read_text()
    assert kernel_counts.main(["--out", str(out)]) == 2 and out.read_text() == before
    monkeypatch.setattr(kernel_counts.shutil, "which", lambda tool: None if tool == "valgrind" else "/bin/true")
    assert kernel_counts.main([]) == 2
