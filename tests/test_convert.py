"""Checkpoint import and export (Mixer supp. App. F, Listing 1): Flax .npz, timm state dicts, pkmixer
checkpoints. Every file is written by the tests: a random Listing 1 Mixer with P=8 at 32 px (S=16), C=16,
2 blocks, D_S=12, D_C=40, 10 classes. (Listing 1 run in Flax itself: tests/test_flax_parity.py.)"""
import argparse
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import pkmixer
from pkmixer.errors import ConfigError
from pkmixer.models.convert import (ActivationWarning, convert_checkpoint, export_checkpoint,
                                    flax_to_pkmixer_state_dict, from_timm, import_checkpoint, pkmixer_to_flax_arrays,
                                    to_timm)
from pkmixer.models.registry import ModelSpec
from pkmixer.models.restore import load_model

from conftest import perturb_, rel_err

P, IMG, C, DEPTH, D_S, D_C, CLASSES = 8, 32, 16, 2, 12, 40, 10
S = (IMG // P) ** 2


def flax_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Listing 1's parameter tree, flattened with '/', with random float32 values everywhere."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / math.sqrt(shape[0] if len(shape) == 2 else np.prod(shape[:3]))
                ).astype(np.float32)

    def ln(prefix):
        return {f"{prefix}/scale": (1 + 0.1 * rng.standard_normal(C)).astype(np.float32),
                f"{prefix}/bias": (0.1 * rng.standard_normal(C)).astype(np.float32)}

    def dense(prefix, n_in, n_out):
        return {f"{prefix}/kernel": w(n_in, n_out),
                f"{prefix}/bias": (0.1 * rng.standard_normal(n_out)).astype(np.float32)}

    arrays = {"stem/kernel": w(P, P, 3, C), "stem/bias": (0.1 * rng.standard_normal(C)).astype(np.float32)}
    for i in range(DEPTH):
        b = f"MixerBlock_{i}"
        arrays |= ln(f"{b}/LayerNorm_0") | dense(f"{b}/token_mixing/Dense_0", S, D_S)
        arrays |= dense(f"{b}/token_mixing/Dense_1", D_S, S) | ln(f"{b}/LayerNorm_1")
        arrays |= dense(f"{b}/channel_mixing/Dense_0", C, D_C) | dense(f"{b}/channel_mixing/Dense_1", D_C, C)
    return arrays | ln("pre_head_layer_norm") | dense("head", C, CLASSES)


