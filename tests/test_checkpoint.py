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
