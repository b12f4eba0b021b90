"""ctypes binding over libtensorvault (the shared library installed inside
this package by `pip install ./python`, SONAME libtensorvault.so.1): the
structures and prototypes of every C function the package calls, and the
exceptions built from a tv_error (code, its stable name from tv_err_name,
the library's message; each an instance of safetensors.SafetensorError).
A model opened from a store or through the daemon is one tv_model, read
with the same functions.

Invariant: every function used has argtypes and restype set here, so a
wrong argument type fails in Python instead of corrupting memory."""
import ctypes
import os

TV_E_NOT_SUPPORTED = -1002
TV_E_INVALID_ARG = -1003
TV_E_NOT_FOUND = -1004
TV_E_BUSY = -1203
TV_E_NO_DAEMON = -1208


try:  # the official exception class, when safetensors is installed
    from safetensors import SafetensorError
except ImportError:
    class SafetensorError(Exception):
        """safetensors' exception class, standing in when the safetensors
        package is not installed."""


class Error(SafetensorError):
    """A tensorvault error, an instance of safetensors.SafetensorError (of
    its stand-in without safetensors): .code (the TV_E_* or -errno value),
    .name (its symbolic name, e.g. "TV_E_NOT_FOUND") and .message. str() is
    "NAME: message", except for the errors whose text is the official
    package's (plain: str() is the message alone, as clients match it)."""

    def __init__(self, code, name, message, plain=False):
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message
        self.plain = plain

    def __str__(self):
        return self.message if self.plain else f"{self.name}: {self.message}"


class MissingTensorError(Error):
    """A tensor name that the model or file does not have (the official
    "File does not contain tensor NAME")."""


class NotFoundError(Error, FileNotFoundError):
    """A model, generation or alias that does not exist: also a
    FileNotFoundError, what the official raises for a missing file."""


class DtypeError(Error, AttributeError):
    """A dtype numpy has no array type for (F4): also an AttributeError, what
    the official numpy path raises there."""


class tv_error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class tv_tensor_desc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("name_len", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("nbytes", ctypes.c_uint64),
        ("n_elements", ctypes.c_uint64),
        ("shard", ctypes.c_uint32),
    ]


class tv_read_req(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("index", ctypes.c_size_t),
        ("dest", ctypes.c_void_p),
        ("dest_len", ctypes.c_size_t),
        ("result", ctypes.c_int),
    ]


class tv_view_req(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("index", ctypes.c_size_t),
        ("view", ctypes.c_void_p),
        ("result", ctypes.c_int),
    ]


class tv_shard_desc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("name_len", ctypes.c_size_t),
        ("file_len", ctypes.c_uint64),
        ("header_len", ctypes.c_uint64),
    ]


def _find_library():
    """$TENSORVAULT_LIBRARY, else the library inside this package (the
    wheel's, or pip install ./python's), else the system's
    libtensorvault.so.1 (the Debian package's, found by the dynamic
    linker)."""
    path = os.environ.get("TENSORVAULT_LIBRARY")
    if path:
        return path
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtensorvault.so")
    return packaged if os.path.exists(packaged) else "libtensorvault.so.1"


def _load():
    path = _find_library()
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"tensorvault: cannot load libtensorvault ({path}: {e}); it is looked for in "
            "$TENSORVAULT_LIBRARY, inside the package, then as the system's "
            "libtensorvault.so.1") from e


lib = _load()

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_E = ctypes.POINTER(tv_error)
_D = ctypes.POINTER(tv_tensor_desc)
_R = ctypes.POINTER(tv_read_req)
_S = ctypes.c_size_t
_U64 = ctypes.c_uint64
_I = ctypes.c_int
_CS = ctypes.c_char_p

_PROTOS = {
    "tv_err_name": (ctypes.c_char_p, [_I]),
    "tv_dtype_name": (ctypes.c_char_p, [_I]),
    # opening a model: in-process from a store directory, or through
    # tensorvaultd's fast path in a session (tensorvault.h, client.h)
    "tv_model_open": (_I, [_CS, _CS, _P, _PP, _E]),
    "tv_client_connect": (_I, [_CS, _P, _PP, _E]),
    "tv_client_close": (None, [_P]),
    "tv_model_open_daemon": (_I, [_P, _CS, _P, _PP, _E]),
    # the one read API, whichever way the model was opened (tensorvault.h)
    "tv_model_close": (None, [_P]),
    "tv_model_generation": (ctypes.c_int64, [_P]),
    "tv_model_n_tensors": (_S, [_P]),
    "tv_model_tensor": (_I, [_P, _S, _D]),
    "tv_model_find": (_I, [_P, _CS, _S, ctypes.POINTER(_S)]),
    "tv_read_into": (_I, [_P, _CS, _P, _S, _E]),
    "tv_read_batch": (_I, [_P, _R, _S, _E]),
    "tv_read_rows": (_I, [_P, _CS, _U64, _U64, _P, _S, _E]),
    "tv_read_into_cuda": (_I, [_P, _CS, _P, _S, _P, _E]),
    "tv_read_batch_cuda": (_I, [_P, _R, _S, _P, _E]),
    "tv_cuda_available": (ctypes.c_bool, []),
}
# Shard headers: resolved on first use by optional(), so that a library
# without them still loads (then metadata() raises TV_E_NOT_SUPPORTED).
_SD = ctypes.POINTER(tv_shard_desc)
_OPTIONAL_PROTOS = {
    "tv_model_n_shards": (_S, [_P]),
    "tv_model_shard": (_I, [_P, _S, _SD]),
    "tv_read_shard_header": (_I, [_P, _S, _P, _S, _E]),
    # read-only views of the daemon's memory tier (tensorvault.h): a model
    # opened through a daemon of fast-path protocol version 3; a library
    # without them still loads (views() then answers None)
    "tv_tensor_view": (_I, [_P, _CS, _PP, _E]),
    "tv_tensor_view_batch": (_I, [_P, ctypes.POINTER(tv_view_req), _S, _E]),
    "tv_view_data": (ctypes.c_void_p, [_P]),
    "tv_view_nbytes": (_U64, [_P]),
    "tv_view_release": (None, [_P]),
    "tv_view_map": (_I, [_P, ctypes.POINTER(ctypes.c_void_p), _E]),
}
for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args


