"""tensorvault: load tensors from a tensorvault store or daemon the way
`safetensors.safe_open` does, and weights_iterator, the (name, tensor)
iterable of a model's load_weights (tensorvault.vllm: the vLLM loader
plugin). Importing the package imports neither torch nor vLLM."""
from ._native import Error, MissingTensorError
from ._safe_open import safe_open
from ._weights import weights_iterator

__all__ = ["Error", "MissingTensorError", "safe_open", "weights_iterator"]
__version__ = "0.2.0"
