"""The element-wise work between an S-Mixer's matrix products in one pass (Hayase & Karakida Eq. 5; Eqs. 3-4).

An S-Mixer sublayer is ``x + φ(W LN(x) + b)``: between one sublayer's Dense and the next one's stand the bias, the
exact GELU, the residual sum and the next LayerNorm, and in the backward their gradients and the accumulation of
the residual's. torch runs each as a pass of its own over the (B, S, C) stream; on a CPU, where the stream is larger
than the cache, they take more of a training step than the products (docs/performance.md section (n)).
:func:`residual_gelu_norm` computes

    y = x + gelu(z + b),    u = LayerNorm(y) (weight w, bias β)

from the sublayer's input x and its Dense's product z (without its bias), and returns (y, u): y is the next
sublayer's residual input and u its Dense's input. Its backward takes the gradients of y and u and gives those of
x, z, b, w and β. The bias b runs along the channels (channel mixing, b of shape (C,)) or along the tokens (token
mixing, b of shape (S,), one per row of the (B, S, C) stream, or of the (S, B, C) stream a narrow S-Mixer keeps
sequence-first, ``sequence_first``).

It runs the C kernel ``pkmixer/kernels/residual_gelu_norm.c`` where :func:`kernel_applies` (float32 CPU tensors,
one intra-op thread, widths it has code for, a kernel built on this machine), torch's operators elsewhere; the two
agree within float rounding (tests/test_fused_sublayers.py). It is one node of an FX graph (``torch.fx.wrap``) and
the operator ``torch.ops.pkmixer.residual_gelu_norm`` (with its backward) to TorchScript, torch.export and
torch.compile, so traced, scripted, exported and compiled models compute what the eager one does. A second
derivative (``create_graph=True``) goes through torch's operators. :class:`pkmixer.models.mixer.Mixer` decides
which S-Mixers use it.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Tuple

import torch
import torch.nn.functional as F

from .. import kernels

MAX_CHANNELS = 2048  # the widest row (and the most tokens of a token bias) the kernel takes
PACKED = (4, 8)  # the widths below 16 it takes, several rows to a vector


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    lib = kernels.load("residual_gelu_norm")
    if lib is not None:
        ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
        lib.pkmixer_residual_gelu_norm_forward.argtypes = [ptr] * 3 + [size] * 2 + [ptr] * 6 + [size, size,
                                                                                                ctypes.c_float]
        lib.pkmixer_residual_gelu_norm_backward.argtypes = [ptr] * 8 + [size] * 2 + [ptr] * 5 + [size, size]
        lib.pkmixer_residual_gelu_norm_forward.restype = ctypes.c_int
        lib.pkmixer_residual_gelu_norm_backward.restype = ctypes.c_int
    return lib


def kernel_takes(channels: int, bias_size: int, token_bias: bool) -> bool:
    """Whether the kernel has code for rows of ``channels`` with this bias: 16 to :data:`MAX_CHANNELS` channels,
    or 4 or 8 (packed several rows to a vector, with the bias of a whole period of rows - S rows for a token
    bias - at most MAX_CHANNELS floats); a bias of at most MAX_CHANNELS entries."""
    if channels in PACKED:
        return (bias_size if token_bias else 1) * channels <= MAX_CHANNELS
    return 16 <= channels <= MAX_CHANNELS and bias_size <= MAX_CHANNELS


def kernel_applies(x: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, beta: torch.Tensor,
                   token_bias: bool, sequence_first: bool = False) -> bool:
    """Whether the C kernel computes this call: float32 CPU tensors of matching shapes (z as x, w and β one per
    channel, b one per token or per channel), widths it has code for (:func:`kernel_takes`), one intra-op thread,
    and a kernel built on this machine."""
    if x.dim() < 2 or z.shape != x.shape or not weight.shape == beta.shape == x.shape[-1:]:
        return False
    if bias.shape != ((_tokens(x, sequence_first),) if token_bias else x.shape[-1:]):
        return False
    return (torch.get_num_threads() == 1
            and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (x, z, bias, weight, beta))
            and kernel_takes(x.shape[-1], bias.numel(), token_bias) and _kernel() is not None)


def kernel_available() -> bool:
    """Whether the kernel is built on this machine (and not switched off, :mod:`pkmixer.kernels`)."""
    return _kernel() is not None


def _tokens(x: torch.Tensor, sequence_first: bool) -> int:
    """S of a (..., S, C) stream, or of an (S, ..., C) one (``sequence_first``)."""
    return x.shape[0] if sequence_first else x.shape[-2]


def _token_rows(x: torch.Tensor, token_bias: bool, sequence_first: bool) -> tuple[int, int]:
    """(period, repeat) of the kernel: row r's token bias is b[(r / repeat) mod period]; period 0 for a channel
    bias; S and 1 on a (..., S, C) stream, S and the rows per token on an (S, ..., C) one."""
    if not token_bias:
        return 0, 1
    S = _tokens(x, sequence_first)
    return S, (x.numel() // max(1, S * x.shape[-1]) if sequence_first else 1)


def _token_bias(bias: torch.Tensor, x: torch.Tensor, token_bias: bool, sequence_first: bool) -> torch.Tensor:
    """The bias broadcast against the stream."""
    if not token_bias:
        return bias
    return bias.view(-1, *[1] * (x.dim() - 1)) if sequence_first else bias.unsqueeze(-1)


def reference(x: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, token_bias: bool, weight: torch.Tensor,
              beta: torch.Tensor, eps: float, sequence_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, u) from torch's operators: the plain S-Mixer's computation (module docstring)."""
    y = x + F.gelu(z + _token_bias(bias, x, token_bias, sequence_first))
    return y, F.layer_norm(y, y.shape[-1:], weight, beta, eps)