def listing1_logits(arrays: dict[str, np.ndarray], x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """Listing 1 written out on the raw arrays in float64 (NHWC input, HWIO stem kernel); GELU as Flax's nn.gelu
    (the tanh approximation), or exact as timm with ``approximate="none"``."""
    a = {k: torch.from_numpy(v).double() for k, v in arrays.items()}

    def ln(y, prefix):
        return F.layer_norm(y, (C,), a[f"{prefix}/scale"], a[f"{prefix}/bias"], eps=1e-6)

    def mlp_block(y, prefix):
        y = F.gelu(y @ a[f"{prefix}/Dense_0/kernel"] + a[f"{prefix}/Dense_0/bias"], approximate=approximate)
        return y @ a[f"{prefix}/Dense_1/kernel"] + a[f"{prefix}/Dense_1/bias"]

    n = x.shape[0]
    patches = x.double().reshape(n, IMG // P, P, IMG // P, P, 3).permute(0, 1, 3, 2, 4, 5)  # n h w p p c
    x = torch.einsum("nhwijc,ijco->nhwo", patches, a["stem/kernel"]) + a["stem/bias"]
    x = x.reshape(n, S, C)  # 'n h w c -> n (h w) c'
    for i in range(DEPTH):
        b = f"MixerBlock_{i}"
        x = x + mlp_block(ln(x, f"{b}/LayerNorm_0").swapaxes(1, 2), f"{b}/token_mixing").swapaxes(1, 2)
        x = x + mlp_block(ln(x, f"{b}/LayerNorm_1"), f"{b}/channel_mixing")
    return ln(x, "pre_head_layer_norm").mean(dim=1) @ a["head/kernel"] + a["head/bias"]


def small_timm() -> torch.nn.Module:
    from timm.models.mlp_mixer import MlpMixer

    model = MlpMixer(num_classes=CLASSES, img_size=IMG, patch_size=P, num_blocks=DEPTH, embed_dim=C,
                     mlp_ratio=(D_S / C, D_C / C))
    return perturb_(model, 0.1).eval()


@pytest.fixture
def npz(tmp_path):
    path = tmp_path / "mixer.npz"
    np.savez(path, **flax_arrays())
    return path


def images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, IMG, IMG)


def test_npz_round_trip_is_bit_exact(npz, tmp_path):
    summary = convert_checkpoint(npz, tmp_path / "mid.pt")
    assert summary == {
        "source": str(npz), "source_format": "flax", "destination": str(tmp_path / "mid.pt"),
        "destination_format": "pkmixer", "model": "mixer_s16_224",
        "overrides": dict(patch_size=P, depth=DEPTH, embed_dim=C, token_hidden=D_S, channel_hidden=D_C,
                          img_size=IMG, num_classes=CLASSES, norm_eps=1e-6, act="gelu_tanh"),
        "params": sum(a.size for a in flax_arrays().values()), "num_classes": CLASSES, "img_size": IMG,
        "dtype": "float32", "act": "gelu_tanh", "head_replaced": False}
    convert_checkpoint(tmp_path / "mid.pt", tmp_path / "back.npz")
    convert_checkpoint(npz, tmp_path / "direct.npz")
    before = np.load(npz)
    for out in ("back.npz", "direct.npz"):
        after = np.load(tmp_path / out)
        assert set(after.files) == set(before.files)
        for key in before.files:
            assert after[key].dtype == before[key].dtype and np.array_equal(after[key], before[key]), key


def test_flax_mapping_functions_round_trip():
    arrays = flax_arrays(1)
    state = flax_to_pkmixer_state_dict(arrays)
    assert state["stem.weight"].shape == (C, 3, P, P)
    assert state["blocks.1.token.mixing.mlp.fc1.weight"].shape == (D_S, S)
    back = pkmixer_to_flax_arrays(state)
    assert back.keys() == arrays.keys() and all(np.array_equal(back[k], arrays[k]) for k in arrays)
    with pytest.raises(ConfigError, match="lacks MixerBlock_1/LayerNorm_1/bias"):
        flax_to_pkmixer_state_dict({k: v for k, v in arrays.items() if k != "MixerBlock_1/LayerNorm_1/bias"})
    with pytest.raises(ConfigError, match="MixerBlock_0/extra/kernel, which is not a parameter"):
        flax_to_pkmixer_state_dict({**arrays, "MixerBlock_0/extra/kernel": arrays["head/kernel"]})


def test_npz_logits_match_listing1_and_timm(npz, tmp_path):
    """The imported model computes Listing 1 on the arrays, with Flax's tanh GELU (or the exact one when
    asked); its timm export gives timm the same network, exactly so with the exact GELU."""
    x = images()
    nhwc = x.permute(0, 2, 3, 1)  # NCHW -> NHWC for the Flax layout
    ref, ref_exact = listing1_logits(flax_arrays(), nhwc), listing1_logits(flax_arrays(), nhwc, "none")
    assert rel_err(ref_exact, ref) > 1e-5  # the two GELUs give measurably different networks
    model = import_checkpoint(npz).model.eval()
    exact = import_checkpoint(npz, act="gelu").model.eval()
    assert (model.activation, exact.activation) == ("gelu_tanh", "gelu")
    with torch.no_grad():
        assert rel_err(model(x).double(), ref) <= 1e-5 and rel_err(exact(x).double(), ref_exact) <= 1e-5
        assert rel_err(to_timm(model).eval()(x).double(), ref) <= 1e-5  # timm's MlpMixer with the tanh GELU
        with pytest.warns(ActivationWarning, match="timm computes act='gelu'"):
            convert_checkpoint(npz, tmp_path / "timm.pth")  # the file cannot say tanh: warned
        with warnings.catch_warnings():
            warnings.simplefilter("error", ActivationWarning)
            convert_checkpoint(npz, tmp_path / "exact.pth", act="gelu")  # nothing to warn about
        theirs = small_timm()
        for name in ("timm.pth", "exact.pth"):
            theirs.load_state_dict(torch.load(tmp_path / name, weights_only=True))
            assert rel_err(theirs(x).double(), ref_exact) <= 1e-5


def test_activation_of_each_format_and_its_warnings(npz, tmp_path):
    """Flax imports as gelu_tanh, timm as gelu, a pkmixer checkpoint as it records (none recorded: gelu);
    export warns exactly when the format's code computes the other GELU."""
    timm_file = tmp_path / "t.pth"
    torch.save(small_timm().state_dict(), timm_file)
    assert import_checkpoint(timm_file).model.activation == "gelu"
    assert import_checkpoint(timm_file, act="gelu_tanh").model.spec.overrides["act"] == "gelu_tanh"
    tanh, exact = import_checkpoint(npz).model, import_checkpoint(timm_file).model
    # a pkmixer checkpoint keeps its act; one written before act existed (no key) is the exact GELU
    convert_checkpoint(npz, tmp_path / "tanh.pt")
    assert load_model(tmp_path / "tanh.pt").activation == "gelu_tanh"
    assert import_checkpoint(tmp_path / "tanh.pt").model.activation == "gelu_tanh"
    assert import_checkpoint(tmp_path / "tanh.pt", act="gelu").model.activation == "gelu"
    old = torch.load(tmp_path / "tanh.pt", weights_only=True)
    old["overrides"].pop("act")
    del old["arguments"]  # a file from before act existed recorded neither
    torch.save(old, tmp_path / "old.pt")
    assert load_model(tmp_path / "old.pt").activation == "gelu"
    assert import_checkpoint(tmp_path / "old.pt").model.activation == "gelu"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ActivationWarning)
        export_checkpoint(tanh, tmp_path / "a.npz")
        export_checkpoint(exact, tmp_path / "a.pth")
        export_checkpoint(tanh, tmp_path / "a.pt")
        export_checkpoint(exact, tmp_path / "b.pt")
    with pytest.warns(ActivationWarning, match=r"Flax \(Listing 1\) computes act='gelu_tanh'.*--act gelu\)"):
        export_checkpoint(exact, tmp_path / "b.npz")
    with pytest.warns(ActivationWarning, match=r"timm computes act='gelu'.*--act gelu_tanh\)"):
        export_checkpoint(tanh, tmp_path / "b.pth")
    # ... and the hint is right: read back with it, each file is the model again
    assert import_checkpoint(tmp_path / "b.npz", act="gelu").model.spec == exact.spec
    assert import_checkpoint(tmp_path / "b.pth", act="gelu_tanh").model.spec == tanh.spec
    with pytest.raises(ConfigError, match="act must be one of"):
        import_checkpoint(npz, act="swish")
    with pytest.raises(ConfigError, match="GELU MLP-Mixer, not act='relu'"):
        export_checkpoint(pkmixer.create_model("mixer_c64d3p4_32", act="relu"), tmp_path / "r.npz")