_optional = {}


def optional(name):
    """The prototyped function `name` of _OPTIONAL_PROTOS, or None when the
    loaded library does not export it."""
    if name not in _optional:
        f = getattr(lib, name, None)
        if f is not None:
            f.restype, f.argtypes = _OPTIONAL_PROTOS[name]
        _optional[name] = f
    return _optional[name]


def err_name(code):
    return lib.tv_err_name(code).decode()


def dtype_name(dt):
    return lib.tv_dtype_name(dt).decode()


def make_error(code, message, cls=Error, plain=False):
    return cls(code, err_name(code), message, plain)


def official(message, code=TV_E_INVALID_ARG, cls=Error):
    """The Error of a case the official package raises SafetensorError for,
    with its text (plain)."""
    return cls(code, err_name(code), message, True)


def raise_for(rc, err):
    """Raises the Error of a failed call (rc < 0) from its tv_error."""
    if rc < 0:
        msg = err.msg.decode("utf-8", "replace") if err is not None else ""
        raise (NotFoundError if rc == TV_E_NOT_FOUND else Error)(rc, err_name(rc), msg or err_name(rc))


class View:
    """One read-only view (tv_view) of a tensor in the daemon's memory tier:
    .nbytes and .buffer(), a read-only memoryview of the bytes in place (no
    copy). The daemon keeps the bytes pinned until release() (also called
    when the object is collected); a buffer taken from a released view must
    not be used. The view keeps `owner` (the model object it came from)
    alive, so the model is not closed under it. Release views from the
    thread that reads the model (a release talks to its session)."""

    __slots__ = ("_v", "nbytes", "_addr", "owner", "__weakref__")

    def __init__(self, handle, owner=None):
        self._v = handle
        self.owner = owner
        self.nbytes = lib.tv_view_nbytes(handle)
        self._addr = lib.tv_view_data(handle)

    def buffer(self):
        """The view's bytes as a read-only memoryview (format 'B'); zero
        bytes: an empty one."""
        if self._v is None:
            raise ValueError("the view was released")
        if not self.nbytes:
            return memoryview(b"")
        arr = (ctypes.c_ubyte * self.nbytes).from_address(self._addr)
        return memoryview(arr).cast("B").toreadonly()

    def map(self):
        """The address of the view's bytes in a private, writable,
        copy-on-write mapping (tv_view_map): reads share the daemon's pages,
        a write copies its page for this process alone. Valid until
        release(). Raises Error (TV_E_NOT_SUPPORTED: a library or handle
        without it)."""
        if self._v is None:
            raise ValueError("the view was released")
        f = optional("tv_view_map")
        if f is None:
            raise make_error(TV_E_NOT_SUPPORTED, "this libtensorvault has no tv_view_map")
        addr, err = ctypes.c_void_p(), tv_error()
        raise_for(f(self._v, ctypes.byref(addr), ctypes.byref(err)), err)
        return addr.value or self._addr

    def release(self):
        """Gives the view back (under its owner's lock when it has one: a
        release talks to the model's session)."""
        v, self._v = self._v, None
        if v is not None:
            lock = getattr(self.owner, "lock", None)
            if lock is None:
                lib.tv_view_release(v)
            else:
                with lock:
                    lib.tv_view_release(v)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the process frees all
            pass


def views(model, names, owner=None):
    """Views of the tensors `names` (str names, or int indexes) of the
    tv_model `model`, in one batch: a list with a View, or the Error of that
    tensor, per name; None when this library lends no views. A model that
    cannot lend views (opened from a store, an older daemon) gives
    TV_E_NOT_SUPPORTED for every name: copy instead (tv_read_batch)."""
    f = optional("tv_tensor_view_batch")
    if f is None:
        return None
    n = len(names)
    reqs = (tv_view_req * max(n, 1))()
    keep = []
    for i, nm in enumerate(names):
        if isinstance(nm, int):
            reqs[i].index = nm
        else:
            b = nm.encode() if isinstance(nm, str) else nm
            keep.append(b)
            reqs[i].name = b
    err = tv_error()
    f(model, reqs, n, ctypes.byref(err))
    for name in ("tv_view_data", "tv_view_nbytes", "tv_view_release"):
        optional(name)
    out = []
    for i in range(n):
        if reqs[i].result == 0 and reqs[i].view:
            out.append(View(reqs[i].view, owner))
        else:
            rc = reqs[i].result or TV_E_INVALID_ARG
            msg = err.msg.decode("utf-8", "replace") if rc == err.code else err_name(rc)
            out.append(Error(rc, err_name(rc), msg))
    return out
