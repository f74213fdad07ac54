"""The C Dense over 4 or 8 channels (pkmixer.layers.narrow_linear, fast path 10) against F.linear and float64:
values and gradients, the fallbacks, its traced, scripted, exported and compiled forms, and its builds at two
x86-64 levels and two vector widths against each other. Correctness only: nothing here is timed."""
import ctypes

import pytest
import torch
import torch.nn.functional as F

from pkmixer.layers import narrow_linear as nl
from pkmixer.layers.mlp import FcAct

from conftest import assert_one_node_traced_scripted_exported, build_kernel_at


def _kernel_or_skip() -> None:
    if nl._kernel() is None:
        pytest.skip("no C kernel on this machine: needs a C compiler (cc)")


def _reference(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """y, grad x, grad w in float64."""
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y = F.linear(x64, w64)
    return [y, *torch.autograd.grad(y, [x64, w64], g.double())]


@pytest.mark.parametrize("n", nl.WIDTHS)
@pytest.mark.parametrize("shape", [(37,), (2, 5), (1,), (4, 33)])
def test_kernel_equals_float64_within_float_rounding(one_thread, n, shape):
    """y = x Wᵀ, and the gradients of x and W, within 1e-6 of float64's largest entry (F.linear's float32 error
    is of the same size), for odd row counts (a last vector half full) and leading shapes."""
    _kernel_or_skip()
    x = torch.randn(*shape, n, requires_grad=True)
    w = torch.randn(n, n, requires_grad=True)
    g = torch.randn(*shape, n)
    assert nl.kernel_applies(x, w)
    y = nl.narrow_linear(x, w)
    assert y.grad_fn is not None and "NarrowLinear" in type(y.grad_fn).__name__
    got = [y, *torch.autograd.grad(y, [x, w], g)]
    for a, r in zip(got, _reference(x, w, g)):
        assert a.dtype == torch.float32 and a.shape == r.shape
        assert (a.double() - r).abs().max() <= 1e-6 * r.abs().max() * 4
    plain = [F.linear(x, w), *torch.autograd.grad(F.linear(x, w), [x, w], g)]
    for a, p in zip(got, plain):
        assert torch.allclose(a, p, rtol=1e-5, atol=1e-5)


def test_kernel_takes_a_strided_input_and_an_empty_batch(one_thread):
    _kernel_or_skip()
    x = torch.randn(5, 8, 20).transpose(1, 2).requires_grad_()  # a strided (5, 20, 8) view
    w = torch.randn(8, 8, requires_grad=True)
    g = torch.randn(5, 20, 8)
    y = nl.narrow_linear(x, w)
    got = [y, *torch.autograd.grad(y, [x, w], g)]
    for a, r in zip(got, _reference(x, w, g)):
        assert (a.double() - r).abs().max() <= 1e-5
    empty = torch.zeros(0, 4, requires_grad=True)
    w4 = torch.randn(4, 4, requires_grad=True)
    out = nl.narrow_linear(empty, w4)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert empty.grad.shape == (0, 4) and torch.equal(w4.grad, torch.zeros(4, 4))


def test_other_widths_threads_and_dtypes_run_f_linear_exactly(one_thread):
    """16 channels, a non-square weight, float64 or two threads: exactly F.linear."""
    x = torch.randn(3, 7, 4)
    w = torch.randn(4, 4)
    torch.set_num_threads(2)
    assert not nl.kernel_applies(x, w)
    assert torch.equal(nl.narrow_linear(x, w), F.linear(x, w))
    torch.set_num_threads(1)
    for xs, ws in ((torch.randn(3, 16), torch.randn(16, 16)), (torch.randn(3, 4), torch.randn(8, 4)),
                   (x.double(), w.double())):
        assert not nl.kernel_applies(xs, ws)
        assert torch.equal(nl.narrow_linear(xs, ws), F.linear(xs, ws))


def test_fcact_product_takes_the_kernel_for_square_dense_of_4_or_8_features():
    for features, out, narrow in ((4, 4, True), (8, 8, True), (16, 16, False), (4, 8, False), (5, 5, False)):
        assert FcAct(features, None, out).narrow_product is narrow
    mlp = FcAct(8, None, 8)
    x = torch.randn(2, 3, 8)
    assert torch.allclose(mlp.product(x), F.linear(x, mlp.fc.weight), atol=1e-6)


def test_backward_after_a_thread_change_and_second_derivatives(one_thread):
    """A backward run with another thread count than its forward, and a second derivative (create_graph), go
    through torch's operators and agree with F.linear's."""
    _kernel_or_skip()
    x = torch.randn(9, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    g = torch.randn(9, 8)
    y = nl.narrow_linear(x, w)
    torch.set_num_threads(2)
    try:
        got = torch.autograd.grad(y, [x, w], g)
    finally:
        torch.set_num_threads(1)
    for a, r in zip(got, torch.autograd.grad(F.linear(x, w), [x, w], g)):
        assert torch.allclose(a, r, atol=1e-5)
    hvp = []
    for fn in (nl.narrow_linear, F.linear):
        gx, = torch.autograd.grad((fn(x, w) ** 3).sum(), [x], create_graph=True)
        hvp.append(torch.autograd.grad((gx * g).sum(), [x, w]))
    for a, r in zip(*hvp):
        assert torch.allclose(a, r, rtol=1e-4, atol=1e-4)


class _Product(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = FcAct(8, None, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp.product(x)


def test_one_node_when_traced_scripted_and_exported(one_thread):
    """torch.fx, TorchScript and torch.export keep the kernel (one node or operator), so that they compute
    exactly what the eager module does."""
    _kernel_or_skip()
    assert_one_node_traced_scripted_exported(_Product(), torch.randn(4, 10, 8), "narrow_linear")


@pytest.mark.slow  # torch.compile builds C++ (about 20 s)
def test_compiled_equals_eager(one_thread):
    _kernel_or_skip()
    model = _Product()
    compiled = torch.compile(model)
    x = torch.randn(4, 10, 8, requires_grad=True)
    g = torch.randn(4, 10, 8)
    got, want = compiled(x), model(x)
    assert torch.equal(got, want)
    for a, r in zip(torch.autograd.grad(got, [x, model.mlp.fc.weight], g),
                    torch.autograd.grad(want, [x, model.mlp.fc.weight], g)):
        assert torch.equal(a, r)


def test_kernel_is_bit_identical_across_x86_levels_and_vector_widths(tmp_path):
    """Builds for the baseline x86-64 and for x86-64-v3 give the same bits; a v3 build with AVX-512's 16-float
    vectors (-DVEC=16) gives y and the input gradient bit for bit (each a fixed sum over n terms) and the weight
    gradient, summed over rows by lane, within float rounding."""
    builds = {"baseline": ["-march=x86-64"], "v3": ["-march=x86-64-v3"], "v3-vec16": ["-march=x86-64-v3", "-DVEC=16"]}
    results = {}
    for name, flags in builds.items():
        lib = build_kernel_at(tmp_path, "narrow_linear", flags)
        out = []
        for n, rows in ((4, 1001), (8, 517)):
            g = torch.Generator().manual_seed(n)
            x, w, gy = (torch.randn(rows, n, generator=g), torch.randn(n, n, generator=g),
                        torch.randn(rows, n, generator=g))
            y, gx, gw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
            assert lib.pkmixer_narrow_linear_forward(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(w.data_ptr()),
                                                     ctypes.c_void_p(y.data_ptr()), ctypes.c_ssize_t(rows),
                                                     ctypes.c_ssize_t(n)) == 0
            assert lib.pkmixer_narrow_linear_backward(*(ctypes.c_void_p(t.data_ptr()) for t in (gy, x, w, gx, gw)),
                                                      ctypes.c_ssize_t(rows), ctypes.c_ssize_t(n)) == 0
            out.append((y, gx, gw))
        results[name] = out
    for (y, gx, gw), (y3, gx3, gw3), (y16, gx16, gw16) in zip(*results.values()):
        assert torch.equal(y, y3) and torch.equal(gx, gx3) and torch.equal(gw, gw3)
        assert torch.equal(y, y16) and torch.equal(gx, gx16)
        assert (gw - gw16).abs().max() <= 1e-6 * gw.abs().max()
