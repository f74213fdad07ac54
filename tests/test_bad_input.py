"""Every verb and option of ``pkmixer`` fed bad input: exit status 2, exactly one line on stderr, and nothing
created or changed in the working directory; and every verb that writes, failing to write (a full disk, no
permission, a read-only file system, a folder that vanished): exit status 1, one line, nothing changed.

The cases are generated from :func:`pkmixer.cli.build_parser` - every sub-command, every action - and from
the fields of :class:`pkmixer.train.config.TrainConfig`, so that a new option or config key cannot go
untested: an option that takes a value gets bad values of its class (numbers by type, including sizes beyond
what their arithmetic holds; strings by the class named in ``STRING_KINDS``; a device this machine lacks), a
flag must be listed in ``FLAGS`` with the reason it cannot be bad, and ``test_every_option_is_covered`` fails
for anything that is neither. A verb with an output option (or listed in ``WRITES_INTO_INPUT``) runs once per
OS error with its first write failing (the fault hook of :mod:`pkmixer.atomic`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import hashlib
import io
import os
import signal
import types
import typing
from pathlib import Path

import pytest
import torch

from pkmixer import atomic
from pkmixer.cli import build_parser, main
from pkmixer.train.config import SECTIONS

from conftest import run_main

# ---- the classes of bad values ---------------------------------------------------------------------------

BAD_INT = ["-1", "0", str(10**20)]  # negative, zero, beyond int64
ZERO_OK = {"seed", "warmup"}  # int options for which 0 is valid
BAD_FLOAT = ["nan", "inf", "-1", "1e300"]  # the last beyond what the arithmetic holds (squares overflow)
TINY_FLOAT = "1e-300"  # bad too (e.g. γ: widths (Ω/γ)^(2/3)), except for these options, with the reason
TINY_OK = {("implicit-l1", "lam"): "a regression with almost no regularisation is valid",
           ("implicit-l1", "noise"): "almost noise-free labels are valid"}
NO_DEVICE = [] if torch.cuda.is_available() else ["cuda"]  # a device this machine does not have
BAD_FILE_IN = ["missing.pt", "binary.pt", "adir", "/proc/no-such-file"]  # missing, garbage, a folder
BAD_BY_KIND: dict[str, list[str]] = {
    "model": ["no_such_model", "mixer_b17"],
    "model-or-checkpoint": ["no_such_model", "missing.pt", "binary.pt", "adir"],
    "checkpoint": BAD_FILE_IN,
    "config": ["missing.yaml", "binary.yaml", "adir", "nan_lr.yaml", "list.yaml"],
    "run-or-checkpoint": ["missing", "binary.pt", "adir"],
    "reproduce-dir": ["missing", "afile", "adir"],
    "figure-out": ["taken.png", "afile/x.png", "/proc/x.png", "x.gif"],  # a folder, under a file, unwritable
    "checkpoint-out": ["taken.pt", "afile/x.pt", "/proc/x.pt", "x.bin"],
    "dir-out": ["afile", "afile/sub", "/proc/pkmixer-x"],
    "data-dir": ["missing", "afile"],
    # a missing folder: refused by the preset when its data set is read from disk ("CIFAR-10 not found: looked
    # in ..."), unused by the bundled digits of the smoke scale
    "reproduce-data-dir": ["afile"],
    "omega": ["nan", "-1", "0", "10**100", "2**x", "1/0"],
    # the spectrum draws weights of Ω entries and Mixer weights of C·C ≈ Ω^(2/3): these cannot be drawn here
    "spectrum-omega": ["nan", "-1", "0", "10**100", "2**x", "1/0", "2**60", "10**30"],
    "int-list": ["-1", "0", "a,b", str(10**9), str(10**400)],
    "density-list": ["nan", "0", "1.5", "-1", "1e-300"],
    "model-list": ["no_such_model", "mixer_b17,mixer_s32_224"],
    "model-set": ["depth=0", "embed_dim=1000000000000", "no_such_option=1", "noequals", "depth=10**9",
                  "embed_dim=nan", "depth=1000000"],
    "picture-option": ["no_such_option=1", "noequals", "block=-1", "num_units=0", "S=100000", "C=5000"],
    "dataset": ["no_such_data", "cifar11"],
    "filter": ["no_match_*"],
    "preset": ["no_such_preset"],
    "scale": ["huge"],
    "device": ["tpu", "cuda:99", *NO_DEVICE],
    "ray-address": ["127.0.0.1:1"],  # with the local backend: refused, not ignored
}

# (verb, dest) -> the class of a string option or positional
STRING_KINDS = {
    ("models", "filter"): "filter",
    ("effective", "name"): "model",
    ("effective", "set"): "model-set",
    ("width", "omega"): "omega",
    ("width", "C"): "int-list",
    ("width", "density"): "density-list",
    ("spectrum", "omega"): "spectrum-omega",
    ("spectrum", "widths"): "int-list",
    ("spectrum", "plot"): "figure-out",
    ("cka", "a"): "model-or-checkpoint",
    ("cka", "b"): "model-or-checkpoint",
    ("cka", "data"): "dataset",
    ("cka", "data_dir"): "data-dir",
    ("cka", "plot"): "figure-out",
    ("cost", "names"): "model",
    ("cost", "set"): "model-set",
    ("cost", "omega"): "omega",
    ("visualize", "model"): "model-or-checkpoint",
    ("visualize", "set"): "model-set",
    ("visualize", "option"): "picture-option",
    ("visualize", "out"): "figure-out",
    ("train", "config"): "config",
    ("train", "set"): "train-set",
    ("train", "data_dir"): "data-dir",
    ("train", "run_dir"): "dir-out",
    ("finetune", "checkpoint"): "checkpoint",
    ("finetune", "config"): "config",
    ("finetune", "set"): "train-set",
    ("finetune", "data_dir"): "data-dir",
    ("finetune", "run_dir"): "dir-out",
    ("convert", "src"): "checkpoint",
    ("convert", "dst"): "checkpoint-out",
    ("convert", "model"): "model",
    ("throughput", "models"): "model-list",
    ("throughput", "device"): "device",
    ("eval", "target"): "run-or-checkpoint",
    ("eval", "set"): "train-set",
    ("eval", "data_dir"): "data-dir",
    ("reproduce", "name"): "preset",
    ("reproduce", "scale"): "scale",
    ("reproduce", "dataset"): "dataset",
    ("reproduce", "data_dir"): "reproduce-data-dir",
    ("reproduce", "address"): "ray-address",
    ("reproduce", "out"): "dir-out",
    ("report", "dir"): "reproduce-dir",
}

# options that take no value, with the reason no value of theirs can be bad
FLAGS = {
    "json": "output format only",
    "overwrite": "permission to replace outputs; the outputs are checked by their own options",
    "resume": "a mode; --run-dir is checked (and tested) with it in test_resume_needs_a_run",
    "quick": "a preset of throughput's own, valid, counts",
    "list": "lists presets; reproduce refuses it together with a name",
    "check_regime": "a mode: prints the regime check of the preset its other options name, which are checked",
    "docs": "a mode: regenerates the docs from the records (tests/test_reproduction_docs.py)",
    "stack": "a mode; a sweep whose runs cannot stack trains them alone (tests/test_stacked_runs.py)",
}

# a valid, cheap command per verb (dest -> value; lists for repeated options), into which one bad value goes
VALID: dict[str, dict[str, typing.Any]] = {
    "models": {},
    "effective": {"name": "smixer_t4_28", "set": ["depth=1", "embed_dim=8"]},
    "width": {"omega": "2**18"},
    "spectrum": {"omega": "2**10", "widths": "32,64", "seeds": "1"},
    "cka": {"a": "smixer_t4_28", "b": "smixer_t4_28", "batches": "1", "batch_size": "4"},
    "cost": {"names": "smixer_t4_28"},
    "visualize": {"kind": "sparsity", "out": "ok.png"},
    "implicit-l1": {"restarts": "1", "samples": "20"},
    "train": {"set": ["data.name=digits", "schedule.epochs=1", "model.name=smixer_t4_28"], "run_dir": "run"},
    "finetune": {"checkpoint": "ok.pt", "image_size": "56", "set": ["data.name=digits", "schedule.epochs=1"],
                 "run_dir": "run"},
    "convert": {"src": "mixer.pt", "dst": "out.pth"},
    "throughput": {"models": "smixer_t4_28", "batch_size": "1", "warmup": "1", "repeats": "1", "device": "cpu"},
    "eval": {"target": "ok.pt", "set": ["data.name=digits"]},
    "reproduce": {"name": "fig5", "scale": "smoke"},
    "report": {"dir": "rep"},
}


def _bad_train_sets() -> list[str]:
    """``section.key=value`` with a bad value for every field of every config section, by its type."""
    out = []
    strings = {"model.name": ["no_such_model"], "model.init": ["missing.pt", "binary.pt", "adir"],
               "data.name": ["no_such_data"], "data.data_dir": ["missing", "afile"],
               "data.auto_augment": ["no_policy"], "data.rand_augment": ["rand-x9"],
               "data.eval_crop": ["center"]}
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key, kind = f"{section}.{f.name}", hints[f.name]
            optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
            base = [a for a in typing.get_args(kind) if a is not type(None)][0] if optional else kind
            origin = typing.get_origin(base)
            if key in strings:
                values = strings[key]
            elif base is bool:
                values = ["maybe", "2"]
            elif base is int:
                values = ["-1", str(10**20), "1.5"]
            elif base is float:
                values = ["nan", "inf", "-1", "'x'"]
            elif origin is typing.Literal:
                values = ["no_such_choice", *(NO_DEVICE if key == "run.device" else [])]
            elif origin is tuple:
                values = ["[2.0, 2.0]", "[nan, 0.5]", "[0.5]"]
            elif origin is dict:
                values = ["[1]"]
            else:
                raise AssertionError(f"no bad values for {key} of type {kind}")
            out += [f"{key}={v}" for v in values]
    return out


BAD_BY_KIND["train-set"] = _bad_train_sets() + ["model.depth=0", "model.embed_dim=1000000000000",
                                                "model.num_classes=5", "no_section=1", "optim.no_key=1"]


# ---- the cases, from the parser --------------------------------------------------------------------------


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _takes_no_value(action: argparse.Action) -> bool:
    return action.nargs == 0


def _bad_values(verb: str, action: argparse.Action) -> list[str] | None:
    if action.choices is not None:
        return ["no-such-choice"]
    if action.type is int:
        return [v for v in BAD_INT if not (v == "0" and action.dest in ZERO_OK)]
    if action.type is float:
        return BAD_FLOAT + ([] if (verb, action.dest) in TINY_OK else [TINY_FLOAT])
    kind = STRING_KINDS.get((verb, action.dest))
    return None if kind is None else BAD_BY_KIND[kind]


def _argv(verb: str, parser: argparse.ArgumentParser, values: dict[str, typing.Any]) -> list[str]:
    argv = [verb]
    for action in parser._actions:
        if action.dest not in values:
            continue
        value = values[action.dest]
        items = value if isinstance(value, list) else [value]
        if action.option_strings:
            for item in items:
                argv += [action.option_strings[0], item]
        else:
            argv += items
    return argv


# cases whose fix lies in the trainer: the refusal is right, but not yet made before the run starts
TRAINER_FIXES: dict[str, str] = {}  # cases a known fault in the trainer still fails (strict xfail)


def _cases() -> list:
    cases = []
    for verb, parser in _subparsers().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or _takes_no_value(action):
                continue
            for bad in _bad_values(verb, action) or []:
                values = dict(VALID[verb])
                if action.dest == "model" and verb == "visualize":
                    values["kind"] = "token-units"
                values[action.dest] = [bad] if isinstance(values.get(action.dest), list) else bad
                case = f"{verb}-{action.dest}-{bad}"
                marks = [pytest.mark.xfail(reason=TRAINER_FIXES[case], strict=True)] if case in TRAINER_FIXES else []
                cases.append(pytest.param(verb, values, id=case, marks=marks))
    return cases


def test_every_option_is_covered():
    """Each option takes bad values of a known class, or is a flag listed with its reason."""
    missing = []
    for verb, parser in _subparsers().items():
        assert verb in VALID, f"no valid command for the new verb {verb}"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if _takes_no_value(action):
                if action.dest not in FLAGS:
                    missing.append(f"{verb} {action.option_strings[0]}: a flag not listed in FLAGS")
            elif _bad_values(verb, action) is None:
                missing.append(f"{verb} {action.dest}: no class of bad values in STRING_KINDS")
    assert not missing, missing


# ---- the working directory -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The inputs the cases refer to, made once: valid checkpoints and bad files of each kind."""
    import torch

    import pkmixer
    from pkmixer.checkpoint import save_model

    root = tmp_path_factory.mktemp("inputs")
    torch.manual_seed(0)
    save_model(root / "ok.pt", pkmixer.create_model("smixer_t4_28", depth=1, embed_dim=8))
    save_model(root / "mixer.pt", pkmixer.create_model("mixer_t4_28", depth=1, embed_dim=8))
    garbage = bytes(range(256)) * 8 + b"\xff\xfe\x00"
    for name in ("binary.pt", "binary.yaml", "binary.bin"):
        (root / name).write_bytes(garbage)
    (root / "nan_lr.yaml").write_text("optim:\n  lr: .nan\ndata:\n  name: digits\n")
    (root / "list.yaml").write_text("- 1\n")
    (root / "afile").write_text("a plain file\n")
    for name in ("adir", "taken.png", "taken.pt"):
        (root / name).mkdir()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["reproduce", "fig3", "--scale", "smoke", "--out", str(root / "rep")]) == 0  # report's input
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def workdir(files, tmp_path, monkeypatch):
    for name, data in files.items():  # sorted: a folder before what it holds
        (tmp_path / name).mkdir() if data is None else (tmp_path / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = ("dir",)
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = ("file", hashlib.sha1(Path(path).read_bytes()).hexdigest())
    return out


def _too_slow(*_):
    raise TimeoutError("no refusal within 60 s")


def _expect_refusal(capsys, root: Path, argv: list[str], code_wanted: int = 2) -> str:
    before = snapshot(root)
    signal.signal(signal.SIGALRM, _too_slow)
    signal.alarm(60)  # a refusal takes a moment; more means the bad value was accepted and work started
    try:
        code, out, err = run_main(capsys, *argv)
    finally:
        signal.alarm(0)
    lines = err.strip().splitlines()
    assert code == code_wanted, f"{argv}: exit {code}\nstdout: {out[-500:]}\nstderr: {err[-2000:]}"
    assert len(lines) == 1, f"{argv}: {len(lines)} lines on stderr:\n{err[-2000:]}"
    assert "Traceback" not in err
    assert snapshot(root) == before, f"{argv} changed the working directory"
    return lines[0]


@pytest.mark.parametrize("verb,values", _cases())
def test_bad_input(capsys, workdir, verb, values):
    _expect_refusal(capsys, workdir, _argv(verb, _subparsers()[verb], values))


def test_the_valid_commands_are_valid(capsys, workdir):
    """The base commands succeed (all but train, finetune and reproduce, which would train), so that a refusal
    above is the bad value's doing."""
    for verb in ("models", "effective", "width", "cost", "spectrum", "cka", "visualize", "implicit-l1", "convert",
                 "throughput", "eval", "report"):
        code, _, err = run_main(capsys, *_argv(verb, _subparsers()[verb], VALID[verb]))
        assert code == 0, (verb, err)


def test_resume_needs_a_run(capsys, workdir):
    for run_dir in ("missing", "afile", "/proc/x"):
        _expect_refusal(capsys, workdir, ["train", "--resume", "--run-dir", run_dir])


@pytest.mark.parametrize("value", ["0", "-2", "many", "100000"])
def test_bad_threads_environment(capsys, workdir, monkeypatch, value):
    monkeypatch.setenv("PKMIXER_THREADS", value)
    line = _expect_refusal(capsys, workdir, ["width", "--omega", "2**12"])
    assert "PKMIXER_THREADS" in line


def test_report_on_a_cut_results_table(capsys, workdir):
    """A results table cut mid-line (a copy that stopped half-way) whose rows cannot come from run directories
    is refused, naming the file and the line."""
    import json

    sweep = workdir / "sweep"
    sweep.mkdir()
    specs = [{"name": f"run{i}", "config": {}, "meta": {"seed": i}} for i in range(2)]
    (sweep / "sweep.json").write_text(json.dumps({"info": {"preset": "fig5", "scale": "smoke"}, "specs": specs}))
    rows = "".join(json.dumps({"run": f"run{i}", "status": "finished"}) + "\n" for i in range(2))
    (sweep / "results.jsonl").write_text(rows[:-20])
    line = _expect_refusal(capsys, workdir, ["report", "sweep"])
    assert "results.jsonl: line 2 is cut" in line


# ---- sizes the arithmetic cannot hold, where the base command's other options matter -------------------------

SIZE_CASES = {
    "cost-omega-tiny-gamma": ["cost", "--omega", "2**18", "--gamma", "5e-324"],  # C* = (Ω/γ)^(1/3) = inf
    "spectrum-thin-mixer-weight": ["spectrum", "--omega", "2**16", "--gamma", "1e-10", "--seeds", "1"],  # 1 × 86861
    "spectrum-thin-swmlp-weight": ["spectrum", "--omega", "2**16", "--gamma", "1e-6", "--seeds", "1"],  # 1 × 256000
    "spectrum-long-swmlp-weight": ["spectrum", "--omega", "2**16", "--gamma", "1e-4", "--seeds", "1"],  # Lanczos on 1e8
    "cka-huge-batch": ["cka", "mixer_b16_224", "mixer_b16_224", "--batches", "1", "--batch-size", "1048576"],
    "throughput-huge-batch": ["throughput", "--models", "mixer_h14_224", "--batch-size", "4096", "--image-size", "896",
                              "--warmup", "1", "--repeats", "1", "--device", "cpu"],  # about 1 TB of activations
}


@pytest.mark.parametrize("argv", SIZE_CASES.values(), ids=SIZE_CASES.keys())
def test_sizes_beyond_what_can_be_built(capsys, workdir, argv):
    _expect_refusal(capsys, workdir, argv)


# ---- the machine fails a write: exit status 1 --------------------------------------------------------------

OUTPUT_KINDS = {"figure-out": "new.png", "checkpoint-out": "new.pt", "dir-out": "newdir"}  # a valid value each
WRITES_INTO_INPUT = {"report": "writes its report into the sweep directory it reads"}
OS_ERRORS = ("ENOSPC", "EACCES", "EROFS", "ENOENT")  # full disk, no permission, read-only, a vanished folder
# verbs that leave what they made before the failed write; the fix lies in the trainer and the sweep
LEAVES_DIRECTORY = {
}


def _writer_cases() -> list:
    cases = []
    for verb, parser in _subparsers().items():
        values = dict(VALID[verb])
        outputs = {a.dest: STRING_KINDS.get((verb, a.dest)) for a in parser._actions}
        outputs = {dest: kind for dest, kind in outputs.items() if kind in OUTPUT_KINDS}
        if not outputs and verb not in WRITES_INTO_INPUT:
            continue  # writes nothing
        for dest, kind in outputs.items():
            values.setdefault(dest, OUTPUT_KINDS[kind])
        marks = [pytest.mark.xfail(reason=LEAVES_DIRECTORY[verb], strict=True)] if verb in LEAVES_DIRECTORY else []
        cases += [pytest.param(verb, values, name, id=f"{verb}-{name}", marks=marks) for name in OS_ERRORS]
    return cases


def test_every_writer_is_covered():
    """The writer cases cover the verbs that write: some output option, or a reason in WRITES_INTO_INPUT."""
    assert {p.values[0] for p in _writer_cases()} == {"spectrum", "cka", "visualize", "train", "finetune",
                                                      "convert", "reproduce", "report"}


@pytest.mark.parametrize("verb,values,error", _writer_cases())
def test_a_failed_write(capsys, workdir, monkeypatch, verb, values, error):
    """The verb's first write fails with ``error``: one line naming the file, exit status 1, nothing changed
    (no temporary file, no half-written output)."""
    monkeypatch.setenv(atomic.FAULT_ENV, f"before-temp-write:1:{error}")
    atomic.reset_fault_counts()
    line = _expect_refusal(capsys, workdir, _argv(verb, _subparsers()[verb], values), code_wanted=1)
    code = getattr(errno, error)
    assert os.strerror(code) in line and "then " in line, line

