"""CLI strictness, end to end: one generation grammar for every command,
--rows and size grammars, bounded --qd/--chunk, --region-offset refused when
unaligned, --replicas lists, `-o -`, option misuse (twice, unknown, missing
value, extra arguments), every command on a path that is not a store, and
error messages that are not built from their own buffer."""
import json
import os
import re

import ml_dtypes
import numpy as np
import pytest

import harness.checkpoints as gen

GEN_BAD = ["+1", " 1", "1 ", "01", "0", "-1", "", "1x", "9223372036854775808",
           "99999999999999999999"]
ROWS_BAD = ["1:2x", "-1:2", "1:-2", "+1:2", " 1:2", "1: 2", "1:2 ", "1:", ":2", "1", ":", "",
            "3:2", "1:18446744073709551616", "0x1:2", "1.0:2"]
SIZE_BAD = ["1GB", "1gb", "1KB", "1B", "1.5G", "1 G", " 1G", "1G ", "+1G", "-1", "1P", "0x10",
            "1e3", "G", "1Gi", "16777216T", "18446744073709551616", "99999999999999999999999T"]
SIZE_OK = {"64M": 64 << 20, "64m": 64 << 20, "64MiB": 64 << 20, "64mib": 64 << 20,
           "64MIB": 64 << 20, "65536K": 64 << 20, "65536kib": 64 << 20, "65536KiB": 64 << 20,
           "67108864": 64 << 20, "1G": 1 << 30, "1g": 1 << 30, "1GiB": 1 << 30, "1gib": 1 << 30,
           "1T": 1 << 40, "1tib": 1 << 40, "1TiB": 1 << 40}


