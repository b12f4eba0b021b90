"""tensorvault.safe_open as a drop-in for safetensors 0.8, property-based
(hypothesis) against the official package on the same bytes, for numpy and
torch, with the model opened in-process (store=), through the daemon
(socket=) and as a file the registry holds (the path; the lookup of
python/tensorvault/_files.py):

- slicing: index expressions drawn from ints (negative, past the end, at
  the 32- and 64-bit edges), slices (None, negative, past the end, steps
  from -2 to 4 and huge), Ellipsis, None, bools, lists, floats, strings,
  numpy and torch scalars and arrays, tuples of up to 5 of them, on a pool
  of tensors of every dtype the official reads (F4 too, and F6, which it
  refuses) and shapes with scalars and zero-size dimensions: the same
  values, shapes, dtypes (torch: strides and contiguity too), or the same
  exception class and text. The documented differences: a start past its
  stop (the official fails inside: SystemError or a panic; here a
  SafetensorError), numpy BF16 and F8 (the official has no numpy type;
  here ml_dtypes', compared with the official slice of a same-width
  integer twin holding the same bytes);
- whole checkpoints drawn (names, dtypes, shapes incl. scalars and
  zero-size, metadata), imported through the daemon from a Hugging Face
  cache layout (the blob named by its SHA-256): keys, offset_keys,
  metadata, every tensor, get_tensors, torch and numpy load_file;
- arguments (framework, device, backend), closed handles, missing tensors,
  models and files, the exception classes, the package without
  safetensors.

Example counts are bounded (settings below) so the module runs in seconds."""
import gc
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
import warnings

import ml_dtypes
import numpy as np
import pytest
import safetensors
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError

import harness.checkpoints as gen
import tensorvault
import tensorvault.numpy
import tensorvault.torch
from harness import python_env
from harness.daemon import serving
from tensorvault import _safe_open

OFFICIAL = _safe_open.OFFICIAL
FWS = ["np", "pt"]
OPENINGS = ["store", "socket", "file"]
SLICE_EXAMPLES = 300
CKPT_EXAMPLES = 12

# torch dtype of each code the pool holds (the raw writer needs only bytes).
WIDTH = {**{k: v.itemsize for k, v in gen.DTYPES.items()}}
TWIN = {"BF16": "U16", "F8_E5M2": "U8", "F8_E4M3": "U8", "F8_E4M3FNUZ": "U8",
        "F8_E5M2FNUZ": "U8", "F8_E8M0": "U8"}


def raw_file(path, tensors, metadata=None):
    """Writes {name: (code, shape, bytes)} as one safetensors file, in name
    order, no padding (any dtype, F4 and F6 included)."""
    header, off, data = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        code, shape, b = tensors[name]
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        data.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))
    return path


def pool_tensors(rng):
    """{name: (code, shape, bytes)}: F32 in every shape, every other dtype
    in two, integer twins of BF16 and F8, F4 and F6."""
    shapes = [(), (0,), (1,), (5,), (0, 3), (3, 0), (4, 3), (2, 3, 4), (3, 1, 2, 2), (9, 2)]
    out = {}
    for shape in shapes:
        out[f"f32.{'x'.join(map(str, shape)) or 'scalar'}"] = (
            "F32", shape, rng.bytes(4 * int(np.prod(shape, dtype=np.int64))))
    for code, dt in gen.DTYPES.items():
        for shape in [(4, 3), (2, 3, 2)]:
            b = gen.random_array(rng, dt, shape).tobytes()
            name = f"{code}.{'x'.join(map(str, shape))}"
            out[name] = (code, shape, b)
            if code in TWIN:
                out[f"{name}.twin"] = (TWIN[code], shape, b)
    for shape in [(2, 4), (3, 2), (0, 4), (4,), (1, 2, 6), (4, 1)]:
        n = int(np.prod(shape, dtype=np.int64)) * 4 // 8
        out[f"F4.{'x'.join(map(str, shape))}"] = ("F4", shape, rng.bytes(n))
    for shape in [(4,), (2, 4)]:
        n = int(np.prod(shape, dtype=np.int64)) * 6 // 8
        out[f"F6_E2M3.{'x'.join(map(str, shape))}"] = ("F6_E2M3", shape, rng.bytes(n))
    return out


def settle(*paths):
    """Waits until every path's last change is over 2 s old: only then does
    the importer record a file's stamps (migrations/0006_shard_files.sql)."""
    newest = max(os.stat(p).st_ctime for p in paths)
    time.sleep(max(0.0, newest + 2.05 - time.time()))