def test_from_timm_reads_the_gelu():
    from timm.models.mlp_mixer import MlpMixer

    theirs = MlpMixer(num_classes=CLASSES, img_size=IMG, patch_size=P, num_blocks=DEPTH, embed_dim=C,
                      mlp_ratio=(D_S / C, D_C / C), act_layer=lambda: torch.nn.GELU(approximate="tanh"))
    perturb_(theirs.double(), 0.1).eval()
    ours = from_timm(theirs).eval()
    x = images().double()
    assert ours.activation == "gelu_tanh" and from_timm(small_timm()).activation == "gelu"
    with torch.no_grad():
        assert rel_err(ours(x), theirs(x)) <= 1e-12
        assert rel_err(to_timm(ours).eval()(x), theirs(x)) <= 1e-12  # float64 kept, not rounded to float32
    with pytest.raises(ConfigError, match="GELU activations"):
        from_timm(MlpMixer(num_classes=2, img_size=IMG, patch_size=P, num_blocks=1, embed_dim=C,
                           act_layer=torch.nn.ReLU))


def test_timm_state_dict_round_trip_plain_and_wrapped(tmp_path):
    theirs = small_timm()
    state = theirs.state_dict()
    x = images()
    with torch.no_grad():
        ref = theirs(x)
    wrapped = {"plain.pth": state, "state.pth": {"state_dict": state, "epoch": 3, "arch": "mixer",
                                                 "args": argparse.Namespace(model="mixer", lr=0.1)},
               "model.pth": {"model": state}}
    for name, payload in wrapped.items():
        torch.save(payload, tmp_path / name)
        imported = import_checkpoint(tmp_path / name)
        assert imported.source_format == "timm" and not imported.head_replaced
        with torch.no_grad():
            assert rel_err(imported.model.eval()(x), ref) <= 1e-5
        summary = convert_checkpoint(tmp_path / name, tmp_path / f"out_{name}")
        assert (summary["source_format"], summary["destination_format"]) == ("timm", "timm")
        back = torch.load(tmp_path / f"out_{name}", weights_only=True)
        assert list(back) == list(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_registered_original_variant_is_picked(tmp_path):
    """Shapes of Table 1's S/32 pick mixer_s32_224; only the image size, class count and (for Flax's tanh
    GELU) act are overrides."""
    source = pkmixer.create_model("mixer_s32_224", img_size=64, num_classes=3)
    with pytest.warns(ActivationWarning):  # an exact-GELU model as Flax arrays
        export_checkpoint(source, tmp_path / "s32.npz")
    imported = import_checkpoint(tmp_path / "s32.npz").model
    assert imported.spec == ModelSpec("mixer_s32_224", {"img_size": 64, "num_classes": 3, "act": "gelu_tanh"})
    assert import_checkpoint(tmp_path / "s32.npz", act="gelu").model.spec == source.spec
    assert all(torch.equal(a, b) for a, b in zip(imported.state_dict().values(), source.state_dict().values()))


def test_new_head_keeps_everything_else(npz, tmp_path):
    summary = convert_checkpoint(npz, tmp_path / "five.pt", num_classes=5)
    assert summary["head_replaced"] and summary["num_classes"] == 5 and summary["overrides"]["num_classes"] == 5
    model = load_model(tmp_path / "five.pt")
    assert torch.count_nonzero(model.head.weight) == 0 and torch.count_nonzero(model.head.bias) == 0
    assert model.head.weight.shape == (5, C)
    expected = flax_to_pkmixer_state_dict(flax_arrays())
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in expected.items() if not k.startswith("head."))
    # the same class count keeps the head; a pkmixer checkpoint can be re-headed too
    assert not convert_checkpoint(npz, tmp_path / "ten.pt", num_classes=CLASSES)["head_replaced"]
    again = convert_checkpoint(tmp_path / "ten.pt", tmp_path / "seven.pt", num_classes=7)
    assert again["source_format"] == "pkmixer" and again["head_replaced"]
    assert load_model(tmp_path / "seven.pt").head.weight.shape == (7, C)


