"""tensorvault: load tensors from a tensorvault store or daemon the way
`safetensors.safe_open` does (numpy for now; torch, CUDA, metadata() and the
vLLM loader are later steps)."""
from ._native import Error, MissingTensorError
from ._safe_open import safe_open

__all__ = ["Error", "MissingTensorError", "safe_open"]
__version__ = "0.1.0"
