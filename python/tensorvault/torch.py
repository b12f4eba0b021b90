"""tensorvault.torch: safetensors.torch's loaders over tensorvault
(load_file, load_model, load); the writers (save, save_file, save_model)
are the official package's, re-exported.

load_file and load_model take a model name or a file (safe_open's rules:
a file the registry holds is read through tensorvault, any other file by
the official safe_open). Importing this module imports torch; `import
tensorvault` does not."""
import json

import torch

from ._safe_open import safe_open

__all__ = ["load_file", "load_model", "load", "save", "save_file", "save_model"]

_WRITERS = ("save", "save_file", "save_model")


def __getattr__(name):
    if name in _WRITERS:
        import safetensors.torch
        return getattr(safetensors.torch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_file(filename, device="cpu", *, backend="mmap", **open_kwargs):
    """{name: torch tensor} of every tensor of `filename` (a model name or a
    file), in file order, read as one batch onto device ("cpu", "cuda",
    "cuda:N", an int N or a torch.device), as
    safetensors.torch.load_file(filename, device, backend=...).
    open_kwargs: safe_open's generation=, alias=, socket=, store=."""
    with safe_open(filename, framework="pt", device=device, backend=backend, **open_kwargs) as f:
        return f.get_tensors()


def load_model(model, filename, strict=True, device="cpu", *, backend="mmap", **open_kwargs):
    """safetensors.torch.load_model over load_file: loads the tensors into
    model (tensors the model shares under several names are loaded once)
    and returns (missing, unexpected) names; with strict, either non-empty
    is a RuntimeError naming them."""
    state_dict = load_file(filename, device=device, backend=backend, **open_kwargs)
    try:
        from safetensors.torch import _remove_duplicate_names
        to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    except ImportError:
        to_removes = {}
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for group in to_removes.values():
        for name in group:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


def load(data):
    """{name: torch tensor} of the safetensors bytes data (nothing is read
    from a store): safetensors.torch.load when safetensors is installed,
    else parsed here."""
    try:
        from safetensors.torch import load as official_load
    except ImportError:
        official_load = None
    if official_load is not None:
        return official_load(data)
    from . import _bytes
    return {name: torch.frombuffer(bytearray(raw), dtype=getattr(torch, dt)).reshape(shape)
            if raw else torch.empty(shape, dtype=getattr(torch, dt))
            for name, dt, shape, raw in _bytes.parse(data, "torch")}
