"""The one-line switch: tensorvault.patch() (or `with tensorvault.patched():`)
makes code that opens .safetensors files with the official package read
the files the registry holds through tensorvault, unchanged:
AutoModel.from_pretrained(DIR), diffusers' and vLLM's loaders, anything
calling safetensors.safe_open, safetensors.torch.load_file / load_model or
safetensors.numpy.load_file. Files no readable generation holds, and
frameworks or devices tensorvault does not serve, go to the official
safe_open as before (_files.open_file).

How: the official safe_open class is replaced by a stand-in (file paths
only, never model names) in the safetensors package and its torch and
numpy modules (whose load_file, load_model call it) and in every module
already imported that bound it by name (`from safetensors import
safe_open`); modules imported later get the stand-in from the package.
isinstance(x, safetensors.safe_open) holds for the handles of both.
unpatch() (the context's exit) puts the official class back wherever the
stand-in is, the modules imported meanwhile included."""
import sys
import threading

from . import _files
from . import _safe_open as S

_lock = threading.Lock()
_stack = []  # the configurations of the patches in force, innermost last


class _Config:
    __slots__ = ("socket", "store", "http")

    def __init__(self, socket, store, http):
        self.socket = None if socket is None else str(socket)
        self.store = None if store is None else str(store)
        self.http = None if http is None else str(http)


class _StandInMeta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, S.safe_open) or (S.OFFICIAL is not None and
                                                isinstance(obj, S.OFFICIAL))


class safe_open(metaclass=_StandInMeta):
    """safetensors.safe_open while tensorvault.patch() is in force: a file
    the registry holds is read through tensorvault (its generation, through
    the daemon or the store the patch names), any other goes to the
    official safe_open."""

    def __new__(cls, filename, framework, device="cpu", *, backend="mmap"):
        cfg = _stack[-1] if _stack else _Config(None, None, None)
        return _files.open_file(filename, framework, device, backend, socket=cfg.socket,
                                store=cfg.store, http=cfg.http)


def _modules():
    return [m for m in list(sys.modules.values()) if m is not None]


def _swap(old, new):
    """Every module attribute that is old becomes new (tensorvault's own
    modules keep theirs: the official class stays reachable)."""
    for mod in _modules():
        if getattr(mod, "__name__", "").split(".")[0] == "tensorvault":
            continue
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for name, value in list(d.items()):
            if value is old:
                try:
                    setattr(mod, name, new)
                except (AttributeError, TypeError):
                    pass


def _need_official(what):
    if S.OFFICIAL is None:
        raise ImportError(f"tensorvault.{what} switches the safetensors package, which is not installed")
    import safetensors  # noqa: F401 - the package whose name is switched
    for name in ("safetensors.torch", "safetensors.numpy"):
        try:
            __import__(name)
        except ImportError:  # safetensors.torch without torch
            pass


def _push(cfg, replace):
    """Puts cfg in force (replacing the innermost when replace); the first
    one switches the modules. Under _lock."""
    if not _stack:
        _stack.append(cfg)
        _swap(S.OFFICIAL, safe_open)
    elif replace:
        _stack[-1] = cfg
    else:
        _stack.append(cfg)


def patch(*, socket=None, store=None, http=None):
    """Switches safetensors' file loading to tensorvault: see the module's
    docstring. socket= (the fast-path socket, default $TENSORVAULT_SOCKET,
    else /run/tensorvault/tensorvault.sock when it exists, else
    ./var/run/tensorvault.sock) and http= (the daemon's HTTP API for
    the lookups: a UNIX socket path or http://127.0.0.1:PORT; default
    $TENSORVAULT_URL, else $TENSORVAULT_HTTP, else http.sock beside the
    fast-path socket), or
    store= (a store directory, read in-process). A second patch() replaces
    the configuration. Needs the safetensors package."""
    _need_official("patch()")
    with _lock:
        _push(_Config(socket, store, http), True)


def unpatch():
    """Puts the official safe_open back everywhere (a no-op when no patch
    is in force)."""
    with _lock:
        _stack.clear()
        if S.OFFICIAL is not None:
            _swap(safe_open, S.OFFICIAL)


def is_patched():
    """Whether a patch is in force."""
    return bool(_stack)


class patched:
    """`with tensorvault.patched(socket=..., store=..., http=...):` the
    switch for the block's duration (nested blocks use the innermost
    configuration; the official class is back after the outermost)."""

    def __init__(self, *, socket=None, store=None, http=None):
        self._cfg = _Config(socket, store, http)

    def __enter__(self):
        _need_official("patched()")
        with _lock:
            _push(self._cfg, False)
        return self

    def __exit__(self, *exc):
        with _lock:
            if self._cfg in _stack:
                _stack.remove(self._cfg)
            if not _stack and S.OFFICIAL is not None:
                _swap(safe_open, S.OFFICIAL)
        return False
