"""Sections (d) structured layers against dense, and (e) token-mixing formulations.

(d) :class:`~pkmixer.layers.structured.KroneckerLinear` and :class:`~pkmixer.layers.structured.MonarchLinear`
(Sec. 3.3, Eq. 12) against ``nn.Linear(n, n, bias=False)`` of the same width n = n1·n2: one forward and
backward (input and weight gradients) of a batch, timed interleaved; also the Kronecker product written with
``torch.matmul``'s broadcasting, the formulation the layer used before its ``bmm`` fast path.

(e) The token mixing W₂ φ(W₁ X) of one MLP-Mixer block (Eq. 1) on a (B, S, C) batch, written five ways, each
with the residual addition that follows it, forward + backward and inference forward: timm's transpose +
Linear + transpose; the same with the transposes made contiguous; ``torch.matmul`` broadcasting W over the
batch; ``einsum``; a sequence-first (S, B·C) single GEMM including the permutes in and out; batched products
(``baddbmm`` with W broadcast, no transposes); and our ``Mlp.forward_left``, which the normal Mixer's token
mixing uses: the batched products, or below ``NARROW_COLUMNS`` channels one GEMM over all B·C columns. The
narrow shapes are the Fashion-MNIST S-Mixers of ``fig5`` (C = 4 and 8, the token MLP S -> S).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from pkmixer.layers.mlp import Mlp
from pkmixer.layers.structured import KroneckerLinear, MonarchLinear

from .common import Settings, interleaved, ratio

D_SIZES = {"smoke": [(4, 8)], "quick": [(28, 28), (64, 64)], "full": [(28, 28), (32, 32), (64, 64), (128, 128)]}
E_SHAPES = {  # (label, B, S, C, D_S)
    "smoke": [("toy", 2, 16, 8, 32)],
    "quick": [("FMNIST S-Mixer C=4", 128, 126, 4, 126), ("FMNIST S-Mixer C=8", 128, 87, 8, 87),
              ("CIFAR S=C=64, γ=4", 128, 64, 64, 256), ("Mixer-S/16", 8, 196, 512, 256),
              ("Mixer-B/16", 8, 196, 768, 384)],
    "full": [("FMNIST S-Mixer C=4", 128, 126, 4, 126), ("FMNIST S-Mixer C=8", 128, 87, 8, 87),
             ("CIFAR S=C=64, γ=4", 128, 64, 64, 256), ("Mixer-S/16", 32, 196, 512, 256),
             ("Mixer-B/16", 32, 196, 768, 384)],
}


def _train_case(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        f(x).backward(g)

    return run


def section_d(settings: Settings) -> dict:
    dev, rows = settings.torch_device, []
    batch = 128
    for n1, n2 in D_SIZES[settings.mode]:
        n = n1 * n2
        torch.manual_seed(0)
        dense = torch.nn.Linear(n, n, bias=False).to(dev)
        kron = KroneckerLinear(n1, n2).to(dev)
        monarch = MonarchLinear(n1, n2).to(dev)

        def kron_matmul(x: torch.Tensor) -> torch.Tensor:  # the broadcasting formulation, for comparison
            y = x.reshape(-1, n1, n2) @ kron.W.t()
            return torch.matmul(kron.V, y).reshape(x.shape)

        x = torch.randn(batch, n, device=dev, requires_grad=True)
        g = torch.randn(batch, n, device=dev)
        layers = {"dense": dense, "kronecker": kron, "kronecker_matmul": kron_matmul, "monarch": monarch}
        t = interleaved({k: _train_case(f, x, g) for k, f in layers.items()}, settings,
                        repeats=max(settings.repeats, 7))
        params = {"dense": n * n, "kronecker": n1 * n1 + n2 * n2, "monarch": n1 * n2 * n2 + n2 * n1 * n1}
        rows.append({"n1": n1, "n2": n2, "width": n, "batch": batch, "params": params,
                     "times": {k: v.as_dict() for k, v in t.items()},
                     "speedup_vs_dense": {k: ratio(t["dense"].median_s, v.median_s) for k, v in t.items()}})
    return {"rows": rows}


def token_formulations(mlp: Mlp) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """W₂ φ(W₁ X) + X for x of shape (B, S, C), six ways and ours (module docstring)."""
    w1, b1, w2, b2 = mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias

    def transpose_linear(x: torch.Tensor) -> torch.Tensor:
        return x + mlp(x.transpose(1, 2)).transpose(1, 2)

    def transpose_contiguous(x: torch.Tensor) -> torch.Tensor:
        return x + mlp(x.transpose(1, 2).contiguous()).transpose(1, 2).contiguous()

    def broadcast_matmul(x: torch.Tensor) -> torch.Tensor:
        return x + (torch.matmul(w2, F.gelu(torch.matmul(w1, x) + b1[:, None])) + b2[:, None])

    def einsum(x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(torch.einsum("ds,bsc->bdc", w1, x) + b1[:, None])
        return x + (torch.einsum("sd,bdc->bsc", w2, h) + b2[:, None])

    def sequence_first(x: torch.Tensor) -> torch.Tensor:
        B, S, C = x.shape
        xs = x.transpose(0, 1).reshape(S, B * C)  # (S, B·C): one copy
        y = torch.addmm(b2[:, None], w2, F.gelu(torch.addmm(b1[:, None], w1, xs)))
        return x + y.view(S, B, C).transpose(0, 1)

    def batched_products(x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(torch.baddbmm(b1[:, None], w1.expand(x.shape[0], -1, -1), x))
        return x + torch.baddbmm(b2[:, None], w2.expand(x.shape[0], -1, -1), h)

    def forward_left(x: torch.Tensor) -> torch.Tensor:
        return x + mlp.forward_left(x)

    return {"transpose_linear": transpose_linear, "transpose_contiguous": transpose_contiguous,
            "broadcast_matmul": broadcast_matmul, "einsum": einsum, "sequence_first": sequence_first,
            "batched_products": batched_products, "forward_left": forward_left}


def section_e(settings: Settings) -> dict:
    dev, rows = settings.torch_device, []
    for label, B, S, C, D in E_SHAPES[settings.mode]:
        torch.manual_seed(0)
        mlp = Mlp(S, D, S).to(dev)
        fns = token_formulations(mlp)
        x = torch.randn(B, S, C, device=dev, requires_grad=True)
        g = torch.randn(B, S, C, device=dev)
        ref = fns["transpose_linear"](x)
        for name, f in fns.items():  # all the same map
            torch.testing.assert_close(f(x), ref, rtol=1e-4, atol=1e-4, msg=f"{name} differs")
        t = interleaved({k: _train_case(f, x, g) for k, f in fns.items()}, settings,
                        repeats=max(settings.repeats, 7))
        xi = x.detach()

        def infer(f: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                with torch.inference_mode():
                    f(xi)

            return run

        ti = interleaved({k: infer(f) for k, f in fns.items()}, settings, repeats=max(settings.repeats, 7))
        base, base_i = t["transpose_linear"].median_s, ti["transpose_linear"].median_s
        rows.append({"shape": label, "B": B, "S": S, "C": C, "D_S": D,
                     "train_times": {k: v.as_dict() for k, v in t.items()},
                     "infer_times": {k: v.as_dict() for k, v in ti.items()},
                     "train_speedup_vs_timm": {k: ratio(base, v.median_s) for k, v in t.items()},
                     "infer_speedup_vs_timm": {k: ratio(base_i, v.median_s) for k, v in ti.items()}})
    return {"rows": rows}
