"""get_slice(name)[key]: which rows of dimension 0 to read and how to index
them, with safetensors 0.8's rules and errors.

framework="numpy": safetensors' own indexing (numpy_plan): a key is an int,
a slice with a positive step, one Ellipsis, a tuple of these, or an empty
list (= 0:0); negative ints count from the end (down to -2^31), slice
bounds are unsigned, an index or slice past a dimension is an error
(checked from the last dimension to the first), and every failure raises
what the official raises, with its text. One difference: a slice whose
start lies past its stop (both in range) is a SafetensorError here, where
the official fails inside (SystemError, or a panic).

framework="pt": torch indexing of the whole tensor, as the official does
(torch_plan): a basic key (ints, slices of ints, None, at most one
Ellipsis) is checked by indexing a stand-in of the tensor's shape whose
every element shares one byte of storage (torch raises its own errors, the
official's), then reads only the dimension-0 rows it covers; any other key
(lists, bools, tensors, arrays, two Ellipses) indexes the whole tensor read
whole.

Invariant: a plan reads rows [r0, r1) of dimension 0 and indexes that block
with `local`; the result equals indexing the whole tensor with the key."""
import operator

import numpy as np

from . import _native as N

_SUBBYTE = ("The slice is slicing for subbytes dtypes, and the slice does not end up at a "
            "byte boundary, this is invalid.")


class Plan:
    """Rows [r0, r1) of dimension 0 (whole: every row), then block[local]."""

    __slots__ = ("whole", "r0", "r1", "local")

    def __init__(self, whole, r0=0, r1=0, local=None):
        self.whole, self.r0, self.r1, self.local = whole, r0, r1, local


WHOLE = Plan(True)


def _usize(v):
    """A slice bound as the official extracts it (an unsigned 64-bit int)."""
    v = operator.index(v)
    if v < 0:
        raise OverflowError("can't convert negative int to unsigned")
    if v >= 1 << 64:
        raise OverflowError("int too big to convert")
    return v


def _clong(v):
    """A slice step as the official extracts it (a C long)."""
    v = operator.index(v)
    if not -(1 << 63) <= v < 1 << 63:
        raise OverflowError("Python int too large to convert to C long")
    return v


def _i32(v):
    """An index as the official extracts it (a 32-bit int), or None."""
    try:
        v = operator.index(v)
    except Exception:
        return None
    return v if -(1 << 31) <= v < 1 << 31 else None