@pytest.fixture(scope="module")
def pool(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("dropin")
    tensors = pool_tensors(np.random.default_rng(41))
    path = raw_file(str(tmp / "pool" / "model.safetensors"), tensors, {"format": "pt", "k": "v"})
    settle(path)
    with serving(build_dir, tmp, {"pool": path}) as d:
        official = {fw: OFFICIAL(path, fw) for fw in FWS}
        ours = {}
        for fw in FWS:
            ours[fw, "store"] = tensorvault.safe_open("pool", fw, store=d.store)
            ours[fw, "socket"] = tensorvault.safe_open("pool", fw, socket=d.socket_path)
            ours[fw, "file"] = tensorvault.safe_open(path, fw, socket=d.socket_path)
            assert type(ours[fw, "file"]) is tensorvault.safe_open  # read from the generation
        yield {"d": d, "path": path, "tensors": tensors, "official": official, "ours": ours}
        for f in ours.values():
            f.close()
        ours.clear()
        gc.collect()  # the last reference to each model: its session closes now


# -- outcomes ------------------------------------------------------------------


def outcome(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return True, fn()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # the official's panics are BaseExceptions
            return False, e


def tensor_bytes(x):
    if isinstance(x, torch.Tensor):
        if x.numel() == 0:
            return b""
        flat = torch.empty(x.numel(), dtype=x.dtype).copy_(x.detach().cpu().reshape(-1))
        return flat.view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


def same_value(got, want, what, strides=True):
    assert type(got) is type(want), (what, type(got), type(want))
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (what, got.shape, want.shape)
    assert tensor_bytes(got) == tensor_bytes(want), what
    if isinstance(got, torch.Tensor):
        assert got.is_contiguous() == want.is_contiguous(), what
        if strides:
            assert got.stride() == want.stride(), (what, got.stride(), want.stride())
    else:
        assert got.flags.c_contiguous, what


def same_error(got, want, what):
    """got (tensorvault) fails as want (the official) does: the class (a
    tensorvault error is a SafetensorError) and the text."""
    assert isinstance(got, BaseException), (what, "no error; the official raised", want)
    if type(want).__name__ in ("SystemError", "PanicException"):
        # the official fails inside (a slice whose start lies past its stop)
        assert isinstance(got, SafetensorError) and "lies past its stop" in str(got), (what, got)
        return
    if isinstance(want, SafetensorError):
        assert isinstance(got, SafetensorError), (what, got, want)
    elif isinstance(got, SafetensorError):  # a tensorvault error that is also the official's class
        assert isinstance(got, type(want)), (what, type(got), got, type(want), want)
    else:
        assert type(got) is type(want), (what, type(got), got, type(want), want)
    assert str(got) == str(want), (what, str(got), str(want))


def same_outcome(got, want, what, strides=True):
    if want[0]:
        assert got[0], (what, "raised", got[1], "; the official returned", want[1])
        same_value(got[1], want[1], what, strides)
    else:
        same_error(got[1], want[1], what)


# -- index expressions --------------------------------------------------------------

BIG = [2 ** 31 - 1, 2 ** 31, -2 ** 31, -2 ** 31 - 1, 2 ** 63, 2 ** 64, -2 ** 63]
bounds = st.one_of(st.none(), st.integers(-6, 10), st.sampled_from(BIG))
steps = st.one_of(st.none(), st.integers(-2, 4), st.sampled_from([2 ** 63, 2 ** 64, -2 ** 63]))
ODD = [[], [0], [0, 1], [-1, 0], [True, False], [[]], 1.0, "0", b"0", (), (0,),
       np.int64(1), np.int32(-1), np.uint8(2), np.array(1), np.array([0]), np.array([], np.int64),
       np.bool_(True), torch.tensor(0), torch.tensor([1]), torch.tensor([0, 1]),
       slice(1.0, 2), slice(None, None, 2.0), slice(np.int64(1), None)]
elems = st.one_of(st.integers(-6, 10), st.sampled_from(BIG), st.builds(slice, bounds, bounds, steps),
                  st.just(Ellipsis), st.none(), st.booleans(), st.sampled_from(ODD))
keys = st.one_of(elems, st.lists(elems, max_size=5).map(tuple),
                 st.lists(st.integers(-3, 3), max_size=3), st.just(()))


def reference(pool, fw, name, key):
    """The official outcome of get_slice(name)[key]; for numpy BF16/F8 (no
    official numpy type) its integer twin's, viewed as the ml_dtypes type."""
    code = pool["tensors"][name][0]
    o = pool["official"][fw]
    if fw == "np" and code in TWIN:
        ok, v = outcome(lambda: o.get_slice(f"{name}.twin")[key])
        return (ok, v.view(_safe_open.NUMPY_DTYPES[code]) if ok else v)
    return outcome(lambda: o.get_slice(name)[key])


SLICE_SETTINGS = settings(max_examples=SLICE_EXAMPLES, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fw", FWS)
def test_slices_equal_official(pool, fw):
    names = sorted(n for n in pool["tensors"] if not n.endswith(".twin"))
    seen = {"ok": 0, "err": 0}

    @SLICE_SETTINGS
    @given(name=st.sampled_from(names), key=keys)
    def check(name, key):
        want = reference(pool, fw, name, key)
        seen["ok" if want[0] else "err"] += 1
        for opening in OPENINGS:
            sl = pool["ours"][fw, opening].get_slice(name)
            same_outcome(outcome(lambda: sl[key]), want, f"{opening} {fw} {name}[{key!r}]")

    check()
    # both kinds were drawn in numbers
    assert seen["ok"] > SLICE_EXAMPLES // 8 and seen["err"] > SLICE_EXAMPLES // 8, seen


def test_slice_table_of_the_review(pool):
    """The cases found by hand, each against the official."""
    cases = {
        "np": ["f32.4x3", [np.s_[:20], np.s_[:, :20], np.s_[-3:], np.s_[5:2], np.s_[9], np.s_[-9],
                           [0, 1], np.s_[None], 1.0, np.s_[0, 0, 0], np.s_[..., ...], np.s_[::-1],
                           [], [[]], True, np.s_[2:1], np.s_[0:4:3], np.s_[...], ()]],
        "pt": ["f32.4x3", [[0, 1], np.s_[None], True, np.s_[..., ...], np.s_[:20], np.s_[-3:],
                           np.s_[5:2], np.s_[:, ::2], np.s_[::-1], 1.0, np.s_[9]]],
    }
    for fw, (name, exprs) in cases.items():
        for key in exprs:
            want = reference(pool, fw, name, key)
            for opening in OPENINGS:
                got = outcome(lambda: pool["ours"][fw, opening].get_slice(name)[key])
                same_outcome(got, want, f"{opening} {fw} {name}[{key!r}]")


def test_slices_read_only_their_rows(pool):
    """A slice reads the dimension-0 rows it covers, nothing more; [...]
    reads the whole tensor in one call."""
    for fw in FWS:
        f = pool["ours"][fw, "store"]
        m = f._src
        calls = []
        real_rows, real_into = m.read_rows, m.read_into
        m.read_rows = lambda h, n, r0, r1, *a: calls.append(("rows", n, r0, r1)) or real_rows(h, n, r0, r1, *a)
        m.read_into = lambda h, n, *a: calls.append(("into", n)) or real_into(h, n, *a)
        try:
            f.get_slice("f32.9x2")[3:7:2]
            f.get_slice("f32.9x2")[-1]
            f.get_slice("f32.9x2")[...]
            f.get_slice("f32.2x3x4")[1, 1:]
        finally:
            m.read_rows, m.read_into = real_rows, real_into
        assert calls == [("rows", b"f32.9x2", 3, 6), ("rows", b"f32.9x2", 8, 9),
                         ("into", b"f32.9x2"), ("rows", b"f32.2x3x4", 1, 2)], (fw, calls)


# -- whole tensors, keys, metadata, dtypes ---------------------------------------------


@pytest.mark.parametrize("fw", FWS)
def test_every_tensor_and_key_equals_official(pool, fw):
    o = pool["official"][fw]
    for opening in OPENINGS:
        f = pool["ours"][fw, opening]
        assert f.keys() == o.keys(), opening
        same_order(f.offset_keys(), o.offset_keys(), pool["path"], opening)
        assert f.metadata() == o.metadata() == {"format": "pt", "k": "v"}, opening
        for name in o.keys():
            code = pool["tensors"][name][0]
            s, os_ = f.get_slice(name), o.get_slice(name)
            assert s.get_shape() == os_.get_shape() and s.get_dtype() == os_.get_dtype(), name
            want = outcome(lambda: o.get_tensor(name))
            got = outcome(lambda: f.get_tensor(name))
            if fw == "np" and code in TWIN:  # no official numpy type: the twin's bytes
                same_value(got[1], o.get_tensor(f"{name}.twin").view(_safe_open.NUMPY_DTYPES[code]), name)
            else:
                same_outcome(got, want, f"{opening} {fw} get_tensor({name})")
        # get_tensors: the official fails on the first tensor it cannot read
        same_outcome_dict(outcome(f.get_tensors), outcome(o.get_tensors), f"{opening} {fw}",
                          pool["path"])


def offsets(path):
    """{name: (begin, end)} from the file's header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"}


def same_order(got, want, path, what):
    """The same names in file order (zero-size tensors at one offset may
    come in any order: the official orders such ties differently from run
    to run)."""
    pos = offsets(path)
    assert sorted(got) == sorted(want), what
    assert [pos[k] for k in got] == [pos[k] for k in want] == sorted(pos.values()), what


def same_outcome_dict(got, want, what, path=None):
    if not want[0]:
        same_error(got[1], want[1], what)
        return
    assert got[0], (what, got[1])
    if path:
        same_order(list(got[1]), list(want[1]), path, what)
    else:
        assert sorted(got[1]) == sorted(want[1]), what
    for k in want[1]:
        same_value(got[1][k], want[1][k], f"{what} {k}")


def test_f4_and_f6(pool):
    """F4 is torch's float4_e2m1fn_x2 (last dimension halved, which must be
    even); F6 is refused as the official refuses it; get_tensors fails as
    the official's does, on the first tensor it cannot read."""
    f = pool["ours"]["pt", "socket"]
    t = f.get_tensor("F4.2x4")
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (2, 2)
    assert tensor_bytes(t) == pool["tensors"]["F4.2x4"][2]
    with pytest.raises(SafetensorError, match="divisible by 2"):
        f.get_tensor("F4.4x1")
    # the official's order: tensor by tensor (F4.4x1 comes before the F6 ones)
    for h in (f, OFFICIAL(pool["path"], "pt")):
        with pytest.raises(SafetensorError, match="divisible by 2 in torch: got \\[4, 1\\]"):
            h.get_tensors()
    assert f.get_tensors(["F4.2x4"])["F4.2x4"].dtype == torch.float4_e2m1fn_x2
    with pytest.raises(SafetensorError, match="Dtype not understood: F6_E2M3"):
        f.get_tensors(["F4.2x4", "F6_E2M3.4"])


# -- arguments, closed handles, errors ----------------------------------------------------

FRAMEWORKS = ["pt", "torch", "pytorch", "np", "numpy", "tf2", "NP", "", None, 3]
DEVICES = ["cpu", None, "cuda", "cuda:0", "cuda:1", 0, 2, True, "cuda:", "cuda:x", "cuda:-1",
           "cuda:+1", "cuda:0:1", "cuda:99999999999999999999", "tpu", " cuda", "CPU", "cpu:0",
           -1, 1.0, 2 ** 64, b"cpu", "mps:1"]
BACKENDS = ["mmap", "pread", "x", "", None, 1]


def construct(fn):
    ok, v = outcome(fn)
    return (True, type(v).__name__) if ok else (False, v)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_arguments_as_official(pool, fw):
    """framework, device and backend checked as the official checks them
    (its classes and texts, in its order), for a file and for a model;
    only the frameworks and devices tensorvault does not serve differ for
    a model (a file goes to the official then)."""
    path, d = pool["path"], pool["d"]
    for dev in DEVICES:
        for be in BACKENDS:
            want = construct(lambda: OFFICIAL(path, fw, device=dev, backend=be))
            for what, fn in (
                    ("file", lambda: tensorvault.safe_open(path, fw, device=dev, backend=be,
                                                           socket=d.socket_path)),
                    ("model", lambda: tensorvault.safe_open("pool", fw, device=dev, backend=be,
                                                            store=d.store))):
                got = construct(fn)
                case = f"{what} framework={fw!r} device={dev!r} backend={be!r}"
                if want[0]:
                    assert got[0], (case, got[1])
                else:
                    same_error(got[1], want[1], case)


def test_torch_device_objects_are_taken(pool):
    """A torch.device (refused by the official) is taken, for a model and
    for a file (handed to the official as its string when the file is not
    served)."""
    d = pool["d"]
    for dev in (torch.device("cpu"), torch.device("cpu", 0)):
        with tensorvault.safe_open("pool", "pt", device=dev, store=d.store) as f:
            assert f.get_tensor("f32.4x3").device.type == "cpu"
        with tensorvault.safe_open(pool["path"], "pt", device=dev, socket=d.socket_path) as f:
            assert type(f) is tensorvault.safe_open


@pytest.mark.parametrize("opening", OPENINGS)
def test_closed_handle_rules(pool, opening):
    """After the with block every method raises "File is closed", a missing
    tensor too; a slice taken before still reads; __enter__/__exit__ again
    are fine."""
    d, path = pool["d"], pool["path"]
    kw = {"store": d.store} if opening == "store" else {"socket": d.socket_path}
    spec = path if opening == "file" else "pool"
    for fw in FWS:
        with tensorvault.safe_open(spec, fw, **kw) as f, OFFICIAL(path, fw) as o:
            sl, osl = f.get_slice("f32.2x3x4"), o.get_slice("f32.2x3x4")
        for call in ("keys", "offset_keys", "metadata", "get_tensors"):
            same_error(outcome(getattr(f, call))[1], outcome(getattr(o, call))[1], call)
        for call in ("get_tensor", "get_slice"):
            for name in ("f32.4x3", "no.such"):
                same_error(outcome(lambda: getattr(f, call)(name))[1],
                           outcome(lambda: getattr(o, call)(name))[1], f"{call}({name})")
        same_value(sl[1], osl[1], "slice after close")
        assert sl.get_shape() == [2, 3, 4] and sl.get_dtype() == "F32"
        assert f.__enter__() is f and f.__exit__(None, None, None) is False


@pytest.mark.parametrize("opening", OPENINGS)
def test_errors_as_official(pool, opening, tmp_path):
    d, path = pool["d"], pool["path"]
    kw = {"store": d.store} if opening == "store" else {"socket": d.socket_path}
    spec = path if opening == "file" else "pool"
    with tensorvault.safe_open(spec, "np", **kw) as f, OFFICIAL(path, "np") as o:
        for call in (lambda h: h.get_tensor("no.such"), lambda h: h.get_slice("no.such"),
                     lambda h: h.get_tensor(3), lambda h: h.get_slice(None)):
            same_error(outcome(lambda: call(f))[1], outcome(lambda: call(o))[1], "missing")
        e = outcome(lambda: f.get_tensor("no.such"))[1]
        assert isinstance(e, tensorvault.MissingTensorError) and not isinstance(e, KeyError)
        assert str(e) == "File does not contain tensor no.such"
    # a model or generation that does not exist is a FileNotFoundError, as a missing file is
    missing = str(tmp_path / "nothing.safetensors")
    want = outcome(lambda: OFFICIAL(missing, "np"))[1]
    assert type(want) is FileNotFoundError
    for fn in (lambda: tensorvault.safe_open(missing, "np", **kw),
               lambda: tensorvault.safe_open("no-such-model", "np", **kw),
               lambda: tensorvault.safe_open("pool", "np", generation=9, **kw)):
        e = outcome(fn)[1]
        assert isinstance(e, FileNotFoundError) and isinstance(e, SafetensorError), e
    e = outcome(lambda: tensorvault.safe_open("no-such-model", "np", **kw))[1]
    assert "no-such-model" in str(e) and "does not exist" in str(e), e


def test_the_official_classes():
    assert issubclass(tensorvault.Error, safetensors.SafetensorError)
    assert tensorvault.SafetensorError is safetensors.SafetensorError
    assert issubclass(tensorvault.NotFoundError, FileNotFoundError)
    assert not issubclass(tensorvault.MissingTensorError, KeyError)
    for name in ("serialize", "serialize_file", "deserialize", "TensorSpec"):
        assert getattr(tensorvault, name) is getattr(safetensors, name)
    import safetensors.torch as st_torch
    assert tensorvault.torch.save_file is st_torch.save_file


def test_without_safetensors(pool, tmp_path):
    """Without the safetensors package: tensorvault imports, its Error is
    its own SafetensorError, models and the files the registry holds read,
    and a file no generation holds is an Error saying the official package
    is missing."""
    stray = raw_file(str(tmp_path / "stray.safetensors"), {"a": ("U8", (3,), b"abc")})
    code = (
        "import sys\n"
        "sys.modules['safetensors'] = None\n"
        "import tensorvault\n"
        "print(tensorvault.SafetensorError.__module__, issubclass(tensorvault.Error, tensorvault.SafetensorError))\n"
        "with tensorvault.safe_open('pool', 'np', store=sys.argv[1]) as f:\n"
        "    print(f.get_tensor('U8.4x3').shape, f.get_slice('f32.9x2')[1:3].shape)\n"
        "with tensorvault.safe_open(sys.argv[2], 'np', socket=sys.argv[3]) as f:\n"
        "    print(type(f).__module__, f.get_tensor('I16.4x3').dtype)\n"
        "try:\n"
        "    tensorvault.safe_open(sys.argv[4], 'np', socket=sys.argv[3])\n"
        "except tensorvault.SafetensorError as e:\n"
        "    print('refused', 'safetensors package' in str(e))\n")
    d = pool["d"]
    p = subprocess.run([sys.executable, "-c", code, d.store, pool["path"], d.socket_path, stray],
                       capture_output=True, text=True, timeout=120, env=python_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["tensorvault._native True", "(4, 3) (2, 2)",
                                     "tensorvault._safe_open int16", "refused True"], p.stdout


# -- whole checkpoints drawn ------------------------------------------------------------

NAMES = st.text(alphabet=st.sampled_from("ab.0_\u00e9/"), min_size=1, max_size=6)
CODES = sorted(gen.DTYPES)
shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
checkpoints = st.fixed_dictionaries({
    "tensors": st.dictionaries(NAMES, st.tuples(st.sampled_from(CODES), shapes), min_size=1,
                               max_size=6),
    "metadata": st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.text(max_size=6),
                                                      max_size=3)),
    "seed": st.integers(0, 2 ** 16),
})


def hub_layout(root, blob_bytes):
    """A Hugging Face cache repository holding one file: the blob named by
    its SHA-256, the snapshot's link to it. Returns the link."""
    sha = hashlib.sha256(blob_bytes).hexdigest()
    blobs = os.path.join(root, "blobs")
    snap = os.path.join(root, "snapshots", "rev0")
    os.makedirs(blobs, exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    with open(os.path.join(blobs, sha), "wb") as f:
        f.write(blob_bytes)
    link = os.path.join(snap, "model.safetensors")
    os.symlink(os.path.join("..", "..", "blobs", sha), link)
    return link


def test_drawn_checkpoints_equal_official(pool):
    d = pool["d"]
    counter = iter(range(10 ** 6))

    @settings(max_examples=CKPT_EXAMPLES, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(ck=checkpoints)
    def check(ck):
        i = next(counter)
        rng = np.random.default_rng(ck["seed"])
        tensors = {k: (code, shape, gen.random_array(rng, gen.DTYPES[code], shape).tobytes())
                   for k, (code, shape) in ck["tensors"].items()}
        tmp = os.path.join(d.workdir, f"drawn{i}")  # under the daemon's import root
        flat = raw_file(os.path.join(tmp, "flat.safetensors"), tensors, ck["metadata"])
        with open(flat, "rb") as fh:
            link = hub_layout(os.path.join(tmp, f"models--org--m{i}"), fh.read())
        d.import_ok(f"drawn{i}", link, activate=True)
        for fw in FWS:
            o = OFFICIAL(link, fw)
            handles = {"store": tensorvault.safe_open(f"drawn{i}", fw, store=d.store),
                       "socket": tensorvault.safe_open(f"drawn{i}", fw, socket=d.socket_path),
                       "file": tensorvault.safe_open(link, fw, socket=d.socket_path)}
            assert type(handles["file"]) is tensorvault.safe_open  # by the blob's name
            for what, f in handles.items():
                assert f.keys() == o.keys() and f.metadata() == o.metadata(), what
                assert sorted(f.offset_keys()) == sorted(o.offset_keys()), what
                for name in o.keys():
                    code = tensors[name][0]
                    if fw == "np" and code in TWIN:
                        got = f.get_tensor(name)
                        assert got.dtype == _safe_open.NUMPY_DTYPES[code]
                        assert got.tobytes() == tensors[name][2], name
                        continue
                    same_outcome(outcome(lambda: f.get_tensor(name)),
                                 outcome(lambda: o.get_tensor(name)), f"{what} {fw} {name}")
                if not (fw == "np" and any(c in TWIN for c, _, _ in tensors.values())):
                    same_outcome_dict(outcome(f.get_tensors), outcome(o.get_tensors), what)
                f.__exit__(None, None, None)
        import safetensors.torch as st_torch
        want = st_torch.load_file(link)
        for kw in ({"store": d.store}, {"socket": d.socket_path}):
            got = tensorvault.torch.load_file(f"drawn{i}", **kw)
            assert list(got) == list(want) or sorted(got) == sorted(want)
            for k in want:
                same_value(got[k], want[k], k)
        got = tensorvault.torch.load_file(link, socket=d.socket_path)
        for k in want:
            same_value(got[k], want[k], k)

    check()
