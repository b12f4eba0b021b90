"""Fixtures of the browser tests (tests/browser): Chromium driven by
Playwright against a real tensorvaultd serving its embedded dashboard at /
(the helpers the tests call are in harness.browser).

Chromium: $TV_CHROMIUM, else /usr/bin/chromium (Debian's package), else
Playwright's own; absent, or Playwright not installed: the tests are skipped
with the reason. Screenshots go to $TV_ARTIFACTS_DIR (default
build/artifacts/browser/)."""
import os

import pytest

from harness import ROOT
from harness.browser import chromium_path, demo_checkpoint
from harness.daemon import Daemon


@pytest.fixture(scope="session")
def artifacts_dir():
    d = os.environ.get("TV_ARTIFACTS_DIR") or os.path.join(ROOT, "build", "artifacts", "browser")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.skip(f"playwright is not installed ({e}): pip install -r requirements/test.txt")
    exe = chromium_path()
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
def daemon_factory(build_dir, tmp_path_factory):
    """make(settings=None) -> a started Daemon in a fresh directory (its
    workdir is an import root); every one made is stopped at module end."""
    made = []

    def make(settings=None):
        tmp = tmp_path_factory.mktemp("web")
        d = Daemon(build_dir, tmp, settings={"store.image_size": "256M", **(settings or {})})
        d.start()
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()


@pytest.fixture(scope="module")
def daemon(daemon_factory):
    """A daemon (256 MiB store image) with one imported, activated model
    "demo" that has an alias "stable"."""
    d = daemon_factory()
    d.import_ok("demo", demo_checkpoint(os.path.join(d.workdir, "ckpt", "model.safetensors")), activate=True)
    r = d.request("PUT", "/v1/models/demo/aliases/stable", body={"generation": 1})
    assert r.status in (200, 201), r
    return d


@pytest.fixture
def base_url(daemon):
    return f"http://127.0.0.1:{daemon.port}"
