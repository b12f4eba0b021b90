"""tensorvault: safetensors 0.8's Python API over a tensorvault store or
daemon, and the one-line switch that makes existing loaders use it.

- safe_open(filename, framework, device="cpu", *, backend="mmap", ...): a
  model's generation (filename: its name; generation=, alias=) or a file
  the registry holds (filename: its path; any other file goes to the
  official safe_open); tensorvault.torch.load_file / load_model / load,
  tensorvault.numpy.load_file / load;
- patch(), unpatch(), patched(): safetensors.safe_open and the loaders
  built on it read the files the registry holds through tensorvault;
- checkout(model, directory, generation=None): a generation's sidecar
  files (config, tokenizer, ...), its index and tensorvault.json in a
  directory a loader can be pointed at (its shards resolve to that
  generation through the record);
- weights_iterator, the (name, tensor) iterable of a model's load_weights
  (tensorvault.vllm: the vLLM loader plugin);
- errors: Error (an instance of safetensors.SafetensorError, of
  SafetensorError below without safetensors), MissingTensorError,
  NotFoundError (also a FileNotFoundError).
The writers (serialize, serialize_file, deserialize, TensorSpec) are the
official package's, re-exported. docs/python.md has the whole API and the
deliberate differences. Importing the package imports neither torch nor
vLLM."""
from ._checkout import checkout
from ._native import Error, MissingTensorError, NotFoundError, SafetensorError
from ._patch import is_patched, patch, patched, unpatch
from ._safe_open import safe_open
from ._weights import weights_iterator

__all__ = ["Error", "MissingTensorError", "NotFoundError", "SafetensorError", "safe_open",
           "patch", "patched", "unpatch", "is_patched", "weights_iterator", "checkout"]
__version__ = "0.2.0"

_OFFICIAL_NAMES = ("serialize", "serialize_file", "deserialize", "TensorSpec")


def __getattr__(name):
    if name in _OFFICIAL_NAMES:
        import safetensors
        return getattr(safetensors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
