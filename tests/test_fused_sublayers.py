"""The S-Mixer's fused sublayers (pkmixer.layers.fused, the C kernel ``residual_gelu_norm.c``) against torch's
operators: the op in float32 against float64 autograd for every layout the kernel has (rows of 16 channels or more,
with and without a partial last vector; 4 and 8 channels packed; batch-first and sequence-first streams), its
fallbacks, its builds at the x86-64 levels (the same bits but for AVX-512's row sums), its traced, scripted and
exported forms; and fused models against the same models run as modules. The traced, scripted, exported,
checkpointed and intermediate-feature forms of fused zoo models (8 channels, sequence-first, and 16) are checked bit
for bit against the eager ones here with tests/test_timm_conventions.py's checks, and a C = 4 S-Mixer's in
tests/test_fastpaths.py.
Correctness only: nothing here is timed."""
import ctypes
import platform
import warnings

import pytest
import torch

import pkmixer
from pkmixer.layers import fused

from conftest import build_kernel_at, perturb_


def _kernel_or_skip():
    if not fused.kernel_available():
        pytest.skip("no C kernel on this machine: needs a C compiler (cc)")


def _inputs(B, S, C, token_bias, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, z = torch.randn(B, S, C, generator=g), 3 * torch.randn(B, S, C, generator=g)  # z wide: GELU's curved part
    bias = torch.randn(S if token_bias else C, generator=g)
    weight, beta = torch.randn(C, generator=g), torch.randn(C, generator=g)
    grad_y, grad_u = torch.randn(B, S, C, generator=g), torch.randn(B, S, C, generator=g)
    return [t.to(dtype) for t in (x, z, bias, weight, beta)], grad_y.to(dtype), grad_u.to(dtype)


def _outputs_and_grads(fn, inputs, token_bias, grad_y, grad_u):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    y, u = fn(*leaves[:3], token_bias, *leaves[3:], 1e-6)
    outs, grads = ([y, u], [grad_y, grad_u]) if grad_y is not None else ([u], [grad_u])
    return [y, u, *torch.autograd.grad(outs, leaves, grads)]


def _rel(a, r):
    a, r = a.detach().double(), r.detach().double()
    return float((a - r).abs().max() / r.abs().max())


CASES = [(16, 64, 64, True), (16, 64, 64, False), (4, 30, 16, True), (2, 3, 17, False), (4, 9, 100, True),
         (3, 16, 56, False), (2, 8, 87, True), (40, 49, 4, True), (5, 126, 4, False), (6, 49, 8, True),
         (2, 87, 8, False), (3, 7, 4, True)]


@pytest.mark.parametrize("with_grad_y", [True, False])
@pytest.mark.parametrize("B, S, C, token_bias", CASES)
def test_kernel_matches_float64_autograd(one_thread, B, S, C, token_bias, with_grad_y):
    """y, u and the gradients of x, z, b, w and β agree with float64 autograd of x + gelu(z + b) and its LayerNorm
    to 1e-5 of each one's largest entry (torch's own float32 operators reach about 3e-6 here), with and without a
    gradient on y."""
    _kernel_or_skip()
    inputs, grad_y, grad_u = _inputs(B, S, C, token_bias)
    assert fused.kernel_applies(*inputs, token_bias)
    want = _outputs_and_grads(fused.reference, [t.double() for t in inputs], token_bias,
                              grad_y.double() if with_grad_y else None, grad_u.double())
    got = _outputs_and_grads(fused.residual_gelu_norm, inputs, token_bias, grad_y if with_grad_y else None, grad_u)
    assert all(g.dtype == torch.float32 for g in got)
    errors = [_rel(a, r) for a, r in zip(got, want)]
    assert max(errors) < 1e-5, errors


SEQUENCE_FIRST_CASES = [(16, 64, 8, True), (5, 126, 4, True), (3, 49, 4, True), (7, 9, 8, True), (4, 30, 16, True),
                        (3, 7, 40, True), (6, 49, 8, False)]


@pytest.mark.parametrize("B, S, C, token_bias", SEQUENCE_FIRST_CASES)
def test_sequence_first_stream_gives_the_rows_of_the_batch_first_one(one_thread, B, S, C, token_bias):
    """On an (S, B, C) stream (``sequence_first``, the layout of a narrow S-Mixer's fused path) y, u and the
    gradients of x and z are the (B, S, C) stream's rows bit for bit (each row's work is the same), those of b, w
    and β within float rounding of them (their sums run over the rows in another order), and all within 1e-5 of
    float64 autograd; odd B puts the packed rows of one vector under two tokens."""
    _kernel_or_skip()
    inputs, grad_y, grad_u = _inputs(B, S, C, token_bias)
    seq = [t.transpose(0, 1).contiguous() for t in inputs[:2]] + inputs[2:]
    gy, gu = (t.transpose(0, 1).contiguous() for t in (grad_y, grad_u))
    assert fused.kernel_applies(*seq, token_bias, sequence_first=True)

    def run(fn, tensors, g_y, g_u, **kw):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        y, u = fn(*leaves[:3], token_bias, *leaves[3:], 1e-6, **kw)
        return [y, u, *torch.autograd.grad([y, u], leaves, [g_y, g_u])]

    got = run(fused.residual_gelu_norm, seq, gy, gu, sequence_first=True)
    batch_first = run(fused.residual_gelu_norm, inputs, grad_y, grad_u)
    for k in range(4):  # y, u, gx, gz
        assert torch.equal(got[k].transpose(0, 1), batch_first[k])
    assert all(_rel(a, r) < 1e-6 for a, r in zip(got[4:], batch_first[4:]))
    want = run(fused.reference, [t.double() for t in seq], gy.double(), gu.double(), sequence_first=True)
    assert max(_rel(a, r) for a, r in zip(got, want)) < 1e-5
    torch.set_num_threads(2)  # torch's operators, the same computation
    try:
        fallback = run(fused.residual_gelu_norm, seq, gy, gu, sequence_first=True)
    finally:
        torch.set_num_threads(1)
    assert max(_rel(a, r) for a, r in zip(fallback, want)) < 1e-5


def test_kernel_takes_strided_inputs_and_gradients(one_thread):
    """Non-contiguous x, z and gradients (the narrow token mixing hands over a transposed product) give what their
    contiguous copies give, bit for bit."""
    _kernel_or_skip()
    inputs, grad_y, grad_u = _inputs(6, 20, 8, True)
    x, z = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in inputs[:2])
    strided = [x, z, *inputs[2:]]
    assert not x.is_contiguous() and not z.is_contiguous()
    gy, gu = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (grad_y, grad_u))
    got = _outputs_and_grads(fused.residual_gelu_norm, strided, True, gy, gu)
    want = _outputs_and_grads(fused.residual_gelu_norm, inputs, True, grad_y, grad_u)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_widths_without_code_run_torchs_operators(one_thread):
    """The kernel has code for 4, 8 and 16 to 2048 channels (biases up to 2048 entries; a packed token bias up to
    2048 floats a period): elsewhere, or with two threads or float64, the op is exactly :func:`fused.reference`,
    and the kernel itself refuses such a width."""
    assert [c for c in range(1, 40) if fused.kernel_takes(c, 1, False)] == [4, 8, *range(16, 40)]
    assert fused.kernel_takes(2048, 2048, True) and not fused.kernel_takes(2049, 1, False)
    assert not fused.kernel_takes(64, 2049, True) and fused.kernel_takes(8, 256, True)
    assert not fused.kernel_takes(8, 257, True)
    for (B, S, C, token_bias), threads, dtype in [((3, 5, 7, True), 1, torch.float32),
                                                  ((3, 5, 16, False), 2, torch.float32),
                                                  ((3, 5, 16, True), 1, torch.float64)]:
        inputs, _, _ = _inputs(B, S, C, token_bias, dtype)
        torch.set_num_threads(threads)
        assert not fused.kernel_applies(*inputs, token_bias)
        got = fused.residual_gelu_norm(*inputs[:3], token_bias, *inputs[3:], 1e-6)
        want = fused.reference(*inputs[:3], token_bias, *inputs[3:], 1e-6)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    torch.set_num_threads(1)
    lib = fused._kernel()
    if lib is not None:
        x = torch.zeros(2, 7)
        assert lib.pkmixer_residual_gelu_norm_forward(*[x.data_ptr()] * 3, 0, 1, *[x.data_ptr()] * 6, 2, 7, 1e-6) == 1


