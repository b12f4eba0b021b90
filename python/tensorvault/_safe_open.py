"""tensorvault.safe_open: safetensors 0.8's safe_open (framework="numpy" or
"pt", device="cpu" or a CUDA device) over a tensorvault model, opened
in-process from a store directory (store=) or through tensorvaultd's fast
path (its UNIX socket): one tv_model either way, read by one code path.

Invariants: get_tensor reads straight into a fresh array's buffer (numpy's,
or the storage of torch.empty(...): no copy; on CUDA the library copies into
the device tensor on the current stream of that device, synchronized before
returning); get_tensors is one batched read; a slice reads only the rows of
dimension 0 it needs (tv_read_rows), the rest is numpy or torch indexing of
that block; a name the model lacks raises MissingTensorError (a KeyError).
torch is imported only when framework="pt" is used."""
import ctypes
import json
import re
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

# safetensors dtype name -> name of the torch dtype: the table of
# safetensors 0.8's torch backend (safe_open(framework="pt") also maps
# F8_E8M0 to float8_e8m0fnu). A dtype this torch lacks is TV_E_NOT_SUPPORTED.
TORCH_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}

FRAMEWORKS = {"numpy": "numpy", "np": "numpy", "pt": "pt", "torch": "pt", "pytorch": "pt"}


class _Model:
    """One tv_model: opened in-process from the store directory `store`, or
    (store None) through tensorvaultd's fast path in a session of its own
    to `socket` (None: the library's default). Read with the same functions
    either way (instance attributes, so that one handle's calls can be
    wrapped)."""

    def __init__(self, spec, store=None, socket=None):
        err = N.tv_error()
        h = ctypes.c_void_p()
        self.c = None
        bspec = spec.encode()
        if store is not None:
            rc = N.lib.tv_model_open(store.encode(), bspec, None, ctypes.byref(h), err)
        else:
            c = ctypes.c_void_p()
            bsock = socket.encode() if socket else None  # before connecting: may raise
            N.raise_for(N.lib.tv_client_connect(bsock, None, ctypes.byref(c), err), err)
            rc = N.lib.tv_model_open_daemon(c, bspec, None, ctypes.byref(h), err)
            if rc < 0:
                N.lib.tv_client_close(c)
            else:
                self.c = c
        N.raise_for(rc, err)
        self.h = h
        self.n_tensors = N.lib.tv_model_n_tensors
        self.tensor = N.lib.tv_model_tensor
        self.find = N.lib.tv_model_find
        self.read_into = N.lib.tv_read_into
        self.read_batch = N.lib.tv_read_batch
        self.read_rows = N.lib.tv_read_rows
        self.read_into_cuda = N.lib.tv_read_into_cuda
        self.read_batch_cuda = N.lib.tv_read_batch_cuda
        self.shard_fns = ("tv_model_n_shards", "tv_model_shard", "tv_read_shard_header")
        self.generation = N.lib.tv_model_generation(h)

    def close(self):
        N.lib.tv_model_close(self.h)
        if self.c is not None:
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


DEVICE_FORMS = "\"cpu\", \"cuda\", \"cuda:N\", an int N >= 0 or a torch.device of type cpu or cuda"


def parse_device(device):
    """None for the CPU, else the CUDA device index N; TV_E_INVALID_ARG for
    anything else. Needs no torch (a torch.device is recognised by type)."""
    bad = N.make_error(N.TV_E_INVALID_ARG, f"device {device!r} is invalid: {DEVICE_FORMS}")
    t = type(device)
    if t.__module__ == "torch" and t.__name__ == "device":
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            return 0 if device.index is None else int(device.index)
        raise bad
    if isinstance(device, bool):
        raise bad
    if isinstance(device, (int, np.integer)):
        if device < 0:
            raise bad
        return int(device)
    if isinstance(device, str):
        if device == "cpu":
            return None
        if device == "cuda":
            return 0
        if re.fullmatch(r"cuda:[0-9]+", device):
            return int(device[5:])
    raise bad


def _numpy_hugepage_switch():
    mod = getattr(np, "_core", None) or getattr(np, "core", None)
    mod = getattr(mod, "multiarray", None)
    return getattr(mod, "_set_madvise_hugepage", None)