def test_mismatch_against_named_model(npz, tmp_path):
    with pytest.raises(ConfigError, match=r"stem/kernel has shape \(8, 8, 3, 16\) in the checkpoint and "
                                          r"\(16, 16, 3, 512\) in the model"):
        convert_checkpoint(npz, tmp_path / "x.pt", model="mixer_s16_224")
    torch.save(small_timm().state_dict(), tmp_path / "timm.pth")
    with pytest.raises(ConfigError, match=r"stem\.proj\.weight has shape \(16, 3, 8, 8\) in the checkpoint"):
        convert_checkpoint(tmp_path / "timm.pth", tmp_path / "x.pt", model="mixer_b32_224")
    with pytest.raises(ConfigError, match="MixerBlock_0/token_mixing/Dense_0/kernel has shape"):
        convert_checkpoint(npz, tmp_path / "x.pt", img_size=64)
    with pytest.raises(ConfigError, match="MLP-Mixer"):
        convert_checkpoint(npz, tmp_path / "x.pt", model="smixer_c64p4_32")
    with pytest.raises(ConfigError, match="did you mean"):
        convert_checkpoint(npz, tmp_path / "x.pt", model="mixer_s16_22")
    assert not (tmp_path / "x.pt").exists()


def test_bad_files_and_existing_destination(npz, tmp_path):
    dst = tmp_path / "dst.pt"
    dst.write_bytes(b"keep me")
    with pytest.raises(ConfigError, match="exists; refusing to overwrite"):
        convert_checkpoint(npz, dst)
    with pytest.raises(ConfigError, match="no checkpoint file"):
        convert_checkpoint(tmp_path / "missing.npz", dst, overwrite=True)
    (tmp_path / "corrupt.npz").write_bytes(npz.read_bytes()[:200])
    (tmp_path / "garbage.pth").write_bytes(b"not a torch file")
    torch.save({"weights": [1, 2]}, tmp_path / "other.pth")
    missing = {k: v for k, v in flax_arrays().items() if k != "head/bias"}
    np.savez(tmp_path / "partial.npz", **missing)
    for name, message in [("corrupt.npz", "not a readable .npz"), ("garbage.pth", "not a readable torch file"),
                          ("other.pth", "neither a pkmixer checkpoint nor a timm state dict"),
                          ("partial.npz", "lacks head/bias")]:
        with pytest.raises(ConfigError, match=message):
            convert_checkpoint(tmp_path / name, dst, overwrite=True)
    with pytest.raises(ConfigError, match="suffix"):
        convert_checkpoint(npz, tmp_path / "out.bin")
    assert dst.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary files left
    convert_checkpoint(npz, dst, overwrite=True)
    assert load_model(dst).num_classes == CLASSES


