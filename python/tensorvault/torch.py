"""tensorvault.torch: safetensors.torch's load_file over a tensorvault model.

Importing this module imports torch; `import tensorvault` does not."""
from ._safe_open import safe_open

__all__ = ["load_file"]


def load_file(model, device="cpu", **open_kwargs):
    """{name: torch tensor} of every tensor of `model`, in file order, read
    as one batch onto device ("cpu", "cuda", "cuda:N", an int N or a
    torch.device), like safetensors.torch.load_file(filename, device).
    open_kwargs: safe_open's generation=, alias=, socket=, store=."""
    with safe_open(model, framework="pt", device=device, **open_kwargs) as f:
        return f.get_tensors()