def _show(ix):
    if isinstance(ix, int):
        return str(ix)
    start, stop, step = ix
    s = ("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop))
    return s if step == 1 else f"{s}:{step}"


def numpy_plan(key, shape, bits):
    """The Plan of key on a tensor of shape whose elements have bits bits
    (framework="numpy"); raises as safetensors 0.8 does."""
    rank = len(shape)
    if isinstance(key, list):
        if key:
            raise N.official("Non empty lists are not implemented")
        items = [slice(0, 0)]
    elif isinstance(key, tuple):
        items = list(key)
    else:
        items = [key]
    ell = [i for i, k in enumerate(items) if k is Ellipsis]
    if len(ell) > 1:
        raise N.official("Only one ellipsis (...) is allowed in slice index")
    if ell:
        i = ell[0]
        items[i:i + 1] = [slice(None)] * max(0, rank - (len(items) - 1))
    ixs = []  # an int (selected) or (start, stop, step)
    for pos, k in enumerate(items):
        if isinstance(k, slice):
            start = None if k.start is None else _usize(k.start)
            stop = None if k.stop is None else _usize(k.stop)
            step = 1 if k.step is None else _clong(k.step)
            if step <= 0:
                raise N.official(f"Slice step must be a positive integer, got {step}")
            ixs.append((start, stop, step))
            continue
        v = _i32(k)
        if v is None:
            raise N.official(
                f"Unsupported slice index at position {pos}: expected slice, int, or ellipsis")
        if v < 0:
            dim = shape[pos] if pos < rank else 0
            if dim + v < 0:
                raise N.official(f"Invalid index {v} for dimension {pos} of size {dim}")
            v += dim
        ixs.append(v)
    if not ixs:
        return WHOLE
    pre = (f"Error during slicing [{', '.join(_show(ix) for ix in ixs)}] "
           f"with shape [{', '.join(map(str, shape))}]: ")
    if len(ixs) > rank:
        raise N.official(pre + "more slicing indexes than dimensions in tensor")
    ranges = [None] * len(ixs)
    span, started = bits, False
    for i in reversed(range(rank)):
        dim = shape[i]
        if i < len(ixs):
            ix = ixs[i]
            if isinstance(ix, int):
                start, stop, step = ix, ix + 1, 1
            else:
                start = 0 if ix[0] is None else ix[0]
                stop = dim if ix[1] is None else ix[1]
                step = ix[2]
            if start >= dim:
                raise N.official(pre + f"index {start} out of bounds for tensor dimension #{i} of size {dim}")
            if stop > dim:
                raise N.official(pre + f"index {stop - 1} out of bounds for tensor dimension #{i} of size {dim}")
            if not started and (start, stop, step) != (0, dim, 1):
                started = True
                if bits % 8 and (start * span % 8 or stop * span % 8 or (step != 1 and span % 8)):
                    raise N.official(pre + _SUBBYTE)
            ranges[i] = (start, stop, step)
        span *= dim
    for i, (start, stop, _) in enumerate(ranges):
        if start > stop:
            raise N.official(pre + f"slice start {start} lies past its stop {stop} in dimension #{i}")
    if all(not isinstance(ix, int) and r == (0, shape[i], 1)
           for i, (ix, r) in enumerate(zip(ixs, ranges))):
        return WHOLE  # every index is a whole dimension: one read of the tensor
    local = []
    for ix, (start, stop, step) in zip(ixs, ranges):
        local.append(ix if isinstance(ix, int) else slice(start, stop, step))
    start, stop, step = ranges[0]
    if isinstance(ixs[0], int):
        r0, r1, local[0] = start, start + 1, 0
    else:
        count = len(range(start, stop, step))
        r0 = start
        r1 = start + (count - 1) * step + 1 if count else start
        local[0] = slice(0, r1 - r0, step)
    return Plan(False, r0, r1, tuple(local) + (Ellipsis,))


_SAFE = 1 << 62


def _int_like(v):
    return (isinstance(v, int) and not isinstance(v, bool)) or isinstance(v, np.integer)


def torch_basic(key, numel):
    """key as a tuple when torch indexes it as a view (ints, slices of
    ints, None, at most one Ellipsis) with no overflow in torch's stride
    arithmetic (a step times numel, a bound: below 2^62), else None (the
    whole tensor is indexed then, as the official does)."""
    if type(key) is tuple:
        items = key
    elif isinstance(key, (tuple, list)):
        return None
    else:
        items = (key,)
    n_ell = 0
    for k in items:
        if k is None:
            continue
        if k is Ellipsis:
            n_ell += 1
        elif isinstance(k, slice):
            if any(v is not None and not _int_like(v) for v in (k.start, k.stop, k.step)):
                return None
            if any(v is not None and abs(int(v)) >= _SAFE for v in (k.start, k.stop)):
                return None
            if k.step is not None and abs(int(k.step)) * max(numel, 1) >= _SAFE:
                return None
        elif not _int_like(k):
            return None
    return items if n_ell <= 1 else None


def torch_plan(items, shape):
    """The Plan of a basic key (torch_basic's tuple) that torch accepted on
    shape: the rows of dimension 0 it covers."""
    rank = len(shape)
    for pos, k in enumerate(items):
        if k is None:
            continue
        if k is Ellipsis:
            after = sum(1 for x in items[pos + 1:] if x is not None)
            if rank - after >= 1:
                return WHOLE  # the Ellipsis covers dimension 0
            continue
        n0 = shape[0]
        if not isinstance(k, slice):
            i = operator.index(k)
            r0 = i + n0 if i < 0 else i
            return Plan(False, r0, r0 + 1, items[:pos] + (0,) + items[pos + 1:])
        start, stop, step = slice(*(None if v is None else operator.index(v)
                                    for v in (k.start, k.stop, k.step))).indices(n0)
        count = len(range(start, stop, step))
        r1 = start + (count - 1) * step + 1 if count else start
        return Plan(False, start, r1, items[:pos] + (slice(0, r1 - start, step),) + items[pos + 1:])
    return WHOLE
