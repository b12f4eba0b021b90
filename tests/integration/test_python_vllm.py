"""The vLLM loader plugin and weights_iterator (python/tensorvault/vllm.py,
_weights.py), against the real vLLM installed in .venv (no stand-in): the
`vllm.general_plugins` entry point `tensorvault` is declared in
python/pyproject.toml and found by importlib.metadata and by vLLM's own
plugin discovery; after register(), get_model_loader returns
TensorvaultModelLoader for load format "tensorvault"; its load_weights feeds
a torch module's load_weights every tensor of a served model in file order,
bytes equal to the official loader's, through the daemon and with store=,
and applies vLLM's strict check of the returned loaded names;
download_model of a missing model names it and the socket or store;
weights_iterator's batches (at most batch_bytes, a bigger tensor alone, same
output whatever the size) and its handle (closed at the end and on an early
close: GET /v1/sessions shows no session after)."""
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest
import torch
from safetensors import safe_open as official_open

import harness.checkpoints as gen
import tensorvault
import tensorvault._safe_open
from tensorvault import _native
import tensorvault.vllm as tvllm
from harness.daemon import serving
from harness.store import reference_tensors

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BACKENDS = ["store", "socket"]


def shard_files(ckpt):
    with open(ckpt) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(os.path.dirname(ckpt), s) for s in files]


def file_positions(ckpt):
    """{name: (shard index, data begin)} from the shards' headers."""
    out = {}
    for i, p in enumerate(shard_files(ckpt)):
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        out.update({k: (i, v["data_offsets"][0]) for k, v in header.items()})
    return out


