"""The CLI against a real tensorvaultd (remote mode): every read command
prints the same document as local mode on the same store, mutations need
the admin token (found in ./var/admin.token, --token-file or
$TENSORVAULT_TOKEN), and names with '/', '%', spaces and non-ASCII bytes
round-trip through the percent-encoded path."""
import json
import os
import subprocess

import numpy as np
import pytest

import harness.checkpoints as gen
from harness.daemon import Daemon

NAMES = {"a/b": np.arange(6, dtype=np.float32).reshape(2, 3), "p%20 q": np.ones(3, np.float32),
         "\u00e9t\u00e9.w": np.zeros(2, np.float32)}


@pytest.fixture
def served(build_dir, tmp_path):
    """A store with model org/m (generations 1 active, 2) served by a daemon
    whose store is ./var of the work directory (so var/admin.token is the
    CLI's default token)."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}

    def tv(*args, cwd=tmp_path, extra_env=None):
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                              env={**env, **(extra_env or {})})

    store = tmp_path / "var"
    ck = gen.write_checkpoint(str(tmp_path / "ck"), NAMES, 2)
    for args in (["store", "init", "--store", store, "--image", tmp_path / "img", "--size", "64M"],
                 ["import", "--store", store, "org/m", ck, "--activate"],
                 ["import", "--store", store, "org/m", ck]):
        p = tv(*args)
        assert p.returncode == 0, (args, p.stderr)
    d = Daemon(os.path.abspath(build_dir), tmp_path, store=store).start()
    try:
        yield tv, d, str(store)
    finally:
        d.stop()


def jdoc(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_remote_and_local_print_the_same_documents(served):
    tv, d, store = served
    url = f"http://127.0.0.1:{d.port}"
    for args in (["models"], ["models", "org/m"], ["generations", "org/m"],
                 ["generation", "org/m@1"], ["tensors", "org/m"],
                 ["tensors", "org/m@2", "--order", "name", "--prefix", "a/"],
                 ["tensors", "org/m", "--order", "size"],
                 ["tensors", "org/m", "--order", "size", "--limit", "2"],
                 ["tensor", "org/m", "a/b"], ["tensor", "org/m@1", "p%20 q"],
                 ["tensor", "org/m", "\u00e9t\u00e9.w"], ["devices"], ["alias", "list", "org/m"]):
        remote = tv(*args, "--url", url, "--json")
        local = tv(*args, "--store", store, "--json")
        assert jdoc(remote) == jdoc(local), args
        # The text rendering is the same too.
        rt, lt = tv(*args, "--url", url), tv(*args, "--store", store)
        assert rt.returncode == lt.returncode == 0, (args, rt.stderr, lt.stderr)
        assert rt.stdout == lt.stdout, args
    # --order size is the REST API's order=size: largest first, ties by name,
    # in both modes.
    api = d.ok("GET", "/v1/models/org%2Fm/generations/active/tensors?order=size")
    assert [t["name"] for t in api["tensors"]] == ["a/b", "p%20 q", "\u00e9t\u00e9.w"]
    for mode in (["--url", url], ["--store", store]):
        assert jdoc(tv("tensors", "org/m", "--order", "size", *mode, "--json")) == api, mode
    t = jdoc(tv("tensor", "org/m", "\u00e9t\u00e9.w", "--url", url, "--json"))
    assert t["name"] == "\u00e9t\u00e9.w" and t["shape"] == [2]


def test_remote_mutations_need_the_admin_token(served, tmp_path):
    tv, d, store = served
    url = f"http://127.0.0.1:{d.port}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # No token (no ./var/admin.token from here): reads are fine on loopback, writes are 401.
    assert jdoc(tv("models", "--url", url, "--json", cwd=elsewhere))["models"][0]["name"] == "org/m"
    p = tv("alias", "set", "org/m", "prod", "2", "--url", url, "--json", cwd=elsewhere)
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_UNAUTHORIZED"
    # The default token file (cwd ./var/admin.token) is the admin's.
    a = jdoc(tv("alias", "set", "org/m", "prod", "2", "--url", url, "--json"))
    assert a == {"model": "org/m", "alias": "prod", "generation": 2}
    assert jdoc(tv("generation", "org/m@prod", "--url", url, "--json"))["aliases"] == ["prod"]
    # A read token: reads yes, writes 403.
    tok = jdoc(tv("token", "create", "ci", "--scope", "read", "--url", url, "--json"))
    assert tok["scope"] == "read" and tok["token"].startswith("tvk_") and len(tok["token"]) == 68
    (tmp_path / "read.token").write_text(tok["token"] + "\n")
    rd = ["--url", url, "--token-file", tmp_path / "read.token"]
    assert jdoc(tv("status", *rd, "--json"))["n_models"] == 1
    p = tv("activate", "org/m", "prod", *rd, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_FORBIDDEN"
    p = tv("activate", "org/m", "prod", "--url", url, "--json", cwd=elsewhere,
           extra_env={"TENSORVAULT_TOKEN": tok["token"]})
    assert p.returncode == 1 and "TV_E_FORBIDDEN" in p.stderr
    # Tokens are listed (never their secrets) and revoked; a revoked one is 401.
    listed = jdoc(tv("token", "list", "--url", url, "--json"))["tokens"]
    assert {t["name"] for t in listed} >= {"admin", "ci"}
    assert all("token" not in t for t in listed)
    rv = jdoc(tv("token", "revoke", tok["id"], "--url", url, "--json"))
    assert rv["id"] == tok["id"] and rv["revoked_at"] is not None
    p = tv("status", *rd, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_UNAUTHORIZED"
    # Activate by alias, rollback, retire refused while aliased: the daemon's answers.
    assert jdoc(tv("activate", "org/m", "prod", "--url", url, "--json"))["generation"] == 2
    assert jdoc(tv("rollback", "org/m", "--url", url, "--json"))["generation"] == 1
    p = tv("retire", "org/m", "2", "--url", url)
    assert p.returncode == 1 and "prod" in p.stderr
    # The daemon holds the writer lock: a local writer is refused, naming it.
    p = tv("alias", "rm", "org/m", "prod", "--store", store)
    assert p.returncode == 1 and "TV_E_LOCKED" in p.stderr


def test_remote_import_follows_the_job(served, tmp_path):
    tv, d, store = served
    url = f"http://127.0.0.1:{d.port}"
    ck = gen.write_checkpoint(str(tmp_path / "ck2"), {"x": np.arange(1000, dtype=np.float32)}, 1)
    # --wait: follows the job off a terminal, prints the ImportResult, exits 0.
    # The source goes absolute (relative to the CLI's cwd, not the daemon's).
    r = jdoc(tv("import", "n", "ck2", "--activate", "--alias", "prod", "--wait", "--url", url,
                "--json"))
    assert (r["model"], r["generation"], r["active"], r["aliases"]) == ("n", 1, True, ["prod"])
    assert r["n_tensors"] == 1 and r["written_bytes"] > 0
    gens = jdoc(tv("generations", "n", "--url", url, "--json"))["generations"]
    assert [(g["generation"], g["state"], g["active"]) for g in gens] == [(1, "ready", True)]
    # Without --wait off a terminal: the queued (or running) Job, exit 0; job ID follows it.
    j = jdoc(tv("import", "n", ck, "--url", url, "--json"))
    assert j["kind"] == "import" and j["model"] == "n" and j["source"] == ck
    assert j["state"] in ("queued", "running", "succeeded")
    for _ in range(200):
        now = jdoc(tv("job", j["id"], "--url", url, "--json"))
        if now["state"] == "succeeded":
            break
    assert now["state"] == "succeeded" and now["result"]["generation"] == 2
    ids = [x["id"] for x in jdoc(tv("jobs", "--kind", "import", "--url", url, "--json"))["jobs"]]
    assert ids[:2] == [j["id"], j["id"] - 1]  # newest first
    # Cancelling a finished job is a conflict; a failed import exits 1 with its error.
    p = tv("cancel", j["id"], "--url", url, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] in ("TV_E_STATE",
                                                                         "TV_E_CONFLICT")
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    p = tv("import", "n", "bad.safetensors", "--wait", "--url", url)
    assert p.returncode == 1 and "TV_E_ST_" in p.stderr, p.stderr
    # A source outside the daemon's import roots is refused before queuing.
    p = tv("import", "n", "/etc", "--wait", "--url", url, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["error"]["code"] == "TV_E_OUTSIDE_ROOTS"
    # Remote verify: a job, waited for, its VerifyResult printed.
    v = jdoc(tv("verify", "--url", url, "--json"))
    assert v["n_failed"] == 0 and v["n_objects"] >= 2


def test_remote_import_on_a_terminal_shows_progress(served, build_dir, tmp_path):
    """On a terminal, import follows the job without --wait and draws the
    bar (bytes, %, MB/s, ETA) on stderr from the job's progress."""
    import pty
    tv, d, store = served
    ck = gen.write_checkpoint(str(tmp_path / "big"), {"x": np.ones(4 << 20, np.float32)}, 1)
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORVAULT_")}
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))
    p = subprocess.Popen([exe, "import", "big", ck, "--url",
                          f"http://127.0.0.1:{d.port}"], stdin=slave, stdout=slave, stderr=slave,
                         cwd=tmp_path, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait()
    os.close(master)
    text = out.decode()
    assert p.returncode == 0, text
    assert "100.0%" in text and "MB/s" in text and "ETA" in text, text
    assert "imported big generation 1" in text, text
