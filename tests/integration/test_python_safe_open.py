"""Differential tests of the Python package (python/, installed into .venv
by scripts/deps): tensorvault.safe_open(framework="numpy") against
safetensors.safe_open on generated checkpoints (every byte-addressable
dtype, two shards and a single file, unaligned offsets, zero-size and
rank-0 tensors), both in-process (store=) and through a daemon's socket:
keys, offset_keys, every tensor's bytes, dtype and shape; a generated table
of slice expressions against the official slice of the shard holding the
tensor (the same values, or the same error: class and text); get_tensors
equals per-tensor reads; and the errors (missing tensor, no daemon, unknown
model, bad framework and device arguments); metadata() against the
official per-file metadata() (merged over the shards); `import tensorvault`
and the numpy path never import torch. test_python_dropin.py is the
property-based half (drawn keys and checkpoints, the arguments, closed
handles)."""
import json
import struct
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors import safe_open as official_open
from safetensors.numpy import save_file

import harness.checkpoints as gen
import tensorvault
from tensorvault import _native, _paths, _safe_open
from harness.daemon import serving
from harness.store import reference_tensors

BACKENDS = ["store", "socket"]
# device= values every framework refuses as the official does (nothing
# opened): SafetensorError "device X is invalid", or ValueError for a
# "cuda:N" whose N is not an unsigned integer.
BAD_DEVICES = ["tpu", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:0:1", " cuda", "CPU", "cuda:\u0662",
               -1, 1.0, b"cpu"]
# safetensors 0.8's numpy get_tensor asks numpy itself for the F8 dtypes
# (np.float8_* does not exist, it raises AttributeError): for them the
# reference is the official deserializer's bytes as the ml_dtypes array.
NO_OFFICIAL_NUMPY = {k for k in gen.DTYPES if k.startswith("F8_")}


def shard_files(ckpt):
    if ckpt.endswith(".json"):
        with open(ckpt) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(os.path.dirname(ckpt), s) for s in files]
    return [ckpt]


