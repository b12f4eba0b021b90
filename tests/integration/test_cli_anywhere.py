"""The CLI from any directory (docs/cli.md "Finding the daemon"): run from a
temp dir outside the repository with nothing but TENSORVAULT_* variables it
imports, lists and reads through the daemon (get and bench with no --store:
the fast path); from the daemon's own directory it finds ./var; with
nothing it fails naming every place it looked at and the variable to set.
Also the text output for people (IEC sizes, local times, shard names, job
start and duration, "activated generation N (was M)"), --help per command,
and the import-roots refusal saying how to add a root."""
import json
import os
import re
import subprocess
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from harness.daemon import Daemon, make_checkpoint

INSTALLED = ("/run/tensorvault/tensorvault.sock", "/run/tensorvault/http.sock",
             "/var/lib/tensorvault/admin.token")


def installed_present():
    return [p for p in INSTALLED if os.path.exists(p)]


@pytest.fixture
def cli(build_dir):
    """Runs the CLI with no TENSORVAULT_* variable but those given, in UTC
    (so local times are known), in cwd."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    base["TZ"] = "UTC0"

    def run(*args, cwd, env=None):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                              env={**base, **(env or {})})
    return run


@pytest.fixture
def served(build_dir, tmp_path):
    """A daemon whose work directory is tmp_path/d (store ./var there) with
    model m (generation 1 active, generation 2 ready), two shards."""
    work = tmp_path / "d"
    work.mkdir()
    d = Daemon(build_dir, work, settings={"store.image_size": "256M"}).start()
    rng = np.random.default_rng(7)
    t1 = {"a.w": rng.integers(0, 255, size=(300, 7), dtype=np.uint8),
          "b/w": rng.standard_normal((33,)).astype(np.float32)}
    src = make_checkpoint(work / "ck1" / "model.safetensors", t1)
    src2 = make_checkpoint(work / "ck2" / "model.safetensors", {"a.w": t1["a.w"] + 1})
    d.import_ok("m", src, activate=True)
    d.import_ok("m", src2)
    d.wait_socket()
    try:
        yield {"d": d, "work": work, "src": src, "src2": src2}
    finally:
        assert d.stop() == 0, d.log_text()


def daemon_env(d):
    return {"TENSORVAULT_SOCKET": d.socket_path,
            "TENSORVAULT_URL": os.path.join(d.store, "run", "http.sock"),
            "TENSORVAULT_TOKEN_FILE": os.path.join(d.store, "admin.token")}


def test_from_elsewhere_with_only_the_variables(cli, served, tmp_path):
    d, work = served["d"], served["work"]
    away = tmp_path / "away"
    away.mkdir()
    env = daemon_env(d)
    # An import from elsewhere: the HTTP socket and the token file come from
    # the variables; the source goes as an absolute path.
    ck = make_checkpoint(work / "ck3" / "model.safetensors",
                         {"x": np.arange(10, dtype=np.int16)})
    p = cli("import", "n", ck, "--activate", "--wait", "--json", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["generation"] == 1
    p = cli("models", "--json", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    assert [m["name"] for m in json.loads(p.stdout)["models"]] == ["m", "n"]
    # get without --store reads through the daemon's fast path: the bytes
    # are the official loader's.
    ref = load_file(served["src"])
    for name, arr in ref.items():
        out = away / "w.bin"
        p = cli("get", "m", name, "-o", out, "--json", cwd=away, env=env)
        assert p.returncode == 0, p.stderr
        assert out.read_bytes() == arr.tobytes(), name
        assert json.loads(p.stdout)["bytes"] == arr.nbytes
    p = cli("get", "m@2", "a.w", "--rows", "3:5", "-o", away / "rows.bin", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    assert (away / "rows.bin").read_bytes() == load_file(served["src2"])["a.w"][3:5].tobytes()
    p = cli("bench", "m", "--json", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["path"] == "fastpath" and doc["bytes"] == sum(a.nbytes for a in ref.values())
    # The HTTP socket beside the fast-path socket gives the daemon's figures.
    assert "daemon" in doc, doc
    # --url as a URL works as well as the socket; unix:PATH too.
    for url in (f"http://127.0.0.1:{d.port}", "unix:" + env["TENSORVAULT_URL"]):
        p = cli("status", "--json", cwd=away, env={**env, "TENSORVAULT_URL": url})
        assert p.returncode == 0 and json.loads(p.stdout)["n_models"] == 2, (url, p.stderr)


def test_the_daemons_own_directory(cli, served):
    """From the directory a daemon was started in (its store ./var), with
    no variables: the HTTP socket, the fast-path socket and the admin token
    are ./var's."""
    if installed_present():
        pytest.skip(f"an installed daemon's files exist ({installed_present()}): they come first")
    d, work = served["d"], served["work"]
    p = cli("alias", "set", "m", "prod", "2", "--json", cwd=work)
    assert p.returncode == 0, p.stderr
    p = cli("get", "m@prod", "a.w", "-o", work / "w.bin", cwd=work)
    assert p.returncode == 0, p.stderr
    assert (work / "w.bin").read_bytes() == load_file(served["src2"])["a.w"].tobytes()
    p = cli("generation", "m@prod", "--json", cwd=work)
    assert p.returncode == 0 and json.loads(p.stdout)["aliases"] == ["prod"], p.stderr


