"""Stacked training (pkmixer.train.stack): K models as one with a member axis equal the K models one by one."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pkmixer.errors import ConfigError
from pkmixer.layers.decay import decayed_parameters
from pkmixer.models.registry import create_model
from pkmixer.train.config import OptimConfig
from pkmixer.train.stack import (MemberOptimizer, TensorData, build_optimizer, clip_member_grads_, stack_models,
                                 train_one, train_stacked)

from conftest import forked

SMALL = dict(num_classes=10, depth=2, embed_dim=16)
CASES = {
    "smixer": ("smixer_t4_28", dict(SMALL, num_tokens=24)),
    "rp_smixer": ("rp_smixer_t4_28", dict(SMALL, num_tokens=24)),
    "mixer": ("smixer_t4_28", dict(SMALL, block="mlp", mlp_ratio=2.0, token_tiles=7)),
    "pyramid_rp": ("rp_smixer_t4_28", dict(SMALL, token_schedule=[24, 16])),
    "swmlp_masked": ("swmlp_t4_28", dict(num_classes=10, depth=2, embed_dim=4, weight_format="masked")),
    "swmlp_dense_input": ("swmlp_t4_28", dict(num_classes=10, depth=2, embed_dim=4, weight_format="masked",
                                              density=1.0, width=64, head_norm=True)),
    "swmlp_csr": ("swmlp_t4_28", dict(num_classes=10, depth=2, embed_dim=4)),  # each member its own nnz
    "swmlp_csr_mlp": ("swmlp_t4_28", dict(num_classes=10, depth=1, embed_dim=4, width=96, block="mlp",
                                          mlp_ratio=2.0, head_norm=True)),  # a CSR input layer, hidden 2m
}


def members(case: str, k: int = 3, dtype=torch.float32, **extra) -> list[torch.nn.Module]:
    """k members, each its own initialisation and structure seed; the zero-initialised heads made random so
    that outputs differ."""
    name, options = CASES[case]
    out = []
    for seed in range(k):
        torch.manual_seed(100 + seed)
        model = create_model(name, **{**options, **extra}, structure_seed=seed)
        torch.nn.init.normal_(model.head.weight, std=0.5)
        torch.nn.init.normal_(model.head.bias, std=0.5)
        out.append(model.to(dtype))
    return out


def images(k: int, b: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(k, b, 1, 28, 28, generator=torch.Generator().manual_seed(7), dtype=dtype)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 2e-5), (torch.float64, 1e-12)])
def test_forward_equals_members(case, dtype, atol):
    models = members(case, dtype=dtype)
    stack = stack_models(models)
    x = images(3, 5, dtype)
    out = stack(x)
    assert out.shape == (3, 5, 10)
    for k, model in enumerate(models):
        torch.testing.assert_close(out[k], model(x[k]), atol=atol, rtol=0)


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("swmlp_csr")])
def test_stacked_models_compile_to_one_graph(case):
    """torch.compile traces the stacked model (the RP members' gathers included) as one graph with no breaks, as
    the solo models (tests/test_engine.py): a stacked run with run.compile fuses the whole forward. CSR weights
    break the graph at each sparse product (their shapes depend on the masks), as they do alone. Traced in a forked
    child: dynamo's state in this process makes a later forked kill test's backward refuse to run."""
    def trace():
        explained = torch._dynamo.explain(stack_models(members(case)))(images(3, 4))
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons

    assert forked(trace) == 0  # exit 3: it raised


def test_rp_members_keep_their_own_permutations():
    models = members("rp_smixer")
    stack = stack_models(models)
    idx = stack.blocks[0].token.mixing.in_index
    assert idx.shape[0] == 3 and not torch.equal(idx[0], idx[1])
    for k, model in enumerate(models):
        assert torch.equal(idx[k], model.blocks[0].token.mixing.in_index)


def test_csr_members_keep_their_own_masks():
    """Each member's CSR weight is its own draw, with its own number of kept weights: one block-diagonal CSR
    product, the stacked tensors zero-padded to the largest count."""
    models = members("swmlp_csr")
    stack = stack_models(models)
    layer, sizes = stack.blocks[0].linears[0], [m.blocks[0].linears[0].nnz for m in models]
    assert layer.sizes == tuple(sizes) and len(set(sizes)) > 1
    assert layer.values.shape == (3, 1, max(sizes))  # each member's (1, nnz) row of kept weights
    for k, model in enumerate(models):
        assert torch.equal(layer.values[k, 0, sizes[k]:], torch.zeros(max(sizes) - sizes[k]))
        assert torch.equal(layer.indices[k, :, :sizes[k]], model.blocks[0].linears[0].indices)
    assert stack.padded()["blocks.0.linears.0.values"] == tuple(sizes)


@pytest.mark.parametrize("case", ["smixer", "rp_smixer", "swmlp_dense_input", "swmlp_csr", "swmlp_csr_mlp"])
def test_gradients_equal_members(case):
    models = members(case, dtype=torch.float64)
    stack = stack_models(models)
    x, y = images(3, 6, torch.float64), torch.randint(0, 10, (3, 6), generator=torch.Generator().manual_seed(1))
    losses = F.cross_entropy(stack(x).flatten(0, 1), y.flatten(), reduction="none").view(3, -1).mean(1)
    losses.sum().backward()
    grads = dict(stack.named_parameters())
    for k, model in enumerate(models):
        F.cross_entropy(model(x[k]), y[k]).backward()
        for name, p in model.named_parameters():
            grad = grads[name].grad[k]
            if name.endswith(".values"):  # a CSR layer's: its own kept weights, then padding that takes none
                grad, padding = grad[..., :p.shape[-1]], grad[..., p.shape[-1]:]
                assert torch.equal(padding, torch.zeros_like(padding)), name
            torch.testing.assert_close(grad, p.grad, atol=1e-12, rtol=1e-10, msg=name)


@pytest.mark.parametrize("case", ["rp_smixer", "swmlp_masked", "swmlp_csr"])
def test_unstacked_state_dicts_load_alone(case):
    models = members(case)
    stack = stack_models(models)
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(0.01 * torch.randn_like(p))  # the stack's own values, not the members'
    x = images(3, 4)
    out = stack(x)
    name, options = CASES[case]
    for k, state in enumerate(stack.unstack()):
        fresh = create_model(name, **options, structure_seed=50 + k)  # its own masks / permutations, replaced
        assert state.keys() == fresh.state_dict().keys()
        fresh.load_state_dict(state)
        torch.testing.assert_close(fresh(x[k]), out[k], atol=2e-5, rtol=0)


def test_weight_decay_follows_members():
    for case in ("smixer", "swmlp_dense_input", "swmlp_csr"):
        models = members(case, k=2)
        assert decayed_parameters(stack_models(models)) == decayed_parameters(models[0])


def _data(n: int = 48, dtype=torch.float64) -> TensorData:
    g = torch.Generator().manual_seed(3)
    return TensorData(torch.randn(n, 1, 28, 28, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g),
                      torch.randn(20, 1, 28, 28, generator=g, dtype=dtype), torch.randint(0, 10, (20,), generator=g))


def _assert_same_run(stack, models, seeds, data, optim, **kw):
    stacked = train_stacked(stack, seeds, data, optim, **kw)
    optims = optim if isinstance(optim, list) else [optim] * len(models)
    for k, (model, seed, o) in enumerate(zip(models, seeds, optims)):
        solo = train_one(model, seed, data, o, **kw)
        assert stacked[k].stopped_step == solo.stopped_step
        torch.testing.assert_close(stacked[k].train_loss, solo.train_loss, atol=1e-10, rtol=1e-8, equal_nan=True)
        assert stacked[k].test_error == solo.test_error
        for name, t in model.state_dict().items():
            torch.testing.assert_close(stack.member_state_dict(k)[name], t, atol=1e-10, rtol=1e-8, msg=name)
    return stacked


ADAMW = OptimConfig(name="adamw", lr=3e-3, weight_decay=0.05)
SGD = OptimConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)


def _each(base: OptimConfig, lrs, wds, **extra) -> list[OptimConfig]:
    """One setting per member: ``base`` with the members' own lr and weight decay."""
    return [dataclasses.replace(base, lr=lr, weight_decay=wd, **extra) for lr, wd in zip(lrs, wds)]


@pytest.mark.parametrize("case, optim", [
    ("smixer", ADAMW),
    ("rp_smixer", SGD),
    ("swmlp_masked", OptimConfig(name="adamw", lr=1e-3, weight_decay=0.1)),
    ("smixer", _each(ADAMW, [1e-3, 3e-3, 1e-2], [0.0, 0.05, 0.3])),
    ("rp_smixer", _each(SGD, [0.01, 0.05, 0.2], [1e-3, 0.0, 1e-2])),
    ("smixer", _each(OptimConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=False), [0.02, 0.1, 0.3], [0.0] * 3)),
    ("rp_smixer", _each(ADAMW, [1e-3, 3e-3, 1e-2], [0.05] * 3, clip_grad=0.5)),
    ("swmlp_masked", _each(SGD, [0.01, 0.05, 0.2], [1e-3] * 3, clip_grad=0.2)),
    ("swmlp_csr", _each(ADAMW, [1e-3, 3e-3, 1e-2], [0.0, 0.05, 0.3], clip_grad=0.5)),
    ("swmlp_csr_mlp", _each(SGD, [0.01, 0.05, 0.2], [1e-3, 0.0, 1e-2])),
])
def test_stacked_training_equals_sequential(case, optim):
    models = members(case, dtype=torch.float64)
    stack = stack_models(models)
    results = _assert_same_run(stack, models, [11, 12, 13], _data(), optim, epochs=2, batch_size=16)
    assert all(len(r.train_loss) == 2 and r.stopped_step is None for r in results)


