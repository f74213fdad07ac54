"""Permutations and the permuted-Kronecker (PK) mixing layer (Hayase & Karakida Sec. 5.1-5.2, App. A.2.3).

Conventions. A feature map is stored as a row-major tensor ``x`` of shape (B, S, C); per sample its flat
storage is ``x.reshape(B, S*C)``, which is vec(Xᵀ) = J_c vec(X) in the paper's column-stacking notation.
A permutation here is an index tensor ``idx`` acting on flat vectors by gathering: ``(J v)[i] = v[idx[i]]``.
It is never materialised as an m x m matrix.

The PK layer PK_W(X; J₁, J₂) = J₂ (I ⊗ W) J₁ vec(X) is realised by gathering with J₁, viewing the result as
``n_blocks`` rows of ``in_features``, applying the mixing MLP to each row (that is the Kronecker factor
I ⊗ W: a row-major (n, k) view of a vector is mat(·)ᵀ of the paper, and a Linear on its last axis is W·mat),
flattening, and gathering with J₂. The normal Mixer's token mixing is the case J₁ = transpose (the gather
that turns storage vec(Xᵀ) into vec(X)) and J₂ = its inverse; its channel mixing is J₁ = J₂ = identity.
Neither moves data: channel mixing is the MLP on the last axis, and token mixing is the MLP's
``forward_left`` (W X as one batched product, :mod:`pkmixer.layers.mlp`), or a transposed view for any other
MLP module. An RP layer (S.13) draws J₁ and J₂ uniformly at random once, keeps them frozen as ``int64``
buffers in the state dict, and runs as two gathers. Any other choice of J₁, J₂ among identity, commutation and
random (Def. 5.1) runs as gathers too (:func:`permute_columns`): with one intra-op thread a small C kernel moving a
row at a time, else a multi-threaded ``torch.gather`` forward and ``scatter_`` backward, the same numbers either
way. Which of these paths a layer takes is fixed when it is built, so that its ``forward`` has
no Python branch on shapes or data (torch.fx, TorchScript and torch.export trace it as it runs).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Literal

import torch
from torch import nn

from .. import kernels
from .mlp import NARROW_COLUMNS, FcAct, Mlp

Axis = Literal["token", "channel"]
PERMUTATIONS = ("identity", "commutation", "random")
# the normal Mixer's (J₁, J₂): token mixing transposes in and out, channel mixing needs no permutation
NORMAL = {"token": ("commutation", "commutation"), "channel": ("identity", "identity")}


def transpose_index(rows: int, cols: int) -> torch.Tensor:
    """Gather index that maps the flat row-major storage of a (rows, cols) matrix to that of its transpose.

    With ``v = A.reshape(-1)``, ``v[transpose_index(r, c)] == A.T.reshape(-1)``. For A = Xᵀ (storage of a
    (S, C) feature map) this is the commutation matrix J_c acting on vec(X) (Def. 3.1).
    """
    return torch.arange(rows * cols, device="cpu").view(rows, cols).t().reshape(-1)


def random_permutation(m: int, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random permutation of ``range(m)`` as a gather index (App. B.2)."""
    return torch.randperm(m, generator=generator, device="cpu")


