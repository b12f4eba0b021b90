"""tensorvault.safe_open: safetensors 0.8's safe_open over a tensorvault
model, opened in-process from a store directory (store=) or through
tensorvaultd's fast path (its UNIX socket): one tv_model either way, read by
one code path.

safe_open(filename, framework, device="cpu", *, backend="mmap", ...) takes
a model name (a generation with generation= or alias=), or a file: a
path-like object, or a str naming an existing file. A file is served from
the generation that holds it (tensorvault._files.lookup: its size, header
and recorded identity, never its whole bytes), only that shard's tensors;
a file no generation holds, or one asked for with a framework or device
tensorvault does not serve, is opened by the official safe_open.

Invariants: arguments, errors and closed-handle rules are the official's
(its exception classes, its texts where clients match them: "File is
closed", "File does not contain tensor NAME", the slicing errors of
_index.py); get_tensor reads straight into a fresh array's buffer (numpy's,
or the storage of torch.empty(...): no copy; on CUDA the library copies
into the device tensor on the current stream of that device, synchronized
before returning); get_tensors is one batched read; a slice reads only the
rows of dimension 0 it needs (tv_read_rows) and stays readable after its
handle is closed (the model is closed when the last handle or slice on it
is gone); torch is imported only when framework="pt" is used."""
import ctypes
import json
import logging
import os
import re
import threading
import weakref

import ml_dtypes
import numpy as np

from . import _index
from . import _native as N
from . import _paths

_log = logging.getLogger("tensorvault")

try:
    from safetensors import safe_open as OFFICIAL
except ImportError:  # tensorvault works without it: no fallback for files then
    OFFICIAL = None

# safetensors dtype name -> numpy dtype (the byte-addressable ones; the
# official numpy path has none for BF16 and F8: tensorvault's are ml_dtypes').
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

# safetensors dtype name -> name of the torch dtype, as safetensors 0.8's
# safe_open(framework="pt") maps them. F4 is torch's float4_e2m1fn_x2: two
# values a byte, the last dimension halved. A dtype this torch lacks is
# TV_E_NOT_SUPPORTED.
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
    "F4": "float4_e2m1fn_x2",
}

# Bits of one element of each safetensors dtype.
BITS = {**{k: 8 * v.itemsize for k, v in NUMPY_DTYPES.items()},
        "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
UNDERSTOOD = set(BITS) - {"F6_E2M3", "F6_E3M2"}  # the official reads no F6

# framework -> what tensorvault serves it as ("other": the official's only).
FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "numpy", "numpy": "numpy",
              "tf": "other", "tensorflow": "other", "jax": "other", "flax": "other",
              "mlx": "other", "paddle": "other"}
ACCELERATORS = ("npu", "xpu", "xla", "mlu", "hpu")
BACKENDS = ("mmap", "pread")


def _not_str(arg, v):
    what = "'None'" if v is None else f"'{type(v).__name__}' object"
    return TypeError(f"argument '{arg}': {what} is not an instance of 'str'")


def parse_framework(framework):
    """"pt", "numpy" or "other" (a framework only the official serves);
    the official's TypeError or SafetensorError for anything else."""
    if not isinstance(framework, str):
        raise _not_str("framework", framework)
    fw = FRAMEWORKS.get(framework)
    if fw is None:
        raise N.official(f"framework {framework} is invalid")
    return fw


def _usize_text(s):
    """A device index as the official parses "cuda:N" (decimal digits, an
    optional '+', below 2^64)."""
    digits = s[1:] if s.startswith("+") else s
    if not s:
        raise ValueError("cannot parse integer from empty string")
    if not digits or not all("0" <= c <= "9" for c in digits):
        raise ValueError("invalid digit found in string")
    v = int(digits)
    if v >= 1 << 64:
        raise ValueError("number too large to fit in target type")
    return v


class Device:
    """A parsed device= value: kind "cpu", "cuda" (index) or "other" (an
    accelerator only the official serves); shown as the official's error
    texts show it."""

    __slots__ = ("kind", "index", "shown")

    def __init__(self, kind, index=None, shown="cpu"):
        self.kind, self.index, self.shown = kind, index, shown


