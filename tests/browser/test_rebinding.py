"""DNS rebinding, as a browser does it: a page of rebind.test, a name this
Chromium resolves to 127.0.0.1 (--host-resolver-rules), is same-origin with
itself, so its scripts could read whatever 127.0.0.1:PORT answers; the
daemon answers 421 to every request whose Host is not one of its names,
so neither the dashboard nor the model list nor a tensor's bytes reach
that page, while the same daemon under 127.0.0.1 and localhost works."""
import pytest

from harness.browser import chromium_path


@pytest.fixture(scope="module")
def rebinding_browser(browser):
    """A second Chromium of the same Playwright, resolving rebind.test to
    127.0.0.1."""
    exe = chromium_path()
    try:
        b = browser.browser_type.launch(executable_path=exe, args=[
            "--no-sandbox", "--host-resolver-rules=MAP rebind.test 127.0.0.1"])
    except Exception as e:  # noqa: BLE001 - any launch failure means no browser here
        pytest.skip(f"Chromium could not be started ({exe or 'playwright default'}): {e}")
    try:
        yield b
    finally:
        b.close()


def test_a_rebound_name_gets_nothing(rebinding_browser, daemon):
    ctx = rebinding_browser.new_context()
    page = ctx.new_page()
    try:
        r = page.goto(f"http://rebind.test:{daemon.port}/")
        assert r.status == 421
        assert "TV_E_BAD_REQUEST" in page.content()
        # the page's own scripts (same origin as rebind.test) get 421 for everything
        got = page.evaluate("""async () => {
            const out = {};
            for (const p of ['/v1/models', '/v1/status',
                             '/v1/models/demo/generations/active/tensors/embed.weight/data']) {
                const r = await fetch(p);
                out[p] = r.status;
            }
            return out;
        }""")
        assert set(got.values()) == {421}, got
        # the same daemon by its own names serves the dashboard and the API
        for host in ["127.0.0.1", "localhost"]:
            r = page.goto(f"http://{host}:{daemon.port}/#models")
            assert r.status == 200, host
            assert page.evaluate("async () => (await fetch('/v1/models')).status") == 200
    finally:
        ctx.close()
