"""Playwright helpers of the browser tests (tests/browser): which Chromium to
drive ($TV_CHROMIUM, else /usr/bin/chromium, Debian's package, else one on
PATH), the small checkpoint the dashboard tests import, a page opened at a
section and waited until its data is in, the problems a page ran into, and
full-page screenshots checked against the viewport and colour scheme."""
import os
import shutil

import numpy as np

from harness.daemon import make_checkpoint


def chromium_path():
    """The Chromium to drive; None: Playwright's own."""
    for p in (os.environ.get("TV_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
              shutil.which("chromium-browser")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def demo_checkpoint(path, seed=12):
    """The small three-tensor checkpoint the dashboard tests import."""
    rng = np.random.default_rng(seed)
    return make_checkpoint(path, {
        "embed.weight": rng.standard_normal((256, 64)).astype(np.float32),
        "layers.0.weight": rng.standard_normal((64, 64)).astype(np.float16),
        "layers.0.bias": np.arange(64, dtype=np.int32),
    })


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
