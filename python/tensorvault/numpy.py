"""tensorvault.numpy: safetensors.numpy's loaders over tensorvault
(load_file, load); the writers (save, save_file) are the official
package's, re-exported. load_file takes a model name or a file
(safe_open's rules)."""
import numpy as np

from ._safe_open import NUMPY_DTYPES, safe_open

__all__ = ["load_file", "load", "save", "save_file"]


def __getattr__(name):
    if name in ("save", "save_file"):
        import safetensors.numpy
        return getattr(safetensors.numpy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_file(filename, *, backend="mmap", **open_kwargs):
    """{name: numpy array} of every tensor of `filename` (a model name or a
    file), in file order, as safetensors.numpy.load_file(filename,
    backend=...). open_kwargs: safe_open's generation=, alias=, socket=,
    store=."""
    with safe_open(filename, framework="np", backend=backend, **open_kwargs) as f:
        return f.get_tensors()


def load(data):
    """{name: numpy array} of the safetensors bytes data:
    safetensors.numpy.load when safetensors is installed, else parsed here."""
    try:
        from safetensors.numpy import load as official_load
    except ImportError:
        official_load = None
    if official_load is not None:
        return official_load(data)
    from . import _bytes
    return {name: np.frombuffer(raw, dtype=NUMPY_DTYPES[code]).reshape(shape)
            for name, code, shape, raw in _bytes.parse(data, "numpy")}
