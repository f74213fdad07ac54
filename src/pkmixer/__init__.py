"""pkmixer: MLP-Mixers as wide and sparse MLPs (Hayase & Karakida, ICML 2024; Tolstikhin et al. 2021).

>>> import pkmixer
>>> model = pkmixer.create_model("rp_smixer_c64p4_32")
>>> model.info().effective_width
4096

``import pkmixer`` itself imports neither torch nor timm, so that the command line starts at once: the model API
(``create_model``, ``list_models``, ``ModelInfo``) and the subpackages (``pkmixer.theory``, ...) are imported
on first use. pkmixer's models are registered with
timm (``timm.create_model("pkmixer_<name>")``) as soon as both timm and ``pkmixer.models`` are imported, in either
order: right away if timm is already imported, else right after whichever of the two is imported first (an import
hook, :class:`_RegisterWithTimm`).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from .errors import ConfigError

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelInfo", "create_model", "list_models", "__version__"]

_MODEL_API = ("ModelInfo", "create_model", "list_models")  # from pkmixer.models, on first use


def __getattr__(name: str) -> Any:
    if name in _MODEL_API:
        from . import models

        value = getattr(models, name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a subpackage, e.g. pkmixer.theory
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODEL_API})


# ---- registration with timm ------------------------------------------------------------------------------------
_WATCHED = ("timm", "pkmixer.models")
_loading: set[str] = set()  # the watched modules whose code is running now
_registered = False


def _register_with_timm() -> None:
    """Register every model with timm once, when neither watched module is half-imported."""
    global _registered
    if _registered or _loading:
        return
    _registered = True
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
    from .models.timm_registry import register_with_timm

    register_with_timm()


class _ThenRegister(importlib.abc.Loader):
    """A watched module's own loader, followed by the registration once the module's code has run."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader, self._name = loader, name

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        _loading.add(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            _loading.discard(self._name)
        _register_with_timm()

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class _RegisterWithTimm(importlib.abc.MetaPathFinder):
    """Finds ``timm`` and ``pkmixer.models`` as the other finders do, with :class:`_ThenRegister` as the loader."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRegister(spec.loader, name)
                return spec
        return None


_HOOK = _RegisterWithTimm()
if "timm" in sys.modules:
    _register_with_timm()
else:
    sys.meta_path.insert(0, _HOOK)
