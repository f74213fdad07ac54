"""A Dense over 4 or 8 channels without its bias: the channel mixing W x of a narrow fused S-Mixer (Hayase &
Karakida Eq. 5), at the narrowest widths of the fixed-Ω grids.

torch runs ``F.linear`` as a BLAS GEMM, whose inner and output sizes are here only the 4 or 8 channels: on the AMD
machine of docs/performance.md one over the (16128, 4) rows of the C = 4 S-Mixer took 0.19 ms forward and 0.28 ms
backward, 8-9 times the C kernel ``pkmixer/kernels/narrow_linear.c`` (fast path 10). :func:`narrow_linear` runs the
kernel where :func:`kernel_applies` (float32 CPU tensors, one intra-op thread, 4 or 8 channels, a kernel built on
this machine), ``F.linear`` elsewhere; the two agree within float rounding (tests/test_fastpaths.py). It is one node
of an FX graph (``torch.fx.wrap``) and the operator ``torch.ops.pkmixer.narrow_linear`` (with its backward) to
TorchScript, torch.export and torch.compile. A second derivative (``create_graph=True``) goes through torch's
operators. :meth:`pkmixer.layers.mlp.FcAct.product` uses it: the fused path's channel products.
"""
from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from .. import kernels

WIDTHS = (4, 8)  # the channel counts the kernel has code for


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    lib = kernels.load("narrow_linear")
    if lib is not None:
        ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
        lib.pkmixer_narrow_linear_forward.argtypes = [ptr] * 3 + [size, size]
        lib.pkmixer_narrow_linear_backward.argtypes = [ptr] * 5 + [size, size]
        lib.pkmixer_narrow_linear_forward.restype = lib.pkmixer_narrow_linear_backward.restype = ctypes.c_int
    return lib


def kernel_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the C kernel computes x Wᵀ: float32 CPU tensors, a square (n, n) weight with n = 4 or 8 the last
    axis of x, one intra-op thread, and a kernel built on this machine (:mod:`pkmixer.kernels`)."""
    n = x.shape[-1] if x.dim() >= 1 else 0
    return (n in WIDTHS and weight.shape == (n, n) and torch.get_num_threads() == 1
            and x.dtype == weight.dtype == torch.float32 and x.device.type == weight.device.type == "cpu"
            and _kernel() is not None)


def _forward(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x, weight = x.contiguous(), weight.contiguous()
    n = x.shape[-1]
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    if _kernel().pkmixer_narrow_linear_forward(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // n, n):
        raise RuntimeError("narrow_linear: the kernel refused its input")  # kernel_applies admits only its widths
    return y


def _backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad of x, grad of the weight) from the kernel."""
    grad, x, weight = grad.contiguous(), x.contiguous(), weight.contiguous()
    n = x.shape[-1]
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format)
    if _kernel().pkmixer_narrow_linear_backward(grad.data_ptr(), x.data_ptr(), weight.data_ptr(), grad_x.data_ptr(),
                                                grad_weight.data_ptr(), x.numel() // n, n):
        raise RuntimeError("narrow_linear: the kernel refused its input")
    return grad_x, grad_weight


def _torch_grads(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same gradients from torch's operators; recorded, and so differentiable again, when grad mode is on."""
    n = x.shape[-1]
    return grad @ weight, grad.reshape(-1, n).t() @ x.reshape(-1, n)


def _grads(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's gradients; torch's where the backward is recorded (``create_graph=True``) or the kernel no
    longer applies (the thread count changed since the forward)."""
    if not torch.is_grad_enabled() and kernel_applies(x, weight):
        return _backward(grad, x, weight)
    return _torch_grads(grad, x, weight)


class _NarrowLinear(torch.autograd.Function):
    """The eager path: the kernel forward and backward, saving the input and the weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return _forward(x, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x, grad_weight = _grads(grad, x, weight)
        needs = ctx.needs_input_grad
        return grad_x if needs[0] else None, grad_weight if needs[1] else None


# The same computation as operators of torch.ops, opaque to TorchScript, torch.export and torch.compile.
@torch.library.custom_op("pkmixer::narrow_linear", mutates_args=())
def _narrow_linear_op(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if kernel_applies(x, weight):
        return _forward(x, weight)
    return F.linear(x, weight)


@_narrow_linear_op.register_fake
def _(x, weight):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("pkmixer::narrow_linear_backward", mutates_args=())
def _narrow_linear_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    return _grads(grad, x, weight)


@_narrow_linear_backward_op.register_fake
def _(grad, x, weight):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight)


def _op_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _op_backward(ctx, grad: torch.Tensor):
    x, weight = ctx.saved_tensors
    if torch.is_grad_enabled():  # recorded (create_graph=True): torch's differentiable operators
        grad_x, grad_weight = _torch_grads(grad, x, weight)
    else:
        grad_x, grad_weight = torch.ops.pkmixer.narrow_linear_backward(grad, x, weight)
    needs = ctx.needs_input_grad
    return grad_x if needs[0] else None, grad_weight if needs[1] else None


_narrow_linear_op.register_autograd(_op_backward, setup_context=_op_setup)


def narrow_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x Wᵀ over the last axis of x (a Dense without its bias): the C kernel where it applies, else ``F.linear``
    (module docstring)."""
    if torch.jit.is_scripting():
        return torch.ops.pkmixer.narrow_linear(x, weight)
    if kernels.through_operator(x):
        return torch.ops.pkmixer.narrow_linear(x, weight)
    if not kernels.functorch_wrapped(x) and kernel_applies(x, weight):
        return _NarrowLinear.apply(x, weight)
    return F.linear(x, weight)


torch.fx.wrap("narrow_linear")