def assert_file_order(names, served):
    """names: every tensor once, shard by shard by offset (zero-size tensors
    at one offset in any order), and tensorvault's offset_keys()."""
    pos = served["pos"]
    assert sorted(names) == sorted(pos)
    at = [pos[n] for n in names]
    assert at == sorted(at)
    assert names == served["order"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("pyvllm")
    rng = np.random.default_rng(33)
    tensors = gen.random_tensors(rng, 2 * len(gen.DTYPES), big_tensor_bytes=(256 << 10) + 12)
    ckpt = gen.write_checkpoint(str(tmp / "ck"), tensors, 2)
    with serving(build_dir, tmp, {"m": ckpt}) as d:
        raw = reference_tensors(ckpt)
        with tensorvault.safe_open("m", framework="np", store=d.store) as f:
            offset_keys = f.offset_keys()
        yield {"d": d, "sock": d.socket_path, "store": d.store, "ckpt": ckpt, "raw": raw,
               "pos": file_positions(ckpt), "order": offset_keys}


def src(served, backend):
    return {"store": served["store"]} if backend == "store" else {"socket": served["sock"]}


def np_bytes(a):
    return np.ascontiguousarray(a).tobytes()


def pt_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def wait_no_session(d, timeout=10):
    deadline = time.monotonic() + timeout
    while d.sessions():
        assert time.monotonic() < deadline, f"a session stayed open: {d.sessions()}"
        time.sleep(0.05)


# -- import, entry point, registration -------------------------------------------


def test_import_does_not_import_torch_or_vllm():
    code = ("import sys, tensorvault, tensorvault.vllm; "
            "assert callable(tensorvault.weights_iterator); "
            "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout


def test_entry_point_is_declared_and_found():
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"tensorvault": "tensorvault.vllm:register"}
    found = {e.name: e for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert found["tensorvault"].value == "tensorvault.vllm:register"
    assert found["tensorvault"].load() is tvllm.register
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    assert DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP)["tensorvault"] is tvllm.register


def test_register_makes_the_load_format():
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import BaseModelLoader, get_model_loader
    cls = tvllm.register()
    assert cls is tvllm.TensorvaultModelLoader and issubclass(cls, BaseModelLoader)
    assert cls.__module__ == "tensorvault.vllm" and not cls.__abstractmethods__
    assert tvllm.register() is cls  # idempotent
    extra = {"model": "m", "socket": "/x.sock", "generation": 1}
    loader = get_model_loader(LoadConfig(load_format="tensorvault", model_loader_extra_config=extra))
    assert type(loader) is cls and loader.load_config.model_loader_extra_config == extra
    for bad in ({"no_such_key": 1}, {"generation": 1, "alias": "prod"}, {"batch_bytes": 0},
                {"generation": "1"}, {"enable_weights_track": "yes"}):
        with pytest.raises(ValueError):
            get_model_loader(LoadConfig(load_format="tensorvault", model_loader_extra_config=bad))


# -- the loader --------------------------------------------------------------------


class ModelConfig:
    """The two ModelConfig fields the loader reads."""

    def __init__(self, model, quantization=None):
        self.model = model
        self.quantization = quantization


class Collector(torch.nn.Module):
    """A vLLM model stand-in: load_weights(weights) collects (name, tensor)
    and returns `returns` (None, or the set of names it loaded)."""

    def __init__(self, params=("w",), returns=None):
        super().__init__()
        for p in params:
            self.register_parameter(p, torch.nn.Parameter(torch.zeros(2)))
        self.returns = returns
        self.got = []

    def load_weights(self, weights):
        for name, t in weights:
            self.got.append((name, t))
        return self.returns


def loader(**extra):
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    tvllm.register()
    return get_model_loader(LoadConfig(load_format="tensorvault", model_loader_extra_config=extra))


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_weights_delivers_every_tensor_in_file_order(served, backend):
    m = Collector()
    # model name from model_config.model; batch_bytes small: several batches
    loader(batch_bytes=4096, **src(served, backend)).load_weights(m, ModelConfig("m"))
    assert_file_order([n for n, _ in m.got], served)
    official = {}
    for p in shard_files(served["ckpt"]):
        with official_open(p, framework="pt") as f:
            official.update({k: f.get_tensor(k) for k in f.keys()})
    for name, t in m.got:
        want = official[name]
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu", name
        assert t.dtype == want.dtype and t.shape == want.shape, name
        assert pt_bytes(t) == pt_bytes(want) == served["raw"][name][2], name
    if backend == "socket":
        wait_no_session(served["d"])
    # the extra config's model overrides model_config.model
    m2 = Collector()
    loader(model="m", generation=1, **src(served, backend)).load_weights(m2, ModelConfig("hf/x"))
    assert [n for n, _ in m2.got] == served["order"]


def test_load_weights_with_views(served):
    """extra config views=true through the daemon: every tensor load_weights
    gets lies over the daemon's memory tier (its view bytes count them
    while the model keeps them; no copy of their own), with the official
    loader's bytes; writing one changes no other load; once dropped, the
    pins and the session go. With store= (no tier) the same config copies.
    A bad value is refused; views on a GPU device are ignored by
    weights_iterator (its copies are read from the tier anyway)."""
    import gc
    d = served["d"]
    wait_no_session(d)
    m = Collector()
    loader(views=True, batch_bytes=4096, socket=served["sock"]).load_weights(m, ModelConfig("m"))
    assert [n for n, _ in m.got] == served["order"]
    for name, t in m.got:
        assert pt_bytes(t) == served["raw"][name][2], name
    assert d.metrics()["tensorvault_tier_view_bytes"] > 0
    big = max(m.got, key=lambda x: x[1].nbytes)
    big[1].reshape(-1).view(torch.uint8).fill_(0xA5)  # private to this process
    again = Collector()
    loader(socket=served["sock"]).load_weights(again, ModelConfig("m"))
    assert pt_bytes(dict(again.got)[big[0]]) == served["raw"][big[0]][2]
    del m, big, again, name, t
    gc.collect()
    assert d.metrics()["tensorvault_tier_view_bytes"] == 0
    wait_no_session(d)
    s = Collector()
    loader(views=True, store=served["store"]).load_weights(s, ModelConfig("m"))
    assert [pt_bytes(t) for _, t in s.got] == [served["raw"][n][2] for n in served["order"]]
    with pytest.raises(ValueError):
        loader(views="yes")
    it = tensorvault.weights_iterator("m", device="cuda:0", socket=served["sock"], views=True)
    with pytest.raises(tensorvault.Error) as e:  # no GPU here, or a GPU: never INVALID_ARG
        next(it)
        raise tensorvault.Error(0, "TV_E_NONE", "read on a GPU")
    assert e.value.name != "TV_E_INVALID_ARG", e.value.message


def test_load_weights_strict_check(served, seen_iterators):
    order = served["order"]
    # every parameter in the returned set: fine
    m = Collector(params=("a", "b"), returns={"a", "b"})
    loader(store=served["store"]).load_weights(m, ModelConfig("m"))
    assert len(m.got) == len(order)
    # "b" not loaded: vLLM's DefaultModelLoader error, naming it and the model
    m = Collector(params=("a", "b"), returns={"a"})
    with pytest.raises(ValueError) as e:
        loader(store=served["store"]).load_weights(m, ModelConfig("m"))
    assert "not initialized from checkpoint" in str(e.value) and "'b'" in str(e.value)
    assert "'m'" in str(e.value)
    # off for quantized models by default, and with enable_weights_track=False
    loader(store=served["store"]).load_weights(Collector(("a", "b"), {"a"}),
                                               ModelConfig("m", quantization="fp8"))
    loader(store=served["store"], enable_weights_track=False).load_weights(
        Collector(("a", "b"), {"a"}), ModelConfig("m"))
    # a module whose quant_method builds its parameters is exempt
    m = Collector(params=("a",), returns={"a"})
    m.q = torch.nn.Linear(2, 2)
    m.q.quant_method = type("QM", (), {"process_weights_after_loading": lambda self, l: None})()
    loader(store=served["store"]).load_weights(m, ModelConfig("m"))


def test_load_weights_quantized_check_is_vllms(served):
    """With the check forced on for a quantized model, vLLM's own rule
    applies: a parameter of a module with a (post-processing) quant_method
    must still come from the checkpoint, unlike the unquantized exemption."""
    m = Collector(params=("a",), returns={"a"})
    m.q = torch.nn.Linear(2, 2)
    m.q.quant_method = type("QM", (), {"process_weights_after_loading": lambda self, l: None})()
    with pytest.raises(ValueError) as e:
        loader(store=served["store"], enable_weights_track=True).load_weights(
            m, ModelConfig("m", quantization="fp8"))
    assert "q.weight" in str(e.value) and "'m'" in str(e.value)


def test_load_weights_skips_unused_and_refuses_secondary_sources(served):
    """is_unused_checkpoint_weight names are neither read nor delivered (the
    rest in file order); a model with secondary_weights sources (weights
    from other checkpoints) is refused with a clear error."""
    order = served["order"]
    unused = set(order[::2])
    m = Collector()
    m.is_unused_checkpoint_weight = lambda name: name in unused
    loader(store=served["store"]).load_weights(m, ModelConfig("m"))
    assert [n for n, _ in m.got] == [n for n in order if n not in unused]
    m = Collector()
    m.secondary_weights = [type("Source", (), {"model_or_path": "org/vision-tower"})()]
    with pytest.raises(tensorvault.Error) as e:
        loader(store=served["store"]).load_weights(m, ModelConfig("m"))
    assert e.value.code == _native.TV_E_NOT_SUPPORTED
    assert "org/vision-tower" in str(e.value) and "secondary_weights" in str(e.value)
    assert m.got == []
    with pytest.raises(ValueError):
        tensorvault.weights_iterator("m", store=served["store"], skip=3)


@pytest.fixture
def seen_iterators(monkeypatch):
    """Records (model, device, framework) of each weights_iterator the
    loader makes and hands it numpy arrays on cpu instead."""
    seen = []
    real = tvllm.weights_iterator

    def spy(model, device, **kw):
        seen.append((model, device, kw["framework"]))
        return real(model, "cpu", **{**kw, "framework": "np"})

    monkeypatch.setattr(tvllm, "weights_iterator", spy)
    return seen


def test_load_weights_uses_the_parameters_device(served, seen_iterators):
    class OnCuda1(Collector):
        def parameters(self, recurse=True):
            yield type("P", (), {"device": torch.device("cuda", 1)})()

    ld = loader(store=served["store"])
    ld.load_weights(OnCuda1(), ModelConfig("m"))
    ld.load_weights(Collector(params=()), ModelConfig("m"))  # no parameters: cpu
    meta = Collector()
    meta.w = torch.nn.Parameter(torch.empty(2, device="meta"))
    ld.load_weights(meta, ModelConfig("m"))
    assert seen_iterators == [("m", "cuda:1", "pt"), ("m", "cpu", "pt"), ("m", "cpu", "pt")]


@pytest.mark.parametrize("backend", BACKENDS)
def test_download_model(served, backend, tmp_path):
    ld = loader(**src(served, backend))
    assert ld.download_model(ModelConfig("m")) is None
    where = served["store"] if backend == "store" else served["sock"]
    with pytest.raises(tensorvault.Error) as e:
        ld.download_model(ModelConfig("no-such-model"))
    assert e.value.name == "TV_E_NOT_FOUND"
    assert "no-such-model" in e.value.message and where in e.value.message
    with pytest.raises(tensorvault.Error) as e:
        loader(generation=99, **src(served, backend)).download_model(ModelConfig("m"))
    assert e.value.name == "TV_E_NOT_FOUND" and "'m@99'" in e.value.message
    if backend == "socket":
        missing = str(tmp_path / "nobody.sock")
        with pytest.raises(tensorvault.Error) as e:
            loader(socket=missing).download_model(ModelConfig("m"))
        assert e.value.name == "TV_E_NO_DAEMON" and missing in e.value.message
        wait_no_session(served["d"])


# -- weights_iterator -----------------------------------------------------------------


@pytest.fixture
def spy_batches(monkeypatch):
    calls = []
    real = tensorvault._safe_open.safe_open.get_tensors

    def spy(self, names=None):
        calls.append(list(names))
        return real(self, names)

    monkeypatch.setattr(tensorvault._safe_open.safe_open, "get_tensors", spy)
    return calls


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_iterator_batches(served, backend, spy_batches):
    raw, order = served["raw"], served["order"]
    size = {n: len(raw[n][2]) for n in order}
    ref = None
    for bb in (1, 100, 4096, 1 << 40):
        spy_batches.clear()
        got = list(tensorvault.weights_iterator("m", framework="np", batch_bytes=bb,
                                                **src(served, backend)))
        assert_file_order([n for n, _ in got], served)
        for name, a in got:
            assert a.shape == tuple(raw[name][1]) and np_bytes(a) == raw[name][2], name
        if ref is None:
            ref = got
        assert all(a.dtype == r.dtype and np_bytes(a) == np_bytes(r)
                   for (_, a), (_, r) in zip(got, ref))
        assert [n for b in spy_batches for n in b] == order, bb
        for b, nxt in zip(spy_batches, spy_batches[1:] + [None]):
            total = sum(size[n] for n in b)
            assert total <= bb or len(b) == 1, (bb, b)  # a bigger tensor is alone
            if nxt is not None:
                assert total + size[nxt[0]] > bb, (bb, b, nxt)  # batches are full
        if bb == 1 << 40:
            assert len(spy_batches) == 1
        if bb == 100:
            assert len(spy_batches) > 5 and ["big.f32"] in spy_batches
    with pytest.raises(ValueError):
        tensorvault.weights_iterator("m", batch_bytes=0, **src(served, backend))
    with pytest.raises(ValueError):
        tensorvault.weights_iterator("m", generation=1, alias="active", **src(served, backend))
    it = tensorvault.weights_iterator("no-such-model", framework="np", **src(served, backend))
    with pytest.raises(tensorvault.Error) as e:
        next(it)
    assert e.value.name == "TV_E_NOT_FOUND" and "no-such-model" in e.value.message


def test_weights_iterator_releases_the_handle(served, monkeypatch):
    d = served["d"]
    wait_no_session(d)
    it = tensorvault.weights_iterator("m", framework="np", socket=served["sock"], batch_bytes=64)
    name, _ = next(it)
    assert name == served["order"][0]
    (s,) = d.sessions()
    assert [h["model"] for h in s["handles"]] == ["m"], s
    it.close()  # early close
    wait_no_session(d)
    n = sum(1 for _ in tensorvault.weights_iterator("m", framework="np", socket=served["sock"]))
    assert n == len(served["order"])
    wait_no_session(d)  # closed when exhausted
    closed = []
    real = tensorvault._safe_open.safe_open.close
    monkeypatch.setattr(tensorvault._safe_open.safe_open, "close",
                        lambda self: (closed.append(1), real(self)))
    it = tensorvault.weights_iterator("m", framework="np", socket=served["sock"])
    next(it)
    assert d.sessions() and not closed
    del it  # dropped unfinished: collected, its finally closes the handle
    assert closed
    wait_no_session(d)
