"""The test tiers and CI's rule for skips (tests/conftest.py): under env CI, a skip for a missing JAX/Flax, Ray,
torchrun, C compiler or Fashion-MNIST is a failure; other skips, and any skip outside CI, stay skips."""
import pytest
from _pytest.reports import CollectReport, TestReport

import conftest


def _skipped(reason: str, kind=TestReport, **extra):
    longrepr = ("tests/test_x.py", 3, f"Skipped: {reason}")
    if kind is TestReport:
        return TestReport("tests/test_x.py::t", ("tests/test_x.py", 3, "t"), {}, "skipped", longrepr, "setup", **extra)
    return CollectReport("tests/test_x.py", "skipped", longrepr, [])


def _through_hook(hook, report, *args):
    """Drive a wrapper hook as pluggy does: run it to its yield, send the inner result, take what it returns."""
    gen = hook(*args)
    next(gen)
    with pytest.raises(StopIteration) as done:
        gen.send(report)
    return done.value.value


@pytest.mark.parametrize("reason", [
    "Ray is not installed (pip install 'pkmixer[ray]')",
    "could not import 'jax': No module named 'jax'",
    "could not import 'flax': No module named 'flax'",
    "torchrun is not installed beside this Python",
    "Debian's dataset-fashion-mnist is not installed",
    "no C kernel on this machine: needs a C compiler (cc)",
])
def test_missing_dependency_skips_fail_under_ci(monkeypatch, reason):
    monkeypatch.setenv("CI", "true")
    report = _through_hook(conftest.pytest_runtest_makereport, _skipped(reason), None, None)
    assert report.failed and reason in report.longrepr and "under CI" in report.longrepr
    collected = _through_hook(conftest.pytest_make_collect_report, _skipped(reason, CollectReport), None)
    assert collected.failed


def test_other_skips_and_skips_outside_ci_stay_skips(monkeypatch):
    monkeypatch.setenv("CI", "1")
    for reason in ["needs a machine without CUDA", "the death-signal bootstrap is Linux-only", "an array of x-rays",
                   "x86-64 levels only"]:
        assert _through_hook(conftest.pytest_runtest_makereport, _skipped(reason), None, None).skipped
    xfail = _skipped("Ray is flaky here")
    xfail.wasxfail = "Ray is flaky here"
    assert _through_hook(conftest.pytest_runtest_makereport, xfail, None, None).skipped
    monkeypatch.delenv("CI")
    assert _through_hook(conftest.pytest_runtest_makereport, _skipped("Ray is not installed"), None, None).skipped


def test_tiers_are_configured(pytestconfig):
    """`make test` deselects the slow tier (pyproject's addopts), every test has a time limit (pytest-timeout)."""
    assert "-m 'not slow'" in pytestconfig.getini("addopts") or pytestconfig.getini("addopts") == ["-m", "not slow"]
    assert any(line.startswith("slow:") for line in pytestconfig.getini("markers"))
    assert pytestconfig.pluginmanager.hasplugin("timeout") and float(pytestconfig.getini("timeout")) > 0