def test_nothing_found_names_every_place(cli, served, tmp_path):
    if installed_present():
        pytest.skip(f"an installed daemon's files exist ({installed_present()}): they come first")
    empty = tmp_path / "empty"
    empty.mkdir()
    here = os.path.realpath(empty)
    # No daemon anywhere: the error lists the variable, the installed
    # socket, ./var's and the built-in URL (port 1 stands for it here).
    p = cli("models", cwd=empty)
    if p.returncode == 0:
        pytest.skip("a daemon answers at 127.0.0.1:8470 on this machine")
    assert p.returncode == 1
    for want in ("TV_E_NO_DAEMON", "$TENSORVAULT_URL (unset)", "/run/tensorvault/http.sock",
                 f"{here}/var/run/http.sock", "http://127.0.0.1:8470", "set TENSORVAULT_URL"):
        assert want in p.stderr, (want, p.stderr)
    p = cli("get", "m", "a.w", "-o", empty / "o", cwd=empty)
    assert p.returncode == 1
    for want in ("TV_E_NO_DAEMON", "$TENSORVAULT_SOCKET (unset)",
                 "/run/tensorvault/tensorvault.sock", f"{here}/var/run/tensorvault.sock",
                 "set TENSORVAULT_SOCKET", "--store DIR"):
        assert want in p.stderr, (want, p.stderr)
    assert not (empty / "o").exists()
    p = cli("bench", "m", "--json", cwd=empty)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_NO_DAEMON"
    # A daemon found, no token: reads work, a write is refused naming where
    # the token was looked for.
    url = {"TENSORVAULT_URL": f"http://127.0.0.1:{served['d'].port}"}
    p = cli("models", "--json", cwd=empty, env=url)
    assert p.returncode == 0, p.stderr
    p = cli("import", "z", served["src"], cwd=empty, env=url)
    assert p.returncode == 1
    for want in ("TV_E_UNAUTHORIZED", "$TENSORVAULT_TOKEN (unset)",
                 "$TENSORVAULT_TOKEN_FILE (unset)", "/var/lib/tensorvault/admin.token",
                 f"{here}/var/admin.token", "set TENSORVAULT_TOKEN_FILE"):
        assert want in p.stderr, (want, p.stderr)
    # A token that is refused says where it came from.
    bad = empty / "bad.token"
    bad.write_text("tvk_" + "0" * 64 + "\n")
    p = cli("import", "z", served["src"], cwd=empty,
            env={**url, "TENSORVAULT_TOKEN_FILE": str(bad)})
    assert p.returncode == 1 and "TV_E_UNAUTHORIZED" in p.stderr
    assert f"$TENSORVAULT_TOKEN_FILE: {bad}" in p.stderr, p.stderr
    # A variable naming a socket that is not there is an error naming it.
    p = cli("get", "m", "a.w", "-o", empty / "o", cwd=empty,
            env={"TENSORVAULT_SOCKET": str(empty / "no.sock")})
    assert p.returncode == 1 and str(empty / "no.sock") in p.stderr, p.stderr


