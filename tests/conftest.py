"""Fixtures every pytest suite shares (tests/integration, tests/browser,
tests/fleet; pytest.ini at the repository root runs them, and puts tests/ on
the import path for the `harness` package):

- `build_dir`: the build under test ($TV_BUILD_DIR, else build/), checked
  to hold tensorvault and tensorvaultd;
- `tv`: runs the CLI of that build;
- `postgres`: a PostgreSQL cluster of its own for the session
  (harness.postgres), started on first use (the fleet and browser suites);
- a report hook: a failing test's report carries the tail of every server
  log registered with harness.logs (PostgreSQL, moto, fleet nodes).

A suite's own fixtures are in its conftest.py."""
import os
import shutil
import subprocess
import tempfile

import pytest

from harness import build_dir as _build_dir
from harness import logs
from harness.postgres import Postgres, pg_bindir


@pytest.fixture(scope="session")
def build_dir():
    d = _build_dir()
    for exe in ("tensorvault", "tensorvaultd"):
        if not os.path.exists(os.path.join(d, exe)):
            pytest.fail(f"{exe} not built in {d} (run scripts/build)")
    return d


@pytest.fixture(scope="session")
def tv(build_dir):
    """Runs the CLI (an absolute path: a test may run it in another
    directory, e.g. the README's daemon layout)."""
    exe = os.path.abspath(os.path.join(build_dir, "tensorvault"))

    def run(*args, check=False, **kw):
        p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"tensorvault {' '.join(map(str, args))} failed "
                                 f"({p.returncode}): {p.stderr}")
        return p

    return run


@pytest.fixture(scope="session")
def postgres():
    bindir = pg_bindir()
    if bindir is None:
        pytest.fail("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                    "(apt-get install postgresql; scripts/deps does it)")
    base = tempfile.mkdtemp(prefix="tv-fleet-pg-")
    pg = Postgres(bindir, base)
    logs.attach("postgres", pg.logfile)
    try:
        pg.init()
        yield pg
    finally:
        pg.close()
        logs.detach("postgres")
        shutil.rmtree(base, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for name, path in logs.LOGS.items():
            rep.sections.append((f"{name} log (tail of {path})", logs.tail(path)))