@pytest.mark.parametrize("case, base", [("smixer", ADAMW), ("smixer", SGD),
                                        ("smixer", dataclasses.replace(SGD, momentum=0.0, nesterov=False)),
                                        ("swmlp_csr", ADAMW), ("swmlp_csr", SGD)])
def test_member_optimizer_equals_torch_optimizers(case, base):
    """Five steps of MemberOptimizer with each member's own lr (changed every step, as a schedule would) and
    weight decay equal each member's torch optimiser (fused AdamW, foreach SGD), state included; the state
    round-trips through the members' own state dicts (zero-padded CSR kept weights included)."""
    models = members(case, dtype=torch.float64)
    stack = stack_models(models)
    params, padded = dict(stack.named_parameters()), stack.padded()
    optims = _each(base, [1e-3, 1e-2, 3e-2], [0.0, 0.05, 0.5])
    opt = build_optimizer(stack, optims)
    solos = [build_optimizer(m, o) for m, o in zip(models, optims)]
    assert isinstance(opt, MemberOptimizer)
    g = torch.Generator().manual_seed(5)
    for step in range(5):
        scale = 1.0 / (1 + step)
        opt.set_lr(torch.tensor([o.lr * scale for o in optims], dtype=torch.float64))
        for name, p in params.items():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            for k, size in enumerate(padded.get(name, ())):
                p.grad[k, size:] = 0  # padding takes no gradient
        for k, (model, solo) in enumerate(zip(models, solos)):
            for group in solo.param_groups:
                group["lr"] = optims[k].lr * scale
            for name, p in model.named_parameters():
                p.grad = params[name].grad[k, ..., :p.shape[-1]].clone()
            solo.step()
        opt.step()
        if step == 2:  # through the members' state dicts and back
            states = [s.state_dict() for s in solos]
            opt = build_optimizer(stack, optims)
            opt.load_members(states)
            for k, solo in enumerate(solos):
                _close_states(opt.member_state_dict(k, states[k]["param_groups"]), solo.state_dict())
    for k, model in enumerate(models):
        for name, t in model.state_dict().items():
            torch.testing.assert_close(stack.member_state_dict(k)[name], t, atol=1e-12, rtol=1e-10, msg=name)
        _close_states(opt.member_state_dict(k, solos[k].state_dict()["param_groups"]), solos[k].state_dict())
    for name, sizes in padded.items():
        if name in params:
            assert all(not params[name][k, size:].any() for k, size in enumerate(sizes)), name


