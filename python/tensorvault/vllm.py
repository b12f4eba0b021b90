"""tensorvault.vllm: the vLLM model loader of load format "tensorvault".

vLLM calls register() (the `vllm.general_plugins` entry point `tensorvault`
declared in python/pyproject.toml) in every process it starts; register()
imports vLLM and registers TensorvaultModelLoader with
register_model_loader("tensorvault"). The loader reads
load_config.model_loader_extra_config: `model` (default: the model_config's
model name), `socket`, `store`, `alias`, `generation`, `batch_bytes` and
`views` (the weights_iterator's) and `enable_weights_track` (as vLLM's
default loader).
When the model path is a checkout (`tensorvault checkout NAME@GEN DIR`: a
directory with tensorvault.json), the model and the generation NUMBER come
from its record (so the config vLLM reads from DIR and the weights are one
generation's), and so does the record's store; an extra config `model` or
`generation` that disagrees with the record, or an `alias`, is refused.

Invariants: importing this module imports neither vLLM nor torch (register()
and the TensorvaultModelLoader attribute do); register() is idempotent;
load_weights feeds model.load_weights the (name, tensor) of every tensor in
file order on the device of the model's parameters."""
import os
import threading

from . import _checkout
from . import _native as N
from ._safe_open import safe_open
from ._weights import DEFAULT_BATCH_BYTES, weights_iterator

LOAD_FORMAT = "tensorvault"
EXTRA_KEYS = ("model", "socket", "store", "alias", "generation", "batch_bytes",
              "enable_weights_track", "views")

_lock = threading.Lock()
_loader_cls = None
_registered = False


def register():
    """Registers load format "tensorvault" with vLLM (the entry point vLLM's
    load_general_plugins calls; calling it again does nothing). Returns the
    loader class."""
    global _registered
    from vllm.model_executor.model_loader import register_model_loader
    cls = _loader_class()
    with _lock:
        if not _registered:
            register_model_loader(LOAD_FORMAT)(cls)
            _registered = True
    return cls


def __getattr__(name):
    if name == "TensorvaultModelLoader":
        return _loader_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _model_device(model):
    """The device of the model's first parameter (cpu when it has none, or
    when they are still on the meta device)."""
    for p in model.parameters():
        return "cpu" if p.device.type == "meta" else str(p.device)
    return "cpu"


def _where(socket, store):
    if store is not None:
        return f"store {store}"
    if socket is not None:
        return f"socket {socket}"
    return ("the default socket ($TENSORVAULT_SOCKET, else /run/tensorvault/tensorvault.sock "
            "when it exists, else ./var/run/tensorvault.sock)")


def _check_extra(extra):
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ValueError(f"model_loader_extra_config must be a dict for load format {LOAD_FORMAT}, got {type(extra).__name__}")
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise ValueError(f"Unexpected extra config keys for load format {LOAD_FORMAT}: {unknown} (known: {list(EXTRA_KEYS)})")
    if extra.get("generation") is not None and extra.get("alias") is not None:
        raise ValueError(f"model_loader_extra_config for load format {LOAD_FORMAT}: give generation or alias, not both")
    gen = extra.get("generation")
    if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int)):
        raise ValueError(f"model_loader_extra_config generation must be an integer, got {gen!r}")
    bb = extra.get("batch_bytes", DEFAULT_BATCH_BYTES)
    if isinstance(bb, bool) or not isinstance(bb, int) or bb <= 0:
        raise ValueError(f"model_loader_extra_config batch_bytes must be a positive integer, got {bb!r}")
    track = extra.get("enable_weights_track")
    if track is not None and not isinstance(track, bool):
        raise ValueError(f"model_loader_extra_config enable_weights_track must be a bool, got {track!r}")
    views = extra.get("views", False)
    if not isinstance(views, bool):
        raise ValueError(f"model_loader_extra_config views must be a bool, got {views!r}")
    return dict(extra)


def pick(model_path, extra):
    """(model name, dict(generation=, alias=, socket=, store=)) the loader
    reads for vLLM's model path and the checked extra config: a checkout
    directory's record names the model and the generation number (and,
    with neither socket nor store in extra, the record's store), else
    extra's `model` (default: the model path) and its generation or
    alias."""
    src = dict(generation=extra.get("generation"), alias=extra.get("alias"),
               socket=extra.get("socket"), store=extra.get("store"))
    path = None if model_path is None else os.fspath(model_path)
    rec = _checkout.read_record(path) if path and os.path.isdir(path) else None
    if rec is None:
        return str(extra.get("model") or path), src
    where = f"{path} is a tensorvault checkout of {rec['model']}@{rec['generation']}"
    if extra.get("model") is not None and extra["model"] != rec["model"]:
        raise ValueError(f"model_loader_extra_config model {extra['model']!r}: {where}")
    if src["generation"] is not None and src["generation"] != rec["generation"]:
        raise ValueError(f"model_loader_extra_config generation {src['generation']}: {where}")
    if src["alias"] is not None:
        raise ValueError(f"model_loader_extra_config alias {src['alias']!r}: {where} (an alias could name another generation than its config's)")
    src["generation"] = rec["generation"]
    if src["socket"] is None and src["store"] is None and isinstance(rec.get("store"), str):
        src["store"] = rec["store"]
    return rec["model"], src


