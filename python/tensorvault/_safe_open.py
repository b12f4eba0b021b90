"""tensorvault.safe_open: safetensors 0.8's safe_open (framework="numpy")
over a tensorvault model, read in-process from a store directory (store=)
or from tensorvaultd's fast path (its UNIX socket).

Invariants: get_tensor reads straight into a fresh numpy array's buffer (no
copy); get_tensors is one batched read; a slice reads only the rows of
dimension 0 it needs (tv_read_rows), the rest is numpy indexing of that
block; a name the model lacks raises MissingTensorError (a KeyError)."""
import ctypes
import threading

import ml_dtypes
import numpy as np

from . import _native as N

# safetensors dtype name -> numpy dtype (the byte-addressable ones).
NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype(np.int32),
    "U32": np.dtype(np.uint32),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
    "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64),
    "C64": np.dtype(np.complex64),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

LATER = "torch support (framework=\"pt\", CUDA devices) is a later step of the tensorvault Python package; use framework=\"numpy\" on device=\"cpu\""


class _Local:
    """A tv_model opened in-process from a store directory."""

    def __init__(self, store, spec):
        err = N.tv_error()
        h = ctypes.c_void_p()
        rc = N.lib.tv_model_open(store.encode(), spec.encode(), None, ctypes.byref(h), err)
        N.raise_for(rc, err)
        self.h = h
        self.n_tensors = N.lib.tv_model_n_tensors
        self.tensor = N.lib.tv_model_tensor
        self.find = N.lib.tv_model_find
        self.read_into = N.lib.tv_read_into
        self.read_batch = N.lib.tv_read_batch
        self.read_rows = N.lib.tv_read_rows
        self.generation = N.lib.tv_model_generation(h)

    def close(self):
        N.lib.tv_model_close(self.h)


class _Remote:
    """A tv_client session to tensorvaultd and one model opened in it."""

    def __init__(self, socket, spec):
        err = N.tv_error()
        c = ctypes.c_void_p()
        rc = N.lib.tv_client_connect(socket.encode() if socket else None, None, ctypes.byref(c),
                                     err)
        N.raise_for(rc, err)
        h = ctypes.c_void_p()
        rc = N.lib.tv_client_open(c, spec.encode(), ctypes.byref(h), err)
        if rc < 0:
            N.lib.tv_client_close(c)
            N.raise_for(rc, err)
        self.c, self.h = c, h
        self.n_tensors = N.lib.tv_client_n_tensors
        self.tensor = N.lib.tv_client_tensor
        self.find = N.lib.tv_client_find
        self.read_into = N.lib.tv_client_read_into
        self.read_batch = N.lib.tv_client_read_batch
        self.read_rows = N.lib.tv_client_read_rows
        self.generation = N.lib.tv_client_model_generation(h)

    def close(self):
        N.lib.tv_client_model_close(self.h)
        N.lib.tv_client_close(self.c)


class _Info:
    __slots__ = ("name", "index", "dtype", "shape", "nbytes")

    def __init__(self, name, index, dtype, shape, nbytes):
        self.name, self.index, self.dtype, self.shape, self.nbytes = name, index, dtype, shape, nbytes


def _spec(model, generation, alias):
    if generation is not None and alias is not None:
        raise ValueError("safe_open: give generation= or alias=, not both")
    if generation is not None:
        return f"{model}@{int(generation)}"
    if alias is not None:
        return f"{model}@{alias}"
    return model