def test_text_output_for_people(cli, served, tmp_path):
    d = served["d"]
    away = tmp_path / "away"
    away.mkdir()
    env = daemon_env(d)
    # Sizes in IEC units and creation times in local time (UTC here).
    p = cli("generations", "m", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    gens = json.loads(cli("generations", "m", "--json", cwd=away, env=env).stdout)["generations"]
    lines = p.stdout.splitlines()
    assert lines[0].split()[:8] == ["GEN", "STATE", "ACTIVE", "SHARDS", "TENSORS", "SIZE",
                                    "CREATED", "ALIASES"]
    for g, line in zip(gens, lines[1:]):
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(g["created_at"]))
        assert created in line, (created, line)
        assert re.search(r"\d+(\.\d)? (B|KiB|MiB)\s", line), line
    # the shard file: 2232 data bytes and its header, in KiB
    assert f"{gens[0]['total_bytes'] / 1024:.1f} KiB" in lines[1], (gens[0], lines[1])
    assert 2232 < gens[0]["total_bytes"] < 102 * 1024
    # Tensors name their shard file, not its index.
    p = cli("tensors", "m", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("a.w "))
    assert row.split()[-1] == "model.safetensors" and "2.1 KiB" in row, row
    # activate and rollback say from which generation to which.
    p = cli("activate", "m", "2", cwd=away, env=env)
    assert p.returncode == 0 and p.stdout == "activated generation 2 of m (was 1)\n", p.stdout
    p = cli("rollback", "m", cwd=away, env=env)
    assert p.returncode == 0 and p.stdout == "activated generation 1 of m (was 2)\n", p.stdout
    p = cli("deactivate", "m", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    p = cli("activate", "m", "1", cwd=away, env=env)
    assert p.stdout == "activated generation 1 of m (was none)\n", p.stdout
    # --json of an activation is the API's Generation, unchanged.
    doc = json.loads(cli("activate", "m", "1", "--json", cwd=away, env=env).stdout)
    assert doc["generation"] == 1 and doc["active"] is True and "was" not in doc
    # jobs: when each started and how long it ran.
    p = cli("jobs", cwd=away, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].split()[-2:] == ["STARTED", "DURATION"]
    jobs = json.loads(cli("jobs", "--json", cwd=away, env=env).stdout)["jobs"]
    first = p.stdout.splitlines()[1]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(jobs[0]["started_at"]))
    assert started in first and re.search(r"(\d+\.\d s|\dm\d\ds)$", first), first
    p = cli("job", str(jobs[0]["id"]), cwd=away, env=env)
    assert f"started:    {started}" in p.stdout and "duration:" in p.stdout, p.stdout


def test_help_is_per_command(cli, tmp_path):
    seen = {}
    for cmd, words in ((["import"], ["--strict", "re-hash", "--wait", "import.roots",
                                     "Example:", "tensorvault import "]),
                       (["rollback"], ["highest ready generation", "Example:"]),
                       (["get"], ["--rows", "rows [R0, R1)", "--socket", "TENSORVAULT_SOCKET",
                                  "/run/tensorvault/tensorvault.sock", "R0:R1"]),
                       (["models"], ["--url", "TENSORVAULT_URL", "/run/tensorvault/http.sock",
                                     "TENSORVAULT_TOKEN_FILE", "/var/lib/tensorvault/admin.token",
                                     "./var/admin.token"]),
                       (["alias", "set"], ["atomically", "GEN: a generation number"]),
                       (["store", "init"], ["--force", "SIZE:", "powers of 1024"]),
                       (["verify"], ["--device ID", "Re-hash", "exit 1"])):
        p = cli(*cmd, "--help", cwd=tmp_path)
        assert p.returncode == 0, (cmd, p.stderr)
        for w in words:
            assert w in p.stdout, (cmd, w, p.stdout)
        body = p.stdout.split("\n", 1)[1]
        assert body not in seen.values(), cmd  # not one generic block
        seen[" ".join(cmd)] = body
    # A command that takes no SIZE does not carry the SIZE grammar.
    assert "SIZE:" not in cli("rollback", "--help", cwd=tmp_path).stdout


def test_import_outside_the_roots_says_how_to_add_one(cli, served, tmp_path):
    d = served["d"]
    outside = tmp_path / "outside"
    ck = make_checkpoint(outside / "model.safetensors", {"x": np.ones(3, np.float32)})
    p = cli("import", "q", ck, cwd=tmp_path, env=daemon_env(d))
    assert p.returncode == 1
    for want in ("TV_E_OUTSIDE_ROOTS", os.path.realpath(served["work"]), "import.roots",
                 "--set import.roots=", "TENSORVAULT_IMPORT_ROOTS"):
        assert want in p.stderr, (want, p.stderr)
