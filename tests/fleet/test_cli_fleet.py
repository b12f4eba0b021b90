"""tensorvault fleet and fleet alias (server/cli/reg_cmds.c) against a
daemon: a standalone node prints mode standalone; a fleet node (fleet.postgres
on the session's PostgreSQL) lists itself; moving an alias of an imported,
published generation answers version 1, and a second move expecting version 0
fails (exit 1) with the API's 409 message. --json is the API's document."""
import json
import os
import subprocess

from harness.daemon import Daemon
from harness.postgres import fresh_db
from harness.wait import wait_for
from .test_catalog import checkpoint, fleet_daemon, published


def cli(build_dir, d, *args):
    exe = os.path.join(build_dir, "tensorvault")
    tok = os.path.join(d.workdir, "cli.token")
    with open(tok, "w") as f:
        f.write(d.token + "\n")
    return subprocess.run([exe, *map(str, args), "--url", f"http://127.0.0.1:{d.port}",
                           "--token-file", tok], capture_output=True, text=True, timeout=60)


def test_fleet_standalone(build_dir, tmp_path):
    d = Daemon(build_dir, tmp_path, settings={"store.image_size": "256M"})
    d.start()
    try:
        p = cli(build_dir, d, "fleet")
        assert p.returncode == 0, p.stderr
        assert "mode:    standalone" in p.stdout and "fleet.postgres" in p.stdout
        p = cli(build_dir, d, "fleet", "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc == d.ok("GET", "/v1/fleet")
        assert doc["mode"] == "standalone" and doc["nodes"] == [] and doc["aliases"] == []
        # a standalone node refuses a move: exit 1, the API's code on stderr
        p = cli(build_dir, d, "fleet", "alias", "m", "prod", "1", "--expect", "0")
        assert p.returncode == 1 and "TV_E_STATE" in p.stderr, p.stderr
        # usage errors before anything is sent
        p = cli(build_dir, d, "fleet", "alias", "m", "prod", "1")
        assert p.returncode == 2 and "--expect" in p.stderr
        p = cli(build_dir, d, "fleet", "alias", "m", "prod", "x", "--expect", "0")
        assert p.returncode == 2
        p = cli(build_dir, d, "fleet", "alias", "m", "prod", "1", "--expect", "0",
                "--placement", "a,,b")
        assert p.returncode == 2 and "--placement" in p.stderr
    finally:
        d.stop()


def test_fleet_node_and_alias_move(build_dir, postgres, tmp_path):
    db, dsn = fresh_db(postgres, "tvcli_")
    d = fleet_daemon(build_dir, tmp_path / "n", dsn, "node-cli")
    d.start()
    try:
        d.import_ok("llama", checkpoint(tmp_path / "n", "m1", 11))
        wait_for(lambda: published(postgres, db, "llama", 1), what="generation published")
        wait_for(lambda: any(n["name"] == "node-cli" for n in d.ok("GET", "/v1/fleet")["nodes"]),
                 what="node listed")
        p = cli(build_dir, d, "fleet")
        assert p.returncode == 0, p.stderr
        assert "mode:    fleet" in p.stdout and "node-cli" in p.stdout
        p = cli(build_dir, d, "fleet", "alias", "llama", "prod", "1", "--expect", "0",
                "--placement", "node-cli", "--quorum", "1", "--timeout", "30", "--json")
        assert p.returncode == 0, p.stderr
        moved = json.loads(p.stdout)
        assert moved["version"] == 1 and moved["generation"] == 1
        assert moved["placement"] == ["node-cli"]
        # again expecting 0: the version moved -> 409, its message on stderr
        p = cli(build_dir, d, "fleet", "alias", "llama", "prod", "1", "--expect", "0")
        assert p.returncode == 1
        assert "TV_E_CONFLICT" in p.stderr or "version" in p.stderr, p.stderr
        assert "1" in p.stderr
        wait_for(lambda: any(a["alias"] == "prod" for a in d.ok("GET", "/v1/fleet")["aliases"]),
                 what="alias in the fleet document")
        p = cli(build_dir, d, "fleet")
        assert p.returncode == 0 and "llama@prod -> generation 1 (version 1" in p.stdout, p.stdout
        # a generation the catalog lacks: 404
        p = cli(build_dir, d, "fleet", "alias", "llama", "prod", "9", "--expect", "1")
        assert p.returncode == 1 and "TV_E_NOT_FOUND" in p.stderr, p.stderr
    finally:
        d.stop()
