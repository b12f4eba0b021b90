"""The safetensors bytes of tensorvault.torch.load / tensorvault.numpy.load
when the safetensors package is not installed (with it, those are the
official load): header, then each tensor's dtype, shape and bytes, in file
order. Checks what indexing the bytes needs (the header's length, its
JSON, every range inside the data); the official reader checks more."""
import json

from . import _native as N
from ._safe_open import NUMPY_DTYPES, TORCH_DTYPES


def parse(data, framework):
    """[(name, dtype, shape, bytes)]: dtype the torch dtype's name
    (framework "torch") or the safetensors code ("numpy")."""
    data = bytes(data)
    table = TORCH_DTYPES if framework == "torch" else NUMPY_DTYPES
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if n <= 0 or 8 + n > len(data):
        raise N.official("Error while deserializing header: invalid header length")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise N.official(f"Error while deserializing header: invalid JSON in header: {e}") from None
    body = data[8 + n:]
    out = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        if t["dtype"] not in table or not 0 <= begin <= end <= len(body):
            raise N.official(f"Error while deserializing header: tensor {name!r} is invalid")
        out.append((begin, end, name, table[t["dtype"]], tuple(t["shape"])))
    out.sort()
    return [(name, dt, shape, body[b:e]) for b, e, name, dt, shape in out]