@pytest.fixture(scope="module")
def st(tmp_path_factory, build_dir):
    """A store with one model, two generations (tensors w [8, 8] F32, h
    BF16, z [0, 4], s scalar)."""
    import subprocess
    tmp = tmp_path_factory.mktemp("cli")
    exe = os.path.join(build_dir, "tensorvault")
    tensors = {
        "w": np.arange(64, dtype=np.float32).reshape(8, 8),
        "h": np.arange(48, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(6, 8),
        "z": np.zeros((0, 4), dtype=np.float32),
        "s": np.array(3.0, dtype=np.float32),
    }
    ck = gen.write_checkpoint(str(tmp / "ck"), tensors, 1)
    store = str(tmp / "store")
    for args in (["store", "init", "--store", store, "--image", str(tmp / "img"), "--size", "16M"],
                 ["import", "--store", store, "m", ck, "--activate"],
                 ["import", "--store", store, "m", ck]):
        p = subprocess.run([exe, *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    return store, tensors


def usage_error(p, value):
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == ""
    assert f"'{value}'" in p.stderr, p.stderr


# ---- generations ------------------------------------------------------------

@pytest.mark.parametrize("g", GEN_BAD)
def test_generation_grammar_everywhere(tv, st, tmp_path, g):
    store, _ = st
    forms = [
        ("activate", "--store", store, "m", g),
        ("retire", "--store", store, "m", g),
        ("tensors", "--store", store, f"m@{g}"),
        ("get", "--store", store, f"m@{g}", "w", "-o", tmp_path / "o"),
        ("bench", "--store", store, f"m@{g}"),
    ]
    for f in forms:
        usage_error(tv(*f), g)
    assert not (tmp_path / "o").exists()


def test_generation_good_forms(tv, st, tmp_path):
    store, t = st
    assert json.loads(tv("tensors", "--store", store, "m@2", "--json", check=True).stdout)[
        "generation"] == 2
    tv("get", "--store", store, "m@1", "w", "-o", tmp_path / "o", check=True)
    assert (tmp_path / "o").read_bytes() == t["w"].tobytes()
    tv("activate", "--store", store, "m", "1", check=True)
    # A well-formed generation that does not exist is a failure, not usage.
    p = tv("activate", "--store", store, "m", "9223372036854775807")
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr


# ---- rows -------------------------------------------------------------------

@pytest.mark.parametrize("rows", ROWS_BAD)
def test_rows_grammar(tv, st, tmp_path, rows):
    store, _ = st
    p = tv("get", "--store", store, "m", "w", "--rows", rows, "-o", tmp_path / "o")
    if rows == "":
        assert p.returncode == 2 and "--rows" in p.stderr
    else:
        usage_error(p, rows)
    assert not (tmp_path / "o").exists()


def test_rows_ranges(tv, st, tmp_path):
    store, t = st
    out = tmp_path / "o"
    w = t["w"]
    # R0 == R1 is an empty read, as numpy's w[3:3].
    tv("get", "--store", store, "m", "w", "--rows", "3:3", "-o", out, check=True)
    assert out.read_bytes() == w[3:3].tobytes() == b""
    tv("get", "--store", store, "m", "w", "--rows", "8:8", "-o", out, check=True)
    assert out.read_bytes() == b""
    tv("get", "--store", store, "m", "z", "--rows", "0:0", "-o", out, check=True)
    assert out.read_bytes() == b""
    tv("get", "--store", store, "m", "w", "--rows", "006:008", "-o", out, check=True)
    assert out.read_bytes() == w[6:8].tobytes()
    # Past dim 0 (numpy would clamp): refused, against the tensor, before
    # any buffer is allocated (a huge R1 would need exabytes).
    for rows in ("0:9", "8:9", "0:18446744073709551615", "18446744073709551615:18446744073709551615"):
        p = tv("get", "--store", store, "m", "w", "--rows", rows, "-o", out)
        assert p.returncode == 1 and "TV_E_INVALID_ARG" in p.stderr, (rows, p.stderr)
        assert "outside [0, 8)" in p.stderr
    p = tv("get", "--store", store, "m", "s", "--rows", "0:0", "-o", out)
    assert p.returncode == 1 and "scalar" in p.stderr


# ---- sizes, --qd, --chunk -----------------------------------------------------

@pytest.mark.parametrize("size", SIZE_BAD)
def test_size_grammar(tv, st, tmp_path, size):
    store, _ = st
    usage_error(tv("store", "init", "--store", tmp_path / "s", "--image", tmp_path / "i",
                   "--size", size), size)
    assert not (tmp_path / "i").exists() and not (tmp_path / "s").exists()
    usage_error(tv("bench", "--store", store, "m", "--chunk", size), size)
    usage_error(tv("get", "--store", store, "m", "w", "-o", tmp_path / "o", "--chunk", size), size)
    usage_error(tv("import", "--store", store, "m2", tmp_path, "--chunk", size), size)
    usage_error(tv("store", "init", "--store", tmp_path / "s", "--image", tmp_path / "i",
                   "--size", "16M", "--region-offset", size), size)
    usage_error(tv("store", "init", "--store", tmp_path / "s", "--image", tmp_path / "i",
                   "--size", "16M", "--region-size", size), size)


def test_size_suffixes_are_binary(tv, tmp_path):
    for i, (s, n) in enumerate(SIZE_OK.items()):
        img = tmp_path / f"i{i}"
        doc = json.loads(tv("store", "init", "--store", tmp_path / f"s{i}", "--image", img,
                            "--size", s, "--json", check=True).stdout)
        assert os.path.getsize(img) == n, s
        assert doc["region_offset"] == 1 << 20
        os.unlink(img)  # sparse anyway; keep the tmp dir small


def test_help_states_the_grammars(tv):
    """The top --help states every grammar; a command's --help those of
    the values it takes."""
    size = ("KiB, MiB, GiB, TiB", "any case", "powers of 1024", "1GB")
    for args, words in ((["--help"], size + ("GEN:", "R0:R1")),
                        (["store", "init", "--help"], size),
                        (["get", "--help"], size + ("GEN:", "R0:R1")),
                        (["bench", "-h"], size + ("GEN:",)),
                        (["import", "--help"], size),
                        (["retire", "--help"], ("GEN:",))):
        p = tv(*args)
        assert p.returncode == 0, args
        for word in words:
            assert word in p.stdout, (args, word)


@pytest.mark.parametrize("args,value", [
    (["--qd", "0"], "0"), (["--qd", "4097"], "4097"), (["--qd", "-1"], "-1"),
    (["--qd", "+4"], "+4"), (["--qd", "1K"], "1K"), (["--qd", "18446744073709551617"], None),
    (["--chunk", "4095"], "4095"), (["--chunk", "2G"], "2G"),
    (["--chunk", "4194304T"], "4194304T"),        # 2^62: corrupted the heap before
    (["--chunk", "16777215T"], "16777215T"),      # just under 2^64
    (["--chunk", "18446744073709551615"], "18446744073709551615"),
    (["--qd", "2048", "--chunk", "1M"], None),     # staging 2 GiB over the cap
    (["--count", "0"], "0"), (["--count", "x"], "x"),
])
def test_read_options_bounded(tv, st, tmp_path, args, value):
    store, _ = st
    extra = ["--latency", "w"] if "--count" in args else []
    for cmd in (["bench", "--store", store, "m", *extra],
                ["get", "--store", store, "m", "w", "-o", tmp_path / "o"]):
        if cmd[0] == "get" and "--count" in args:
            continue
        p = tv(*cmd, *args)
        assert p.returncode == 2, (cmd, args, p.stderr)
        if value is not None:
            assert f"'{value}'" in p.stderr, p.stderr
        else:
            assert "staging" in p.stderr or "outside" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_read_options_in_bounds_work(tv, st, tmp_path):
    store, t = st
    for args in (["--qd", "1", "--chunk", "4K"], ["--qd", "4096", "--chunk", "4k"],
                 ["--chunk", "64MiB", "--qd", "1", "--engine", "pread"], ["--chunk", "5000"]):
        tv("get", "--store", store, "m", "w", "-o", tmp_path / "o", *args, check=True)
        assert (tmp_path / "o").read_bytes() == t["w"].tobytes(), args
    tv("bench", "--store", store, "m", "--latency", "w", "--count", "3", check=True)


# ---- store init --region-offset ---------------------------------------------

def test_region_offset_refused_not_rounded(tv, tmp_path):
    p = tv("store", "init", "--store", tmp_path / "s", "--image", tmp_path / "i", "--size", "16M",
           "--region-offset", "6000")
    assert p.returncode == 1 and "TV_E_INVALID_ARG" in p.stderr, p.stderr
    assert "6000" in p.stderr and "io alignment 4096" in p.stderr
    usage_error(tv("store", "init", "--store", tmp_path / "s", "--image", tmp_path / "i",
                   "--size", "16M", "--region-offset", "0"), "0")
    doc = json.loads(tv("store", "init", "--store", tmp_path / "s2", "--image", tmp_path / "i2",
                        "--size", "16M", "--region-offset", "8k", "--region-size", "4M", "--json",
                        check=True).stdout)
    assert doc["region_offset"] == 8192 and doc["region_bytes"] == 4 << 20


# ---- --replicas ---------------------------------------------------------------

@pytest.mark.parametrize("rep", [",,", ",", "", "a,,b", "1,", ",1", "1,1", "a,b,a"])
def test_replicas_list(tv, st, rep, tmp_path):
    store, _ = st
    before = tv("generations", "--store", store, "m", "--json", check=True).stdout
    p = tv("import", "--store", store, "m", tmp_path, "--replicas", rep)
    if rep == "":
        assert p.returncode == 2 and "--replicas" in p.stderr
    else:
        usage_error(p, rep)
    assert tv("generations", "--store", store, "m", "--json", check=True).stdout == before


# ---- -o - -----------------------------------------------------------------------

def test_output_to_stdout_is_byte_identical(build_dir, st, tmp_path):
    import subprocess
    store, t = st
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    for extra in ([], ["--rows", "2:5"], ["--f32"], ["--rows", "1:1"]):
        for name in ("w", "h", "z"):
            if name == "z" and extra[:1] == ["--rows"]:
                continue
            f = tmp_path / "f.bin"
            a = subprocess.run([exe, "get", "--store", store, "m", name, "-o", str(f), *extra],
                               capture_output=True)
            b = subprocess.run([exe, "get", "--store", store, "m", name, "-o", "-", *extra],
                               capture_output=True, cwd=tmp_path)
            assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
            assert a.stdout == b""
            assert b.stdout == f.read_bytes(), (name, extra)
            if not extra:
                assert b.stdout == t[name].tobytes()
    assert not (tmp_path / "-").exists()
    p = subprocess.run([exe, "get", "--store", store, "m", "w", "-o", "-", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""


# ---- option misuse, for every command -------------------------------------------

def commands(store, tmp):
    return {
        "inspect": ["inspect", str(tmp)],
        "store": ["store", "init", "--store", str(tmp / "n"), "--image", str(tmp / "ni"),
                  "--size", "16M"],
        "import": ["import", "--store", store, "m9", str(tmp)],
        "models": ["models", "--store", store, "m"],  # NAME is optional: extra-arg is a second
        "generations": ["generations", "--store", store, "m"],
        "tensors": ["tensors", "--store", store, "m"],
        "devices": ["devices", "--store", store],
        "activate": ["activate", "--store", store, "m", "1"],
        "retire": ["retire", "--store", store, "m", "7"],
        "gc": ["gc", "--store", store],
        "verify": ["verify", "--store", store],
        "get": ["get", "--store", store, "m", "w", "-o", str(tmp / "o")],
        "bench": ["bench", "--store", store, "m"],
    }


def test_option_misuse_everywhere(tv, st, tmp_path):
    store, _ = st
    for name, args in commands(store, tmp_path).items():
        p = tv(*args, "--json", "--json")
        assert p.returncode == 2 and "--json given twice" in p.stderr, (name, p.stderr)
        p = tv(*args, "--bogus")
        assert p.returncode == 2 and "'--bogus'" in p.stderr, (name, p.stderr)
        p = tv(*args, "extra-arg")
        assert p.returncode == 2 and "'extra-arg'" in p.stderr, (name, p.stderr)
        if "--store" in args:
            i = args.index("--store")
            p = tv(*args[:i], *args[i + 2:], "--store")
            assert p.returncode == 2 and "--store needs a value" in p.stderr, (name, p.stderr)
            p = tv(*args[:i], *args[i + 2:], "--store", "--json")
            assert p.returncode == 2 and "--store needs a value" in p.stderr, (name, p.stderr)
            p = tv(*args, "--store", store)
            assert p.returncode == 2 and "--store given twice" in p.stderr, (name, p.stderr)
    # Nothing above ran a command: the store is unchanged and nothing was created.
    assert not (tmp_path / "n").exists() and not (tmp_path / "ni").exists()
    assert not (tmp_path / "o").exists()
    p = tv("get", "--store", store, "m", "w", "-o", tmp_path / "o", "--output", tmp_path / "p")
    assert p.returncode == 2
    p = tv("store", "frob")
    assert p.returncode == 2 and "'frob'" in p.stderr


# ---- not a store ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["missing", "file", "empty", "fake"])
def test_not_a_store_every_command(tv, tmp_path, kind):
    d = tmp_path / "d"
    if kind == "file":
        d.write_bytes(b"x")
    elif kind == "empty":
        d.mkdir()
    elif kind == "fake":  # looks like a reader's store but has no registry
        (d / "snapshots" / "m").mkdir(parents=True)
        (d / "snapshots" / "m" / "active").write_text("1\n")
    for name, args in commands(str(d), tmp_path).items():
        if name in ("inspect", "store"):
            continue
        p = tv(*args)
        assert p.returncode == 1, (name, p.stderr)
        if kind == "fake":  # a store directory that lost its registry
            want = "TV_E_REGISTRY"
            assert f"registry {d}/registry.db is missing" in p.stderr, (name, p.stderr)
        else:
            want = "TV_E_NOT_FOUND"
            assert f"{d} is not a tensorvault store" in p.stderr, (name, p.stderr)
        assert want in p.stderr, (name, p.stderr)
        assert "SQLite" not in p.stderr, (name, p.stderr)
        p = tv(*args, "--json")
        assert p.returncode == 1
        assert json.loads(p.stdout)["error"]["code"] == want, name
    # No command created anything there.
    if kind == "missing":
        assert not d.exists()
    elif kind in ("empty", "fake"):
        assert not (d / "registry.db").exists() and not (d / "lock").exists()


# ---- messages not built from their own buffer ---------------------------------------

def repeated(msg, path):
    """A run of 24+ characters that occurs twice (once the legitimately
    repeated path is shortened): the trace of a message formatted into its
    own buffer."""
    return re.search(r"(.{24,}).*\1", msg.replace(str(path), "IMG"))


def test_label_error_message_not_garbled(tv, tmp_path):
    ck = gen.write_checkpoint(str(tmp_path / "ck"), {"w": np.ones((4, 4), np.float32)}, 1)
    s, img = tmp_path / "s", tmp_path / "img"
    tv("store", "init", "--store", s, "--image", img, "--size", "16M", check=True)
    tv("import", "--store", s, "m", ck, "--activate", check=True)
    os.truncate(img, 4096)  # the label block is now past the end
    p = tv("devices", "--store", s)
    line = next(ln for ln in p.stdout.splitlines() if str(img) in ln)
    assert "label unreadable" in line and not repeated(line, img), line
    p = tv("get", "--store", s, "m", "w", "-o", tmp_path / "o")
    # The reader excludes the shrunken device (replica failover) and names why.
    assert p.returncode == 1 and "TV_E_DEVICE_MISMATCH" in p.stderr and "resized" in p.stderr
    assert not repeated(p.stderr, img), p.stderr


def test_every_command_answers_help(tv):
    """Every command of `tensorvault --help` answers --help (and -h) with its
    usage line, exit 0, listing every flag its line names."""
    import re
    top = tv("--help")
    assert top.returncode == 0
    lines = [ln.strip() for ln in top.stdout.split("\n\n")[1].splitlines()[1:] if ln.strip()]
    assert len(lines) >= 29, lines
    for line in lines:
        words = line.split()
        n = 2 if words[0] in ("store", "alias", "token") or words[:2] == ["fleet", "alias"] else 1
        cmd = words[:n]
        for flag in ("--help", "-h"):
            p = tv(*cmd, flag)
            assert p.returncode == 0, (cmd, flag, p.stderr)
            assert p.stdout.splitlines()[0] == f"usage: tensorvault {line}", (cmd, p.stdout)
        for opt in re.findall(r"--[a-z-]+", line):
            assert opt in p.stdout, (cmd, opt)
    # A two-word command's first word alone: every subcommand's usage.
    p = tv("token", "--help")
    assert p.returncode == 0 and p.stdout.count("usage: tensorvault token ") == 3
    p = tv("alias")
    assert p.returncode == 2 and p.stderr.count("usage: tensorvault alias ") == 3


# ---- the registry commands through the in-process API ----------------------

def test_registry_commands_local(tv, tmp_path):
    """alias set/list/rm, generation, tensor, activate by alias, rollback,
    retire, delete, status and version through --store: the documents of
    API9 (docs/openapi.yaml), the same ones the daemon serves."""
    t1 = {"a/b c%": np.arange(6, dtype=np.float32).reshape(2, 3), "w": np.ones(4, np.float32)}
    t2 = {"a/b c%": np.zeros((2, 3), np.float32), "w": np.full(4, 2, np.float32)}
    ck1 = gen.write_checkpoint(str(tmp_path / "c1"), t1, 1)
    ck2 = gen.write_checkpoint(str(tmp_path / "c2"), t2, 2)
    s = str(tmp_path / "s")
    tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "64M", check=True)

    def js(*args):
        p = tv(*args, "--store", s, "--json")
        assert p.returncode == 0, (args, p.stderr)
        return json.loads(p.stdout)

    r = js("import", "org/m", ck1, "--activate")
    assert (r["model"], r["generation"], r["active"], r["n_tensors"]) == ("org/m", 1, True, 2)
    assert js("import", "org/m", ck2)["generation"] == 2
    r3 = js("import", "org/m", ck2, "--alias", "canary")  # deduplicated: nothing written
    assert (r3["generation"], r3["aliases"], r3["written_bytes"]) == (3, ["canary"], 0)
    assert js("alias", "rm", "org/m", "canary")["generation"] == 3
    assert js("retire", "org/m", "3")["state"] == "retired"
    p = tv("import", "--store", s, "org/m", ck2, "--alias", "9x")
    assert p.returncode == 1 and "TV_E_NAME" in p.stderr  # refused before the import
    assert js("models", "org/m")["n_generations"] == 3
    # Aliases: set, listed on the model and its generation, used as NAME@ALIAS.
    a = js("alias", "set", "org/m", "prod", "2")
    assert a == {"model": "org/m", "alias": "prod", "generation": 2}
    assert js("alias", "list", "org/m")["aliases"] == [a]
    # The reader opens NAME@ALIAS: get reads generation 2's bytes.
    tv("get", "--store", s, "org/m@prod", "w", "-o", tmp_path / "w2", check=True)
    assert (tmp_path / "w2").read_bytes() == t2["w"].tobytes()
    m = js("models", "org/m")
    assert m["active_generation"] == 1 and m["aliases"] == {"prod": 2} and m["n_generations"] == 3
    g = js("generation", "org/m@prod")
    assert g["generation"] == 2 and g["aliases"] == ["prod"] and not g["active"]
    assert g["n_shards"] == len(g["shards"]) == 2 and all(sh["sha256"] for sh in g["shards"])
    t = js("tensor", "org/m@prod", "a/b c%")
    assert (t["name"], t["dtype"], t["shape"], t["nbytes"]) == ("a/b c%", "F32", [2, 3], 24)
    assert t["data_offsets"][1] - t["data_offsets"][0] == 24 and len(t["replicas"]) == 1
    listed = js("tensors", "org/m@1", "--order", "name")
    assert [x["name"] for x in listed["tensors"]] == ["a/b c%", "w"]
    assert listed["next_cursor"] is None and "replicas" not in listed["tensors"][0]
    assert [x["name"] for x in js("tensors", "org/m", "--prefix", "a/")["tensors"]] == ["a/b c%"]
    page = js("tensors", "org/m", "--limit", "1", "--order", "name")
    assert len(page["tensors"]) == 1 and page["next_cursor"]
    # Text output is rendered from the same documents.
    p = tv("alias", "list", "org/m", "--store", s)
    assert p.stdout.split() == ["ALIAS", "GENERATION", "prod", "2"]
    # activate by alias, rollback to the one below, retire refuses the aliased one.
    assert js("activate", "org/m", "prod")["generation"] == 2
    assert js("models", "org/m")["active_generation"] == 2
    assert js("rollback", "org/m")["generation"] == 1
    p = tv("retire", "org/m", "2", "--store", s)
    assert p.returncode == 1 and "prod" in p.stderr, p.stderr
    rm = js("alias", "rm", "org/m", "prod")
    assert rm["alias"] == "prod" and rm["generation"] == 2
    assert js("alias", "list", "org/m")["aliases"] == []
    assert js("retire", "org/m", "2")["state"] == "retired"
    # delete refuses a model with an active generation.
    p = tv("delete", "org/m", "--store", s, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] in ("TV_E_STATE",
                                                                          "TV_E_CONFLICT")
    # verify --device: that device's objects only (read-only, here and locally).
    allv = js("verify")
    assert allv["n_failed"] == 0 and allv["n_objects"] >= 2
    assert js("verify", "--device", "1")["n_objects"] == allv["n_objects"]
    assert js("verify", "--device", "2")["n_objects"] == 0
    st = js("status")
    assert st["n_models"] == 1 and st["n_devices"] == 1
    v = json.loads(tv("version", "--json", check=True).stdout)
    assert v["name"] == "tensorvault" and v["api"] == "v1" and set(v["features"]) == {
        "cuda", "nvme", "io_uring"}
    # Errors are the API's error objects.
    p = tv("generation", "org/m@9", "--store", s, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_NOT_FOUND"
    p = tv("models", "nope", "--store", s)
    assert p.returncode == 1 and "nope" in p.stderr
    # deactivate: NAME no longer opens, NAME@GEN does, and then delete works.
    d = js("deactivate", "org/m")
    assert d["name"] == "org/m" and d["active_generation"] is None
    assert js("deactivate", "org/m")["active_generation"] is None  # a no-op
    p = tv("get", "--store", s, "org/m", "w", "-o", tmp_path / "w0")
    assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    tv("get", "--store", s, "org/m@1", "w", "-o", tmp_path / "w1", check=True)
    assert (tmp_path / "w1").read_bytes() == t1["w"].tobytes()
    gone = js("delete", "org/m")
    assert gone["model"] == "org/m" and gone["freed_bytes"] > 0
    assert js("models")["models"] == []
    p = tv("deactivate", "org/m", "--store", s, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_NOT_FOUND"


def test_demo_checkpoint_is_gpt2_shaped(tmp_path):
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = tmp_path / "d"
    p = subprocess.run([sys.executable, os.path.join(root, "scripts", "gen_demo.py"), str(out),
                        "--layers", "2", "--embd", "16", "--vocab", "50", "--ctx", "8"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    idx = json.load(open(out / "model.safetensors.index.json"))
    names = set(idx["weight_map"])
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"} <= names
    for i in range(2):
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            assert {f"h.{i}.{part}.weight", f"h.{i}.{part}.bias"} <= names
    assert len(names) == 4 + 2 * 12
    assert sorted(set(idx["weight_map"].values())) == ["model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors"]
    from safetensors.numpy import load_file
    ten = {}
    for f in sorted(set(idx["weight_map"].values())):
        ten.update(load_file(str(out / f)))
    assert ten["h.1.attn.c_attn.weight"].shape == (16, 48)
    assert ten["h.0.mlp.c_fc.weight"].shape == (16, 64) and ten["wte.weight"].shape == (50, 16)
    assert all(v.dtype == ml_dtypes.bfloat16 for v in ten.values())
    assert idx["metadata"]["total_size"] == sum(v.nbytes for v in ten.values())
    config = json.load(open(out / "config.json"))
    assert (config["model_type"], config["n_layer"], config["n_embd"], config["vocab_size"],
            config["n_positions"]) == ("gpt2", 2, 16, 50, 8)
    assert config["n_embd"] % config["n_head"] == 0 and config["n_head"] == 8
    assert json.load(open(out / "generation_config.json"))["eos_token_id"] == 49
    # Deterministic: the same arguments give the same bytes.
    p = subprocess.run([sys.executable, os.path.join(root, "scripts", "gen_demo.py"),
                        str(tmp_path / "e"), "--layers", "2", "--embd", "16", "--vocab", "50",
                        "--ctx", "8"], capture_output=True, text=True)
    assert p.returncode == 0
    for f in os.listdir(out):
        assert (out / f).read_bytes() == (tmp_path / "e" / f).read_bytes(), f


def test_demo_command_imports_it(tv, tmp_path):
    s = str(tmp_path / "s")
    tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "256M", check=True)
    p = tv("demo", "--store", s, "--layers", "1", "--dir", tmp_path / "demo", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["model"], r["generation"], r["active"], r["n_shards"]) == ("demo", 1, True, 2)
    assert r["n_tensors"] == 4 + 12
    assert (tmp_path / "demo" / "model.safetensors.index.json").exists()
    files = json.loads(tv("files", "--store", s, "demo", "--json", check=True).stdout)["files"]
    assert sorted(f["path"] for f in files) == ["config.json", "generation_config.json"]
    p = tv("demo", "--store", s, "--layers", "0")
    assert p.returncode == 2 and "'0'" in p.stderr


def test_demo_checkout_is_a_model_transformers_builds(tv, tmp_path):
    """The demo is a whole model: a checkout of it (its config, an index,
    no weight file) is a directory transformers builds GPT-2 from under
    tensorvault.patched(), every weight equal to the demo files' and the
    same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import tensorvault
    s = str(tmp_path / "s")
    tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "256M", check=True)
    tv("demo", "--store", s, "--layers", "2", "--dir", tmp_path / "demo", check=True)
    out = tmp_path / "out"
    tv("checkout", "--store", s, "demo@1", out, check=True)
    assert not [f for f in os.listdir(out) if f.endswith(".safetensors")]
    with tensorvault.patched():
        m = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "demo"))
    got, want = m.state_dict(), ref.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref(ids).logits)


def test_local_import_is_a_job_row(tv, tmp_path):
    """A local import runs inline through the API: it leaves the same job
    row a daemon's would (jobs, job), and prints its ImportResult."""
    s = str(tmp_path / "s")
    tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "16M", check=True)
    ck = gen.write_checkpoint(str(tmp_path / "ck"), {"w": np.ones(8, np.float32)}, 1)
    r = json.loads(tv("import", "--store", s, "m", ck, "--activate", "--json", check=True).stdout)
    assert r["generation"] == 1 and r["active"]
    jobs = json.loads(tv("jobs", "--store", s, "--json", check=True).stdout)["jobs"]
    assert [(j["kind"], j["state"], j["model"], j["generation"]) for j in jobs] == \
        [("import", "succeeded", "m", 1)]
    one = json.loads(tv("job", "--store", s, jobs[0]["id"], "--json", check=True).stdout)
    assert one["result"] == r and one["source"] == ck
    p = tv("import", "--store", s, "m", tmp_path / "missing")
    assert p.returncode == 1
    assert json.loads(tv("jobs", "--store", s, "--state", "succeeded", "--json",
                         check=True).stdout)["jobs"] == jobs


def test_tensors_follow_cursors_to_the_end(tv, tmp_path):
    """More tensors than a page (the API's default limit is 100): `tensors`
    follows next_cursor to the end in every order (size: largest first, ties
    by name, the ties crossing page boundaries); --limit shows one page."""
    names = [f"layers.{i}/w" for i in range(250)]
    size = {n: 4 * (1 + i % 7) for i, n in enumerate(names)}
    ck = gen.write_checkpoint(str(tmp_path / "ck"), {n: np.full(size[n] // 4, i, np.float32)
                                                     for i, n in enumerate(names)}, 3)
    s = str(tmp_path / "s")
    tv("store", "init", "--store", s, "--image", tmp_path / "img", "--size", "64M", check=True)
    tv("import", "--store", s, "m", ck, "--activate", check=True)
    for order in ("file", "name", "size"):
        doc = json.loads(tv("tensors", "--store", s, "m", "--order", order, "--json",
                            check=True).stdout)
        got = [t["name"] for t in doc["tensors"]]
        assert sorted(got) == sorted(names) and len(got) == 250 and doc["next_cursor"] is None
        if order == "name":
            assert got == sorted(names)
        if order == "size":
            assert got == sorted(names, key=lambda n: (-size[n], n))
            assert all(t["nbytes"] == size[t["name"]] for t in doc["tensors"])
    page = json.loads(tv("tensors", "--store", s, "m", "--limit", "100", "--order", "size",
                         "--json", check=True).stdout)
    assert [t["name"] for t in page["tensors"]] == \
        sorted(names, key=lambda n: (-size[n], n))[:100] and page["next_cursor"]
    p = tv("tensors", "--store", s, "m", "--order", "bogus")
    assert p.returncode == 2 and "file, name or size" in p.stderr
    page = json.loads(tv("tensors", "--store", s, "m", "--limit", "100", "--order", "name",
                         "--json", check=True).stdout)
    assert [t["name"] for t in page["tensors"]] == sorted(names)[:100] and page["next_cursor"]
    doc = json.loads(tv("tensors", "--store", s, "m", "--prefix", "layers.1", "--json",
                        check=True).stdout)
    assert sorted(t["name"] for t in doc["tensors"]) == sorted(n for n in names
                                                               if n.startswith("layers.1"))
