"""Differential tests of tensorvault.safe_open(framework="pt") and
tensorvault.torch.load_file against safetensors 0.8 (safe_open with
framework="pt", safetensors.torch.load_file) on generated checkpoints
(every byte-addressable dtype, two shards and a single file, unaligned
offsets, zero-size and rank-0 tensors), in-process (store=) and through a
daemon: keys, offset_keys, metadata, every tensor's bytes, dtype and shape;
the generated table of slice expressions against the official slice (the
same values and strides, or the same error); get_tensors equals
per-tensor reads; zero-copy reads; device= handling; and, on this GPU-less
machine, CUDA devices failing cleanly with a tensorvault.Error (the CUDA
comparison itself is tests/gpu/py_cuda_cmp.py)."""
import ctypes

import numpy as np
import pytest
import torch
from safetensors import SafetensorError
from safetensors import safe_open as official_open
from safetensors.torch import load_file as official_load_file

import harness.checkpoints as gen
import tensorvault
import tensorvault.torch
from harness.daemon import serving
from tensorvault import _native, _safe_open
from .test_python_dropin import outcome, same_outcome
from .test_python_safe_open import (BAD_DEVICES, metadata_checkpoints, official_metadata,
                                    same_file_order, shard_files, slice_table)

BACKENDS = ["store", "socket"]


def official_pt(ckpt):
    """{name: tensor} (file order), sorted keys, offset_keys and
    {name: dtype string} from safetensors.safe_open(framework="pt")."""
    tensors, keys, offset_keys, dtypes = {}, [], [], {}
    for p in shard_files(ckpt):
        with official_open(p, framework="pt") as o:
            keys += o.keys()
            offset_keys += o.offset_keys()
            for k in o.offset_keys():
                tensors[k] = o.get_tensor(k)
                dtypes[k] = o.get_slice(k).get_dtype()
    return tensors, sorted(keys), offset_keys, dtypes


@pytest.fixture(scope="module")
def served(tmp_path_factory, build_dir):
    tmp = tmp_path_factory.mktemp("pytorch")
    rng = np.random.default_rng(111)
    tensors = gen.random_tensors(rng, 3 * len(gen.DTYPES), big_tensor_bytes=(1 << 20) + 20)
    tensors["rows.f32"] = np.arange(7 * 5 * 3, dtype=np.float32).reshape(7, 5, 3)
    tensors["rows.bf16"] = gen.random_array(rng, gen.DTYPES["BF16"], (9, 4))
    tensors["rows.u16"] = gen.random_array(rng, gen.DTYPES["U16"], (6, 4, 2))
    tensors["rows.e8m0"] = gen.random_array(rng, gen.DTYPES["F8_E8M0"], (5, 3))
    sharded = gen.write_checkpoint(str(tmp / "ck2"), tensors, 2)
    single = gen.write_checkpoint(str(tmp / "ck1"),
                                  gen.random_tensors(np.random.default_rng(112), len(gen.DTYPES)), 1,
                                  {"format": "pt"})
    ckpts = {"m": sharded, "one": single, **metadata_checkpoints(tmp)}
    with serving(build_dir, tmp, ckpts) as d:
        yield {"d": d, "sock": d.socket_path, "store": d.store, "ckpt": ckpts,
               "ref": {"m": official_pt(sharded), "one": official_pt(single)}}


def open_kw(served, backend):
    return {"store": served["store"]} if backend == "store" else {"socket": served["sock"]}


def open_tv(served, backend, spec="m", framework="pt", **kw):
    return tensorvault.safe_open(spec, framework=framework, **open_kw(served, backend), **kw)


def tbytes(t):
    if t.numel() == 0:
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().cpu().reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def same(a, b, what):
    assert isinstance(a, torch.Tensor), what
    assert a.dtype == b.dtype, (what, a.dtype, b.dtype)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert a.device == b.device, what
    assert tbytes(a) == tbytes(b), what