class safe_open:
    """safe_open(model, framework="numpy", device="cpu", *, generation=None,
    alias=None, socket=None, store=None): a context manager over one
    generation of a model. store=DIR reads in-process; otherwise through the
    daemon at socket=, else $TENSORVAULT_SOCKET, else
    ./var/run/tensorvault.sock."""

    def __init__(self, model, framework="numpy", device="cpu", *, generation=None, alias=None,
                 socket=None, store=None):
        fw = str(framework)
        dev = str(device)
        if fw in ("pt", "torch", "pytorch") or dev.startswith("cuda"):
            raise N.make_error(N.TV_E_NOT_SUPPORTED, LATER)
        if fw not in ("numpy", "np"):
            raise N.make_error(N.TV_E_NOT_SUPPORTED, f"framework {fw!r} is not supported (numpy or np)")
        if dev != "cpu":
            raise N.make_error(N.TV_E_NOT_SUPPORTED, f"device {dev!r} is not supported (cpu)")
        spec = _spec(model, generation, alias)
        self._lock = threading.Lock()
        self._src = _Local(str(store), spec) if store is not None else _Remote(
            None if socket is None else str(socket), spec)
        try:
            self._load_index()
        except BaseException:
            self._src.close()
            raise
        self._closed = False

    def _load_index(self):
        src = self._src
        n = src.n_tensors(src.h)
        self._order = []
        self._by_name = {}
        d = N.tv_tensor_desc()
        for i in range(n):
            rc = src.tensor(src.h, i, ctypes.byref(d))
            if rc < 0:
                raise N.make_error(rc, f"tensor {i} of model {self._src_name()}: invalid record")
            name = ctypes.string_at(d.name, d.name_len).decode("utf-8")
            info = _Info(name, i, N.dtype_name(d.dtype), tuple(d.shape[k] for k in range(d.rank)),
                         d.nbytes)
            self._order.append(info)
            self._by_name[name] = info

    def _src_name(self):
        return f"generation {self._src.generation}"

    # -- context manager -----------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        with self._lock:
            if not self._closed:
                self._closed = True
                self._src.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- metadata ------------------------------------------------------------

    def keys(self):
        """Tensor names, sorted (as safetensors' keys())."""
        return sorted(self._by_name)

    def offset_keys(self):
        """Tensor names in file order (shard by shard, by offset)."""
        return [t.name for t in self._order]

    @property
    def generation(self):
        return self._src.generation

    def _info(self, name):
        info = self._by_name.get(name)
        if info is None:
            raise N.make_error(N.TV_E_NOT_FOUND,
                               f"no tensor {name!r} in generation {self._src.generation}",
                               N.MissingTensorError)
        return info

    def _check_open(self):
        if self._closed:
            raise N.make_error(N.TV_E_INVALID_ARG, "safe_open: the handle is closed")

    @staticmethod
    def _np_dtype(info):
        dt = NUMPY_DTYPES.get(info.dtype)
        if dt is None:
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"tensor {info.name!r}: dtype {info.dtype} has no numpy equivalent")
        return dt

    # -- reads ---------------------------------------------------------------

    def get_tensor(self, name):
        info = self._info(name)
        arr = np.empty(info.shape, dtype=self._np_dtype(info))
        if info.nbytes:
            err = N.tv_error()
            with self._lock:
                self._check_open()
                rc = self._src.read_into(self._src.h, name.encode(), arr.ctypes.data, arr.nbytes,
                                         err)
            N.raise_for(rc, err)
        return arr

    def get_tensors(self, names=None):
        """{name: array} for names (default: every tensor, in file order),
        read as one batch (adjacent tensors coalesced)."""
        infos = self._order if names is None else [self._info(n) for n in names]
        out = {}
        reqs = []
        for info in infos:
            arr = np.empty(info.shape, dtype=self._np_dtype(info))
            out[info.name] = arr
            if info.nbytes:
                reqs.append((info.index, arr))
        if reqs:
            arr_t = (N.tv_read_req * len(reqs))()
            for r, (idx, arr) in zip(arr_t, reqs):
                r.name = None
                r.index = idx
                r.dest = arr.ctypes.data
                r.dest_len = arr.nbytes
            err = N.tv_error()
            with self._lock:
                self._check_open()
                rc = self._src.read_batch(self._src.h, arr_t, len(reqs), err)
            N.raise_for(rc, err)
        return out

    def _read_rows(self, info, r0, r1):
        arr = np.empty((r1 - r0,) + tuple(info.shape[1:]), dtype=self._np_dtype(info))
        if arr.nbytes:
            err = N.tv_error()
            with self._lock:
                self._check_open()
                rc = self._src.read_rows(self._src.h, info.name.encode(), r0, r1, arr.ctypes.data,
                                         arr.nbytes, err)
            N.raise_for(rc, err)
        return arr

    def get_slice(self, name):
        return Slice(self, self._info(name))


def _expand(key, rank):
    """key (one index or a tuple) as a tuple of ints and slices of length
    <= rank, with one Ellipsis expanded."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    for k in key:
        if k is Ellipsis:
            continue
        if isinstance(k, slice):
            for v in (k.start, k.stop, k.step):
                if v is not None and not isinstance(v, (int, np.integer)):
                    raise TypeError(f"slice bounds must be integers, got {v!r}")
            if k.step is not None and k.step <= 0:
                raise ValueError("slice step must be positive")
        elif not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"unsupported index {k!r}: integers, slices and one '...'")
    if n_ell:
        i = key.index(Ellipsis)
        fill = rank - (len(key) - 1)
        if fill < 0:
            raise IndexError(f"too many indices for a tensor of rank {rank}")
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    if len(key) > rank:
        raise IndexError(f"too many indices for a tensor of rank {rank}: {len(key)}")
    return key


def _result(x):
    """An indexing result as the official returns it: an array (0-d for
    integer indices only), C-contiguous (copied only when it is not)."""
    if not isinstance(x, np.ndarray):
        return np.asarray(x)
    return x if x.flags.c_contiguous else x.copy()


class Slice:
    """safetensors' PySafeSlice for numpy: get_shape(), get_dtype() and
    __getitem__ reading only the dimension-0 rows it needs."""

    def __init__(self, f, info):
        self._f = f
        self._info = info

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        return self._info.dtype

    def __getitem__(self, key):
        info = self._info
        shape = info.shape
        key = _expand(key, len(shape))
        if not key or len(shape) == 0:
            return _result(self._f.get_tensor(info.name)[key])
        n0 = shape[0]
        k0 = key[0]
        if isinstance(k0, slice):
            start, stop, step = k0.indices(n0)
            if stop <= start:
                r0 = r1 = min(start, n0)
            else:
                r0 = start
                r1 = start + ((stop - start - 1) // step) * step + 1
            local = slice(0, r1 - r0, step)
        else:
            i = int(k0)
            if i < -n0 or i >= n0:
                raise IndexError(f"index {i} is out of bounds for dimension 0 with size {n0}")
            r0 = i + n0 if i < 0 else i
            r1 = r0 + 1
            local = 0
        block = self._f._read_rows(info, r0, r1)
        return _result(block[(local,) + key[1:]])