def test_thread_change_and_second_derivatives(one_thread):
    """A backward with another thread count than its forward, and a second derivative (create_graph), go through
    torch's operators and agree with the reference's."""
    _kernel_or_skip()
    inputs, grad_y, grad_u = _inputs(4, 10, 16, True)
    leaves = [t.clone().requires_grad_() for t in inputs]
    y, u = fused.residual_gelu_norm(*leaves[:3], True, *leaves[3:], 1e-6)
    torch.set_num_threads(2)
    try:
        got = torch.autograd.grad([y, u], leaves, [grad_y, grad_u])
    finally:
        torch.set_num_threads(1)
    want = _outputs_and_grads(fused.reference, inputs, True, grad_y, grad_u)[2:]
    assert max(_rel(a, r) for a, r in zip(got, want)) < 1e-5
    second = []
    for fn in (fused.residual_gelu_norm, fused.reference):
        leaves = [t.clone().requires_grad_() for t in inputs]
        y, u = fn(*leaves[:3], True, *leaves[3:], 1e-6)
        gx, gz = torch.autograd.grad((u ** 3).sum() + (y * grad_y).sum(), leaves[:2], create_graph=True)
        second.append(torch.autograd.grad((gx * grad_u).sum() + (gz * grad_y).sum(), leaves))
    assert max(_rel(a, r) for a, r in zip(*second)) < 1e-4