@pytest.mark.parametrize("model", ["m", "one"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_tensor_equals_official(served, backend, model):
    ref, keys, offset_keys, dtypes = served["ref"][model]
    assert any(v.dim() == 0 for v in ref.values()) and any(v.numel() == 0 for v in ref.values())
    assert {v.dtype for v in ref.values()} == {getattr(torch, n) for k, n in
                                               _safe_open.TORCH_DTYPES.items() if k != "F4"}
    for framework in ("pt", "torch", "pytorch"):
        with open_tv(served, backend, model, framework=framework) as f:
            assert f.keys() == keys
            same_file_order(f.offset_keys(), offset_keys, served["ckpt"][model])
            for name, want in ref.items():
                got = f.get_tensor(name)
                same(got, want, name)
                assert got.is_contiguous() and got.device.type == "cpu", name
                s = f.get_slice(name)
                assert s.get_shape() == list(want.shape) and s.get_dtype() == dtypes[name], name
            assert f.metadata() == official_metadata(served["ckpt"][model])[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_tensors_equals_per_tensor_reads(served, backend):
    ref = served["ref"]["m"][0]
    with open_tv(served, backend) as f:
        every = f.get_tensors()
        assert list(every) == f.offset_keys()
        for name, t in every.items():
            same(t, f.get_tensor(name), name)
            same(t, ref[name], name)
        pick = ["rows.u16", "odd.u8", "big.f32", "rows.e8m0", "rows.f32"]
        some = f.get_tensors(pick)
        assert list(some) == pick
        for name in pick:
            same(some[name], ref[name], name)
        assert f.get_tensors([]) == {}
        with pytest.raises(tensorvault.MissingTensorError):
            f.get_tensors(["rows.f32", "no.such"])


def test_reads_land_in_the_tensor_storage(served):
    """Zero copy: the library writes straight into torch.empty()'s storage
    (the pointer it is given is the returned tensor's data_ptr)."""
    with open_tv(served, "store") as f:
        seen = []
        real_into, real_batch = f._src.read_into, f._src.read_batch

        def into(h, name, dest, n, err):
            seen.append((name, dest, n))
            return real_into(h, name, dest, n, err)

        def batch(h, reqs, n, err):
            seen.extend((reqs[i].index, reqs[i].dest, reqs[i].dest_len) for i in range(n))
            return real_batch(h, reqs, n, err)

        f._src.read_into, f._src.read_batch = into, batch
        t = f.get_tensor("big.f32")
        assert seen == [(b"big.f32", t.data_ptr(), t.nbytes)]
        seen.clear()
        some = f.get_tensors(["rows.f32", "rows.bf16"])
        assert [(d, n) for _, d, n in seen] == [(v.data_ptr(), v.nbytes) for v in some.values()]
        assert len({t.untyped_storage().data_ptr() for t in some.values()}) == 2


def test_slices_equal_torch_and_official(served):
    """slice_table's expressions give the official slice (values, dtype,
    shape, strides, contiguity) or its error (class and text), through the
    store and the daemon."""
    ref, _, _, dtypes = served["ref"]["m"]
    shard_of = {}
    for p in shard_files(served["ckpt"]["m"]):
        with official_open(p, framework="pt") as o:
            shard_of.update({k: p for k in o.keys()})
    names = ["rows.f32", "rows.bf16", "rows.u16", "rows.e8m0", "big.f32"] + sorted(
        k for k, v in ref.items() if v.dim() >= 1 and v.shape[0] >= 3 and v.numel())
    n_ok = n_err = 0
    for backend in BACKENDS:
        with open_tv(served, backend) as f:
            for name in names:
                sl = f.get_slice(name)
                with official_open(shard_of[name], framework="pt") as o:
                    osl = o.get_slice(name)
                    for expr in slice_table(tuple(ref[name].shape)):
                        want = outcome(lambda: osl[expr])
                        same_outcome(outcome(lambda: sl[expr]), want, f"{backend}: {name}[{expr}]")
                        n_ok += want[0]
                        n_err += not want[0]
    assert n_ok > 400 and n_err > 20, (n_ok, n_err)
    with open_tv(served, "store") as f:
        sl = f.get_slice("rows.f32")
        assert sl[3, 2, 1].shape == () and sl[3, 2, 1].item() == 3 * 15 + 2 * 3 + 1
        assert sl[np.int64(2), np.int32(1)].shape == (3,)
        # what torch indexing of the whole tensor does, as the official
        same(sl[[0, 1]], ref["rows.f32"][[0, 1]], "a list")
        same(sl[..., ...], ref["rows.f32"], "two Ellipses")
        same(sl[None, 1], ref["rows.f32"][None, 1], "None")
        with pytest.raises(ValueError):
            sl[::-1]
        with pytest.raises(IndexError):
            sl[7]
        scalar = next(k for k, v in ref.items() if v.dim() == 0)
        same(f.get_slice(scalar)[...], ref[scalar], scalar)
        same(f.get_slice(scalar)[()], ref[scalar], scalar)


def test_slice_reads_only_the_rows_it_needs(served):
    calls = []
    ref = served["ref"]["m"][0]
    with open_tv(served, "socket") as f:
        real = f._src.read_rows

        def spy(h, name, r0, r1, dest, n, err):
            calls.append((name, r0, r1))
            return real(h, name, r0, r1, dest, n, err)

        f._src.read_rows = spy
        n = ref["big.f32"].shape[0]
        same(f.get_slice("big.f32")[1000:2001:10], ref["big.f32"][1000:2001:10], "strided")
        same(f.get_slice("big.f32")[-5:], ref["big.f32"][-5:], "negative (torch's rules)")
        same(f.get_slice("rows.u16")[-1, 1:], ref["rows.u16"][-1, 1:], "int")
        same(f.get_slice("rows.f32")[4:2], ref["rows.f32"][4:2], "empty")
    assert calls == [(b"big.f32", 1000, 2001), (b"big.f32", n - 5, n), (b"rows.u16", 5, 6)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_file_equals_official(served, backend):
    for model in ("m", "one"):
        want = {}
        for p in shard_files(served["ckpt"][model]):
            want.update(official_load_file(p))
        for dev in ("cpu", torch.device("cpu")):
            got = tensorvault.torch.load_file(model, device=dev, **open_kw(served, backend))
            assert sorted(got) == sorted(want)
            same_file_order(list(got), served["ref"][model][2], served["ckpt"][model])
            for name, t in want.items():
                same(got[name], t, name)
    got = tensorvault.torch.load_file("m", generation=1, **open_kw(served, backend))
    assert sorted(got) == served["ref"]["m"][1]
    with pytest.raises(tensorvault.Error) as e:
        tensorvault.torch.load_file("m", generation=99, **open_kw(served, backend))
    assert e.value.name == "TV_E_NOT_FOUND"


def test_device_arguments(served):
    for dev in ("cpu", torch.device("cpu"), torch.device("cpu", 0)):
        with open_tv(served, "store", device=dev) as f:
            assert f.get_tensor("rows.f32").device == torch.device("cpu")
    for dev, index in (("cuda", 0), ("cuda:0", 0), ("cuda:12", 12), (0, 0), (3, 3),
                       (np.int64(1), 1), (torch.device("cuda"), 0), (torch.device("cuda:2"), 2)):
        with open_tv(served, "store", device=dev) as f:  # opens; reads need the GPU
            assert f._fw.cuda == torch.device("cuda", index), dev
    for dev in BAD_DEVICES + ["cpu:0"]:  # as the official refuses them
        with pytest.raises((SafetensorError, ValueError)) as e:
            open_tv(served, "store", device=dev)
        with pytest.raises(Exception) as o:
            official_open(served["ckpt"]["one"], framework="pt", device=dev)
        assert isinstance(e.value, type(o.value)) and str(e.value) == str(o.value), dev
    for dev in (torch.device("meta"), "mps", "npu:1"):  # the official's only
        with pytest.raises(tensorvault.Error) as e:
            open_tv(served, "store", device=dev)
        assert e.value.name == "TV_E_NOT_SUPPORTED" and "not served by tensorvault" in e.value.message
    with pytest.raises(tensorvault.Error) as e:
        open_tv(served, "store", framework="numpy", device=torch.device("cuda:1"))
    assert str(e.value) == "Device cuda:1 is not supported for framework numpy"


def test_dtype_torch_lacks(served, monkeypatch):
    monkeypatch.setitem(_safe_open.TORCH_DTYPES, "BF16", "bfloat16_not_in_this_torch")
    with open_tv(served, "store") as f:
        for read in (lambda: f.get_tensor("rows.bf16"), lambda: f.get_tensors(["rows.f32", "rows.bf16"]),
                     lambda: f.get_slice("rows.bf16")[1:]):
            with pytest.raises(tensorvault.Error) as e:
                read()
            assert e.value.name == "TV_E_NOT_SUPPORTED"
            assert "rows.bf16" in e.value.message and "BF16" in e.value.message
        same(f.get_tensor("rows.f32"), served["ref"]["m"][0]["rows.f32"], "rows.f32")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: tests/gpu/py_cuda_cmp.py compares CUDA reads")
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_without_gpu_fails_cleanly(served, backend):
    """No GPU: every read of a CUDA handle raises tensorvault.Error (with a
    code) before anything is allocated; the library's own CUDA entry points
    refuse (TV_E_NOT_SUPPORTED) without touching the destination, and the
    same model handle then reads into host memory as before."""
    ref = served["ref"]["m"][0]
    for dev in ("cuda", "cuda:0", 0, torch.device("cuda:0")):
        with open_tv(served, backend, device=dev) as f:
            for read in (lambda: f.get_tensor("rows.f32"), lambda: f.get_tensors(),
                         lambda: f.get_tensors(["big.f32"]), lambda: f.get_slice("rows.f32")[1:3],
                         lambda: tensorvault.torch.load_file("m", device=dev, **open_kw(served, backend))):
                with pytest.raises(tensorvault.Error) as e:
                    read()
                assert e.value.code == _native.TV_E_NOT_SUPPORTED and "cuda:0" in e.value.message
            assert f.keys() == served["ref"]["m"][1]
            assert f.get_slice("rows.f32").get_shape() == [7, 5, 3]
            src, err = f._src, _native.tv_error()
            bogus = 0x1000  # never dereferenced: no CUDA device is found first
            assert src.read_into_cuda(src.h, b"rows.f32", bogus, 420, None, err) == _native.TV_E_NOT_SUPPORTED
            assert "CUDA" in err.msg.decode()
            reqs = (_native.tv_read_req * 2)()
            for r, name in zip(reqs, (b"rows.f32", b"big.f32")):
                r.name, r.dest, r.dest_len = name, bogus, 1 << 22
            assert src.read_batch_cuda(src.h, reqs, 2, None, err) == _native.TV_E_NOT_SUPPORTED
            assert [r.result for r in reqs] == [_native.TV_E_NOT_SUPPORTED] * 2
            host = torch.empty(7, 5, 3)
            assert src.read_into(src.h, b"rows.f32", host.data_ptr(), host.nbytes, err) == 0
            same(host, ref["rows.f32"], "host read after the CUDA refusal")
    with open_tv(served, backend) as f:
        same(f.get_tensor("big.f32"), ref["big.f32"], "a CPU handle afterwards")
    assert served["d"].alive()


def test_cuda_branch_plumbing(served, monkeypatch):
    """The CUDA branch with its device parts replaced by host stand-ins: the
    reads go to the *_cuda entry points with the stream on_stream hands
    them, under the lock, and the results come back as the host reads do."""
    ref = served["ref"]["m"][0]
    for backend in BACKENDS:
        with open_tv(served, backend, device="cuda:0") as f:
            fw, src = f._fw, f._src
            calls = []
            monkeypatch.setattr(fw, "check_cuda", lambda: calls.append("check"))
            monkeypatch.setattr(fw, "empty", lambda info, shape, on_device=True: torch.empty(
                shape, dtype=fw.dtype(info)))
            monkeypatch.setattr(fw, "to_device", lambda t: calls.append("to_device") or t)

            def on_stream(call):
                lock = f._src.lock  # an RLock: held by this thread
                assert lock._is_owned() if hasattr(lock, "_is_owned") else lock.locked()
                calls.append("stream")
                return call(ctypes.c_void_p(0xC0DA))

            monkeypatch.setattr(fw, "on_stream", on_stream)
            into, batch = src.read_into, src.read_batch

            def into_cuda(h, name, dest, n, stream, err):
                assert stream.value == 0xC0DA
                calls.append(("into_cuda", name))
                return into(h, name, dest, n, err)

            def batch_cuda(h, reqs, n, stream, err):
                assert stream.value == 0xC0DA
                calls.append(("batch_cuda", n))
                return batch(h, reqs, n, err)

            src.read_into_cuda, src.read_batch_cuda = into_cuda, batch_cuda
            src.read_into = src.read_batch = None  # a host read would fail
            same(f.get_tensor("rows.u16"), ref["rows.u16"], "get_tensor")
            got = f.get_tensors(["rows.f32", "big.f32"])
            same(got["big.f32"], ref["big.f32"], "get_tensors")
            same(f.get_slice("rows.bf16")[2:5, 1], ref["rows.bf16"][2:5, 1], "slice")
            assert calls == ["stream", ("into_cuda", b"rows.u16"), "stream", ("batch_cuda", 2),
                             "check", "to_device"]
