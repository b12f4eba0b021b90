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


def demo_checkpoint(path, seed=12):
    """The small three-tensor checkpoint the dashboard tests import."""
    rng = np.random.default_rng(seed)
    return make_checkpoint(path, {
        "embed.weight": rng.standard_normal((256, 64)).astype(np.float32),
        "layers.0.weight": rng.standard_normal((64, 64)).astype(np.float16),
        "layers.0.bias": np.arange(64, dtype=np.int32),
    })


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


SIZES = {"wide": (1280, 900), "narrow": (390, 844)}


class Watch:
    """Everything that went wrong while a page was open: console errors,
    page errors, failed requests and HTTP >= 400 answers (a test that
    provokes one filters it out by URL)."""

    def __init__(self, page):
        self.problems = []
        page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"console error: {m.text} ({m.location.get('url')})"))
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(
            f"request failed: {r.method} {r.url}: {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and self.problems.append(
            f"HTTP {r.status}: {r.request.method} {r.url}"))

    def other_than(self, *needles):
        """The problems that mention none of needles."""
        return [p for p in self.problems if not any(n in p for n in needles)]


def open_page(browser, base_url, hash_="#overview", scheme="light", size="wide", route=None,
              token=None):
    """A new context + page at base_url/hash_, waited until that page's
    section is data-ready. token: put into sessionStorage before the page
    runs (as if entered earlier in this browser session). Returns
    (ctx, page, watch); close ctx when done."""
    w, h = SIZES[size]
    ctx = browser.new_context(viewport={"width": w, "height": h}, color_scheme=scheme)
    if token is not None:
        ctx.add_init_script(f"sessionStorage.setItem('tensorvault.token', {token!r});")
    page = ctx.new_page()
    watch = Watch(page)
    if route:
        page.route(*route)
    page.goto(base_url + "/" + hash_)
    name = (hash_.lstrip("#").split("/")[0].split("?")[0]) or "overview"
    page.wait_for_selector(f"#page-{name}[data-ready='1']", timeout=15000)
    return ctx, page, watch


def shoot(page, artifacts_dir, name, scheme, size):
    """Checks the page fits the viewport's width and is in the colour scheme
    asked for, and writes artifacts_dir/NAME-SCHEME-SIZE.png (full page)."""
    sw = page.evaluate("() => document.documentElement.scrollWidth")
    assert sw <= SIZES[size][0], f"{name} {scheme} {size}: the page is {sw} px wide"
    bg = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert (bg == "rgb(246, 247, 249)") == (scheme == "light"), bg
    path = os.path.join(artifacts_dir, f"{name}-{scheme}-{size}.png")
    page.screenshot(path=path, full_page=True)
    assert os.path.getsize(path) > 1000
    return path
