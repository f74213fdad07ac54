"""LayerNorm over few channels: the Mixer's per-token normalisation (Mixer supp. Listing 1; Hayase & Karakida
Eq. 5) at the narrowest widths of the fixed-Ω grids (C = 4 against S ≈ 126).

torch's CPU LayerNorm is not vectorised over rows shorter than its vector width (8 floats with AVX2): in
docs/performance.md section (n) its forward and backward over the (128, 126, 4) stream of the C = 4 S-Mixer take
1.3-1.6 ms, 2.4-2.9 times as long as over the (128, 87, 8) stream of the C = 8 one, which in turn takes longer than
the (128, 32, 32) stream of the square model. :func:`layer_norm` builds :class:`NarrowLayerNorm` below
:data:`NARROW_NORM` channels - an ``nn.LayerNorm`` (same parameters, state dict and initialisation) whose forward
runs the C kernel ``pkmixer/kernels/layer_norm.c`` where it applies (:func:`kernel_applies`: float32 CPU tensors
and one intra-op thread, the sweeps' setting - torch's kernel spreads rows over threads, this one does not) and
torch's LayerNorm elsewhere; equal to it within float rounding (tests/test_fastpaths.py). Which path runs is decided
per call from the tensors, so the last bits of a run depend on its thread count, as with torch's own kernels. From
16 channels up the norm is ``nn.LayerNorm``.

The kernel is one node ``narrow_layer_norm`` of an FX graph (``torch.fx.wrap``) and the operator
``torch.ops.pkmixer.narrow_layer_norm`` (with its backward ``narrow_layer_norm_backward``) to TorchScript,
torch.export and torch.compile, so traced, scripted, exported and compiled models compute what the eager one does.
A second derivative (``create_graph=True``) goes through torch's operators.
"""
from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F
from torch import nn

from .. import kernels

# Below this many channels a model's LayerNorm is a NarrowLayerNorm (docs/performance.md section (n)).
NARROW_NORM = 16
# The widths the C kernel has code for (it runs for any of them when called directly).
KERNEL_WIDTHS = range(1, 16)


def layer_norm(features: int, eps: float) -> nn.LayerNorm:
    """A LayerNorm over the last axis of ``features`` channels: :class:`NarrowLayerNorm` below
    :data:`NARROW_NORM`, else ``nn.LayerNorm``."""
    return NarrowLayerNorm(features, eps) if features < NARROW_NORM else nn.LayerNorm(features, eps=eps)


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    lib = kernels.load("layer_norm")
    if lib is not None:
        ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
        lib.pkmixer_layer_norm_forward.argtypes = [ptr] * 6 + [size, size, ctypes.c_float]
        lib.pkmixer_layer_norm_backward.argtypes = [ptr] * 8 + [size, size, ctypes.c_float]
        lib.pkmixer_layer_norm_forward.restype = lib.pkmixer_layer_norm_backward.restype = ctypes.c_int
    return lib