class _Close(torch.nn.Module):
    def __init__(self, C: int, S: int):
        super().__init__()
        self.bias, self.weight, self.beta = (torch.nn.Parameter(torch.randn(n)) for n in (S, C, C))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y, u = fused.residual_gelu_norm(x, z, self.bias, True, self.weight, self.beta, 1e-6)
        return y * u


def test_op_is_one_node_when_traced_scripted_and_exported(one_thread):
    """torch.fx, TorchScript and torch.export keep the op (one node, or the operator pkmixer::residual_gelu_norm)
    and compute exactly what the eager one does, forward and backward."""
    _kernel_or_skip()
    module = _Close(16, 10)
    inputs, grad, _ = _inputs(3, 10, 16, True)
    x, z = inputs[:2]
    graph = torch.fx.symbolic_trace(module)
    assert [n.target.__name__ for n in graph.graph.nodes if n.op == "call_function"][0] == "residual_gelu_norm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(module)
    exported = torch.export.export(module, (x, z)).module()
    assert "pkmixer.residual_gelu_norm" in str(exported.graph)

    def run(fn):
        xs, zs = x.clone().requires_grad_(), z.clone().requires_grad_()
        out = fn(xs, zs)
        return [out, *torch.autograd.grad(out, [xs, zs, *module.parameters()], grad)]

    want = run(module)
    for other in (graph, scripted, exported):
        assert all(torch.equal(a, b) for a, b in zip(run(other), want))


def test_kernel_is_bit_identical_across_x86_levels(tmp_path):
    """The kernel built for the baseline x86-64 (fused multiply-adds from the library) and for x86-64-v3 gives the
    same bits, packed rows and rows with a partial last vector, both bias kinds, batch-first and sequence-first
    streams; a build for this machine's level gives them too, but for an AVX-512 build, and so does a v3 build with
    AVX-512's 16-float vectors (``-DVEC=16``: that width's code on any x86-64-v3 machine), whose sums over a row add
    in another order: their element-wise output y is the same bits and the rest within float rounding."""
    from pkmixer import kernels

    native = list(kernels._flags()[len(kernels._BASE_FLAGS):])
    outputs = []
    for level in ([], ["-march=x86-64-v3"], native, ["-march=x86-64-v3", "-DVEC=16"]):
        so = build_kernel_at(tmp_path, "residual_gelu_norm", level)
        ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
        so.pkmixer_residual_gelu_norm_forward.argtypes = [ptr] * 3 + [size] * 2 + [ptr] * 6 + [size, size,
                                                                                               ctypes.c_float]
        so.pkmixer_residual_gelu_norm_backward.argtypes = [ptr] * 8 + [size] * 2 + [ptr] * 5 + [size, size]
        found = []
        for B, S, C, token_bias, repeat in ((5, 9, 4, True, 1), (5, 9, 8, False, 1), (4, 7, 40, True, 1),
                                            (4, 7, 40, False, 1), (9, 5, 4, True, 9), (7, 6, 8, True, 7),
                                            (3, 7, 40, True, 3)):
            (x, z, bias, w, beta), gy, gu = _inputs(B, S, C, token_bias)
            rows, period = B * S, S if token_bias else 0  # repeat > 1: the same floats read as (S, B, C)
            y, u, gx, gz = (torch.empty_like(x) for _ in range(4))
            mean, rstd, gw, gbeta, gbias = (torch.empty(rows), torch.empty(rows), torch.empty(C), torch.empty(C),
                                            torch.empty_like(bias))
            assert so.pkmixer_residual_gelu_norm_forward(
                x.data_ptr(), z.data_ptr(), bias.data_ptr(), period, repeat, w.data_ptr(), beta.data_ptr(),
                y.data_ptr(), u.data_ptr(), mean.data_ptr(), rstd.data_ptr(), rows, C, 1e-6) == 0
            assert so.pkmixer_residual_gelu_norm_backward(
                gy.data_ptr(), gu.data_ptr(), y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), w.data_ptr(),
                z.data_ptr(), bias.data_ptr(), period, repeat, gx.data_ptr(), gz.data_ptr(), gw.data_ptr(),
                gbeta.data_ptr(), gbias.data_ptr(), rows, C) == 0
            found += [y, u, mean, rstd, gx, gz, gw, gbeta, gbias]
        outputs.append(found)
    baseline, v3, native_build, wide = outputs
    assert all(torch.equal(a, b) for a, b in zip(baseline, v3))
    if "-march=x86-64-v4" not in native:
        assert all(torch.equal(a, b) for a, b in zip(v3, native_build))
    for other in (native_build, wide):
        for k, (a, b) in enumerate(zip(v3, other)):
            if k % 9 == 0:  # y
                assert torch.equal(a, b)
            assert _rel(b, a) < 1e-5


