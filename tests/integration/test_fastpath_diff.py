"""Differential tests of the fast path: every tensor of generated checkpoints
(every dtype, unaligned offsets, zero-size and scalar tensors, a tensor over
several 1 MiB slots; one two-shard checkpoint and one single file) read
with the model opened through tensorvaultd's socket (tests/tools/tv_dump
--fastpath: host, batch, rows, f32, get; guard bytes around every
destination) equals the same read call on the model opened in-process
(tv_dump on the same store, same mode) and the official safetensors loader:
bytes, dtype and shape; f32 equals numpy's conversion bit for bit.
Then the CLI: `tensorvault get --fastpath` and `bench --fastpath` in the
README's daemon layout (run where the daemon runs: var/run/tensorvault.sock)
and with an explicit SOCKET, and the errors (no daemon, unknown model)."""
import json
import os

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import serving
from harness.store import reference_tensors
from .test_read import dump as tv_dump

MODES = ["host", "batch", "rows", "f32", "get"]


@pytest.fixture(scope="module")
def served(tmp_path_factory, build_dir, every_float_value):
    """A daemon (README layout: store ./var, socket var/run/tensorvault.sock)
    serving "m" (two shards) and "one" (a single file)."""
    tmp = tmp_path_factory.mktemp("fpdiff")
    rng = np.random.default_rng(10)
    tensors = gen.random_tensors(rng, 3 * len(gen.DTYPES), big_tensor_bytes=(3 << 20) + 12)
    tensors.update(every_float_value)
    sharded = gen.write_checkpoint(str(tmp / "ck2"), tensors, 2)
    single = gen.write_checkpoint(str(tmp / "ck1"),
                                  gen.random_tensors(np.random.default_rng(11), 2 * len(gen.DTYPES),
                                                     big_tensor_bytes=(1 << 20) + 20), 1)
    with serving(build_dir, tmp, {"m": sharded, "one": single}) as d:
        yield {"d": d, "sock": d.socket_path, "store": d.store,
               "ref": {"m": reference_tensors(sharded), "one": reference_tensors(single)}}


def read(path):
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("model", ["m", "one"])
@pytest.mark.parametrize("mode", MODES)
def test_every_tensor_equals_reader_and_official_loader(build_dir, f32_from, served, tmp_path,
                                                        model, mode):
    ref = served["ref"][model]
    got = tv_dump(build_dir, None, model, mode, tmp_path / "fp", sock=served["sock"])
    inproc = tv_dump(build_dir, served["store"], model, mode, tmp_path / "tv")
    if mode != "f32":
        assert set(got) == set(ref)
    checked = set()
    for name, (dtype, shape, data) in ref.items():
        if mode == "f32" and dtype not in f32_from:
            assert name not in got, name  # no conversion: skipped, no file
            continue
        meta, path = got[name]
        assert meta["dtype"] == dtype and meta["shape"] == shape, name
        mine = read(path)
        assert mine == read(inproc[name][1]), name  # the in-process reader
        if mode == "f32":
            want = np.frombuffer(data, dtype=f32_from[dtype]).astype(np.float32)
            assert mine == want.tobytes(), name  # numpy's conversion, bit for bit
            checked.add(dtype)
        else:
            assert mine == data, name  # the official loader
    if mode == "f32" and model == "m":
        assert checked == set(f32_from)


def test_cli_get_through_readme_layout(tv, served, tmp_path):
    """`tensorvault get --fastpath` run where the daemon runs finds
    var/run/tensorvault.sock; --rows and --f32 work the same."""
    d, ref = served["d"], served["ref"]["m"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    big = ref["big.f32"][2]
    out = tmp_path / "o.bin"
    for args, want in (([], big),
                       (["--rows", "100:7000"], big[400:28000]),
                       (["--f32"], big)):
        tv("get", "m", "big.f32", "--fastpath", *args, "-o", out, cwd=d.workdir, env=env,
           check=True)
        assert out.read_bytes() == want, args
    # Every tensor by name through an explicit SOCKET, and the in-process twin.
    for name, (_, _, data) in sorted(ref.items()):
        tv("get", "--fastpath", served["sock"], "m", name, "-o", out, check=True)
        assert out.read_bytes() == data, name
    p = tv("get", "--fastpath", served["sock"], "m", "big.f32", "-o", "-", "--json")
    assert p.returncode == 2  # -o - with --json: a usage error, as without --fastpath
    doc = json.loads(tv("get", "--fastpath", served["sock"], "one@1", "big.f32", "-o", out,
                        "--json", check=True).stdout)
    assert doc["model"] == "one" and doc["generation"] == 1
    assert doc["bytes"] == len(served["ref"]["one"]["big.f32"][2])


def test_cli_bench_both_ways(tv, served):
    d, ref = served["d"], served["ref"]["m"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    total = sum(len(x) for _, _, x in ref.values())
    fp = json.loads(tv("bench", "m", "--fastpath", "--json", cwd=d.workdir, env=env,
                       check=True).stdout)
    local = json.loads(tv("bench", "--store", served["store"], "m", "--json",
                          check=True).stdout)
    assert fp["path"] == "fastpath" and local["path"] == "in-process"
    for doc in (fp, local):
        assert doc["bytes"] == total and doc["tensors"] == len(ref)
        assert doc["model"] == "m" and doc["generation"] == 1
    # The same text line either way; $TENSORVAULT_SOCKET as the default.
    p = tv("bench", "m", "--fastpath", env={**env, "TENSORVAULT_SOCKET": served["sock"]},
           check=True)
    assert p.stdout.startswith(f"m@1: {len(ref)} tensors, {total} bytes in "), p.stdout
    lat = json.loads(tv("bench", "--fastpath", served["sock"], "m", "--latency", "odd.u8",
                        "--count", "50", "--json", check=True).stdout)
    assert lat["path"] == "fastpath" and lat["count"] == 50 and lat["p50_us"] > 0


def test_cli_fastpath_no_daemon(tv, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    out = tmp_path / "o"
    # No daemon where the default socket would be: the message names it.
    p = tv("get", "m", "odd.u8", "--fastpath", "-o", out, cwd=tmp_path, env=env)
    assert p.returncode == 1 and "TV_E_NO_DAEMON" in p.stderr, p.stderr
    assert "var/run/tensorvault.sock" in p.stderr
    p = tv("bench", "m", "--fastpath", "--json", cwd=tmp_path, env=env)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_NO_DAEMON"
    p = tv("bench", "m", "--fastpath", env={**env, "TENSORVAULT_SOCKET": str(tmp_path / "x.sock")})
    assert p.returncode == 1 and "x.sock" in p.stderr, p.stderr
    assert not out.exists()


def test_cli_fastpath_errors(tv, served, tmp_path):
    out = tmp_path / "o"
    p = tv("get", "--fastpath", served["sock"], "nosuch", "w", "-o", out)
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    p = tv("get", "--fastpath", served["sock"], "m", "no.such.tensor", "-o", out)
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    p = tv("get", "--fastpath", served["sock"], "m@9", "odd.u8", "-o", out)
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    p = tv("get", "--fastpath", served["sock"], "m", "odd.u8", "--rows", "5:2", "-o", out)
    assert p.returncode == 2  # R0 > R1: a usage error, before anything is opened
