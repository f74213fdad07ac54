import os

import pytest
import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def perturb_(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Move every parameter off its initial value (zero biases, unit LayerNorm, zero head) so that every
    term of the forward pass matters in a comparison."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """``pkmixer ARGS`` in this process: (exit status, stdout, stderr); argparse's SystemExit included."""
    from pkmixer.cli import main

    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


# Tests run with one torch thread: the machine is shared, and a thread that loses its core stalls every
# parallel region. `pkmixer.cli.main` reads PKMIXER_THREADS, so in-process CLI calls keep the same count.
os.environ.setdefault("PKMIXER_THREADS", "1")
torch.set_num_threads(int(os.environ["PKMIXER_THREADS"]))
