"""Registry names follow one grammar (docs/models.md, "Names"), and every earlier name is an alias that builds
the same architecture - through pkmixer, timm and checkpoints."""
import re
import warnings

import pytest
import timm
import torch

import pkmixer
from pkmixer.errors import ConfigError
from pkmixer.models import registry, spellings
from pkmixer.models.registry import canonical_name, list_aliases, model_entry
from pkmixer.checkpoint import save_model
from pkmixer.models.restore import load_model

# the grammar as docs/models.md writes it: [rp_]<family>[_<variant>]_<size><patch>_<img> | shallow_<weights>_<img>
GRAMMAR = re.compile(
    r"(?:(?P<rp>rp_)?(?P<family>mixer|smixer|swmlp)(?:_(?P<variant>untied|grouped|views|pyramid))?"
    r"_(?:(?P<code>ssw|ss|bw|s|b|l|h|t)|(?P<qty>[cm])(?P<number>\d+)(?:d(?P<depth>\d+))?p)(?P<patch>\d+)"
    r"|shallow_(?P<weights>dense|kronecker|monarch))_(?P<img>\d+)")
# (C, depth) of the letter size codes; None: not fixed by the code
SIZES = {"s": (512, 8), "b": (768, 12), "l": (1024, 24), "h": (1280, 32), "ss": (986, 2), "ssw": (487, 2),
         "bw": (588, 8), "t": (None, 4)}
VARIANTS = {"untied": "untied_tokens", "grouped": "channel_groups", "views": "group_views",
            "pyramid": "token_schedule"}
# every name of the registry before the grammar (pkmixer 0.1.0): each must still build
OLD_NAMES = [
    "mixer_b16_224", "mixer_b32_224", "mixer_bw14_224", "mixer_f2_32", "mixer_grouped_t4_28", "mixer_h14_224",
    "mixer_l16_224", "mixer_l32_224", "mixer_pyramid_t4_28", "mixer_s16_224", "mixer_s32_224", "mixer_s64_32",
    "mixer_ss8_32", "mixer_ssw4_32", "mixer_t4_28", "mixer_untied_t4_28", "mixer_views_t4_28", "rp_mixer_s64_32",
    "rp_smixer_s128_32", "rp_smixer_s64_32", "rp_smixer_t4_28", "smixer_s128_32", "smixer_s64_32", "smixer_t4_28",
    "swmlp_f2_32", "swmlp_o18_32", "swmlp_t4_28", "shallow_dense_28", "shallow_kronecker_28", "shallow_monarch_28"]


def _meta(name: str, **overrides) -> torch.nn.Module:
    with torch.device("meta"):
        return pkmixer.create_model(name, **overrides)


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_grammar_is_the_registry_s():
    names = [*pkmixer.list_models(), *list_aliases(), "mixer_tiny", "mixer_c64_32", "smixer_c64d3_p4_32",
             "rp_shallow_dense_28", "mixer_t4", "swmlp_m12p4_32", "mixer_untied_b16_224", "smixer_x4_32"]
    assert [bool(GRAMMAR.fullmatch(n)) for n in names] == [bool(registry.NAME_GRAMMAR.fullmatch(n)) for n in names]


@pytest.mark.parametrize("name", pkmixer.list_models())
def test_name_follows_the_grammar_and_says_the_truth(name):
    match = GRAMMAR.fullmatch(name)
    assert match, f"{name} does not follow the naming grammar"
    model = _meta(name)
    assert model.img_size == int(match["img"])
    if match["weights"]:
        assert type(model).__name__ == "ShallowMLP" and model.weights == match["weights"]
        return
    family = {"mixer": ("Mixer", "mlp"), "smixer": ("Mixer", "fc"), "swmlp": ("SWMLP", None)}[match["family"]]
    assert type(model).__name__ == family[0]
    if family[1]:
        assert model.block_kind == family[1]
    assert model.patch_size == int(match["patch"])
    rp = getattr(model, "rp_blocks", frozenset())
    assert (rp == frozenset(range(model.depth))) if match["rp"] else not rp
    if match["variant"]:
        assert model.token_ablations == (VARIANTS[match["variant"]],) or \
            VARIANTS[match["variant"]] in model.token_ablations
    elif hasattr(model, "token_ablations"):
        assert model.token_ablations == ()
    if match["code"]:
        C, depth = SIZES[match["code"]]
        assert C in (None, model.embed_dim) and model.depth == depth
    else:
        number = int(match["number"])
        if match["qty"] == "c":
            assert model.num_tokens == model.embed_dim == number
        else:
            assert model.width == number
        assert model.depth == (int(match["depth"]) if match["depth"] else 8)