def parse_device(device):
    """device= as the official parses it (None, "cpu", "cuda", "cuda:N", an
    int N >= 0 (torch's accelerator N), "mps", "npu[:N]", ...; its errors),
    and a torch.device of type cpu or cuda (the official refuses those).
    Needs no torch (a torch.device is recognised by type)."""
    t = type(device)
    if t.__module__ == "torch" and t.__name__ == "device":
        if device.type == "cpu":
            return Device("cpu")
        index = 0 if device.index is None else int(device.index)
        if device.type == "cuda":
            return Device("cuda", index, f"cuda:{index}")
        return Device("other", index, str(device))
    if device is None:
        return Device("cpu")
    if isinstance(device, str):
        if device == "cpu":
            return Device("cpu")
        if device == "cuda":
            return Device("cuda", 0, "cuda:0")
        if device in ("mps", "mps:0"):
            return Device("other", 0, "mps")
        if device in ACCELERATORS:
            return Device("other", 0, f"{device}:0")
        kind = device.split(":", 1)[0]
        if kind in ("cuda",) + ACCELERATORS and device.startswith(kind + ":"):
            tokens = device.split(":")
            if len(tokens) != 2:
                raise N.official(f"device {device} is invalid")
            index = _usize_text(tokens[1])
            return Device("cuda" if kind == "cuda" else "other", index, f"{kind}:{index}")
        if device.startswith("mps:"):
            raise N.official(f"device {device} is invalid: only mps or mps:0 is supported")
        raise N.official(f"device {device} is invalid")
    try:
        index = device.__index__()
    except Exception:
        index = None
    if isinstance(index, int) and 0 <= index < 1 << 64:
        return Device("cuda", index, str(index))
    raise N.official(f"device {device} is invalid")


def check_backend(backend):
    """The official's TypeError or SafetensorError for a backend= that is not
    "mmap" or "pread" (both read the same bytes here)."""
    if not isinstance(backend, str):
        raise _not_str("backend", backend)
    if backend not in BACKENDS:
        shown = '"' + backend.replace("\\", "\\\\").replace('"', '\\"') + '"'
        raise N.official(f'backend {shown} is invalid (expected one of: "mmap", "pread")')


class _Info:
    __slots__ = ("name", "index", "dtype", "shape", "nbytes", "shard")

    def __init__(self, name, index, dtype, shape, nbytes, shard):
        self.name, self.index, self.dtype, self.shape = name, index, dtype, shape
        self.nbytes, self.shard = nbytes, shard


