"""What earlier versions wrote, and what it means now: model names of earlier releases (aliases) and the Mixer's
plain option spelling. Configs, presets and checkpoints that use them keep working.

* **Aliases** (:data:`ALIASES`): each earlier name builds its canonical model, the same architecture and state-dict
  shapes (docs/models.md, "Names"). ``create_model`` warns once per alias (``FutureWarning``, naming the new name)
  that it stays until pkmixer :data:`KEPT_UNTIL`; a checkpoint that records an alias is read back under it
  without a warning (:mod:`pkmixer.models.restore`).
* **The Mixer's plain options** (:data:`PLAIN_OPTIONS`): ``untied_tokens``, ``channel_groups``, ``group_views``
  and ``token_schedule``, the keywords of the Mixer's earlier signature, are what configs and checkpoints hold for
  its injected arguments (``token_mixing`` factories, a ``Pyramid``). ``create_model`` accepts them
  (:func:`from_plain_options`) and records every model's arguments in them (:func:`to_plain_options`), so that a
  checkpoint holds plain values and loads with ``weights_only=True``. They are the Mixer's serialised form, not
  deprecated.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError
from ..layers.token_mixing import TiedTokens, TokenMixingFactory, token_mixing_from_options
from .mixer import Mixer, Pyramid
from .registry import register_alias, register_spelling

KEPT_UNTIL = "0.3.0"  # the release up to which the aliases stay; checkpoints that record them load after it too

# an earlier name -> the canonical name (docs/models.md, "Names")
ALIASES = {
    "mixer_f2_32": "mixer_c64d3p4_32",
    "mixer_s64_32": "mixer_c64p4_32",
    "rp_mixer_s64_32": "rp_mixer_c64p4_32",
    "smixer_s64_32": "smixer_c64p4_32",
    "smixer_s128_32": "smixer_c128p4_32",
    "rp_smixer_s64_32": "rp_smixer_c64p4_32",
    "rp_smixer_s128_32": "rp_smixer_c128p4_32",
    "swmlp_f2_32": "swmlp_m4096d6p4_32",
    "swmlp_o18_32": "swmlp_m1619p4_32",
}

PLAIN_OPTIONS = ("untied_tokens", "channel_groups", "group_views", "token_schedule")
_MIXING_OPTIONS = PLAIN_OPTIONS[:3]


def from_plain_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Mixer arguments from ``create_model``'s: the plain options (:data:`PLAIN_OPTIONS`, the keywords of
    Mixer's earlier signature, which checkpoints and configs record) update ``token_mixing`` and ``num_tokens``.

    ``untied_tokens``, ``channel_groups``, ``group_views`` replace those options of the given (or default)
    factory, so ``channel_groups=2`` on ``mixer_views_t4_28`` keeps its views. ``token_schedule=[S_1, …]``
    becomes ``num_tokens=Pyramid(S_1, …)``; with an integer ``num_tokens`` it must start at that S and keeps
    block 0's App. A.2.4 skip (``project_first``); ``token_schedule=None`` drops a Pyramid.
    """
    out = dict(kwargs)
    plain = {k: out.pop(k) for k in PLAIN_OPTIONS if k in out}
    if any(k in plain for k in _MIXING_OPTIONS):
        mixing = out.get("token_mixing", TiedTokens())
        if not isinstance(mixing, TokenMixingFactory):
            raise ConfigError(f"token_mixing must be a token-mixing factory (pkmixer.layers.token_mixing), "
                              f"got {mixing!r}")
        options = {**mixing.options(), **{k: plain[k] for k in _MIXING_OPTIONS if k in plain}}
        out["token_mixing"] = token_mixing_from_options(**options)
    if "token_schedule" in plain:
        schedule, num_tokens = plain["token_schedule"], out.get("num_tokens")
        if schedule is None:
            if isinstance(num_tokens, Pyramid):
                out["num_tokens"] = None
            return out
        depth = out.get("depth", 8)
        entries = list(schedule) if isinstance(schedule, Sequence) and not isinstance(schedule, str) else []
        project_first = num_tokens is not None and not isinstance(num_tokens, Pyramid)
        try:  # Pyramid checks the entries; the message names the plain option the user wrote
            if len(entries) != depth:
                raise ConfigError("")
            pyramid = Pyramid(*entries, project_first=project_first)
        except ConfigError:
            raise ConfigError(f"token_schedule must list depth={depth} non-increasing positive integers, the "
                              f"tokens after each block's token mixing, got {schedule!r}") from None
        if project_first and entries[0] != num_tokens:
            raise ConfigError(f"token_schedule starts at {entries[0]} tokens but num_tokens is {num_tokens}: "
                              "the first entry is the first block's S")
        out["num_tokens"] = pyramid
    return out


def to_plain_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`from_plain_options` on ``create_model`` overrides, so that ``model.spec`` and the
    checkpoints that record it hold plain values: a factory as its :meth:`~TokenMixingFactory.options`, a
    Pyramid as ``token_schedule`` (and ``num_tokens``, its first S where ``project_first``, else None)."""
    out = dict(overrides)
    mixing = out.get("token_mixing")
    if isinstance(mixing, TokenMixingFactory):
        del out["token_mixing"]
        out.update(mixing.options())
    num_tokens = out.get("num_tokens")
    if isinstance(num_tokens, Pyramid):
        out["num_tokens"] = num_tokens.tokens[0] if num_tokens.project_first else None
        out["token_schedule"] = num_tokens.tokens
    return out


register_spelling(Mixer, PLAIN_OPTIONS, from_plain_options, to_plain_options)
for _alias, _name in ALIASES.items():
    register_alias(_alias, _name, kept_until=KEPT_UNTIL)
