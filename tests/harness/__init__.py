"""The Python test harness of tensorvault, shared by every pytest suite
(tests/integration, tests/browser, tests/fleet) and by the benchmarks.

pytest finds it through `pythonpath = tests` in the repository's pytest.ini
(no test edits sys.path); a Python child a test starts gets it through
python_env() (PYTHONPATH), e.g. a snippet run as another uid.

Modules:
- daemon: start/stop tensorvaultd on a free port with a temp store and INI
  config, talk raw HTTP to it, write checkpoints with the official writer
  (Daemon, serving, make_checkpoint, big_checkpoint, seg, free_port, SLOW);
- store: the official loader's reference bytes and store-vs-source checks;
- checkpoints: the checkpoint generator (random, every dtype, sharded,
  malformed fixtures; also a command-line tool);
- wire: the fast-path protocol's codec and a client (Session);
- fastpath: fast-path checkpoints, settings, health checks, peers of
  another uid;
- stall: an HTTP origin that stalls mid-body;
- origin: a Range-capable HTTP origin with byte counters and fault switches;
- postgres: a PostgreSQL cluster of its own (Postgres, fresh_db);
- s3: a moto S3 endpoint checking SigV4 (S3) and its server program;
- nodes: several daemons in network namespaces on a bridge (Net, Node);
- fleet: helpers the fleet tests share (sample checkpoints, checks);
- browser: Playwright helpers of the dashboard tests (open_page, shoot);
- logs: server logs attached to a failing test's report;
- wait: wait_for (poll a condition with a deadline);
- installed: the Debian package installed in private namespaces and used
  as an operator and a worker would (a program test_install.py runs)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")


def build_dir():
    """The build directory under test: $TV_BUILD_DIR, else ROOT/build."""
    return os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build"))


def python_env(env=None, **extra):
    """env (default os.environ) with tests/ first on PYTHONPATH, so that a
    Python child can `import harness...`; extra: more variables."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([TESTS] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update(extra)
    return env
