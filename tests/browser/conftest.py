"""Fixtures of the browser tests (tests/browser): Chromium driven by
Playwright against a real tensorvaultd serving its embedded dashboard at /.

Chromium: $TV_CHROMIUM, else /usr/bin/chromium (Debian's package), else
Playwright's own; absent, or Playwright not installed: the tests are skipped
with the reason. Screenshots go to $TV_ARTIFACTS_DIR (default
build/artifacts/browser/)."""
import os
import shutil
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

from daemon import Daemon, make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def build_dir():
    d = os.environ.get("TV_BUILD_DIR", os.path.join(ROOT, "build"))
    if not os.path.exists(os.path.join(d, "tensorvaultd")):
        pytest.fail(f"tensorvaultd not built in {d} (run scripts/build)")
    return d


@pytest.fixture(scope="session")
def artifacts_dir():
    d = os.environ.get("TV_ARTIFACTS_DIR") or os.path.join(ROOT, "build", "artifacts", "browser")
    os.makedirs(d, exist_ok=True)
    return d


def _chromium_path():
    for p in (os.environ.get("TV_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if p and os.access(p, os.X_OK):
            return p
    return None


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.skip(f"playwright is not installed ({e}): pip install -r requirements.txt")
    exe = _chromium_path()
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        except Exception as e:  # noqa: BLE001 - any launch failure means no browser here
            pytest.skip(f"Chromium could not be started ({exe or 'playwright default'}): {e}")
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def daemon(build_dir, tmp_path_factory):
    """A daemon (256 MiB store image) with one imported, activated model
    "demo" that has an alias "stable"."""
    tmp = tmp_path_factory.mktemp("web")
    rng = np.random.default_rng(12)
    ckpt = make_checkpoint(tmp / "ckpt" / "model.safetensors", {
        "embed.weight": rng.standard_normal((256, 64)).astype(np.float32),
        "layers.0.weight": rng.standard_normal((64, 64)).astype(np.float16),
        "layers.0.bias": np.arange(64, dtype=np.int32),
    })
    d = Daemon(build_dir, tmp, settings={"store.image_size": "256M"})
    d.start()
    try:
        d.import_ok("demo", ckpt, activate=True)
        r = d.request("PUT", "/v1/models/demo/aliases/stable", body={"generation": 1})
        assert r.status in (200, 201), r
        yield d
    finally:
        d.stop()


@pytest.fixture
def base_url(daemon):
    return f"http://127.0.0.1:{daemon.port}"