def _kernel_forward(x: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, token_bias: bool, weight: torch.Tensor,
                    beta: torch.Tensor, eps: float, sequence_first: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, u, each row's mean, each row's 1/σ) from the kernel."""
    x, z = x.contiguous(), z.contiguous()
    bias, weight, beta = bias.contiguous(), weight.contiguous(), beta.contiguous()
    n = x.shape[-1]
    rows = x.numel() // n
    y, u = torch.empty_like(x), torch.empty_like(x)
    mean, rstd = x.new_empty(rows), x.new_empty(rows)
    failed = _kernel().pkmixer_residual_gelu_norm_forward(
        x.data_ptr(), z.data_ptr(), bias.data_ptr(), *_token_rows(x, token_bias, sequence_first), weight.data_ptr(),
        beta.data_ptr(), y.data_ptr(), u.data_ptr(), mean.data_ptr(), rstd.data_ptr(), rows, n, eps)
    if failed:  # kernel_applies admits only what the kernel takes
        raise RuntimeError("residual_gelu_norm: the kernel refused its input")
    return y, u, mean, rstd


class _ResidualGeluNorm(torch.autograd.Function):
    """The eager path: the kernel forward and backward, saving the inputs, y and each row's mean and 1/σ."""

    @staticmethod
    def forward(ctx, x, z, bias, weight, beta, eps: float, token_bias: bool, sequence_first: bool):
        y, u, mean, rstd = _kernel_forward(x, z, bias, token_bias, weight, beta, eps, sequence_first)
        ctx.eps, ctx.token_bias, ctx.sequence_first = eps, token_bias, sequence_first
        ctx.save_for_backward(x, z, bias, weight, beta, y, mean, rstd)
        return y, u

    @staticmethod
    def backward(ctx, grad_y, grad_u):
        x, z, bias, weight, beta, y, mean, rstd = ctx.saved_tensors
        grads = _grads(grad_y, grad_u, x, z, bias, ctx.token_bias, weight, beta, ctx.eps, y, mean, rstd,
                       ctx.sequence_first)
        return (*(g if need else None for g, need in zip(grads, ctx.needs_input_grad[:5])), None, None, None)