_SET_HUGEPAGE = _numpy_hugepage_switch()
_HUGEPAGE_LOCK = threading.Lock()
_HUGEPAGE_MIN = 4 << 20  # numpy advises MADV_HUGEPAGE from 4 MiB on


def empty_array(shape, dtype):
    """np.empty without numpy's MADV_HUGEPAGE advice on the new buffer.
    The library's copies fault every destination page in; on the benchmark
    VM (THP "madvise", defrag "madvise") faulting advised 2 MiB pages made a
    whole-model load 2-3x slower than plain pages (bench/python.sh), and
    torch's allocator never advises. The system's THP policy still applies;
    numpy's own switch is restored at once (other threads' allocations made
    meanwhile only miss the advice)."""
    dtype = np.dtype(dtype)
    n = dtype.itemsize
    for d in shape:
        n *= d
    if _SET_HUGEPAGE is None or n < _HUGEPAGE_MIN:
        return np.empty(shape, dtype=dtype)
    with _HUGEPAGE_LOCK:
        was = _SET_HUGEPAGE(False)
        try:
            return np.empty(shape, dtype=dtype)
        finally:
            _SET_HUGEPAGE(was)


class _Numpy:
    """framework="numpy": numpy arrays (BF16 and F8 through ml_dtypes)."""

    cuda = None

    @staticmethod
    def dtype(info):
        dt = NUMPY_DTYPES.get(info.dtype)
        if dt is None:
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"tensor {info.name!r}: dtype {info.dtype} has no numpy equivalent")
        return dt

    def empty(self, info, shape, on_device=True):
        return empty_array(shape, self.dtype(info))

    @staticmethod
    def ptr(a):
        return a.ctypes.data

    @staticmethod
    def to_device(a):
        return a

    @staticmethod
    def result(x):
        """An indexing result as the official returns it: an array (0-d for
        integer indices only), C-contiguous (copied only when it is not)."""
        if not isinstance(x, np.ndarray):
            return np.asarray(x)
        return x if x.flags.c_contiguous else x.copy()


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise N.make_error(N.TV_E_NOT_SUPPORTED,
                           f"framework \"pt\" needs torch, which does not import here ({e})") from None
    return torch


class _Torch:
    """framework="pt": torch tensors on the CPU or on CUDA device `cuda`
    (an index, or None for the CPU)."""

    def __init__(self, cuda):
        self.torch = _import_torch()
        self.cuda = None if cuda is None else self.torch.device("cuda", cuda)

    def dtype(self, info):
        dt = getattr(self.torch, TORCH_DTYPES.get(info.dtype, "-"), None)
        if not isinstance(dt, self.torch.dtype):
            raise N.make_error(
                N.TV_E_NOT_SUPPORTED,
                f"tensor {info.name!r}: dtype {info.dtype} has no equivalent in torch {self.torch.__version__}")
        return dt

    def check_cuda(self):
        """TV_E_NOT_SUPPORTED / TV_E_INVALID_ARG when torch cannot reach the
        handle's CUDA device (before any allocation there)."""
        cuda = self.torch.cuda
        if not cuda.is_available():
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"device {self.cuda}: torch sees no usable CUDA device here")
        if self.cuda.index >= cuda.device_count():
            raise N.make_error(N.TV_E_INVALID_ARG,
                               f"device {self.cuda}: torch sees {cuda.device_count()} CUDA devices")

    def empty(self, info, shape, on_device=True):
        dt = self.dtype(info)
        if on_device and self.cuda is not None:
            self.check_cuda()
            return self.torch.empty(shape, dtype=dt, device=self.cuda)
        return self.torch.empty(shape, dtype=dt)

    @staticmethod
    def ptr(t):
        return t.data_ptr()

    def to_device(self, t):
        return t if self.cuda is None else t.to(self.cuda)

    @staticmethod
    def result(x):
        return x  # torch indexing as the official: views, 0-d for integer indices only

    def on_stream(self, call):
        """call(stream) with the current stream of the CUDA device (under
        that device), then waits for the stream, also after a failure (no
        copy may still be in flight into a tensor that is dropped)."""
        torch = self.torch
        with torch.cuda.device(self.cuda):
            stream = torch.cuda.current_stream(self.cuda)
            try:
                return call(ctypes.c_void_p(stream.cuda_stream))
            finally:
                stream.synchronize()