def test_every_old_name_still_builds():
    known = set(pkmixer.list_models()) | set(list_aliases())
    assert set(OLD_NAMES) <= known
    assert not set(list_aliases()) & set(pkmixer.list_models())
    assert set(list_aliases("smixer_*")) == {"smixer_s64_32", "smixer_s128_32"}


@pytest.mark.parametrize("alias", sorted(list_aliases()))
def test_alias_is_its_canonical_architecture(alias):
    name = list_aliases()[alias]
    assert canonical_name(alias) == canonical_name("pkmixer_" + alias) == name == canonical_name(name)
    entry = model_entry(alias)
    assert (entry.name, entry.canonical) == (alias, name)
    assert (entry.cls, entry.defaults, entry.data_set) == (model_entry(name).cls, model_entry(name).defaults,
                                                            model_entry(name).data_set)
    a, c = _meta(alias), _meta(name)
    assert _shapes(a) == _shapes(c)
    assert a.info() == c.info()
    assert a.spec.name == alias and c.spec.name == name  # the spec records the name asked for
    assert a.pretrained_cfg["architecture"] == c.pretrained_cfg["architecture"] == "pkmixer_" + name


def test_alias_in_timm():
    deprecated = timm.models.get_deprecated_models("timm_registry")
    assert deprecated == {"pkmixer_" + a: "pkmixer_" + n for a, n in list_aliases().items()}
    assert not set(deprecated) & set(timm.list_models("pkmixer_*"))
    with pytest.warns(UserWarning, match="pkmixer_smixer_c64p4_32"):
        model = timm.create_model("pkmixer_smixer_s64_32", num_classes=3, depth=2)
    assert _shapes(model) == _shapes(pkmixer.create_model("smixer_c64p4_32", num_classes=3, depth=2))


def test_checkpoint_with_an_old_name_loads(tmp_path):
    torch.manual_seed(0)
    old = pkmixer.create_model("rp_smixer_s64_32", depth=2, num_classes=3)  # as an earlier version wrote it
    path = save_model(tmp_path / "old.pt", old)
    assert torch.load(path, weights_only=True)["model"] == "rp_smixer_s64_32"
    loaded = load_model(path)
    assert loaded.spec == old.spec
    new = pkmixer.create_model("rp_smixer_c64p4_32", depth=2, num_classes=3)
    new.load_state_dict(loaded.state_dict())  # the same architecture, permutations included
    x = torch.randn(2, 3, 32, 32)
    torch.nn.init.normal_(new.head.weight)
    loaded.head.weight.data.copy_(new.head.weight)
    with torch.no_grad():
        assert torch.equal(new(x), loaded(x))


def test_unknown_names_and_bad_registrations():
    with pytest.raises(ConfigError, match="did you mean.*smixer_s64_32"):
        pkmixer.create_model("smixer_s46_32")  # aliases are suggested too
    with pytest.raises(ConfigError, match="did you mean.*smixer_c64p4_32"):
        pkmixer.create_model("smixer_c46p4_32")
    with pytest.raises(ValueError, match="grammar"):
        registry.register("mixer_tiny", pkmixer.models.Mixer, "", "")
    with pytest.raises(ValueError, match="twice"):
        registry.register_alias("mixer_s64_32", "mixer_t4_28", kept_until="0.3.0")


def test_an_alias_warns_once_with_its_new_name_and_the_release_it_stays_until(monkeypatch):
    monkeypatch.setattr(registry, "_WARNED", set())
    until = registry.alias_kept_until("mixer_f2_32")
    assert until == spellings.KEPT_UNTIL and re.fullmatch(r"\d+\.\d+\.\d+", until)
    with pytest.warns(FutureWarning, match=rf"'mixer_f2_32' is deprecated: use 'mixer_c64d3p4_32'.*until pkmixer {until}"):
        assert pkmixer.create_model("mixer_f2_32", depth=1).spec.name == "mixer_f2_32"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process and alias
        pkmixer.create_model("mixer_f2_32", depth=1)
        model_entry("mixer_s64_32")  # looking a name up does not warn
    with pytest.warns(FutureWarning, match="'swmlp_o18_32'.*'swmlp_m1619p4_32'"):  # another alias warns once too
        pkmixer.create_model("pkmixer_swmlp_o18_32", depth=1)


def test_a_checkpoint_with_an_old_name_loads_without_a_warning(tmp_path, monkeypatch):
    old = pkmixer.create_model("rp_smixer_s64_32", depth=1, num_classes=3)
    path = save_model(tmp_path / "old.pt", old)
    monkeypatch.setattr(registry, "_WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(path).spec.name == "rp_smixer_s64_32"
