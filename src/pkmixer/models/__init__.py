"""Model families (one file each), the registry, and weight conversion."""
from .info import ModelInfo
from .mixer import Mixer
from .registry import create_model, list_models, model_entry
from .shallow import ShallowMLP
from .swmlp import SWMLP

__all__ = ["Mixer", "SWMLP", "ShallowMLP", "ModelInfo", "create_model", "list_models", "model_entry"]
