"""Weights as users get them (pkmixer.models.weights, pkmixer.checkpoint): safetensors weights files, the folder
timm's push_to_hf_hub uploads, read back offline by timm ("local-dir:") and by pkmixer.create_model(pretrained=),
Google's Mixer weights by timm's hub names from a local Hugging Face cache, and old checkpoints loading."""
import json

import huggingface_hub.constants
import pytest
import timm
import torch
from safetensors.torch import save_file

import pkmixer
from pkmixer.checkpoint import read_weights, save_model, save_weights
from pkmixer.errors import ConfigError
from pkmixer.models import save_pretrained
from pkmixer.models.convert import export_checkpoint, import_checkpoint
from pkmixer.models.restore import load_model

from conftest import perturb_

MADE = "Not trained: the registry's initialisation (seed 0), perturbed for this test."


def _model(name: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb_(pkmixer.create_model(name, **overrides)).eval()


def _x(model: torch.nn.Module) -> torch.Tensor:
    return torch.randn(2, model.in_chans, model.img_size, model.img_size, generator=torch.Generator().manual_seed(3))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    x = _x(a)
    with torch.no_grad():
        return torch.equal(a(x), b(x))


# the random structure travels with the weights: a Mixer, an RP S-Mixer's permutations, an SW-MLP's masks
CASES = [("mixer_t4_28", dict(depth=2)), ("rp_smixer_c64p4_32", dict(depth=2, embed_dim=16, img_size=16)),
         ("swmlp_t4_28", dict(depth=2, structure_seed=3))]


@pytest.mark.parametrize("name, overrides", CASES)
def test_a_hub_folder_round_trips_through_timm_and_pkmixer_offline(name, overrides, tmp_path):
    model = _model(name, **overrides)
    folder = save_pretrained(model, tmp_path / "hub", how_made=MADE)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "pkmixer_" + name and config["model_args"] == overrides
    assert config["num_classes"] == model.num_classes and config["pretrained_cfg"]["mean"] == list(model.pretrained_cfg["mean"])
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: timm" in card and MADE in card and name in card
    assert "How they were made" in card and "@inproceedings{hayase2024understanding" in card
    through_timm = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    through_pkmixer = pkmixer.create_model(name, pretrained=folder).eval()
    from_file = pkmixer.create_model(name, pretrained=folder / "model.safetensors").eval()
    for other in (through_timm, through_pkmixer, from_file):
        assert _same(model, other)
        assert other.spec.name == name and other.spec.overrides == model.spec.overrides
        assert other.pretrained_cfg["mean"] == model.pretrained_cfg["mean"]
    assert through_timm.pretrained_cfg["source"] == "local-dir"


def test_weights_file_records_the_model_and_rebuilds_it_exactly(tmp_path):
    model = _model("mixer_pyramid_t4_28", depth=2, token_schedule=[49, 25])
    path = save_weights(tmp_path / "w.safetensors", model)
    payload = read_weights(path)
    assert payload["model"] == "mixer_pyramid_t4_28" and payload["arguments"] == model.spec.arguments
    assert payload["overrides"] == model.spec.overrides  # tuples stay tuples (Python literals in the metadata)
    for loaded in (load_model(path), import_checkpoint(path).model, pkmixer.create_model("mixer_pyramid_t4_28",
                                                                                        pretrained=path)):
        assert _same(model, loaded.eval()) and loaded.spec == model.spec
    with pytest.raises(ConfigError, match="exists"):
        save_weights(path, model)
    assert export_checkpoint(model, tmp_path / "x.safetensors") == "pkmixer"
    assert read_weights(tmp_path / "x.safetensors")["state_dict"].keys() == model.state_dict().keys()


def test_new_head_keeps_the_other_weights_and_a_wrong_model_is_refused(tmp_path):
    model = _model("mixer_t4_28", depth=2)
    folder = save_pretrained(model, tmp_path / "f", how_made=MADE)
    five = pkmixer.create_model("mixer_t4_28", pretrained=folder, num_classes=5)
    assert five.num_classes == 5 and not five.head.weight.any()  # the model's own zero head
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in five.state_dict().items() if not k.startswith("head"))
    headless = pkmixer.create_model("mixer_t4_28", pretrained=folder, num_classes=0).eval()
    with torch.no_grad():
        assert torch.equal(headless(_x(model)), model.forward_head(model.forward_features(_x(model)), pre_logits=True))
    with pytest.raises(ConfigError, match="weights of mixer_t4_28, not smixer_t4_28"):
        pkmixer.create_model("smixer_t4_28", pretrained=folder)
    with pytest.raises(ConfigError, match="do not fit"):
        pkmixer.create_model("mixer_t4_28", pretrained=tmp_path / "f" / "model.safetensors", embed_dim=16)
    with pytest.raises(ConfigError, match="not empty"):
        save_pretrained(model, folder, how_made=MADE)
    with pytest.raises(ConfigError, match="how_made"):
        save_pretrained(model, tmp_path / "g", how_made=" ")
    assert not (tmp_path / "g").exists()
    with pytest.raises(ConfigError, match="no weights file or folder"):
        pkmixer.create_model("mixer_t4_28", pretrained=tmp_path / "nothing")
    with pytest.raises(ConfigError, match="no hub weights"):
        pkmixer.create_model("mixer_t4_28", pretrained=True)
    with pytest.raises(ConfigError, match="no pretrained weights"):
        timm.create_model("pkmixer_mixer_t4_28", pretrained=True)


