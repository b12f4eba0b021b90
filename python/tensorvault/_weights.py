"""tensorvault.weights_iterator: every (name, tensor) of one generation of a
model in file order, the iterable that vLLM's and SGLang's
`model.load_weights(weights)` take.

Invariants: tensors come in offset_keys() order, read in batches of at most
batch_bytes with one safe_open.get_tensors(names) each (a tensor bigger than
batch_bytes is a batch of its own); the safe_open handle is opened on the
first next() and closed when the iteration ends, fails or the generator is
closed early (or collected), never left open."""
from ._safe_open import parse_device, safe_open

DEFAULT_BATCH_BYTES = 256 << 20


def batches(sizes, batch_bytes):
    """Splits [(name, nbytes)] (in order) into lists of names whose nbytes
    sum to at most batch_bytes; a tensor bigger than that is a batch of its
    own. Zero-size tensors join the batch they fall in."""
    out, cur, cur_bytes = [], [], 0
    for name, n in sizes:
        if cur and cur_bytes + n > batch_bytes:
            out.append(cur)
            cur, cur_bytes = [], 0
        cur.append(name)
        cur_bytes += n
    if cur:
        out.append(cur)
    return out


def weights_iterator(model, device="cpu", *, framework="pt", generation=None, alias=None,
                     socket=None, store=None, batch_bytes=DEFAULT_BATCH_BYTES, skip=None,
                     views=False):
    """Yields (name, tensor) for every tensor of `model` (one generation:
    generation= or alias=, else the active one) in file order, on `device`,
    from the daemon at socket= (default as safe_open) or the store directory
    store=. Tensors are read batch_bytes at a time (safe_open.get_tensors).
    skip (optional): a callable name -> bool; the tensors it accepts are
    neither read nor yielded (vLLM's is_unused_checkpoint_weight).
    views: safe_open's views= for a host device (ignored for a GPU, whose
    copies are read from the daemon's memory anyway): through the daemon
    each tensor lies over a private copy-on-write map of its memory tier
    instead of being copied into new memory, for a consumer that copies it
    into its own parameter anyway; a tensor kept keeps its pin and the
    daemon's handle (past the budget, copies).
    Arguments are checked now; the model is opened when the iteration
    starts (its errors, e.g. an unknown model, come from the first next())."""
    if isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes <= 0:
        raise ValueError(f"weights_iterator: batch_bytes must be a positive integer, got {batch_bytes!r}")
    if generation is not None and alias is not None:
        raise ValueError("weights_iterator: give generation= or alias=, not both")
    if skip is not None and not callable(skip):
        raise ValueError(f"weights_iterator: skip must be callable, got {skip!r}")
    if views:
        try:
            views = parse_device(device).kind == "cpu"
        except Exception:  # a bad device: safe_open says so at the first next()
            views = False
    return _iterate(dict(filename=model, framework=framework, device=device, generation=generation,
                         alias=alias, socket=socket, store=store, views=bool(views)),
                    batch_bytes, skip)


def _iterate(open_kwargs, batch_bytes, skip=None):
    f = safe_open(**open_kwargs)
    try:
        sizes = [(name, f._info(name).nbytes) for name in f.offset_keys()
                 if skip is None or not skip(name)]
        for names in batches(sizes, batch_bytes):
            got = f.get_tensors(names)
            for name in names:
                yield name, got.pop(name)
    finally:
        f.close()