def inverse_permutation(idx: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(idx)
    inv[idx] = torch.arange(idx.numel(), device=idx.device)
    return inv


@functools.cache
def _kernel() -> ctypes.CDLL | None:
    lib = kernels.load("permute_columns")
    if lib is not None:
        ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
        for fn in (lib.pkmixer_gather_columns, lib.pkmixer_scatter_columns):
            fn.argtypes = [ptr] * 3 + [size, size]
            fn.restype = ctypes.c_int
    return lib


def kernel_applies(x: torch.Tensor, index: torch.Tensor) -> bool:
    """Whether the C kernel ``pkmixer/kernels/permute_columns.c`` moves the columns: a float32 CPU matrix, an int64
    CPU index of its width, one intra-op thread (torch's gather and scatter spread over more) and a kernel built on
    this machine. It moves the same numbers as torch's operators, bit for bit."""
    return (x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and index.dim() == 1
            and index.dtype == torch.int64 and index.device.type == "cpu" and index.numel() == x.shape[1]
            and torch.get_num_threads() == 1 and not kernels.functorch_wrapped(x) and _kernel() is not None)


def _native(entry: str, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor | None:
    """The kernel's ``entry`` (gather or scatter) on x, or None where it refused the index."""
    x, index = x.contiguous(), index.contiguous()
    out = torch.empty_like(x)
    failed = getattr(_kernel(), entry)(x.data_ptr(), index.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1])
    return None if failed else out


def _gather_columns(x: torch.Tensor, index: torch.Tensor, native: bool = True) -> torch.Tensor:
    """x[:, index]: the C kernel where it applies (and ``native``), else ``torch.gather``."""
    if native and kernel_applies(x, index):
        out = _native("pkmixer_gather_columns", x, index)
        if out is not None:
            return out
    return torch.gather(x, 1, index.expand(x.shape[0], -1))


def _scatter_columns(grad: torch.Tensor, index: torch.Tensor, native: bool = True) -> torch.Tensor:
    """z with z[:, index[i]] = grad[:, i]: the transpose of the column gather by a permutation ``index``."""
    if native and kernel_applies(grad, index):
        out = _native("pkmixer_scatter_columns", grad, index)
        if out is not None:
            return out
    return torch.empty_like(grad).scatter_(1, index.expand(grad.shape[0], -1), grad)


class PermuteColumns(torch.autograd.Function):
    """y = x[:, idx] for a permutation ``idx`` of x's m columns; the gradient goes back by scattering to idx.

    Both directions move data only: with one intra-op thread through the C kernel (:func:`kernel_applies`), else
    ``torch.gather`` forward and ``scatter_`` backward with the index broadcast over the batch (a stride-0 view),
    which run on all threads, where ``index_select`` along dim 1 runs on one and its autograd scatter-adds into zeros
    as it must for an index with repeats. For a permutation the scatter to idx is the same map as a gather with
    idx⁻¹, so no inverse is needed. The index is frozen structure, not an input: it is kept on ``ctx``, not saved
    as a tensor. ``native=False`` keeps torch's operators (the benchmarks' peer).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor, native: bool = True) -> torch.Tensor:  # (B, m)
        ctx.index, ctx.native = index, native
        return _gather_columns(x, index, native)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _scatter_columns(grad, ctx.index, ctx.native), None, None


# The same map as an operator of torch.ops, for TorchScript (which cannot run an autograd.Function) and the tracers
# that should not look inside: scripted, jit-traced, exported and compiled models call it, eager and FX-traced ones
# PermuteColumns (identical values both ways, forward and backward).
@torch.library.custom_op("pkmixer::permute_columns", mutates_args=())
def _permute_columns_op(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _gather_columns(x, index)


@_permute_columns_op.register_fake
def _(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _permute_setup(ctx, inputs, output) -> None:
    ctx.index = inputs[1]


def _permute_backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return _scatter_columns(grad, ctx.index), None


_permute_columns_op.register_autograd(_permute_backward, setup_context=_permute_setup)


def permute_columns(x: torch.Tensor, index: torch.Tensor, native: bool = True) -> torch.Tensor:
    """x[:, index] for a permutation ``index`` of x's columns, x of shape (B, m) (:class:`PermuteColumns`).

    One node of an FX graph (``torch.fx.wrap``), the operator ``torch.ops.pkmixer.permute_columns`` in TorchScript,
    torch.jit.trace, torch.export and torch.compile (which moves the same numbers whatever ``native`` says)."""
    if torch.jit.is_scripting():
        return torch.ops.pkmixer.permute_columns(x, index)
    if torch.jit.is_tracing() or torch.compiler.is_compiling():  # opaque to them: one operator, no graph break
        return torch.ops.pkmixer.permute_columns(x, index)
    return PermuteColumns.apply(x, index, native)


torch.fx.wrap("permute_columns")


class PKMixing(nn.Module):
    """PK_W(X; J₁, J₂) on a (B, S, C) feature map: token or channel mixing with chosen permutations.

    ``mlp`` acts on the last axis, mapping ``in_features`` to ``out_features``; ``other`` is the number of
    Kronecker blocks (C for token mixing, S for channel mixing). Token mixing maps (B, S_in, C) ->
    (B, S_out, C) with ``in_features = S_in``; channel mixing maps (B, S, C_in) -> (B, S, C_out).

    ``perms = (J₁, J₂)``, each ``"identity"``, ``"commutation"`` or ``"random"``. J₁ acts on the input
    storage: commutation transposes the (S_in, C) feature matrix. J₂ acts on the (other, out_features)
    blocks: commutation transposes them. Random ones are drawn from ``generator`` and kept as persistent
    ``int64`` buffers ``in_index`` / ``out_index``. ``None`` gives the normal Mixer's choice, which runs as
    plain transposes; every other choice runs as gathers.
    """

    # fixed when built: constants to TorchScript, which compiles only the path they choose
    __constants__ = ["normal", "normal_channel", "normal_left", "narrow", "out_rows", "out_cols", "other",
                     "in_features"]
    __jit_unused_properties__ = ["permuted"]

    def __init__(self, mlp: nn.Module, axis: Axis, other: int, in_features: int, out_features: int,
                 perms: tuple[str, str] | None = None, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if axis not in NORMAL:
            raise ValueError(f"axis must be 'token' or 'channel', got {axis!r}")
        perms = NORMAL[axis] if perms is None else tuple(perms)
        if len(perms) != 2 or any(p not in PERMUTATIONS for p in perms):
            raise ValueError(f"perms must be two of {', '.join(PERMUTATIONS)}, got {perms!r}")
        if "random" in perms and generator is None:
            raise ValueError("random permutations need a generator")
        self.mlp = mlp
        self.axis: Axis = axis
        self.other = other
        self.in_features = in_features
        self.out_features = out_features
        self.perms = perms
        self.normal = perms == NORMAL[axis]
        # the path forward takes, chosen here (constants to TorchScript): the MLP on the last axis, the MLP's
        # left multiplication (sequence-first below NARROW_COLUMNS columns), transposes around it, or gathers
        self.normal_channel = self.normal and axis == "channel"
        self.normal_left = self.normal and axis == "token" and isinstance(mlp, (Mlp, FcAct))
        self.narrow = other < NARROW_COLUMNS
        self.native_gather = True  # gathers through the C kernel where it applies (False: torch's operators)
        self.out_rows, self.out_cols = (out_features, other) if axis == "token" else (other, out_features)
        if not self.normal:
            rows_in = (in_features, other) if axis == "token" else (other, in_features)  # the input feature map
            for name, kind, shape in (("in_index", perms[0], rows_in), ("out_index", perms[1], (other, out_features))):
                if kind == "random":
                    self.register_buffer(name, random_permutation(shape[0] * shape[1], generator))
                else:  # derived from the shapes: not state
                    idx = transpose_index(*shape) if kind == "commutation" else torch.arange(shape[0] * shape[1])
                    self.register_buffer(name, idx, persistent=False)

    @property
    def permuted(self) -> bool:
        """Whether any of J₁, J₂ is random (an RP layer)."""
        return "random" in self.perms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normal_channel:
            y = self.mlp(x)  # (B, S, C_in) -> (B, S, C_out)
        elif self.normal_left:  # W X: (B, S_in, C) -> (B, S_out, C), no transposes
            y = self.mlp.forward_left(x, self.narrow)
        elif self.normal:  # (B, C, S_in) -> (B, C, S_out) -> (B, S_out, C)
            y = self.mlp(x.transpose(1, 2)).transpose(1, 2)
        else:
            B = x.shape[0]
            y = permute_columns(x.reshape(B, -1), self.in_index, self.native_gather)  # J₁: (B, other * in)
            y = self.mlp(y.view(B, self.other, self.in_features))  # I ⊗ W: (B, other, out)
            y = permute_columns(y.reshape(B, -1), self.out_index, self.native_gather)  # J₂: (B, other * out)
            y = y.view(B, self.out_rows, self.out_cols)  # (B, S_out, C) or (B, S, C_out)
        return y

    def gather_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(J₁, J₂) as gather indices on flat row-major storage (Eq. 19, S.21-S.23), normal layers included."""
        if not self.normal:
            return self.in_index, self.out_index
        n = self.other
        if self.axis == "channel":
            return torch.arange(n * self.in_features), torch.arange(n * self.out_features)
        # storage (S_in, C) -> blocks (C, S_in); blocks (C, S_out) -> storage (S_out, C)
        return transpose_index(self.in_features, n), transpose_index(n, self.out_features)

    def input_maps(self) -> list[nn.Module]:
        """Per-token maps applied before J₁ (PKLayer contract, pkmixer.models.contract): none here."""
        return []

    def rows_per_image(self) -> dict[nn.Module, int]:
        """Every Dense of the mixing MLP runs once per Kronecker block: ``other`` rows per image."""
        return {m: self.other for m in self.mlp.modules()}

    def extra_repr(self) -> str:
        return (f"axis={self.axis}, blocks={self.other}, in={self.in_features}, out={self.out_features}, "
                f"perms={self.perms}")
