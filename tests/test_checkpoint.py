"""Checkpoints: round trip with permutations and masks, atomic writes, refusals."""
import pytest
import torch

import pkmixer
from pkmixer.atomic import write_text_atomically
from pkmixer.errors import ConfigError
from pkmixer.checkpoint import read_checkpoint, save_model
from pkmixer.models.restore import load_model


@pytest.mark.parametrize("name,overrides", [("rp_smixer_t4_28", {"structure_seed": 5}),
                                            ("swmlp_t4_28", {"depth": 2, "density": 0.3})])
def test_round_trip(tmp_path, name, overrides):
    model = pkmixer.create_model(name, **overrides).eval()
    torch.nn.init.normal_(model.head.weight)
    path = save_model(tmp_path / "ckpt.pt", model, epoch=3)
    assert read_checkpoint(path)["epoch"] == 3
    loaded = load_model(path).eval()
    assert loaded.spec == model.spec
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(loaded(x), model(x))


def test_refuses_to_overwrite_and_leaves_no_temporary(tmp_path):
    model = pkmixer.create_model("smixer_t4_28", depth=1)
    path = save_model(tmp_path / "a.pt", model)
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="exists"):
        save_model(path, pkmixer.create_model("smixer_t4_28", depth=2))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt"]


def test_corrupt_foreign_and_missing(tmp_path):
    model = pkmixer.create_model("smixer_t4_28", depth=1)
    good = save_model(tmp_path / "good.pt", model)
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[:100])
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign.pt")
    (tmp_path / "text.pt").write_text("hello")
    for name, needle in [("cut.pt", "not a readable checkpoint"), ("foreign.pt", "not a pkmixer checkpoint"),
                         ("text.pt", "not a readable checkpoint"), ("missing.pt", "no checkpoint file")]:
        with pytest.raises(ConfigError, match=needle):
            load_model(tmp_path / name)


def test_weights_that_do_not_fit(tmp_path):
    model = pkmixer.create_model("smixer_t4_28", depth=1)
    path = save_model(tmp_path / "m.pt", model)
    payload = read_checkpoint(path)
    payload["overrides"] = {"depth": 1, "embed_dim": 32}
    payload["arguments"]["embed_dim"] = 32  # the architecture the file names, against its 64-channel weights
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="do not fit"):
        load_model(tmp_path / "bad.pt")


def test_written_with_the_permissions_of_a_plain_open(tmp_path):
    import os

    plain = tmp_path / "plain"
    plain.write_bytes(b"")  # open() honours the umask: what a checkpoint should get too
    save_model(tmp_path / "m.pt", pkmixer.create_model("smixer_t4_28"))
    write_text_atomically(tmp_path / "results.csv", "a,b\n")
    for written in ("m.pt", "results.csv"):
        assert os.stat(tmp_path / written).st_mode & 0o777 == os.stat(plain).st_mode & 0o777, written
    assert (tmp_path / "results.csv").read_text() == "a,b\n"


@pytest.mark.parametrize("name", ["smixer_t4_28", "mixer_pyramid_t4_28", "swmlp_t4_28", "mixer_b16_224"])
def test_checkpoints_record_every_constructor_argument(tmp_path, monkeypatch, name):
    """Editing a registry default later never changes what an old checkpoint means: the file records every
    argument its model was built with. A file from before they were recorded follows the
    registry, as it always did."""
    import inspect

    from pkmixer.models.registry import _REGISTRY, model_entry

    with torch.device("meta") if name == "mixer_b16_224" else torch.device("cpu"):
        model = pkmixer.create_model(name, num_classes=7)
    if name == "mixer_b16_224":  # the full-size check of the recorded arguments only, on the meta device
        arguments = model.spec.arguments
        assert arguments["embed_dim"] == 768 and arguments["token_hidden"] == 384 and arguments["num_classes"] == 7
        return
    path = save_model(tmp_path / "m.pt", model)
    arguments = read_checkpoint(path)["arguments"]
    entry = model_entry(name)
    params = [p for p in inspect.signature(entry.cls.__init__).parameters if p != "self"]
    assert arguments["num_classes"] == 7 and arguments["embed_dim"] == entry.defaults["embed_dim"]
    assert set(params) - {"token_mixing"} <= set(arguments)  # every argument, in its plain spelling
    before = {k: v.shape for k, v in model.state_dict().items()}
    monkeypatch.setitem(_REGISTRY[entry.canonical].defaults, "embed_dim", 2 * entry.defaults["embed_dim"])
    loaded = load_model(path)
    assert {k: v.shape for k, v in loaded.state_dict().items()} == before and loaded.spec == model.spec
    old = read_checkpoint(path)
    del old["arguments"]
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(ConfigError, match="weights do not fit"):
        load_model(tmp_path / "old.pt")


@pytest.mark.parametrize("options", [{"untied_tokens": True}, {"channel_groups": 4},
                                     {"channel_groups": 4, "group_views": True}, {"token_schedule": [16, 9]}],
                         ids=["untied", "grouped", "views", "pyramid"])
def test_plain_ablation_options_are_recorded_as_built(tmp_path, options):
    """A Mixer built from its plain A.1 options (as configs spell them) is rebuilt from its checkpoint alone, with
    the same outputs: the recorded arguments are those the options resolved to, not the class's defaults."""
    torch.manual_seed(0)
    model = pkmixer.create_model("mixer_t4_28", img_size=8, patch_size=2, depth=2, embed_dim=16, **options).eval()
    path = save_model(tmp_path / "m.pt", model)
    loaded = load_model(path).eval()
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(loaded(x), model(x))
    recorded = read_checkpoint(path)["arguments"]
    assert all(recorded[k] == (tuple(v) if isinstance(v, list) else v) for k, v in options.items())