def _close_states(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for idx, entry in b["state"].items():
        assert a["state"][idx].keys() == entry.keys()
        for key, t in entry.items():
            torch.testing.assert_close(a["state"][idx][key], t, atol=1e-12, rtol=1e-10, msg=f"{idx}.{key}")


def test_clip_member_grads_equals_each_members_clip_grad_norm():
    models = members("rp_smixer", dtype=torch.float64)
    stack = stack_models(models)
    g = torch.Generator().manual_seed(2)
    for p in stack.parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * torch.tensor([0.01, 1.0, 10.0]).view(
            -1, *(1,) * (p.ndim - 1))  # member 0 below the bound, the others above
    for k, model in enumerate(models):
        for name, p in model.named_parameters():
            p.grad = dict(stack.named_parameters())[name].grad[k].clone()
    norms = clip_member_grads_(stack, 5.0)
    for k, model in enumerate(models):
        want = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        torch.testing.assert_close(norms[k], want)
        for name, p in model.named_parameters():
            torch.testing.assert_close(dict(stack.named_parameters())[name].grad[k], p.grad, msg=name)
    assert norms[0] < 5.0 < norms[1]


def test_diverging_member_stops_alone():
    """Training image 5 is NaN: each member meets it at the step its own data order says (seed 24 never in two
    epochs of 40 images in batches of 16, seed 7 at step 3, seed 0 at step 0) and stops there alone."""
    models = members("smixer", dtype=torch.float64)
    data = _data(40)
    data.x_train[5] = float("nan")
    stack = stack_models(models)
    start = {name: t.clone() for name, t in stack.state_dict().items()}
    results = _assert_same_run(stack, models, [24, 7, 0], data, OptimConfig(name="adamw", lr=1e-3), epochs=2,
                               batch_size=16)
    assert [r.stopped_step for r in results] == [None, 3, 0]
    assert [len(r.train_loss) for r in results] == [2, 2, 1]
    for name, t in stack.state_dict().items():
        assert torch.equal(t[2], start[name][2]), name  # stopped before its first step: untouched
        assert torch.isfinite(t.double()).all()


@pytest.mark.parametrize("case, extra, words", [
    ("smixer", dict(proj_drop_rate=0.1), "dropout"),
    ("smixer", dict(drop_rate=0.1), "dropout"),
    ("smixer", dict(drop_path_rate=0.1), "stochastic depth"),
    ("smixer", dict(untied_tokens=True), "untied"),
])
def test_refuses_what_it_cannot_carry(case, extra, words):
    with pytest.raises(ConfigError, match=words):
        stack_models(members(case, k=2, **extra))


def test_refuses_mismatched_members():
    a, b = members("smixer", k=1)[0], create_model("smixer_t4_28", **dict(SMALL, embed_dim=8, num_tokens=24))
    with pytest.raises(ConfigError, match="differs from member 0"):
        stack_models([a, b])
    with pytest.raises(ConfigError, match="differs from member 0"):
        stack_models([a, copy.deepcopy(a).double()])
    with pytest.raises(ConfigError, match="declare stacked_forward"):
        stack_models([torch.nn.Linear(2, 2)])


def test_refuses_differing_optimisers():
    models = members("smixer", k=2)
    base = OptimConfig(name="adamw", lr=1e-3)
    for other in (dataclasses.replace(base, betas=(0.8, 0.99)), dataclasses.replace(base, name="sgd"),
                  dataclasses.replace(base, clip_grad=1.0)):
        with pytest.raises(ConfigError, match="lr and weight_decay only"):
            train_stacked(stack_models(models), [0, 1], _data(16, torch.float32), [base, other], epochs=1,
                          batch_size=8)
    with pytest.raises(ConfigError, match="Polyak average"):
        train_stacked(stack_models(models), [0, 1], _data(16, torch.float32),
                      dataclasses.replace(base, ema_decay=0.9), epochs=1, batch_size=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["smixer", "rp_smixer", "swmlp_masked", "swmlp_csr"])
def test_cuda_training_equals_sequential(case, monkeypatch):
    """On a GPU too, members of their own lr and weight decay, clipped, each equal its run alone."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    models = [m.cuda() for m in members(case, dtype=torch.float64)]
    data = TensorData(*(t.cuda() for t in dataclasses.astuple(_data())))
    stack = stack_models(models)
    x = images(3, 5, torch.float64).cuda()
    for k, model in enumerate(models):
        torch.testing.assert_close(stack(x)[k], model(x[k]), atol=1e-10, rtol=0)
    _assert_same_run(stack, models, [1, 2, 3], data, _each(ADAMW, [1e-3, 3e-3, 1e-2], [0.0, 0.05, 0.3], clip_grad=0.5),
                     epochs=1, batch_size=16)


@pytest.mark.slow  # seconds at toy sizes, more on a loaded machine
def test_benchmark_section_runs():
    """benchmarks/stack.py's section at toy sizes."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, root)
    try:
        from benchmarks.common import Settings
        from benchmarks.stack import section_s
    finally:
        sys.path.remove(root)
    rows = section_s(Settings(mode="smoke", device="cpu", dtype="float32", threads=1, warmup=0, repeats=1,
                              compile=False))["rows"]
    assert {r["members"] for r in rows} == {1, 2} and all(r["speedup"] > 0 for r in rows)
    assert all(r["vmap_speedup"] > 0 for r in rows)


# ---- a family that is not pkmixer's stacks through the contract, with no edit under train/ -------------------


class Scale(torch.nn.Module):
    """A layer of the toy family with a stacked form of its own (its ``stacked`` classmethod)."""

    decayed_parameters = ()  # a gain, as a norm's (pkmixer.layers.decay)

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(1 + 0.1 * torch.randn(width))

    def forward(self, x):
        return x * self.gain

    @classmethod
    def stacked(cls, members, path):
        return StackedScale(torch.stack([m.gain.detach() for m in members]))


class StackedScale(torch.nn.Module):
    decayed_parameters = ()
    def __init__(self, gain) -> None:  # (K, width), under the members' name
        super().__init__()
        self.gain = torch.nn.Parameter(gain)

    def forward(self, x):  # (K, B, width)
        return x * self.gain[:, None]


class ToyBlock(torch.nn.Module):
    STACKS_BY_CHILDREN = True  # its forward is generic in the leading axes

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc, self.scale, self.act = torch.nn.Linear(width, width), Scale(width), torch.nn.GELU()

    def forward(self, x):
        return x + self.act(self.scale(self.fc(x)))


class ToyFamily(torch.nn.Module):
    in_chans, img_size, num_classes = 1, 4, 3

    def __init__(self, width: int = 6, depth: int = 2, block=ToyBlock) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(16, width)
        self.blocks = torch.nn.ModuleList([block(width) for _ in range(depth)])
        self.head = torch.nn.Linear(width, self.num_classes)

    def forward(self, x):  # (B, 1, 4, 4)
        x = self.embed(x.flatten(1))
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)

    @staticmethod
    def stacked_forward(net, x):  # (K, B, 1, 4, 4)
        x = net.embed(x.flatten(2))
        for blk in net.blocks:
            x = blk(x)
        return net.head(x)