def kernel_applies(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether the C kernel computes this LayerNorm: float32 CPU tensors, 1 to 15 channels (``KERNEL_WIDTHS``)
    with a weight and a bias, one intra-op thread, and a kernel built on this machine (:mod:`pkmixer.kernels`)."""
    return (weight is not None and bias is not None and torch.get_num_threads() == 1
            and x.dtype == weight.dtype == bias.dtype == torch.float32
            and x.device.type == weight.device.type == bias.device.type == "cpu"
            and x.dim() >= 1 and x.shape[-1] in KERNEL_WIDTHS and weight.shape == bias.shape == x.shape[-1:]
            and _kernel() is not None)


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, moments: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(y, each row's mean, each row's 1/σ); the moments only where asked for."""
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty_like(x)
    mean, rstd = (x.new_empty(rows), x.new_empty(rows)) if moments else (None, None)
    _kernel().pkmixer_layer_norm_forward(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(),
                                         _pointer(mean), _pointer(rstd), rows, n, eps)
    return y, mean, rstd


def _backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float,
              mean: torch.Tensor | None = None, rstd: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight, grad_bias), from the forward's moments or recomputing them."""
    grad, x, weight = grad.contiguous(), x.contiguous(), weight.contiguous()
    n = x.shape[-1]
    grad_x, grad_weight, grad_bias = torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)
    _kernel().pkmixer_layer_norm_backward(grad.data_ptr(), x.data_ptr(), _pointer(mean), _pointer(rstd),
                                          weight.data_ptr(), grad_x.data_ptr(), grad_weight.data_ptr(),
                                          grad_bias.data_ptr(), x.numel() // n, n, eps)
    return grad_x, grad_weight, grad_bias


def _torch_grads(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same gradients from torch's operators; recorded, and so differentiable again, when grad mode is on
    (a backward with ``create_graph=True``)."""
    n = x.shape[-1]
    var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + eps)
    xhat = (x - mean) * rstd
    g = grad * weight
    grad_x = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return grad_x, (grad * xhat).reshape(-1, n).sum(0), grad.reshape(-1, n).sum(0)


def _grads(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
           needs: tuple[bool, ...], mean: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The kernel's gradients (the forward ran it); torch's where the backward is recorded (``create_graph=True``)
    or the thread count changed since the forward."""
    if not torch.is_grad_enabled() and torch.get_num_threads() == 1:
        found = _backward(grad, x, weight, eps, mean, rstd)
    else:
        found = _torch_grads(grad, x, weight, eps)
    return tuple(g if need else None for g, need in zip(found, needs))


class _NarrowLayerNormFunction(torch.autograd.Function):
    """The eager path: the C kernel forward and backward, saving the input and each row's mean and 1/σ."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
        y, mean, rstd = _forward(x, weight, bias, eps, moments=True)
        ctx.eps = eps
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        return (*_grads(grad, x, weight, bias, ctx.eps, ctx.needs_input_grad[:3], mean, rstd), None)


# The same computation as operators of torch.ops, opaque to TorchScript, torch.export and torch.compile.
@torch.library.custom_op("pkmixer::narrow_layer_norm", mutates_args=())
def _narrow_layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    if kernel_applies(x, weight, bias):
        return _forward(x, weight, bias, eps)[0]
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


@_narrow_layer_norm_op.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("pkmixer::narrow_layer_norm_backward", mutates_args=())
def _narrow_layer_norm_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if kernel_applies(x, weight, bias):
        return _backward(grad, x, weight, eps)
    return _torch_grads(grad, x, weight, eps)


@_narrow_layer_norm_backward_op.register_fake
def _(grad, x, weight, bias, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight),
            torch.empty_like(bias))


def _op_setup(ctx, inputs, output) -> None:
    x, weight, bias, eps = inputs
    ctx.eps = eps
    ctx.save_for_backward(x, weight, bias)


def _op_backward(ctx, grad: torch.Tensor):
    x, weight, bias = ctx.saved_tensors
    needs = ctx.needs_input_grad[:3]
    if torch.is_grad_enabled():  # recorded (create_graph=True): torch's differentiable operators
        grads = _torch_grads(grad, x, weight, ctx.eps)
    else:
        grads = torch.ops.pkmixer.narrow_layer_norm_backward(grad, x, weight, bias, ctx.eps)
    return (*(g if need else None for g, need in zip(grads, needs)), None)


_narrow_layer_norm_op.register_autograd(_op_backward, setup_context=_op_setup)


def narrow_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of x over its last axis with ``weight`` and ``bias``: the C kernel where it applies, else torch's
    (module docstring)."""
    if torch.jit.is_scripting():
        return torch.ops.pkmixer.narrow_layer_norm(x, weight, bias, eps)
    if kernels.through_operator(x):
        return torch.ops.pkmixer.narrow_layer_norm(x, weight, bias, eps)
    if not kernels.functorch_wrapped(x) and kernel_applies(x, weight, bias):
        return _NarrowLayerNormFunction.apply(x, weight, bias, eps)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


torch.fx.wrap("narrow_layer_norm")


class NarrowLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm(features, eps)`` whose forward is :func:`narrow_layer_norm` (module docstring)."""

    decayed_parameters = ()  # as nn.LayerNorm (pkmixer.layers.decay)

    def __init__(self, features: int, eps: float = 1e-5) -> None:
        super().__init__(features, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return narrow_layer_norm(x, self.weight, self.bias, self.eps)