def test_pickled_code_is_refused(tmp_path):
    torch.save({"state_dict": small_timm().state_dict(), "hook": torch.nn.ReLU()}, tmp_path / "code.pth")
    with pytest.raises(ConfigError, match="not a readable torch file"):
        import_checkpoint(tmp_path / "code.pth")


def test_pkmixer_checkpoint_loads_with_same_logits(npz, tmp_path):
    imported = import_checkpoint(npz).model.eval()
    convert_checkpoint(npz, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt").eval()
    x = images()
    with torch.no_grad():
        assert torch.equal(loaded(x), imported(x))


def test_convert_command_and_refusals(npz, tmp_path, capsys):
    from pkmixer.cli import main

    dst = tmp_path / "m.pth"
    assert main(["convert", str(npz), str(dst), "--num-classes", "7", "--json"]) == 0
    captured = capsys.readouterr()
    result = __import__("json").loads(captured.out)
    assert (result["source_format"], result["destination_format"], result["num_classes"], result["head_replaced"]) \
        == ("flax", "timm", 7, True)
    assert result["act"] == "gelu_tanh"  # Listing 1's, which a timm file cannot hold: one line of warning
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pkmixer convert: warning: ") and "--act gelu_tanh" in err[0], err
    assert import_checkpoint(dst).model.num_classes == 7
    exact = tmp_path / "exact.pth"
    assert main(["convert", str(npz), str(exact), "--act", "gelu"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "act gelu" in captured.out
    exact.unlink()
    before = dst.read_bytes()
    for args, needle in [([str(npz), str(dst)], "exists"), ([str(npz), str(tmp_path / "x.bin")], "suffix"),
                         ([str(tmp_path / "none.npz"), str(tmp_path / "y.pt")], "checkpoint file at"),
                         ([str(npz), str(tmp_path / "z.pt"), "--model", "mixer_b16_224"], "does not fit")]:
        assert main(["convert", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, err
    assert dst.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pth", "mixer.npz"]


def test_flax_checkpoint_initialises_training_and_evaluates(npz, tmp_path, capsys):
    """`pkmixer train --set model.init=X.npz` starts from the Flax weights; `pkmixer eval X.npz` scores them."""
    from pkmixer.cli import main
    from pkmixer.train import loop
    from pkmixer.train.build import build_model
    from pkmixer.train.config import build_config

    data = {"data.name": "synthetic", "data.train_subset": 64, "data.test_subset": 64, "data.batch_size": 32,
            "run.progress": False}
    assert main(["eval", str(npz), "--json", *[f"--set={k}={v}" for k, v in data.items()]]) == 0
    scored = __import__("json").loads(capsys.readouterr().out)
    assert scored["test_examples"] == 64 and scored["model"] == import_checkpoint(npz).model.spec.name
    # the same file enlarged to 64 px (Mixer supp. C): a model of another shape, scored on the same images
    assert main(["eval", str(npz), "--json", "--set=model.img_size=64",
                 *[f"--set={k}={v}" for k, v in data.items()]]) == 0
    enlarged = __import__("json").loads(capsys.readouterr().out)
    assert enlarged["test_examples"] == 64 and enlarged["test_loss"] != scored["test_loss"]

    name = import_checkpoint(npz).model.spec.name
    cfg = build_config(None, {**data, "model.name": name, "model.init": str(npz), "schedule.epochs": 1})
    start = build_model(cfg.model, CLASSES).state_dict()
    for key, value in flax_to_pkmixer_state_dict(flax_arrays()).items():
        assert torch.equal(start[key], value), key
    assert loop.train(cfg, tmp_path / "run", log=lambda _: None)["status"] == "finished"

    convert_checkpoint(npz, tmp_path / "seven.pt", num_classes=7)
    assert main(["eval", str(tmp_path / "seven.pt"), "--set", "data.name=synthetic"]) == 2
    assert main(["eval", str(tmp_path / "run"), "--set", "data.name=digits"]) == 2  # a run keeps its own config
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and "7-class head" in errors[0] and "with its own config" in errors[1], errors