_UNREAD = object()


class safe_open:
    """safe_open(model, framework="numpy", device="cpu", *, generation=None,
    alias=None, socket=None, store=None): a context manager over one
    generation of a model. framework: "numpy"/"np" or "pt" ("torch",
    "pytorch"); device: "cpu", "cuda", "cuda:N", an int N or a torch.device
    (CUDA only with "pt"). store=DIR reads in-process; otherwise through the
    daemon at socket=, else $TENSORVAULT_SOCKET, else
    ./var/run/tensorvault.sock."""

    def __init__(self, model, framework="numpy", device="cpu", *, generation=None, alias=None,
                 socket=None, store=None):
        self._closed = True
        fw = FRAMEWORKS.get(str(framework))
        if fw is None:
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"framework {str(framework)!r} is not supported (numpy, np or pt)")
        cuda = parse_device(device)
        if fw == "numpy" and cuda is not None:
            raise N.make_error(N.TV_E_INVALID_ARG,
                               f"device cuda:{cuda} is not supported for framework numpy (use framework=\"pt\")")
        self._fw = _Numpy() if fw == "numpy" else _Torch(cuda)
        spec = _spec(model, generation, alias)
        self._spec = spec
        self._lock = threading.Lock()
        self._meta = _UNREAD
        self._src = _Model(spec, store=None if store is None else str(store),
                           socket=None if socket is None else str(socket))
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
        return f"{self._spec!r} (generation {self._src.generation})"

    # -- context manager -----------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
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

    def metadata(self):
        """The shards' __metadata__ merged in shard order (a key keeps its
        first value), or None when no shard has one; read once (the shard
        headers, tv_read_shard_header), then cached."""
        with self._lock:
            self._check_open()
            if self._meta is _UNREAD:
                self._meta = self._read_metadata()
            meta = self._meta
        return None if meta is None else dict(meta)

    def _read_metadata(self):
        return merge_metadata(self._shard_headers())

    def _shard_headers(self):
        """Yields each shard's JSON header (parsed), in shard order."""
        src = self._src
        fns = [N.optional(f) for f in src.shard_fns]
        if None in fns:
            raise N.make_error(
                N.TV_E_NOT_SUPPORTED,
                f"metadata() of model {self._src_name()}: this libtensorvault has no shard header reads ({', '.join(src.shard_fns)})")
        n_shards, shard, read_header = fns
        for i in range(n_shards(src.h)):
            d = N.tv_shard_desc()
            rc = shard(src.h, i, ctypes.byref(d))
            if rc < 0:
                raise N.make_error(rc, f"shard {i} of model {self._src_name()}: no record")
            n = 8 + d.header_len
            buf = ctypes.create_string_buffer(n)
            err = N.tv_error()
            N.raise_for(read_header(src.h, i, buf, n, err), err)
            try:
                header = json.loads(buf.raw[8:n].decode("utf-8"))
            except ValueError as e:
                shard_name = ctypes.string_at(d.name, d.name_len).decode("utf-8", "replace")
                raise N.make_error(
                    N.TV_E_INVALID_ARG,
                    f"shard {shard_name!r} of model {self._src_name()}: header is not JSON ({e})") from None
            yield header

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

    # -- reads ---------------------------------------------------------------

    def _call(self, host, cuda):
        """host() or, on a CUDA handle, cuda(stream) on the device's current
        stream; under the lock, on an open handle. Returns the rc."""
        with self._lock:
            self._check_open()
            if self._fw.cuda is None:
                return host()
            return self._fw.on_stream(cuda)

    def get_tensor(self, name):
        info = self._info(name)
        fw, src = self._fw, self._src
        t = fw.empty(info, info.shape)
        if info.nbytes:
            err = N.tv_error()
            ptr, n, cname = fw.ptr(t), info.nbytes, name.encode()
            rc = self._call(lambda: src.read_into(src.h, cname, ptr, n, err),
                            lambda s: src.read_into_cuda(src.h, cname, ptr, n, s, err))
            N.raise_for(rc, err)
        return t

    def get_tensors(self, names=None):
        """{name: tensor} for names (default: every tensor, in file order),
        read as one batch (adjacent tensors coalesced)."""
        if names is None:
            infos = self._order
        else:  # a name given twice is read once (the result is a dict)
            infos = [self._info(n) for n in dict.fromkeys(names)]
        fw, src = self._fw, self._src
        out = {}
        reqs = []  # each holds its tensor: no destination is freed before the read
        for info in infos:
            t = fw.empty(info, info.shape)
            out[info.name] = t
            if info.nbytes:
                reqs.append((info.index, t, info.nbytes))
        if reqs:
            arr = (N.tv_read_req * len(reqs))()
            for r, (idx, t, n) in zip(arr, reqs):
                r.name = None
                r.index = idx
                r.dest = fw.ptr(t)
                r.dest_len = n
            err = N.tv_error()
            rc = self._call(lambda: src.read_batch(src.h, arr, len(reqs), err),
                            lambda s: src.read_batch_cuda(src.h, arr, len(reqs), s, err))
            N.raise_for(rc, err)
        return out

    def _read_rows(self, info, r0, r1):
        """Rows [r0, r1) of dimension 0, on the handle's device (read into
        host memory, then moved to a CUDA device)."""
        fw = self._fw
        if fw.cuda is not None:
            fw.check_cuda()
        block = fw.empty(info, (r1 - r0,) + tuple(info.shape[1:]), on_device=False)
        n = block.nbytes
        if n:
            err = N.tv_error()
            with self._lock:
                self._check_open()
                rc = self._src.read_rows(self._src.h, info.name.encode(), r0, r1, fw.ptr(block), n,
                                         err)
            N.raise_for(rc, err)
        return fw.to_device(block)

    def get_slice(self, name):
        return Slice(self, self._info(name))