def test_kernel_is_not_used_below_avx2(monkeypatch, tmp_path):
    """On an x86-64 CPU without AVX2 and FMA the kernel is not built (its fmaf calls would run in software), and
    says why."""
    from pkmixer import kernels

    monkeypatch.setenv("PKMIXER_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(kernels, "_level", lambda: None)
    with pytest.raises(RuntimeError, match="without AVX2"):
        kernels._build("residual_gelu_norm")
    kernels._build("layer_norm")  # a kernel without fused multiply-adds is built at any level


# ---- models -----------------------------------------------------------------------------------------------

FUSED_MODELS = [("smixer_c64p4_32", dict(img_size=16, depth=2)),
                ("smixer_t4_28", dict(img_size=16, depth=2, embed_dim=4, num_tokens=20)),  # packed, a skip
                ("smixer_t4_28", dict(img_size=16, depth=2, embed_dim=8)),  # packed, narrow token products
                ("smixer_t4_28", dict(img_size=16, depth=2, embed_dim=87, num_tokens=8))]


def _reached_kernel(out: torch.Tensor) -> bool:
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ == "_ResidualGeluNormBackward":
            return True
        todo += [f for f, _ in fn.next_functions]
    return False


@pytest.mark.parametrize("name, overrides", FUSED_MODELS)
def test_fused_model_equals_its_modules(one_thread, name, overrides):
    """A fused S-Mixer's logits and every parameter and input gradient agree with the same model run as modules
    (``fuse_sublayers = False``) to 1e-5 of each one's largest entry; the kernel ran."""
    _kernel_or_skip()
    torch.manual_seed(0)
    model = perturb_(pkmixer.create_model(name, **overrides), 0.3)
    assert model.fuse_sublayers
    x = torch.randn(5, model.in_chans, model.img_size, model.img_size)
    results = []
    for fuse in (True, False):
        model.fuse_sublayers = fuse
        xs = x.clone().requires_grad_()
        out = model(xs)
        assert _reached_kernel(out) == fuse
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum(),
                                    [xs, *model.parameters()])
        results.append([out, *grads])
    assert max(_rel(a, r) for a, r in zip(*results)) < 1e-5


