"""The model zoo: every registered configuration of the papers (and pkmixer's small ones), by its name.

Names follow the grammar of :data:`pkmixer.models.registry.NAME_GRAMMAR` (docs/models.md, "Names"); the names of
earlier versions are in :mod:`pkmixer.models.spellings`. Every entry names the data set it is meant for (its
normalisation in the timm ``pretrained_cfg``) and where in the papers it comes from (``source``, which also
gives the papers its timm ``pretrained_cfg`` cites).
"""
from __future__ import annotations

from ..layers.token_mixing import GroupedTokens, UntiedTokens
from .mixer import Mixer, Pyramid
from .registry import register
from .shallow import ShallowMLP
from .swmlp import SWMLP

_TOLSTIKHIN = "Tolstikhin et al. 2021, Table 1"
# name: (patch, depth, C, D_S, D_C)
_ORIGINAL = {
    "s32": (32, 8, 512, 256, 2048), "s16": (16, 8, 512, 256, 2048),
    "b32": (32, 12, 768, 384, 3072), "b16": (16, 12, 768, 384, 3072),
    "l32": (32, 24, 1024, 512, 4096), "l16": (16, 24, 1024, 512, 4096),
    "h14": (14, 32, 1280, 640, 5120),
}
for _key, (_p, _d, _c, _ds, _dc) in _ORIGINAL.items():
    register(f"mixer_{_key}_224", Mixer, f"Mixer-{_key[0].upper()}/{_key[1:]} at 224 px", _TOLSTIKHIN,
             data_set="imagenet", img_size=224, patch_size=_p, depth=_d, embed_dim=_c, token_hidden=_ds,
             channel_hidden=_dc)

_HAYASE = "Hayase & Karakida 2024"
_CIFAR = dict(img_size=32, patch_size=4, num_classes=10, norm_eps=1e-5)
register("mixer_ss8_32", Mixer, "Mixer-SS/8: S=16, C=986, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **{**_CIFAR, "patch_size": 8}, depth=2, embed_dim=986, mlp_ratio=4.0)
register("mixer_ssw4_32", Mixer, "Mixer-SS-W: S=64, C=487, γ=4, 2 blocks (CIFAR)", f"{_HAYASE}, Table 1, App. C.3",
         data_set="cifar10", **_CIFAR, depth=2, embed_dim=487, mlp_ratio=4.0)
register("mixer_bw14_224", Mixer, "Mixer-B-W: P=14, S=256, C=588, γ=4.57, 8 blocks", f"{_HAYASE}, Table 1, App. C.3",
         data_set="imagenet", img_size=224, patch_size=14, depth=8, embed_dim=588, mlp_ratio=4.57, norm_eps=1e-5)
register("mixer_c64d3p4_32", Mixer, "MLP-Mixer S=C=64, γ=2, 3 blocks (Fig. 2 CKA)", f"{_HAYASE}, App. C.1",
         data_set="cifar10", **_CIFAR, depth=3, embed_dim=64, mlp_ratio=2.0)
register("mixer_c64p4_32", Mixer, "MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, App. D.7",
         data_set="cifar10", **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0)
register("rp_mixer_c64p4_32", Mixer, "RP MLP-Mixer S=C=64, γ=4, 8 blocks", f"{_HAYASE}, Sec. 5.2, App. D.7",
         data_set="cifar10", **_CIFAR, depth=8, embed_dim=64, mlp_ratio=4.0,
         rp_blocks="all")
_T4 = dict(img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64, mlp_ratio=2.0)
_GREY = "fashion-mnist"  # the 28 px grey models are trained on Fashion-MNIST here (make demo, configs/)
register("mixer_t4_28", Mixer, "small MLP-Mixer for 28 px grey images: S=49, C=64, γ=2, 4 blocks", "pkmixer",
         data_set=_GREY, **_T4)
_ABLATION = "Tolstikhin et al. 2021, supp. A.1"  # the token-mixing ablations, on mixer_t4_28
# (create_model also takes their plain spelling, untied_tokens=True, channel_groups=4, group_views=True,
# token_schedule=(...), on every Mixer entry: pkmixer.models.spellings; checkpoints record those)
register("mixer_untied_t4_28", Mixer, "mixer_t4_28 with untied token mixing: C=64 separate token MLPs", _ABLATION,
         data_set=_GREY, **_T4, token_mixing=UntiedTokens())
register("mixer_grouped_t4_28", Mixer, "mixer_t4_28 with token MLPs on G=4 grouped channels: (S·G)×(C/G) = 196×16",
         _ABLATION, data_set=_GREY, **_T4, token_mixing=GroupedTokens(4))
register("mixer_views_t4_28", Mixer, "mixer_t4_28 with G=4 trainable views R^64 -> R^16 mixed as 196×16", _ABLATION,
         data_set=_GREY, **_T4, token_mixing=GroupedTokens(4, views=True))
register("mixer_pyramid_t4_28", Mixer, "mixer_t4_28 as a pyramid: S = 49, 49, 25, 16 after blocks 1-4", _ABLATION,
         data_set=_GREY, **_T4, num_tokens=Pyramid(49, 49, 25, 16))
for _s in (64, 128):
    _tokens = None if _s == 64 else _s  # S0 = 64 at 32 px with 4 px patches; S=128 needs the skip layer
    register(f"smixer_c{_s}p4_32", Mixer, f"S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Figs. 5-7, App. C.4, C.6",
             data_set="cifar10", **_CIFAR, depth=8, embed_dim=_s, num_tokens=_tokens,
             block="fc")
    register(f"rp_smixer_c{_s}p4_32", Mixer, f"RP S-Mixer S=C={_s}, 8 blocks", f"{_HAYASE}, Sec. 5.2, Figs. 5-7",
             data_set="cifar10", **_CIFAR, depth=8, embed_dim=_s,
             num_tokens=_tokens, block="fc", rp_blocks="all")
register("smixer_t4_28", Mixer, "small S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc")
register("rp_smixer_t4_28", Mixer, "small RP S-Mixer for 28 px grey images: S=49, C=64, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, norm_eps=1e-5, depth=4, embed_dim=64,
         block="fc", rp_blocks="all")
register("swmlp_m4096d6p4_32", SWMLP, "SW-MLP m=4096, p=1/64, γ=2 MLP blocks, 6 blocks (Fig. 2 CKA)",
         f"{_HAYASE}, App. C.1", data_set="cifar10", img_size=32, patch_size=4,
         num_classes=10, embed_dim=64, depth=6, block="mlp", mlp_ratio=2.0, density=1 / 64)
register("swmlp_m1619p4_32", SWMLP, "SW-MLP Ω=2^18, p=0.1, m=1619, 8 blocks (Fig. 5)", f"{_HAYASE}, App. C.4",
         data_set="cifar10", img_size=32, patch_size=4, num_classes=10, embed_dim=64,
         depth=8, block="fc", width=1619, density=0.1)
register("swmlp_t4_28", SWMLP, "small SW-MLP for 28 px grey images: m=784, p=1/8, 4 blocks", "pkmixer",
         data_set=_GREY, img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=16, depth=4, block="fc",
         density=1 / 8)
for _w in ("dense", "kronecker", "monarch"):
    register(f"shallow_{_w}_28", ShallowMLP, f"shallow MLP with {_w} weights on 28 px (MNIST)",
             f"{_HAYASE}, Sec. 3.3, Fig. 2d", data_set="mnist", img_size=28, in_chans=1, num_classes=10, weights=_w)
