"""Model families (one file each), the registry (naming and creation), the zoo, the build budget, weights and
conversion."""
from . import zoo, spellings  # noqa: F401  (the entries, then the earlier names and spellings)
from .info import ModelInfo
from .mixer import Mixer
from .registry import create_model, list_models, model_entry
from .shallow import ShallowMLP
from .swmlp import SWMLP
from .weights import save_pretrained

__all__ = ["Mixer", "SWMLP", "ShallowMLP", "ModelInfo", "create_model", "list_models", "model_entry",
           "save_pretrained"]