def _fake_hub_cache(root, repo: str, files: dict[str, bytes]) -> None:
    """A Hugging Face cache entry as hf_hub_download leaves it: refs/main names a snapshot holding the files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    entry = root / ("models--" + repo.replace("/", "--"))
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """A temporary HF_HOME with HF_HUB_OFFLINE=1: only the local cache is read, nothing is downloaded."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return home / "hub"


def test_google_s_mixer_weights_load_by_timm_s_hub_name_from_the_local_cache(offline_hub, tmp_path):
    """A small stand-in for timm/mixer_b16_224.goog_in21k_ft_in1k (the real one is 240 MB): a timm MlpMixer of the
    overridden sizes, saved as the hub holds it (timm's names, safetensors)."""
    from timm.models.mlp_mixer import MlpMixer

    sizes = dict(img_size=32, depth=1, embed_dim=8, token_hidden=4, channel_hidden=16)
    torch.manual_seed(0)
    theirs = MlpMixer(img_size=32, patch_size=16, num_blocks=1, embed_dim=8, mlp_ratio=(0.5, 2.0), num_classes=1000)
    perturb_(theirs).eval()
    weights = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(weights))
    _fake_hub_cache(offline_hub, "timm/mixer_b16_224.goog_in21k_ft_in1k", {"model.safetensors": weights.read_bytes()})
    x = torch.randn(2, 3, 32, 32)
    for ours in (pkmixer.create_model("mixer_b16_224.goog_in21k_ft_in1k", pretrained=True, **sizes),
                 pkmixer.create_model("mixer_b16_224", pretrained=True, **sizes),  # timm's default tag
                 timm.create_model("pkmixer_mixer_b16_224.goog_in21k_ft_in1k", pretrained=True, **sizes)):
        with torch.no_grad():
            torch.testing.assert_close(ours.eval()(x), theirs(x), rtol=1e-5, atol=1e-6)
        cfg = ours.pretrained_cfg
        assert cfg["mean"] == cfg["std"] == (0.5, 0.5, 0.5) and cfg["hf_hub_id"] == "timm/mixer_b16_224.goog_in21k_ft_in1k"
        assert cfg["tag"] == "goog_in21k_ft_in1k" and ours.spec.name == "mixer_b16_224"
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):  # not in the cache, and no download offline
        pkmixer.create_model("mixer_l16_224.goog_in21k", pretrained=True, **sizes)
    with pytest.raises(ConfigError, match="no hub weights for mixer_s16_224.*timm has none"):
        pkmixer.create_model("mixer_s16_224", pretrained=True)


def test_a_pushed_folder_loads_by_its_hub_repo_from_the_cache(offline_hub, tmp_path):
    model = _model("swmlp_t4_28", depth=1)
    folder = save_pretrained(model, tmp_path / "f", how_made=MADE)
    _fake_hub_cache(offline_hub, "someone/pkmixer-swmlp", {p.name: p.read_bytes() for p in folder.iterdir()})
    assert _same(model, pkmixer.create_model("swmlp_t4_28", pretrained="hf-hub:someone/pkmixer-swmlp").eval())
    assert _same(model, timm.create_model("hf-hub:someone/pkmixer-swmlp", pretrained=True).eval())


def test_checkpoints_of_earlier_versions_load(tmp_path):
    """A checkpoint whose SW-MLP kept weights are the 1-D vector of earlier versions loads, exactly."""
    model = _model("swmlp_t4_28", depth=2)
    path = save_model(tmp_path / "new.pt", model)
    payload = torch.load(path, weights_only=True)
    payload["state_dict"] = {k: v.reshape(-1) if k.endswith(".values") else v for k, v in payload["state_dict"].items()}
    assert payload["state_dict"]["blocks.0.linears.0.values"].ndim == 1
    torch.save(payload, tmp_path / "old.pt")
    assert _same(model, load_model(tmp_path / "old.pt").eval())
    assert _same(model, import_checkpoint(tmp_path / "old.pt").model.eval())


def test_an_optimiser_state_of_earlier_versions_fits_the_new_rows():
    """A resumed run of an earlier version has AdamW moments of 1-D kept weights: fit_optimizer_state reshapes
    them, and the step is the one the earlier version took."""
    from pkmixer.checkpoint import fit_optimizer_state

    model = _model("swmlp_t4_28", depth=1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x, y = _x(model), torch.tensor([1, 2])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    state = opt.state_dict()
    old = {**state, "state": {i: {k: v.reshape(-1) if v.ndim == 2 and v.shape[0] == 1 else v for k, v in s.items()}
                              for i, s in state["state"].items()}}
    again = torch.optim.AdamW(model.parameters(), lr=0.1)
    again.load_state_dict(old)
    fit_optimizer_state(again)
    assert all(again.state[p]["exp_avg"].shape == p.shape for p in model.parameters())
    assert all(torch.equal(again.state[p]["exp_avg_sq"], opt.state[p]["exp_avg_sq"]) for p in model.parameters())
