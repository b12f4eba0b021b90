"""Fixtures of the integration tests (tests/integration; build_dir and tv are
tests/conftest.py's): the test-only CLI build with its crash hook, and what
the differential read tests (test_read, test_fastpath_diff) share: the
float32 reference conversions and the tensors that hold every value of
every float format."""
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def f32_from():
    """dtype code -> the numpy dtype whose astype(np.float32) is the
    reference of the float32 read (tv_read_f32, a model opened either way)."""
    import ml_dtypes
    import numpy as np
    return {
        "F32": np.float32,
        "F16": np.float16,
        "BF16": ml_dtypes.bfloat16,
        "F8_E4M3": ml_dtypes.float8_e4m3fn,
        "F8_E5M2": ml_dtypes.float8_e5m2,
        "F8_E8M0": ml_dtypes.float8_e8m0fnu,
    }


@pytest.fixture(scope="session")
def every_float_value():
    """Tensors holding every float format the converter knows with all their
    bit patterns (all 256 byte values of the 8-bit ones, NaNs and subnormals
    included; all 65536 of F16 and BF16): added to a generated checkpoint."""
    import harness.checkpoints as gen
    import ml_dtypes
    import numpy as np
    t = {}
    for code in ("F8_E4M3", "F8_E5M2", "F8_E8M0"):
        t[f"all.{code}"] = np.arange(256, dtype=np.uint8).view(gen.DTYPES[code]).reshape(16, 16)
    t["all.F16"] = np.arange(65536, dtype=np.uint16).view(np.float16).reshape(256, 256)
    t["all.BF16"] = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256)
    return t


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
