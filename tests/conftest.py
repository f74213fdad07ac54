import os
import re

import pytest
import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """torch on one thread for the test (bitwise comparisons), the count restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_kernel_at(tmp_path, name: str, flags: list[str]):
    """pkmixer's C kernel ``<name>.c`` built with the loader's base flags and ``flags`` (an x86-64 level, a
    ``-DVEC``), loaded with ctypes; the test skips off x86-64 or without a C compiler (cc)."""
    import ctypes
    import platform
    import shutil
    import subprocess

    from pkmixer import kernels

    if platform.machine() != "x86_64":
        pytest.skip("x86-64 levels only")
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("needs a C compiler (cc)")
    source = os.path.join(os.path.dirname(kernels.__file__), f"{name}.c")
    lib = tmp_path / f"{name}-{len(list(tmp_path.glob(name + '-*.so')))}.so"
    subprocess.run([cc, *kernels._BASE_FLAGS, *flags, source, "-o", str(lib), "-lm"], check=True)
    return ctypes.CDLL(str(lib))


def assert_one_node_traced_scripted_exported(model: torch.nn.Module, x: torch.Tensor, op: str) -> None:
    """torch.fx, TorchScript and torch.export keep pkmixer's function ``op`` as one node (the operator
    ``pkmixer.<op>``), and compute exactly what the eager ``model`` does on ``x``."""
    import warnings

    graph = torch.fx.symbolic_trace(model)
    assert [n.target.__name__ for n in graph.graph.nodes if n.op == "call_function"] == [op]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(model)
    exported = torch.export.export(model.eval(), (x,)).module()
    assert f"pkmixer.{op}" in str(exported.graph)
    with torch.no_grad():
        want = model(x)
        for other in (graph, scripted, exported):
            assert torch.equal(other(x), want)


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


# ---- under CI, a missing dependency is a failure, not a skip ----------------------------------------------
# A test that skips because JAX/Flax, Ray, torchrun, a C compiler or Debian's Fashion-MNIST is missing would pass
# unnoticed in CI: with env CI set, such a skip (at collection, setup or call; whatever its mechanism: importorskip,
# skipif, pytest.skip) is turned into a failure. Outside CI it stays a skip. `.ci/run` installs all of them.
CI_REQUIRED = re.compile(r"\b(jax|flax|ray|torchrun|fashion-mnist|C compiler)\b", re.IGNORECASE)


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _fail_required_skip(report):
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if CI_REQUIRED.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"{reason.removeprefix('Skipped: ')}\n-> a failure under CI (env CI is set): "
                               "`.ci/run` installs jax, flax and ray (the test extra) and dataset-fashion-mnist, "
                               "and torchrun comes with torch")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return _fail_required_skip((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return _fail_required_skip((yield))


def forked(train, fault: str | None = None, trace=None) -> int:
    """``train()`` in a forked child with one torch thread, under fault injection ``fault`` (PKMIXER_FAULT,
    :mod:`pkmixer.atomic`) and writing its trace to ``trace``; the child's wait status (exit 3: it raised)."""
    from pkmixer import atomic

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            for key, value in ((atomic.FAULT_ENV, fault), (atomic.FAULT_TRACE_ENV, trace)):
                os.environ.pop(key, None)
                if value is not None:
                    os.environ[key] = str(value)
            atomic.reset_fault_counts()
            torch.set_num_threads(1)
            train()
        except BaseException:
            code = 3
        os._exit(code)
    return os.waitpid(pid, 0)[1]
