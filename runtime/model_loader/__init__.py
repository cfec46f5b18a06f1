"""Model location and loading: the bundled default GGUF, cached HF folders, safetensors."""

from runtime.model_loader.default_model import (
    DEFAULT_MODEL_NAME,
    default_cache_dir,
    find_default_gguf,
    materialize_gguf,
    resolve_model_path,
)
from runtime.model_loader.weights import iter_safetensors, load_hf_config

__all__ = [
    "DEFAULT_MODEL_NAME",
    "default_cache_dir",
    "find_default_gguf",
    "iter_safetensors",
    "load_hf_config",
    "materialize_gguf",
    "resolve_model_path",
]