def positions(ckpt):
    """{name: (shard, begin, end)} from the shard headers: file order is
    the order of these (tensors of zero size may share one: the official
    offset_keys() orders such ties differently from run to run)."""
    out = {}
    for i, p in enumerate(shard_files(ckpt)):
        with open(p, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                out[k] = (i,) + tuple(v["data_offsets"])
    return out


def same_file_order(got, want, ckpt):
    pos = positions(ckpt)
    assert sorted(got) == sorted(want)
    assert [pos[k] for k in got] == [pos[k] for k in want]
    assert [pos[k] for k in got] == sorted(pos.values())


def official(ckpt):
    """{name: array} in file order (shard by shard), keys() and offset_keys()
    of every shard, from safetensors.safe_open."""
    raw = reference_tensors(ckpt)
    tensors, keys, offset_keys = {}, [], []
    for p in shard_files(ckpt):
        with official_open(p, framework="numpy") as f:
            keys += f.keys()
            offset_keys += f.offset_keys()
            for k in f.offset_keys():
                dtype, shape, data = raw[k]
                tensors[k] = np.frombuffer(data, dtype=gen.DTYPES[dtype]).reshape(shape)
                if dtype not in NO_OFFICIAL_NUMPY:
                    same(f.get_tensor(k), tensors[k], k)
    return tensors, sorted(keys), offset_keys


@pytest.fixture(scope="module")
def served(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("pysafe")
    rng = np.random.default_rng(11)
    tensors = gen.random_tensors(rng, 3 * len(gen.DTYPES), big_tensor_bytes=(1 << 20) + 44)
    tensors["rows.f32"] = np.arange(7 * 5 * 3, dtype=np.float32).reshape(7, 5, 3)
    tensors["rows.bf16"] = gen.random_array(rng, gen.DTYPES["BF16"], (9, 4))
    sharded = gen.write_checkpoint(str(tmp / "ck2"), tensors, 2)
    single = gen.write_checkpoint(str(tmp / "ck1"),
                                  gen.random_tensors(np.random.default_rng(12), len(gen.DTYPES)), 1)
    ckpts = {"m": sharded, "one": single, **metadata_checkpoints(tmp)}
    with serving(build_dir, tmp, ckpts) as d:
        yield {"d": d, "sock": d.socket_path, "store": d.store, "ckpt": ckpts,
               "ref": {"m": official(sharded), "one": official(single)}}


# Per-shard __metadata__ of the "meta" model (None: the shard has none) and
# what the merge rule makes of it: shard order, a key keeps its first value.
META_SHARDS = [{"format": "pt", "k": "first"}, None, {"k": "third", "only3": "x", "": ""}]
META_MERGED = {"format": "pt", "k": "first", "only3": "x", "": ""}
META_ONE = {"format": "np", "unicode": "\u00e9 \u2713 \U0001f600", "empty": "", "q": "\"{}\""}


def metadata_checkpoints(tmp):
    """{model: checkpoint}: "meta", three shards with different metadata
    (META_SHARDS), and "meta1", one file with META_ONE."""
    d = tmp / "meta"
    d.mkdir()
    weight_map = {}
    for i, meta in enumerate(META_SHARDS):
        fname = f"model-{i + 1:05d}-of-{len(META_SHARDS):05d}.safetensors"
        name = f"layer.{i}.w"
        save_file({name: np.arange(i + 3, dtype=np.int16)}, str(d / fname), metadata=meta)
        weight_map[name] = fname
    with open(d / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    one = gen.write_checkpoint(str(tmp / "meta1"), {"w": np.ones(3, np.float32)}, 1, META_ONE)
    return {"meta": str(d / "model.safetensors.index.json"), "meta1": one}


def open_tv(served, backend, spec="m", **kw):
    if backend == "store":
        return tensorvault.safe_open(spec, framework="np", store=served["store"], **kw)
    return tensorvault.safe_open(spec, framework="numpy", socket=served["sock"], **kw)


def same(a, b, what):
    assert a.dtype == b.dtype, what
    assert a.shape == b.shape, what
    assert a.tobytes() == b.tobytes(), what


@pytest.mark.parametrize("model", ["m", "one"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_tensor_equals_official(served, backend, model):
    ref, keys, offset_keys = served["ref"][model]
    assert any(v.ndim == 0 for v in ref.values()) and any(v.size == 0 for v in ref.values())
    with open_tv(served, backend, model) as f:
        assert f.keys() == keys
        same_file_order(f.offset_keys(), offset_keys, served["ckpt"][model])
        for name, want in ref.items():
            got = f.get_tensor(name)
            same(got, want, name)
            assert got.flags.c_contiguous and got.flags.writeable and got.base is None, name
            s = f.get_slice(name)
            assert s.get_shape() == list(want.shape), name
        n_dtypes = 0
        for p in shard_files(served["ckpt"][model]):
            with official_open(p, framework="numpy") as o:
                for name in o.keys():
                    assert f.get_slice(name).get_dtype() == o.get_slice(name).get_dtype(), name
                    n_dtypes += 1
        assert n_dtypes == len(ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_tensors_equals_per_tensor_reads(served, backend):
    ref = served["ref"]["m"][0]
    with open_tv(served, backend) as f:
        every = f.get_tensors()
        assert list(every) == f.offset_keys()
        for name, arr in every.items():
            same(arr, f.get_tensor(name), name)
            same(arr, ref[name], name)
        pick = ["rows.f32", "odd.u8", "big.f32", "rows.bf16"]
        some = f.get_tensors(pick)
        assert list(some) == pick
        for name in pick:
            same(some[name], ref[name], name)
        with pytest.raises(tensorvault.MissingTensorError):
            f.get_tensors(["rows.f32", "no.such"])


def slice_table(shape):
    """Index expressions for a tensor of this shape: in range, negative,
    past the end, stop < start, steps, Ellipsis, ints and slices mixed."""
    n = shape[0]
    out = [np.s_[:], np.s_[...], np.s_[0], np.s_[n - 1],
           np.s_[-1], np.s_[-n], np.s_[1:], np.s_[:2],
           np.s_[1:n - 1], np.s_[::2], np.s_[1::3], np.s_[0:n:n],
           np.s_[2:2], np.s_[n:], np.s_[5:1], np.s_[:100],
           np.s_[..., 0], np.s_[0, ...], np.s_[1:, ..., :1],
           np.s_[-2:], np.s_[:-1], np.s_[-3:-1],
           np.s_[-100:2], np.s_[-1:, -2:], np.s_[::3]]
    if len(shape) >= 2:
        m = shape[1]
        out += [np.s_[:, 0], np.s_[1, 1:], np.s_[:, ::2],
                np.s_[-1, -1], np.s_[0:2, m - 1], np.s_[:, -2:],
                np.s_[1:3, :-1]]
    if len(shape) >= 3:
        out += [np.s_[1:4, 2, 0:2], np.s_[..., 1:, 0], np.s_[-2:, :, -1]]
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_slices_equal_official(served, backend):
    """Every expression of slice_table on the two-shard model's tensors
    gives the official slice of the shard holding the tensor, or its error
    (numpy BF16 and F8, which the official has no numpy type for, are
    test_python_dropin.py's)."""
    from .test_python_dropin import outcome, same_outcome
    ref = served["ref"]["m"][0]
    shard_of = {}
    for p in shard_files(served["ckpt"]["m"]):
        with official_open(p, framework="numpy") as o:
            shard_of.update({k: p for k in o.keys()})
    n_ok = n_err = 0
    with open_tv(served, backend) as f:
        for name in ["rows.f32", "big.f32"] + sorted(
                k for k, v in ref.items() if v.ndim >= 1 and v.shape[0] >= 3 and v.size):
            sl = f.get_slice(name)
            if sl.get_dtype() in NO_OFFICIAL_NUMPY or sl.get_dtype() == "BF16":
                continue
            with official_open(shard_of[name], framework="numpy") as o:
                osl = o.get_slice(name)
                for expr in slice_table(ref[name].shape):
                    want = outcome(lambda: osl[expr])
                    same_outcome(outcome(lambda: sl[expr]), want, f"{name}[{expr}]")
                    n_ok += want[0]
                    n_err += not want[0]
    assert n_ok > 100 and n_err > 100, (n_ok, n_err)
    with open_tv(served, backend) as f:
        scalar = next(k for k, v in ref.items() if v.ndim == 0)
        same(f.get_slice(scalar)[...], ref[scalar], scalar)


def test_one_code_path_both_openings(served):
    """store= and socket= differ only in how the model is opened: one
    tv_model handle class, read with the same library functions, equal
    results."""
    ref = served["ref"]["m"][0]
    with open_tv(served, "store") as a, open_tv(served, "socket") as b:
        assert type(a._src) is type(b._src)
        for fn in ("n_tensors", "tensor", "find", "read_into", "read_batch", "read_rows",
                   "read_into_cuda", "read_batch_cuda"):
            assert getattr(a._src, fn) is getattr(b._src, fn), fn
        assert a._src.shard_fns == b._src.shard_fns
        assert a._src.c is None and b._src.c is not None  # only the daemon has a session
        assert a.offset_keys() == b.offset_keys() and a.generation == b.generation
        for name in ("rows.f32", "big.f32"):
            same(a.get_tensor(name), b.get_tensor(name), name)
            same(b.get_tensor(name), ref[name], name)
        got_a, got_b = a.get_tensors(), b.get_tensors()
        for name in got_a:
            same(got_a[name], got_b[name], name)


def test_slice_reads_only_the_rows_it_needs(served, monkeypatch):
    """A slice asks the library for exactly the dim-0 rows it covers."""
    calls = []
    with open_tv(served, "store") as f:
        real = f._src.read_rows

        def spy(h, name, r0, r1, dest, n, err):
            calls.append((name, r0, r1))
            return real(h, name, r0, r1, dest, n, err)

        f._src.read_rows = spy
        want = served["ref"]["m"][0]["big.f32"]
        n = want.shape[0]
        same(f.get_slice("big.f32")[1000:2001:10], want[1000:2001:10], "strided")
        same(f.get_slice("big.f32")[n - 5:], want[-5:], "the last rows")
        same(f.get_slice("rows.f32")[-4, 1:], served["ref"]["m"][0]["rows.f32"][3, 1:], "int")
    assert calls == [(b"big.f32", 1000, 2001), (b"big.f32", n - 5, n), (b"rows.f32", 3, 4)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_generation_and_alias(served, backend):
    d = served["d"]
    with open_tv(served, backend, generation=1) as f:
        assert f.generation == 1 and f.keys() == served["ref"]["m"][1]
    with open_tv(served, backend, alias="active") as f:
        assert f.generation == 1
    with pytest.raises(ValueError):
        open_tv(served, backend, generation=1, alias="prod")
    with pytest.raises(tensorvault.Error) as e:
        open_tv(served, backend, generation=99)
    assert e.value.code == -1004 and e.value.name == "TV_E_NOT_FOUND"
    assert d.alive()


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors(served, backend, tmp_path, monkeypatch):
    with open_tv(served, backend) as f:
        with pytest.raises(SafetensorError) as e:
            f.get_tensor("no.such.tensor")
        assert isinstance(e.value, tensorvault.MissingTensorError)
        assert isinstance(e.value, tensorvault.Error) and not isinstance(e.value, KeyError)
        assert e.value.name == "TV_E_NOT_FOUND"
        assert str(e.value) == "File does not contain tensor no.such.tensor"
        with pytest.raises(tensorvault.MissingTensorError):
            f.get_slice("no.such.tensor")
    with pytest.raises(SafetensorError) as e:
        f.get_tensor("rows.f32")  # closed
    assert str(e.value) == "File is closed"
    with pytest.raises(FileNotFoundError) as e:
        open_tv(served, backend, "unknown-model")
    assert isinstance(e.value, tensorvault.NotFoundError) and e.value.name == "TV_E_NOT_FOUND"
    assert "model 'unknown-model' does not exist" in e.value.message
    for dev, shown in (("cuda", "cuda:0"), ("cuda:0", "cuda:0"), ("cuda:3", "cuda:3"), (0, "0"),
                       (2, "2")):  # as the official: numpy is host memory only
        with pytest.raises(SafetensorError) as e:
            tensorvault.safe_open("m", framework="np", device=dev, store=served["store"])
        assert str(e.value) == f"Device {shown} is not supported for framework numpy", dev
    for dev in BAD_DEVICES:
        with pytest.raises((SafetensorError, ValueError)) as e:
            tensorvault.safe_open("m", framework="numpy", device=dev, store=served["store"])
        with pytest.raises(Exception) as o:
            official_open(served["ckpt"]["one"], framework="numpy", device=dev)
        assert isinstance(e.value, type(o.value)) and str(e.value) == str(o.value), dev
    for fw in ("tf", "flax", "jax", "mlx"):  # the official's, not tensorvault's
        with pytest.raises(tensorvault.Error) as e:
            tensorvault.safe_open("m", framework=fw, store=served["store"])
        assert e.value.name == "TV_E_NOT_SUPPORTED" and f"framework {fw}" in e.value.message, fw
    for fw in ("", "NP"):
        with pytest.raises(SafetensorError) as e:
            tensorvault.safe_open("m", framework=fw, store=served["store"])
        assert str(e.value) == f"framework {fw} is invalid"


def test_store_that_is_no_store(served, tmp_path):
    """store= naming a directory that is no store (empty, missing, a file)
    says so, not that the model is missing; a store without the model
    still says the model does not exist."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_bytes(b"x")
    cases = ((tmp_path / "empty", "no registry.db"), (tmp_path / "missing", "no such directory"),
             (tmp_path / "file", "not a directory"))
    for d, why in cases:
        with pytest.raises(tensorvault.NotFoundError) as e:
            tensorvault.safe_open("m", framework="np", store=str(d))
        assert e.value.message == f"{d} is not a tensorvault store ({why}" + (
            "; run 'tensorvault store init')" if why == "no registry.db" else ")"), e.value.message
    assert not os.path.exists(tmp_path / "empty" / "registry.db")  # nothing made there
    with pytest.raises(tensorvault.NotFoundError) as e:
        tensorvault.safe_open("unknown-model", framework="np", store=served["store"])
    assert "model 'unknown-model' does not exist" in e.value.message


SHARD_HEADER_FNS = ("tv_model_n_shards", "tv_model_shard", "tv_read_shard_header")


def official_metadata(ckpt):
    """The merge rule over the official per-file metadata()."""
    metas = []
    for p in shard_files(ckpt):
        with official_open(p, framework="numpy") as o:
            metas.append(o.metadata())
    return metas, _safe_open.merge_metadata({"__metadata__": m} for m in metas)


@pytest.mark.parametrize("model", ["m", "one", "meta", "meta1"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_equals_official(served, backend, model):
    metas, want = official_metadata(served["ckpt"][model])
    if model == "meta":
        assert metas == META_SHARDS and want == META_MERGED
    elif model == "meta1":
        assert want == META_ONE
    else:
        assert want is None
    assert all(_native.optional(fn) for fn in SHARD_HEADER_FNS)  # the library has them
    with open_tv(served, backend, model) as f:
        got = f.metadata()
        assert got == want
        if got is not None:
            got["added"] = "by the caller"  # a copy: the cached value is unchanged
        assert f.metadata() == want
    with pytest.raises(tensorvault.Error) as e:
        f.metadata()
    assert str(e.value) == "File is closed"


def test_metadata_read_once(served, monkeypatch):
    """metadata() reads the shard headers on its first call only, and not at
    open (a handle that never asks reads no header)."""
    reads = []
    real = _safe_open.safe_open._shard_headers

    def spy(self):
        reads.append(self._spec)
        return real(self)

    monkeypatch.setattr(_safe_open.safe_open, "_shard_headers", spy)
    with open_tv(served, "store", "meta") as f:
        assert reads == []
        first = [f.metadata() for _ in range(3)]
        assert reads == ["meta"]
        assert first == [META_MERGED] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_without_shard_header_reads(served, backend, monkeypatch):
    """A library without the shard header functions still loads; only
    metadata() refuses, naming them, and the handle reads on."""
    monkeypatch.setattr(_native, "optional", lambda name: None)
    with open_tv(served, backend, "meta1") as f:
        with pytest.raises(tensorvault.Error) as e:
            f.metadata()
        assert e.value.name == "TV_E_NOT_SUPPORTED" and "read_shard_header" in e.value.message
        assert "meta1" in e.value.message
        assert f.get_tensor("w").tolist() == [1.0, 1.0, 1.0]


def test_merge_metadata_rule():
    m = _safe_open.merge_metadata
    assert m([]) is None
    assert m([{}, {"__metadata__": None}, {"a": {"dtype": "U8"}}]) is None
    assert m([{"__metadata__": {}}]) == {}
    assert m([{"__metadata__": None}, {"__metadata__": {"a": "1", "b": "2"}},
              {"__metadata__": {"b": "3", "c": "4"}}]) == {"a": "1", "b": "2", "c": "4"}
    assert list(m([{"__metadata__": {"z": "1"}}, {"__metadata__": {"a": "2", "z": "3"}}])) == ["z", "a"]


def test_import_does_not_import_torch(served):
    """`import tensorvault` and the whole numpy path leave torch unimported."""
    code = ("import sys, tensorvault\n"
            "with tensorvault.safe_open('m', framework='np', store=sys.argv[1]) as f:\n"
            "    f.get_tensors(); f.get_slice('rows.f32')[1:3, 0]; f.metadata()\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n"
            "print('no torch')\n")
    p = subprocess.run([sys.executable, "-c", code, served["store"]], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "no torch\n", p.stderr
    # Without torch, framework="pt" is a tensorvault.Error (the numpy path still works).
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"
            "import tensorvault\n"
            "try:\n"
            "    tensorvault.safe_open('m', framework='pt', store=sys.argv[1])\n"
            "except tensorvault.Error as e:\n"
            "    print(e.name, 'needs torch' in e.message)\n"
            "with tensorvault.safe_open('m', framework='np', store=sys.argv[1]) as f:\n"
            "    print(f.get_tensor('rows.f32').shape)\n")
    p = subprocess.run([sys.executable, "-c", code, served["store"]], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "TV_E_NOT_SUPPORTED True\n(7, 5, 3)\n", p.stderr


def test_no_daemon(tmp_path, monkeypatch):
    missing = str(tmp_path / "nobody.sock")
    with pytest.raises(tensorvault.Error) as e:
        tensorvault.safe_open("m", framework="np", socket=missing)
    assert e.value.name == "TV_E_NO_DAEMON" and missing in e.value.message
    monkeypatch.setenv("TENSORVAULT_SOCKET", missing)  # the environment's socket
    with pytest.raises(tensorvault.Error) as e:
        tensorvault.safe_open("m", framework="np")
    assert e.value.name == "TV_E_NO_DAEMON" and missing in e.value.message
    assert "named by $TENSORVAULT_SOCKET" in e.value.message
    monkeypatch.delenv("TENSORVAULT_SOCKET")
    monkeypatch.chdir(tmp_path)  # the defaults: the installed socket, then ./var/run/...
    monkeypatch.setattr(_paths, "INSTALLED_SOCKET", str(tmp_path / "run" / "tensorvault.sock"))
    with pytest.raises(tensorvault.Error) as e:
        tensorvault.safe_open("m", framework="np")
    msg = e.value.message
    assert e.value.name == "TV_E_NO_DAEMON" and "var/run/tensorvault.sock" in msg
    # every place looked, what was there, and what to set
    assert f"{tmp_path}/run/tensorvault.sock (absent)" in msg, msg
    assert f"{tmp_path}/var/run/tensorvault.sock (absent)" in msg, msg
    assert "set TENSORVAULT_SOCKET (or pass socket=)" in msg, msg
    (tmp_path / "var" / "run").mkdir(parents=True)
    (tmp_path / "var" / "run" / "tensorvault.sock").write_text("")
    with pytest.raises(tensorvault.Error) as e:
        tensorvault.safe_open("m", framework="np")
    assert f"{tmp_path}/var/run/tensorvault.sock (not a socket)" in e.value.message


def test_installed_socket_before_local(served, monkeypatch, tmp_path):
    """The installed default, when it exists, comes before ./var/run: a
    directory with a dead ./var/run socket still reaches the installed
    daemon; $TENSORVAULT_SOCKET and socket= come before both."""
    monkeypatch.delenv("TENSORVAULT_SOCKET", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "var" / "run").mkdir(parents=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dead.bind(str(tmp_path / "var" / "run" / "tensorvault.sock"))  # bound, not listening
    try:
        monkeypatch.setattr(_paths, "INSTALLED_SOCKET", served["sock"])
        assert _paths.fast_socket().how == "installed"
        with tensorvault.safe_open("one", framework="np") as f:
            assert f.keys() == served["ref"]["one"][1]
        # the HTTP socket for file lookups: beside the installed one
        assert _paths.http_endpoint() == os.path.join(os.path.dirname(served["sock"]),
                                                      "http.sock")
        monkeypatch.setenv("TENSORVAULT_SOCKET", str(tmp_path / "var" / "run" / "tensorvault.sock"))
        with pytest.raises(tensorvault.Error) as e:
            tensorvault.safe_open("one", framework="np")
        assert e.value.name == "TV_E_NO_DAEMON"
        monkeypatch.setattr(_paths, "INSTALLED_SOCKET", str(tmp_path / "absent.sock"))
        monkeypatch.delenv("TENSORVAULT_SOCKET")
        assert _paths.fast_socket().how == "local"
        with tensorvault.safe_open("one", framework="np", socket=served["sock"]) as f:
            assert f.keys() == served["ref"]["one"][1]
    finally:
        dead.close()


def test_environment_and_default_socket(served, monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORVAULT_SOCKET", served["sock"])
    with tensorvault.safe_open("one", framework="np") as f:
        assert f.keys() == served["ref"]["one"][1]
    monkeypatch.delenv("TENSORVAULT_SOCKET")
    monkeypatch.chdir(served["d"].workdir)  # README layout: ./var/run/tensorvault.sock
    with tensorvault.safe_open("one", framework="np") as f:
        name = f.offset_keys()[-1]
        same(f.get_tensor(name), served["ref"]["one"][0][name], name)


def _vm_flags(addr):
    """VmFlags of the mapping holding addr (/proc/self/smaps)."""
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                cur = lo <= addr < hi
            elif cur and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_destinations_not_hugepage_advised():
    """Large destination arrays come without numpy's MADV_HUGEPAGE ("hg"),
    and numpy's own switch is left as it was."""
    sw = _safe_open._SET_HUGEPAGE
    if sw is None:
        pytest.skip("this numpy has no _set_madvise_hugepage switch")
    was = sw(True)
    try:
        plain = np.empty(16 << 20, dtype=np.uint8)
        assert "hg" in _vm_flags(plain.ctypes.data + (8 << 20))  # numpy advises (2 MiB-aligned part)
        ours = _safe_open.empty_array((4 << 20,), np.float32)
        assert ours.shape == (4 << 20,) and ours.dtype == np.float32
        assert "hg" not in _vm_flags(ours.ctypes.data + (8 << 20))
        assert sw(True) is True  # restored
        small = _safe_open.empty_array((3, 5), np.float16)
        assert small.shape == (3, 5)
    finally:
        sw(was)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_tensors_repeated_names(served, backend):
    """A name given twice is read once, and every destination the library is
    handed belongs to a tensor of the result (none was freed before the
    read: the review found a batch writing into a dropped duplicate)."""
    ref = served["ref"]["m"][0]
    with open_tv(served, backend) as f:
        seen = []
        real = f._src.read_batch

        def spy(h, arr, n, err):
            seen.extend((arr[i].dest, arr[i].dest_len) for i in range(n))
            return real(h, arr, n, err)

        f._src.read_batch = spy
        got = f.get_tensors(["big.f32", "rows.f32", "big.f32", "rows.f32"])
        assert list(got) == ["big.f32", "rows.f32"]
        for name, arr in got.items():
            same(arr, ref[name], name)
        assert sorted(seen) == sorted((a.ctypes.data, a.nbytes) for a in got.values())
