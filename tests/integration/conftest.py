"""Shared pytest fixtures: where the built binaries are and how to run them."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))


@pytest.fixture(scope="session")
def build_dir():
    d = os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build"))
    if not os.path.exists(os.path.join(d, "tensorvault")):
        pytest.fail(f"tensorvault binary not built in {d} (run scripts/build)")
    return d


@pytest.fixture(scope="session")
def tv(build_dir):
    exe = os.path.join(build_dir, "tensorvault")

    def run(*args, check=False, **kw):
        p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, **kw)
        if check and p.returncode != 0:
            raise AssertionError(f"tensorvault {' '.join(map(str, args))} failed "
                                 f"({p.returncode}): {p.stderr}")
        return p

    return run


@pytest.fixture(scope="session")
def tv_crash(build_dir):
    """Runs the test-only CLI build (tests/tools/tensorvault_crashtest.c: the
    same dispatcher plus a crash hook): crash_at=POINT[#N] kill -9s it at that
    crash point, trace=FILE appends every crash point reached to FILE."""
    exe = os.path.join(build_dir, "tests", "tensorvault_crashtest")
    if not os.path.exists(exe):
        pytest.fail(f"tensorvault_crashtest not built in {build_dir}/tests (run scripts/build)")

    def run(*args, crash_at=None, trace=None, **kw):
        env = dict(kw.pop("env", os.environ))
        env.pop("TV_TEST_CRASH_AT", None)
        env.pop("TV_TEST_CRASH_TRACE", None)
        if crash_at:
            env["TV_TEST_CRASH_AT"] = crash_at
        if trace:
            env["TV_TEST_CRASH_TRACE"] = str(trace)
        return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env,
                              **kw)

    return run
