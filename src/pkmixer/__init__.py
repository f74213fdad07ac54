"""pkmixer: MLP-Mixers as wide and sparse MLPs (Hayase & Karakida, ICML 2024; Tolstikhin et al. 2021).

>>> import pkmixer
>>> model = pkmixer.create_model("rp_smixer_s64_32")
>>> model.info().effective_width
4096
"""
from .errors import ConfigError
from .models import ModelInfo, create_model, list_models
from .models.registry import register_with_timm

__version__ = "0.1.0"
__all__ = ["ConfigError", "ModelInfo", "create_model", "list_models", "__version__"]

register_with_timm()