class _Model:
    """One tv_model: opened in-process from the store directory `store`, or
    (store None) through tensorvaultd's fast path in a session of its own
    to `socket` (None: the first of _paths.py's places), with its tensors' index;
    shared by every handle and slice on that generation (closed when the
    last is gone). Reads on it hold its lock (the library wants reads on
    one model serialized). Read with the same functions either way
    (instance attributes, so that one model's calls can be wrapped)."""

    _cache = weakref.WeakValueDictionary()  # (store, socket, "model@N") -> _Model
    _cache_lock = threading.Lock()

    @classmethod
    def get(cls, spec, store, socket, pinned):
        """The open model of spec, shared when spec names a generation
        number (pinned): one that names the active generation or an alias
        is opened afresh, as it may have moved."""
        if store is None:  # the socket now, so that the key names one daemon
            socket = _paths.fast_socket(socket)
        if not pinned:
            return cls(spec, store, socket)
        key = (store, None if store is not None else socket.path, spec)
        with cls._cache_lock:
            m = cls._cache.get(key)
            if m is None:
                m = cls(spec, store, socket)
                cls._cache[key] = m
            return m

    def __init__(self, spec, store=None, socket=None):
        """socket: a path, a _paths.Where, or None (_paths.fast_socket)."""
        err = N.tv_error()
        h = ctypes.c_void_p()
        self.h = None
        self.c = None
        self.lock = threading.RLock()  # a view's release may come in a read's thread
        self.said_busy = False  # a view refused by a budget was logged
        self.spec = spec
        bspec = spec.encode()
        if store is not None:
            rc = N.lib.tv_model_open(store.encode(), bspec, None, ctypes.byref(h), err)
        else:
            c = ctypes.c_void_p()
            where = socket if isinstance(socket, _paths.Where) else _paths.fast_socket(socket)
            bsock = where.path.encode()  # before connecting: may raise
            rc = N.lib.tv_client_connect(bsock, None, ctypes.byref(c), err)
            if rc == N.TV_E_NO_DAEMON:
                raise N.make_error(rc, _paths.no_daemon_message(
                    where, err.msg.decode("utf-8", "replace")))
            N.raise_for(rc, err)
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
        try:
            self._load_index()
        except BaseException:
            self.close()
            raise

    def _load_index(self):
        n = self.n_tensors(self.h)
        self.order = []
        self.by_name = {}
        d = N.tv_tensor_desc()
        for i in range(n):
            rc = self.tensor(self.h, i, ctypes.byref(d))
            if rc < 0:
                raise N.make_error(rc, f"tensor {i} of model {self.spec!r}: invalid record")
            name = ctypes.string_at(d.name, d.name_len).decode("utf-8")
            info = _Info(name, i, N.dtype_name(d.dtype), tuple(d.shape[k] for k in range(d.rank)),
                         d.nbytes, d.shard)
            self.order.append(info)
            self.by_name[name] = info

    def close(self):
        h, self.h = self.h, None
        if h is not None:
            N.lib.tv_model_close(h)
        c, self.c = self.c, None
        if c is not None:
            N.lib.tv_client_close(c)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _spec(model, generation, alias):
    if generation is not None and alias is not None:
        raise ValueError("safe_open: give generation= or alias=, not both")
    if generation is not None:
        return f"{model}@{int(generation)}"
    if alias is not None:
        return f"{model}@{alias}"
    return model


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


def _not_understood(info):
    return N.official(f"Dtype not understood: {info.dtype}", N.TV_E_NOT_SUPPORTED)