def test_which_models_fuse(one_thread):
    """S-Mixers with the exact GELU, Listing 1's token mixing and widths the kernel takes are fusable; RP blocks, the
    MLP-Mixer, other activations, dropout, stochastic depth, untied tokens and widths without code are not. A
    fusable model runs fused in float32 on the CPU with one intra-op thread where the kernel is built: casting it to
    float64 and back turns the fused path off and on again, and built or moved with two threads it runs its
    modules. Below 16 channels its fused path holds the stream sequence-first."""
    def fusable(name, **kw):
        return pkmixer.create_model(name, img_size=16, depth=2, **kw).fusable

    assert fusable("smixer_t4_28") and fusable("smixer_t4_28", embed_dim=16, num_tokens=9)
    assert not fusable("rp_smixer_t4_28") and not fusable("mixer_t4_28")
    assert not fusable("smixer_t4_28", rp_blocks=[1])
    assert not fusable("smixer_t4_28", act="gelu_tanh") and not fusable("smixer_t4_28", act="relu")
    assert not fusable("smixer_t4_28", drop_path_rate=0.1) and not fusable("smixer_t4_28", proj_drop_rate=0.1)
    assert not fusable("smixer_t4_28", untied_tokens=True) and not fusable("smixer_t4_28", embed_dim=7)
    assert pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=8).fused_sequence_first
    assert not pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=16).fused_sequence_first
    assert not pkmixer.create_model("rp_smixer_t4_28", img_size=16, depth=2, embed_dim=8).fused_sequence_first
    torch.set_num_threads(1)
    model = pkmixer.create_model("smixer_t4_28", img_size=16, depth=2)
    assert model.fuse_sublayers == fused.kernel_available()
    assert not model.double().fuse_sublayers and model.float().fuse_sublayers == fused.kernel_available()
    torch.set_num_threads(2)  # torch's operators share the work: the modules run
    assert not pkmixer.create_model("smixer_t4_28", img_size=16, depth=2).fuse_sublayers
    assert not model.float().fuse_sublayers


@pytest.mark.parametrize("check", ["features/head/reset(0)", "features_only", "forward_intermediates/prune",
                                   "grad checkpointing", "fx fwd+bwd", "torchscript", "torch.export"])
@pytest.mark.parametrize("channels", [8, 16])
def test_fused_model_keeps_timm_conventions(one_thread, monkeypatch, check, channels):
    """The timm conventions' bit-for-bit checks (tests/test_timm_conventions.py: eager against checkpointed, traced,
    scripted and exported forwards, forward_intermediates and features_only with their pruning) on a fused
    S-Mixer, built with one thread (that file's own models, built with the session's threads, may run modules):
    with 8 channels (its stream sequence-first, a skip projection) and with 16."""
    import test_timm_conventions

    from test_timm_conventions import CHECKS

    _kernel_or_skip()
    sizes = test_timm_conventions.small_overrides
    monkeypatch.setattr(test_timm_conventions, "small_overrides", lambda name: {**sizes(name), "embed_dim": channels})
    model = test_timm_conventions.build("smixer_c128p4_32")
    assert model.fuse_sublayers and model.fused_sequence_first == (channels < 16)
    CHECKS[check]("smixer_c128p4_32")


def test_hooks_run_the_modules(one_thread):
    """A forward hook on a module inside the blocks sees its call: the forward runs the modules, exactly as an
    unfused copy does."""
    _kernel_or_skip()
    model = perturb_(pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=16)).eval()
    plain = pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=16).eval()
    plain.load_state_dict(model.state_dict())
    plain.fuse_sublayers = False
    calls = []
    handle = model.blocks[1].channel.mixing.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        hooked = model(x)
        handle.remove()
        assert calls == [1] and torch.equal(hooked, plain(x))
        assert not torch.equal(model(x), hooked)  # unhooked: the fused path, other last bits


@pytest.mark.slow  # torch.compile builds C++ (about 30 s)
def test_fused_model_compiled_runs_the_kernel(one_thread, monkeypatch):
    """torch.compile keeps the op (the kernel runs in the compiled forward, once per sublayer) and agrees with the
    eager model within float rounding (the compiler fuses the stem, pooling and head its own way)."""
    _kernel_or_skip()
    model = perturb_(pkmixer.create_model("smixer_t4_28", img_size=16, depth=2, embed_dim=16))
    x = torch.randn(3, 1, 16, 16)
    compiled = torch.compile(model)
    compiled(x)  # compiles
    calls = []
    forward = fused._kernel_forward
    monkeypatch.setattr(fused, "_kernel_forward", lambda *a: calls.append(1) or forward(*a))
    got = compiled(x)
    assert len(calls) == 4  # 2 blocks x 2 sublayers
    want = model(x)
    g = torch.randn_like(got)
    pairs = [(got, want), *zip(torch.autograd.grad(got, list(model.parameters()), g),
                               torch.autograd.grad(want, list(model.parameters()), g))]
    assert max(_rel(a, r) for a, r in pairs) < 1e-5