class Opaque(torch.nn.Module):
    decayed_parameters = ("w",)
    def __init__(self, width: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(width))

    def forward(self, x):
        return x * self.w


def test_a_new_family_stacks_through_the_contract():
    torch.manual_seed(0)
    toys = [ToyFamily() for _ in range(3)]
    x = torch.randn(3, 5, 1, 4, 4)
    stacked = stack_models(toys)
    torch.testing.assert_close(stacked(x), torch.stack([m(x[k]) for k, m in enumerate(toys)]))
    for k, toy in enumerate(toys):
        mine = toy.state_dict()
        assert stacked.member_state_dict(k).keys() == mine.keys()
        assert all(torch.equal(t, mine[n]) for n, t in stacked.member_state_dict(k).items())
    data = TensorData(torch.randn(24, 1, 4, 4), torch.randint(0, 3, (24,)), torch.randn(8, 1, 4, 4),
                      torch.randint(0, 3, (8,)))
    optim = OptimConfig(name="adamw", lr=1e-2)
    runs = train_stacked(stack_models(toys), [1, 2, 3], data, optim, epochs=2, batch_size=8)
    for toy, seed, run in zip(copy.deepcopy(toys), [1, 2, 3], runs):
        alone = train_one(toy, seed, data, optim, epochs=2, batch_size=8)
        assert alone.train_loss == pytest.approx(run.train_loss, rel=1e-4)


def test_a_layer_that_declares_no_stacked_form_is_named():
    with pytest.raises(ConfigError, match=r"blocks\.0 is a Opaque, which declares no stacked form"):
        stack_models([ToyFamily(block=Opaque) for _ in range(2)])