def _grads(grad_y, grad_u, x, z, bias, token_bias, weight, beta, eps, y, mean, rstd, sequence_first):
    """The kernel's gradients (the forward ran it); torch's where the backward is recorded (``create_graph=True``)
    or the thread count changed since the forward."""
    if torch.is_grad_enabled() or torch.get_num_threads() != 1:
        return _torch_grads(grad_y, grad_u, x, z, bias, token_bias, weight, beta, eps, sequence_first)
    return _kernel_grads(grad_y, grad_u, y, mean, rstd, z, bias, token_bias, weight, sequence_first)


def _kernel_grads(grad_y, grad_u, y, mean, rstd, z, bias, token_bias, weight, sequence_first):
    """(gx, gz, gbias, gweight, gbeta) from the kernel."""
    grad_u, z, bias, weight = grad_u.contiguous(), z.contiguous(), bias.contiguous(), weight.contiguous()
    grad_y = None if grad_y is None else grad_y.contiguous()
    n = y.shape[-1]
    gx, gz = torch.empty_like(y), torch.empty_like(y)
    gbias, gweight, gbeta = torch.empty_like(bias), torch.empty_like(weight), torch.empty_like(weight)
    failed = _kernel().pkmixer_residual_gelu_norm_backward(
        None if grad_y is None else grad_y.data_ptr(), grad_u.data_ptr(), y.data_ptr(), mean.data_ptr(),
        rstd.data_ptr(), weight.data_ptr(), z.data_ptr(), bias.data_ptr(), *_token_rows(y, token_bias, sequence_first),
        gx.data_ptr(), gz.data_ptr(), gweight.data_ptr(), gbeta.data_ptr(), gbias.data_ptr(), y.numel() // n, n)
    if failed:
        raise RuntimeError("residual_gelu_norm: the kernel refused its input")
    return gx, gz, gbias, gweight, gbeta


def _torch_grads(grad_y, grad_u, x, z, bias, token_bias, weight, beta, eps, sequence_first):
    """The same gradients from torch's operators; recorded, and so differentiable again, when grad mode is on."""
    n = x.shape[-1]
    v = z + _token_bias(bias, x, token_bias, sequence_first)
    y = x + F.gelu(v)
    var, mean = torch.var_mean(y, -1, keepdim=True, correction=0)
    rstd = torch.rsqrt(var + eps)
    xhat = (y - mean) * rstd
    g = grad_u * weight
    gx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    if grad_y is not None:
        gx = gx + grad_y
    cdf = 0.5 * (1.0 + torch.erf(v * 0.7071067811865476))
    gz = gx * (cdf + v * torch.exp(-0.5 * v * v) * 0.3989422804014327)
    if not token_bias:
        gbias = gz.reshape(-1, n).sum(0)
    elif sequence_first:
        gbias = gz.reshape(x.shape[0], -1).sum(1)
    else:
        gbias = gz.reshape(-1, x.shape[-2], n).sum((0, 2))
    return gx, gz, gbias, (grad_u * xhat).reshape(-1, n).sum(0), grad_u.reshape(-1, n).sum(0)


# The same computation as operators of torch.ops, opaque to TorchScript, torch.export and torch.compile. The forward
# also returns each row's mean and 1/σ (empty where torch's operators ran), so that the backward reads the moments
# the forward used, as the eager path does.
@torch.library.custom_op("pkmixer::residual_gelu_norm", mutates_args=())
def _residual_gelu_norm_op(x: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, token_bias: bool,
                           weight: torch.Tensor, beta: torch.Tensor, eps: float, sequence_first: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if kernel_applies(x, z, bias, weight, beta, token_bias, sequence_first):
        return _kernel_forward(x, z, bias, token_bias, weight, beta, eps, sequence_first)
    y, u = reference(x, z, bias, token_bias, weight, beta, eps, sequence_first)
    return y, u, x.new_empty(0), x.new_empty(0)


@_residual_gelu_norm_op.register_fake
def _(x, z, bias, token_bias, weight, beta, eps, sequence_first):
    rows = x.new_empty(x.shape[:-1]).numel()
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(rows), x.new_empty(rows))


@torch.library.custom_op("pkmixer::residual_gelu_norm_backward", mutates_args=())
def _residual_gelu_norm_backward_op(grad_y: torch.Tensor, grad_u: torch.Tensor, x: torch.Tensor, z: torch.Tensor,
                                    bias: torch.Tensor, token_bias: bool, weight: torch.Tensor, beta: torch.Tensor,
                                    eps: float, y: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                                    sequence_first: bool
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if mean.numel() and kernel_applies(x, z, bias, weight, beta, token_bias, sequence_first):
        return _kernel_grads(grad_y, grad_u, y, mean, rstd, z, bias, token_bias, weight, sequence_first)
    return _torch_grads(grad_y, grad_u, x, z, bias, token_bias, weight, beta, eps, sequence_first)


@_residual_gelu_norm_backward_op.register_fake
def _(grad_y, grad_u, x, z, bias, token_bias, weight, beta, eps, y, mean, rstd, sequence_first):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(bias),
            torch.empty_like(weight), torch.empty_like(beta))


def _op_setup(ctx, inputs, output) -> None:
    x, z, bias, token_bias, weight, beta, eps, sequence_first = inputs
    y, _, mean, rstd = output
    ctx.eps, ctx.token_bias, ctx.sequence_first = eps, token_bias, sequence_first
    ctx.save_for_backward(x, z, bias, weight, beta, y, mean, rstd)


def _op_backward(ctx, grad_y, grad_u, grad_mean, grad_rstd):
    x, z, bias, weight, beta, y, mean, rstd = ctx.saved_tensors
    if grad_y is None:
        grad_y = torch.zeros_like(y)
    if grad_u is None:
        grad_u = torch.zeros_like(y)
    if torch.is_grad_enabled():  # recorded (create_graph=True): torch's differentiable operators
        grads = _torch_grads(grad_y, grad_u, x, z, bias, ctx.token_bias, weight, beta, ctx.eps, ctx.sequence_first)
    else:
        grads = torch.ops.pkmixer.residual_gelu_norm_backward(grad_y, grad_u, x, z, bias, ctx.token_bias, weight,
                                                              beta, ctx.eps, y, mean, rstd, ctx.sequence_first)
    gx, gz, gbias, gweight, gbeta = grads
    needs = ctx.needs_input_grad
    return (gx if needs[0] else None, gz if needs[1] else None, gbias if needs[2] else None, None,
            gweight if needs[4] else None, gbeta if needs[5] else None, None, None)


_residual_gelu_norm_op.register_autograd(_op_backward, setup_context=_op_setup)


def residual_gelu_norm(x: torch.Tensor, z: torch.Tensor, bias: torch.Tensor, token_bias: bool,
                       weight: torch.Tensor, beta: torch.Tensor, eps: float, sequence_first: bool = False
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, u) = (x + gelu(z + b), LayerNorm(y)) for a (..., S, C) stream, or an (S, ..., C) one where
    ``sequence_first`` (module docstring): the C kernel where it applies, else :func:`reference`."""
    if torch.jit.is_scripting():
        y, u, _, _ = torch.ops.pkmixer.residual_gelu_norm(x, z, bias, token_bias, weight, beta, eps, sequence_first)
        return y, u
    if kernels.through_operator(x):
        y, u, _, _ = torch.ops.pkmixer.residual_gelu_norm(x, z, bias, token_bias, weight, beta, eps, sequence_first)
        return y, u
    if not kernels.functorch_wrapped(x) and kernel_applies(x, z, bias, weight, beta, token_bias, sequence_first):
        return _ResidualGeluNorm.apply(x, z, bias, weight, beta, eps, token_bias, sequence_first)
    return reference(x, z, bias, token_bias, weight, beta, eps, sequence_first)


torch.fx.wrap("residual_gelu_norm")