def merge_metadata(headers):
    """The __metadata__ objects of the shard headers merged in order (a key
    already set keeps its first value); None when no header has one (an
    absent or null __metadata__)."""
    merged = None
    for header in headers:
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        if isinstance(meta, dict):
            merged = {} if merged is None else merged
            for k, v in meta.items():
                merged.setdefault(k, v)
    return merged


def _index(k):
    return int(k) if isinstance(k, np.integer) else k


def _expand(key, rank):
    """key (one index or a tuple) as a tuple of ints and slices (Python
    ints) of length <= rank, with one Ellipsis expanded."""
    if not isinstance(key, tuple):
        key = (key,)
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    out = []
    for k in key:
        if k is Ellipsis:
            out.append(k)
        elif isinstance(k, slice):
            for v in (k.start, k.stop, k.step):
                if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool)):
                    raise TypeError(f"slice bounds must be integers, got {v!r}")
            if k.step is not None and k.step <= 0:
                raise ValueError("slice step must be positive")
            out.append(slice(_index(k.start), _index(k.stop), _index(k.step)))
        elif not isinstance(k, (int, np.integer)) or isinstance(k, bool):
            raise TypeError(f"unsupported index {k!r}: integers, slices and one '...'")
        else:
            out.append(int(k))
    key = tuple(out)
    if n_ell:
        i = key.index(Ellipsis)
        fill = rank - (len(key) - 1)
        if fill < 0:
            raise IndexError(f"too many indices for a tensor of rank {rank}")
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    if len(key) > rank:
        raise IndexError(f"too many indices for a tensor of rank {rank}: {len(key)}")
    return key


class Slice:
    """safetensors' PySafeSlice: get_shape(), get_dtype() and __getitem__
    reading only the dimension-0 rows it needs."""

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
        result = self._f._fw.result
        key = _expand(key, len(shape))
        if not key or len(shape) == 0:
            return result(self._f.get_tensor(info.name)[key])
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
            i = k0
            if i < -n0 or i >= n0:
                raise IndexError(f"index {i} is out of bounds for dimension 0 with size {n0}")
            r0 = i + n0 if i < 0 else i
            r1 = r0 + 1
            local = 0
        block = self._f._read_rows(info, r0, r1)
        return result(block[(local,) + key[1:]])