def _weights_not_loaded(model, loaded):
    """The parameter names of model missing from loaded, vLLM's
    DefaultModelLoader.track_weights_loading for unquantized models: the
    parameters of modules whose quant_method builds them (online
    quantization, process_weights_after_loading) are exempt."""
    expected = {name for name, _ in model.named_parameters()}
    loaded = set(loaded)
    for mname, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        if getattr(qm, "uses_meta_device", False) or getattr(qm, "process_weights_after_loading",
                                                             None):
            for pname, _ in module.named_parameters():
                loaded.add(f"{mname}.{pname}" if mname else pname)
    return expected - loaded


def _track_weights_loading(loader, model, loaded, quantized):
    """vLLM's own strict check (DefaultModelLoader.track_weights_loading of
    the installed vLLM: which parameters may be missing from a checkpoint
    depends on its quantization rules), else the unquantized rule below."""
    try:
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        check = DefaultModelLoader.track_weights_loading
    except (ImportError, AttributeError):
        check = None
    if check is not None:
        check(loader, model, loaded, quantized=quantized)
        return
    missing = _weights_not_loaded(model, loaded)
    if missing:
        raise ValueError(f"Following weights were not initialized from checkpoint: {sorted(missing)}")


def _loader_class():
    global _loader_cls
    with _lock:
        if _loader_cls is None:
            _loader_cls = _make_loader_class()
        return _loader_cls


def _make_loader_class():
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class TensorvaultModelLoader(BaseModelLoader):
        """vLLM model loader reading the weights from tensorvault (the
        daemon's fast path, or a store directory with extra config
        `store`), the tensors in file order on the rank's device."""

        def __init__(self, load_config):
            super().__init__(load_config)
            self.extra = _check_extra(load_config.model_loader_extra_config)

        def _model_name(self, model_config):
            return pick(model_config.model, self.extra)[0]

        def _source(self, model_config):
            return pick(model_config.model, self.extra)[1]

        def download_model(self, model_config):
            """Checks that the model (and generation or alias) exists: opens
            it and closes it again. Nothing is downloaded."""
            name = self._model_name(model_config)
            src = self._source(model_config)
            try:
                with safe_open(name, framework="np", **src):
                    pass
            except N.Error as e:
                what = name
                if src["generation"] is not None:
                    what += f"@{src['generation']}"
                elif src["alias"] is not None:
                    what += f"@{src['alias']}"
                raise type(e)(e.code, e.name, f"tensorvault model {what!r} is not available from {_where(src['socket'], src['store'])}: {e.message}") from e

        def load_weights(self, model, model_config):
            """model.load_weights(weights_iterator(...)) on the device of
            the model's parameters; when it returns the set of loaded names
            (vLLM models do), every parameter must be in it (vLLM's strict
            check, on by default for unquantized models; extra config
            enable_weights_track overrides)."""
            name = self._model_name(model_config)
            secondary = list(getattr(model, "secondary_weights", ()) or ())
            if secondary:
                raise N.make_error(N.TV_E_NOT_SUPPORTED, f"{type(model).__name__} also loads weights from {[getattr(s, 'model_or_path', s) for s in secondary]} (secondary_weights): load format {LOAD_FORMAT} serves one tensorvault model ({name!r}); use vLLM's default loader for this model")
            weights = weights_iterator(name, _model_device(model), framework="pt",
                                       batch_bytes=self.extra.get("batch_bytes",
                                                                  DEFAULT_BATCH_BYTES),
                                       skip=getattr(model, "is_unused_checkpoint_weight", None),
                                       views=self.extra.get("views", False),
                                       **self._source(model_config))
            try:
                loaded = model.load_weights(weights)
            finally:
                weights.close()
            quantized = getattr(model_config, "quantization", None) is not None
            track = self.extra.get("enable_weights_track")
            if track is None:
                track = not quantized and loaded is not None
            if track and loaded is not None:
                try:
                    _track_weights_loading(self, model, set(loaded), quantized)
                except ValueError as e:
                    raise ValueError(f"{e} (tensorvault model {name!r})") from e

    TensorvaultModelLoader.__module__ = __name__
    TensorvaultModelLoader.__qualname__ = "TensorvaultModelLoader"
    return TensorvaultModelLoader
