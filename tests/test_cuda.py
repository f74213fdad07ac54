"""The CUDA paths: skipped on a machine without a GPU (CI's), run on one with
``python -m pytest tests/test_cuda.py`` (docs/performance.md, "Not measured, or left for later", says where they
last ran)."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

from pkmixer.experiments import get_preset
from pkmixer.models.registry import create_model
from pkmixer.train import loop

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMOKE = {spec.name: spec for spec in get_preset("fig5").runs("smoke", None)}


@pytest.fixture(autouse=True)
def _no_tf32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("name,weight_format", [("smixer-o512-c4-s14-s0", None), ("rpsmixer-o512-c8-s8-s0", None),
                                                ("swmlp-o512-m45-s0", "masked"), ("swmlp-o512-m45-s0", "sparse")])
def test_cuda_forward_and_backward_equal_the_cpu(name, weight_format):
    """The same weights give the same outputs and gradients on the GPU as on the CPU in fp32 (the RP gathers,
    the narrow sequence-first token mixing and the CSR products included)."""
    options = dict(SMOKE[name].config.model.options, num_classes=10)
    if weight_format:
        options["weight_format"] = weight_format
    torch.manual_seed(0)
    cpu = create_model(SMOKE[name].config.model.name, **options)
    gpu = copy.deepcopy(cpu).cuda()
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    torch.testing.assert_close(gpu(x.cuda()).cpu(), cpu(x), rtol=1e-4, atol=1e-5)
    for (n, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=n)


def test_train_and_resume_on_cuda(tmp_path):
    """A run trains on the GPU with its data resident there, records bf16 autocast (the engine's GPU default),
    and a second call resumes it from its checkpoint to the configured epochs."""
    cfg = SMOKE["smixer-o512-c8-s8-s0"].config.override({"run.device": "cuda", "schedule.epochs": 2,
                                                        "run.progress": False})
    first = loop.train(cfg, tmp_path / "run", stop_after=1, log=lambda _: None)
    assert first["status"] == "stopped" and first["epochs_done"] == 1
    summary = loop.train(None, tmp_path / "run", resume=True, log=lambda _: None)
    assert summary["status"] == "finished" and summary["epochs_done"] == 2
    assert summary["precision"] == "fp32" and summary["pipeline"] == "resident"  # the presets: amp off, no TF32
    assert 0 <= summary["final_test_error"] < 0.9


@pytest.mark.parametrize("name", ["smixer-o512-c8-s8-s0", "rpsmixer-o512-c8-s8-s0"])
def test_cuda_graph_training_equals_eager(tmp_path, name):
    """run.compile_mode=reduce-overhead (CUDA graphs replayed every step, GraphSteps) trains the same run as eager
    execution, to float rounding: every epoch's training loss and test error."""
    rows = {}
    for mode in ("eager", "reduce-overhead"):
        extra = {} if mode == "eager" else {"run.compile": True, "run.compile_mode": mode}
        cfg = SMOKE[name].config.override({"run.device": "cuda", "schedule.epochs": 2, "run.progress": False,
                                           **extra})
        loop.train(cfg, tmp_path / mode, log=lambda _: None)
        rows[mode] = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    for eager, graphs in zip(rows["eager"], rows["reduce-overhead"], strict=True):
        assert graphs["train_loss"] == pytest.approx(eager["train_loss"], rel=1e-4)
        assert graphs["test_error"] == pytest.approx(eager["test_error"], abs=2 / eager["test_examples"])


@pytest.mark.parametrize("channels, size", [(3, 32), (1, 28)])
def test_batched_auto_augment_on_cuda_equals_v2s_cuda_kernels(channels, size):
    """pkmixer.data.auto_augment argues that its byte path is exact on CUDA too (CUDA's ``add_(alpha=)`` fused as
    the CPU's); this checks every slot of the CIFAR10 policy against v2's kernels on CUDA uint8 tensors."""
    from test_auto_augment import kernel, slot_entries, varied_bytes

    from pkmixer.data import auto_augment as aa

    x = varied_bytes(8, size, channels, seed=size).cuda()
    table = aa.AutoAugmentTable("cifar10", size)
    for p, s, neg, op, m in slot_entries(table):
        full = lambda v: torch.full((len(x),), v, device="cuda")  # noqa: E731
        out = aa.auto_augment_slot(x.float(), full(int(table.ops[p, s])), (full(p), full(s), full(neg)), table)
        for i in range(len(x)):
            assert torch.equal(out[i], kernel("cifar10", x[i], op, m).float()), (op, m, i)