class _Numpy:
    """framework="numpy": numpy arrays (BF16 and F8 through ml_dtypes)."""

    cuda = None

    @staticmethod
    def dtype(info):
        dt = NUMPY_DTYPES.get(info.dtype)
        if dt is not None:
            return dt
        if info.dtype == "F4":
            raise N.DtypeError(
                N.TV_E_NOT_SUPPORTED, N.err_name(N.TV_E_NOT_SUPPORTED),
                "module 'numpy' has no attribute 'float4_e2m1fn_x2'", True)
        raise _not_understood(info)

    def empty(self, info, shape, on_device=True):
        return empty_array(shape, self.dtype(info))

    storage_shape = staticmethod(lambda info: info.shape)

    @staticmethod
    def ptr(a):
        return a.ctypes.data

    @staticmethod
    def to_device(a):
        return a

    def index(self, f, info, key):
        """get_slice(name)[key] with safetensors' own rules (_index.py)."""
        plan = _index.numpy_plan(key, info.shape, BITS[info.dtype])
        self.dtype(info)  # the official checks the dtype after the key
        if plan.whole:
            return f.read_tensor(info)
        x = f.read_rows(info, plan.r0, plan.r1)[plan.local]
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
        if info.dtype not in UNDERSTOOD:
            raise _not_understood(info)
        dt = getattr(self.torch, TORCH_DTYPES.get(info.dtype, "-"), None)
        if not isinstance(dt, self.torch.dtype):
            raise N.make_error(
                N.TV_E_NOT_SUPPORTED,
                f"tensor {info.name!r}: dtype {info.dtype} has no equivalent in torch {self.torch.__version__}")
        return dt

    @staticmethod
    def storage_shape(info):
        """The torch shape of a tensor: F4 holds two values a byte, so its
        last dimension is halved (which must then be even)."""
        shape = info.shape
        if info.dtype != "F4":
            return shape
        if not shape or shape[-1] % 2:
            raise N.official(
                f"f4_x2 dtype requires that the last dim be divisible by 2 in torch: got {list(shape)}")
        return shape[:-1] + (shape[-1] // 2,)

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

    def index(self, f, info, key):
        """get_slice(name)[key]: torch indexing of the whole tensor, as the
        official does it (_index.py), reading only the rows needed."""
        torch = self.torch
        dt = self.dtype(info)
        shape = info.shape
        if info.dtype == "F4":  # the official reshapes the packed bytes to the header's shape
            n = info.nbytes
            if n != np.prod(shape, dtype=np.int64):
                raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {n}")
            return self.to_device(torch.empty(shape, dtype=dt))[key]
        if key is Ellipsis or (type(key) is tuple and not key):
            return f.read_tensor(info)
        items = _index.torch_basic(key, int(np.prod(shape, dtype=np.int64)))
        if items is None or not shape:
            return f.read_tensor(info)[key]
        stand_in = torch.empty((1,) * len(shape), dtype=dt).expand(shape)
        stand_in[items]  # torch's own errors, before anything is read
        plan = _index.torch_plan(items, shape)
        if plan.whole:
            return f.read_tensor(info)[items]
        return f.read_rows(info, plan.r0, plan.r1)[plan.local]

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


def _view_array(v, dtype, shape):
    """A read-only numpy array over view v's bytes, in place. The array
    keeps the view (and so its pins at the daemon) alive: the view is
    released when the last array over it is collected."""
    if not v.nbytes:
        v.release()
        a = np.empty(shape, dtype=dtype)
        a.flags.writeable = False
        return a
    raw = (ctypes.c_ubyte * v.nbytes).from_address(v._addr)
    raw._tv_view = v  # the memoryview below keeps raw, raw keeps the view
    return np.frombuffer(memoryview(raw).toreadonly(), dtype=dtype).reshape(shape)


def _view_tensor(torch, v, dtype, shape):
    """A torch tensor over view v's bytes in place: a private, writable,
    copy-on-write mapping of the tier's pages (tv_view_map), so the tensor
    is as writable as any and a write reaches no other process. The tensor
    keeps the view (and its pins) alive; the view is released when the
    tensor's storage is freed."""
    if not v.nbytes:
        v.release()
        return torch.empty(shape, dtype=dtype)
    raw = (ctypes.c_ubyte * v.nbytes).from_address(v.map())
    raw._tv_view = v  # the tensor keeps raw (its buffer), raw keeps the view
    return torch.frombuffer(raw, dtype=dtype).view(shape)


class _Reader:
    """The reads of one framework on one model: what a handle and its
    slices share (a slice keeps it, so it reads after its handle closed).
    views: whole tensors are lent as read-only numpy arrays over the
    daemon's memory tier where the model can lend them (else copied)."""

    __slots__ = ("m", "fw", "views")

    def __init__(self, m, fw, views=False):
        self.m, self.fw, self.views = m, fw, views

    def lend(self, infos):
        """({name: view}, [infos to copy]) for infos: views of the daemon's
        memory tier (read-only numpy arrays, or torch tensors over private
        copy-on-write maps), in order, and the tensors whose view a budget
        refused (cache.bytes, cache.view_bytes_per_uid: TV_E_BUSY), which
        the caller copies; or None when this model lends none (opened from
        a store, a daemon before protocol version 3, a library without
        views, no private mapping): the caller copies them all."""
        m = self.m
        shapes = [(info, self.fw.dtype(info), self.fw.storage_shape(info)) for info in infos]
        with m.lock:
            if m.h is None:
                raise N.official("File is closed")
            got = N.views(m.h, [info.index for info in infos], owner=m)
        if got is None:
            return None
        errs = [x for x in got if isinstance(x, N.Error)]
        fatal = [e for e in errs if e.code != N.TV_E_BUSY]
        if fatal:
            for x in got:
                if isinstance(x, N.View):
                    x.release()
            if any(e.code == N.TV_E_NOT_SUPPORTED for e in fatal):
                return None
            raise fatal[0]
        if errs and not m.said_busy:  # once per model: a budget, not a failure
            m.said_busy = True
            _log.warning("tensorvault: %s; those tensors are copied instead", errs[0].message)
        lent = [(info, dt, shape, v) for (info, dt, shape), v in zip(shapes, got)
                if not isinstance(v, N.Error)]
        rest = [info for info, v in zip(infos, got) if isinstance(v, N.Error)]
        if isinstance(self.fw, _Numpy):
            return {info.name: _view_array(v, dt, shape) for info, dt, shape, v in lent}, rest
        try:
            return {info.name: _view_tensor(self.fw.torch, v, dt, shape)
                    for info, dt, shape, v in lent}, rest
        except N.Error as e:
            for x in got:
                if isinstance(x, N.View):
                    x.release()
            # no private mapping here (a library or handle without it, or
            # mmap's -errno: e.g. no free huge page to reserve): copies
            if e.code == N.TV_E_NOT_SUPPORTED or -1000 < e.code < 0:
                return None
            raise

    def call(self, host, cuda):
        """host() or, on a CUDA handle, cuda(stream) on the device's current
        stream; under the model's lock. Returns the rc."""
        with self.m.lock:
            if self.m.h is None:
                raise N.official("File is closed")
            if self.fw.cuda is None:
                return host()
            return self.fw.on_stream(cuda)

    def read_tensor(self, info):
        fw, m = self.fw, self.m
        if self.views:
            lent = self.lend([info])
            if lent is not None and lent[0]:
                return lent[0][info.name]
        t = fw.empty(info, fw.storage_shape(info))
        if info.nbytes:
            err = N.tv_error()
            ptr, n, cname = fw.ptr(t), info.nbytes, info.name.encode()
            rc = self.call(lambda: m.read_into(m.h, cname, ptr, n, err),
                           lambda s: m.read_into_cuda(m.h, cname, ptr, n, s, err))
            N.raise_for(rc, err)
        return t

    def read_tensors(self, infos):
        """{name: tensor} of infos, read as one batch (adjacent tensors
        coalesced); every dtype is checked before anything is read."""
        if self.views and infos:
            lent = self.lend(infos)
            if lent is not None:
                views, rest = lent
                if not rest:
                    return views
                copies = self.copy_tensors(rest)
                return {info.name: views[info.name] if info.name in views else copies[info.name]
                        for info in infos}
        return self.copy_tensors(infos)

    def copy_tensors(self, infos):
        """read_tensors' copies: new tensors, one batched read."""
        fw, m = self.fw, self.m
        shapes = []
        for info in infos:  # the official's order: tensor by tensor, dtype then shape
            fw.dtype(info)
            shapes.append(fw.storage_shape(info))
        out = {}
        reqs = []  # each holds its tensor: no destination is freed before the read
        for info, shape in zip(infos, shapes):
            t = fw.empty(info, shape)
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
            rc = self.call(lambda: m.read_batch(m.h, arr, len(reqs), err),
                           lambda s: m.read_batch_cuda(m.h, arr, len(reqs), s, err))
            N.raise_for(rc, err)
        return out

    def read_rows(self, info, r0, r1):
        """Rows [r0, r1) of dimension 0, on the handle's device (read into
        host memory, then moved to a CUDA device)."""
        fw, m = self.fw, self.m
        if fw.cuda is not None:
            fw.check_cuda()
        block = fw.empty(info, (r1 - r0,) + tuple(info.shape[1:]), on_device=False)
        n = block.nbytes
        if n:
            err = N.tv_error()
            with m.lock:
                if m.h is None:
                    raise N.official("File is closed")
                rc = m.read_rows(m.h, info.name.encode(), r0, r1, fw.ptr(block), n, err)
            N.raise_for(rc, err)
        return fw.to_device(block)


def _file_path(filename):
    """filename as a path when it names a file: a path-like object always,
    a str when a file of that name exists; else None (a model name)."""
    if isinstance(filename, os.PathLike):
        return os.fspath(filename)
    if isinstance(filename, str) and os.path.isfile(filename):
        return filename
    return None


class safe_open:
    """safe_open(filename, framework, device="cpu", *, backend="mmap",
    generation=None, alias=None, socket=None, store=None, views=False):
    safetensors 0.8's
    safe_open over tensorvault, a context manager over one generation of a
    model (filename: the model's name; generation= or alias=, else the
    active one) or over one file the registry holds (filename: a path;
    see the module's docstring). framework: "numpy"/"np" or "pt"/"torch"/
    "pytorch"; device: "cpu", "cuda", "cuda:N", an int N or a torch.device
    (CUDA only with "pt"); backend: "mmap" or "pread" (checked, the same
    reads either way). store=DIR reads in-process; otherwise through the
    daemon at socket=, else $TENSORVAULT_SOCKET, else
    /run/tensorvault/tensorvault.sock when it exists (the installed
    daemon's), else ./var/run/tensorvault.sock (_paths.py; its HTTP socket
    answers the file lookups: _files.py). views=True (device "cpu";
    tensorvault's own): whole tensors are lent from the daemon's memory
    tier, no copy, pinned there while a tensor over them lives: numpy
    arrays read-only, torch tensors writable over a private copy-on-write
    mapping (a write copies the page it touches, for this process alone).
    A model opened from a store, or through a daemon before fast-path
    protocol version 3, copies instead."""

    def __new__(cls, filename, framework, device="cpu", *, backend="mmap", generation=None,
                alias=None, socket=None, store=None, views=False):
        path = _file_path(filename)
        if views and parse_device(device).kind != "cpu":
            raise N.make_error(
                N.TV_E_INVALID_ARG,
                f"views=True lends the daemon's host memory; device {parse_device(device).shown} gets copies")
        if path is not None:
            if generation is not None or alias is not None:
                raise ValueError("safe_open: generation= and alias= choose a model's generation; "
                                 f"{path!r} is a file")
            from . import _files
            return _files.open_file(filename, framework, device, backend,
                                    socket=socket, store=store, views=bool(views))
        if not isinstance(filename, str):
            raise _not_str("filename", filename)
        fw, dev = parse_framework(framework), parse_device(device)
        check_backend(backend)
        if fw == "other":
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"framework {framework} is not served by tensorvault: numpy (np) or pt (torch, pytorch)")
        if dev.kind == "other":
            raise N.make_error(N.TV_E_NOT_SUPPORTED,
                               f"device {dev.shown} is not served by tensorvault: cpu or cuda")
        spec = _spec(filename, generation, alias)
        m = _Model.get(spec, None if store is None else str(store),
                       None if socket is None else str(socket), generation is not None)
        return cls._make(m, fw, dev, spec, views=bool(views))

    def __init__(self, *args, **kwargs):
        pass  # __new__ opened it

    @classmethod
    def _make(cls, m, fw, dev, spec, shard=None, header=None, views=False):
        """A handle on model m (all of it, or only shard `shard`, whose 8 +
        N header bytes are header)."""
        if fw == "numpy" and dev.kind != "cpu":
            raise N.official(f"Device {dev.shown} is not supported for framework numpy")
        self = object.__new__(cls)
        self._closed = True
        self._spec = spec
        self._reader = _Reader(m, _Numpy() if fw == "numpy" else _Torch(dev.index), views)
        if shard is None:
            self._order, self._by_name = m.order, m.by_name
        else:
            self._order = [t for t in m.order if t.shard == shard]
            self._by_name = {t.name: t for t in self._order}
        self._shard = shard
        self._header = header
        self._meta = _UNREAD
        self._meta_lock = threading.Lock()
        self._closed = False
        return self

    # -- context manager -----------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Closes the handle (what __exit__ does): its methods then raise
        "File is closed"; slices taken before still read."""
        self._closed = True
        self.__dict__.pop("_reader", None)

    @property
    def _fw(self):
        return self._reader.fw

    @property
    def _src(self):
        return self._reader.m

    # -- metadata ------------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise N.official("File is closed")

    def keys(self):
        """Tensor names, sorted (as safetensors' keys())."""
        self._check_open()
        return sorted(self._by_name)

    def offset_keys(self):
        """Tensor names in file order (shard by shard, by offset)."""
        self._check_open()
        return [t.name for t in self._order]

    @property
    def generation(self):
        self._check_open()
        return self._src.generation

    def metadata(self):
        """The file's __metadata__ (a dict) or None; for a model, its
        shards' merged in shard order (a key keeps its first value). Read
        once, then cached (a copy each call)."""
        self._check_open()
        with self._meta_lock:
            if self._meta is _UNREAD:
                if self._header is not None:
                    self._meta = merge_metadata([_parse_header(self._header, self._spec)])
                else:
                    self._meta = merge_metadata(self._shard_headers())
            meta = self._meta
        return None if meta is None else dict(meta)

    def _shard_headers(self):
        """Yields each shard's JSON header (parsed), in shard order (only
        the handle's shard when it has one)."""
        src = self._src
        fns = [N.optional(f) for f in src.shard_fns]
        if None in fns:
            raise N.make_error(
                N.TV_E_NOT_SUPPORTED,
                f"metadata() of model {self._spec!r}: this libtensorvault has no shard header reads ({', '.join(src.shard_fns)})")
        n_shards, shard, read_header = fns
        for i in range(n_shards(src.h)):
            if self._shard is not None and i != self._shard:
                continue
            d = N.tv_shard_desc()
            rc = shard(src.h, i, ctypes.byref(d))
            if rc < 0:
                raise N.make_error(rc, f"shard {i} of model {self._spec!r}: no record")
            n = 8 + d.header_len
            buf = ctypes.create_string_buffer(n)
            err = N.tv_error()
            with src.lock:
                N.raise_for(read_header(src.h, i, buf, n, err), err)
            shard_name = ctypes.string_at(d.name, d.name_len).decode("utf-8", "replace")
            yield _parse_header(buf.raw, f"{self._spec!r}, shard {shard_name!r}")

    def _info(self, name):
        if not isinstance(name, str):
            raise _not_str("name", name)
        self._check_open()
        info = self._by_name.get(name)
        if info is None:
            raise N.official(f"File does not contain tensor {name}", N.TV_E_NOT_FOUND,
                             N.MissingTensorError)
        return info

    # -- reads ---------------------------------------------------------------

    def get_tensor(self, name):
        info = self._info(name)
        return self._reader.read_tensor(info)

    def get_tensors(self, names=None):
        """{name: tensor} for names (default: every tensor, in file order),
        read as one batch (adjacent tensors coalesced)."""
        self._check_open()
        if names is None:
            infos = self._order
        else:  # a name given twice is read once (the result is a dict)
            infos = [self._info(n) for n in dict.fromkeys(names)]
        return self._reader.read_tensors(infos)

    def get_slice(self, name):
        info = self._info(name)
        return Slice(self._reader, info)


def _parse_header(raw, what):
    try:
        return json.loads(raw[8:].decode("utf-8"))
    except ValueError as e:
        raise N.make_error(N.TV_E_INVALID_ARG, f"{what}: header is not JSON ({e})") from None


_UNREAD = object()


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


class Slice:
    """safetensors' PySafeSlice: get_shape(), get_dtype() and __getitem__
    (_index.py's rules for the framework), reading only the dimension-0
    rows it needs; it keeps its model, so it reads after its handle closed."""

    __slots__ = ("_reader", "_info")

    def __init__(self, reader, info):
        self._reader = reader
        self._info = info

    def get_shape(self):
        return list(self._info.shape)

    def get_dtype(self):
        return self._info.dtype

    def __getitem__(self, key):
        return self._reader.fw.index(self._reader, self._info, key)
