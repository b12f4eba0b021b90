"""The dashboard shell under attack and misuse, in Chromium:
malformed or hostile hashes still land on a page, the router never
refreshes a page before its show resolved nor two refreshes at once, a
page's failure message goes once it works again, non-JSON / HTML / empty
answers give a short message that names the call, the CSP stops an injected
inline handler, a confirmation opened and dismissed 50 times sends nothing
and one OK sends exactly one request, the token stays in sessionStorage
and only ever goes to the daemon in the Authorization header, the page
recovers when the daemon comes back, and a 128-byte name in a message
wraps at 390 px instead of widening the page."""
import os
import time

from harness.browser import Watch, demo_checkpoint, open_page


def wait_route(page, name):
    """Waits until the router shows NAME (visible and ready)."""
    page.wait_for_function(
        "n => { const s = document.getElementById('page-' + n);"
        " return s && !s.hidden && s.dataset.ready === '1' && document.body.dataset.page === n; }",
        arg=name, timeout=10000)


def test_hostile_hashes_land_on_a_page(browser, base_url):
    # A malformed percent-encoding in the page name, at load and later.
    ctx = browser.new_context()
    page = ctx.new_page()
    watch = Watch(page)
    try:
        page.goto(base_url + "/#%E0%A4%A")
        wait_route(page, "overview")
        for h in ["#%E0%A4%A", "#constructor", "#__proto__", "#toString", "#hasOwnProperty",
                  "#../../", "#%zz/x?%zz=%zz"]:
            page.evaluate("() => { location.hash = '#models'; }")
            wait_route(page, "models")
            page.evaluate("h => { location.hash = h; }", h)
            wait_route(page, "overview")
            assert page.eval_on_selector_all("section.page:not([hidden])", "s => s.map(x => x.id)") == [
                "page-overview"], h
        # A model name that is no valid percent-encoding, and one that is markup.
        for raw, shown in [("%E0%A4%A", "%E0%A4%A"),
                           ("%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D1%22%3E",
                            '<img src=x onerror="window.__pwned=1">')]:
            page.evaluate("h => { location.hash = h; }", "#models/" + raw)
            page.wait_for_selector("#model-missing:not([hidden])")
            assert shown in page.text_content("#model-missing")
            assert page.query_selector("#page-models img") is None
            page.evaluate("() => { location.hash = '#overview'; }")
            wait_route(page, "overview")
        assert page.evaluate("() => window.__pwned") is None
        assert watch.other_than("404") == []
    finally:
        ctx.close()


PROBE = """() => {
  const s = document.createElement('section');
  s.id = 'page-probe'; s.className = 'page'; s.hidden = true; s.textContent = 'probe';
  document.getElementById('content').appendChild(s);
  const P = window.__probe = {shows: [], refreshes: [], active: 0, maxActive: 0, early: [],
                              fail: {}, auto: false};
  function deferred() { let res, rej; const p = new Promise((a, b) => { res = a; rej = b; });
                        return {p, res, rej}; }
  TV.register('probe', {
    show(args) {
      if (P.fail.show) throw new Error('show threw (test)');
      const d = deferred(); const e = {args: args.join('/'), done: false, res: d.res, rej: d.rej};
      P.shows.push(e);
      return d.p.then(() => { e.done = true; }, (x) => { e.done = true; throw x; });
    },
    refresh(args) {
      const a = args.join('/');
      const last = P.shows[P.shows.length - 1];
      if (!last || last.args !== a || !last.done) P.early.push(a);
      if (P.fail.refresh) throw new Error('refresh threw (test)');
      if (P.auto) return undefined;
      P.active++; P.maxActive = Math.max(P.maxActive, P.active);
      const d = deferred(); const e = {args: a, res: d.res};
      P.refreshes.push(e);
      return d.p.then(() => { P.active--; });
    },
    hide() { if (P.fail.hide) throw new Error('hide threw (test)'); }
  });
}"""

FLUSH = "() => new Promise(r => setTimeout(r, 50))"  # lets queued promise callbacks run


def test_router_orders_show_and_refresh(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#overview")
    try:
        page.evaluate(PROBE)
        # Two routes in a row; the first one's show resolving must not
        # refresh the second before its own show resolved.
        page.evaluate("() => { location.hash = '#probe/a'; }")
        page.wait_for_function("() => __probe.shows.length === 1")
        page.evaluate("() => { location.hash = '#probe/b'; }")
        page.wait_for_function("() => __probe.shows.length === 2")
        page.evaluate("() => __probe.shows[0].res()")
        page.evaluate(FLUSH)
        assert page.evaluate("() => __probe.refreshes.length") == 0
        assert page.get_attribute("#page-probe", "data-ready") is None
        page.evaluate("() => __probe.shows[1].res()")
        page.wait_for_function("() => __probe.refreshes.length === 1")
        assert page.evaluate("() => __probe.refreshes[0].args") == "b"
        assert page.get_attribute("#page-probe", "data-ready") is None  # refresh not done
        page.evaluate("() => __probe.refreshes[0].res()")
        page.wait_for_selector("#page-probe[data-ready='1']")

        # A poll's refresh in flight, then a new route: its first refresh
        # waits for the old one (never two at once).
        page.wait_for_function("() => __probe.refreshes.length === 2", timeout=10000)
        page.evaluate("() => { location.hash = '#probe/c'; }")
        page.wait_for_function("() => __probe.shows.length === 3")
        page.evaluate("() => __probe.shows[2].res()")
        page.evaluate(FLUSH)
        assert page.evaluate("() => __probe.refreshes.length") == 2
        page.evaluate("() => __probe.refreshes[1].res()")
        page.wait_for_function("() => __probe.refreshes.length === 3")
        assert page.evaluate("() => __probe.refreshes[2].args") == "c"
        assert page.get_attribute("#page-probe", "data-ready") is None
        page.evaluate("() => __probe.refreshes[2].res()")
        page.wait_for_selector("#page-probe[data-ready='1']")
        assert page.evaluate("() => [__probe.maxActive, __probe.early]") == [1, []]
        assert watch.problems == []
    finally:
        ctx.close()


def test_page_failure_is_shown_and_cleared(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#overview")
    try:
        page.evaluate(PROBE)
        # A show that throws: its message, and the page still gets ready.
        page.evaluate("() => { Object.assign(__probe, {auto: true, fail: {show: true, refresh: true}});"
                      " location.hash = '#probe'; }")
        page.wait_for_selector("#page-probe[data-ready='1']")
        line = "#errors p.error-line[data-source='page probe'] span"
        page.wait_for_selector(line)
        # Later polls retry: a refresh that throws says so, one that works
        # takes the message away.
        page.wait_for_function(f"() => document.querySelector(\"{line}\").textContent"
                               ".includes('refresh threw (test)')", timeout=10000)
        page.evaluate("() => { __probe.fail = {}; }")
        page.wait_for_selector(line, state="detached", timeout=10000)
        # A hide that throws: the next page is shown all the same.
        page.evaluate("() => { __probe.fail = {hide: true}; location.hash = '#models'; }")
        wait_route(page, "models")
        assert "hide threw (test)" in page.text_content(line)
        assert watch.problems == []
    finally:
        ctx.close()


def test_error_box_keeps_focus_across_polls(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#overview")
    page.route("**/v1/models?*", lambda r: r.fulfill(
        status=500, content_type="application/json",
        body='{"error": {"code": "TV_E_IO", "message": "disk on fire (test)", "errno": -5}}'))
    try:
        page.evaluate("() => { location.hash = '#models'; }")
        wait_route(page, "models")
        btn = "#errors p.error-line[data-source='models'] button"
        page.focus(btn)
        for _ in range(2):  # two more polls answer the same error
            with page.expect_response(lambda r: "/v1/models?" in r.url, timeout=10000):
                pass
        page.evaluate(FLUSH)
        assert page.evaluate("() => document.activeElement.closest('p.error-line') !== null")
        assert page.evaluate("() => document.activeElement.textContent") == "dismiss"
        assert watch.other_than("500") == []
    finally:
        ctx.close()


def test_odd_answers_give_a_short_message(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#overview")
    answer = {}
    page.route("**/v1/models?*", lambda r: r.fulfill(**answer))
    line = "#errors p.error-line[data-source='models']"
    try:
        # 200 with an HTML page (a proxy's login page, say).
        answer.update(status=200, content_type="text/html", body="<html><body>sign in</body></html>")
        page.evaluate("() => { location.hash = '#models'; }")
        wait_route(page, "models")
        page.wait_for_selector(line)
        text = page.text_content(line + " span")
        assert "GET /v1/models" in text and "not JSON" in text, text
        # A 502 HTML error page of 20 KB: the status, a short excerpt.
        answer.update(status=502, content_type="text/html",
                      body="<html><head><title>502 Bad Gateway</title></head><body>" + "x" * 20000)
        page.wait_for_function(f"() => document.querySelector(\"{line} span\").textContent.includes('HTTP 502')",
                               timeout=10000)
        text = page.text_content(line + " span")
        assert "GET /v1/models" in text and "502 Bad Gateway" in text and len(text) < 400, text
        # 204, no body: an empty list, no error.
        answer.clear()
        answer.update(status=204, body="")
        page.wait_for_selector(line, state="detached", timeout=10000)
        page.wait_for_selector("#models-empty:not([hidden])")
        assert page.text_content("#models-count") == "0 models"
        assert watch.other_than("502") == []
    finally:
        ctx.close()


def test_csp_blocks_an_injected_inline_handler(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#overview")
    try:
        fired = page.evaluate("""() => new Promise(done => {
          const box = document.createElement('div');
          box.innerHTML = '<img id="evil" src="/ui/no-such.png" onerror="window.__pwned = 1">';
          box.querySelector('img').addEventListener('error', () => done(true));
          document.body.appendChild(box);
        })""")
        assert fired
        page.evaluate(FLUSH)
        assert page.evaluate("() => window.__pwned") is None
        assert any("Content Security Policy" in p for p in watch.problems), watch.problems
        assert watch.other_than("Content Security Policy", "no-such.png") == []
    finally:
        ctx.close()


def test_confirmation_dismissed_50_times_then_one_request(browser, base_url, daemon):
    ctx, page, watch = open_page(browser, base_url, "#models/demo", token=daemon.token)
    puts = []
    page.on("request", lambda r: r.method != "GET" and puts.append((r.method, r.url)))
    try:
        page.fill("#alias-name", "stable")
        for i in range(50):
            page.click("#alias-set")
            page.wait_for_selector("#confirm-dialog[open]")
            if i % 2:
                page.keyboard.press("Escape")
            else:
                page.click("#confirm-cancel")
            page.wait_for_selector("#confirm-dialog", state="hidden")
        assert puts == []
        page.click("#alias-set")
        page.wait_for_selector("#confirm-dialog[open]")
        with page.expect_response(lambda r: r.request.method == "PUT"):
            page.dblclick("#confirm-ok")
        page.wait_for_selector("#page-models[data-busy='0']")
        page.evaluate(FLUSH)
        assert puts == [("PUT", base_url + "/v1/models/demo/aliases/stable")]
        assert page.is_hidden("#confirm-dialog") and page.is_hidden("#token-dialog")
        assert watch.problems == []
    finally:
        ctx.close()


def test_token_stays_in_the_session_and_the_header(browser, base_url, daemon):
    ctx, page, watch = open_page(browser, base_url, "#models/demo")
    seen = []
    page.on("request", lambda r: seen.append((r.url, r.headers.get("authorization"))))
    try:
        page.fill("#alias-name", "stable")
        page.click("#alias-set")
        page.click("#confirm-ok")
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", daemon.token)
        page.click("#token-ok")
        page.wait_for_selector("#page-models[data-busy='0']")
        page.wait_for_selector("#notice:not([hidden])")
        assert page.evaluate("() => sessionStorage.getItem('tensorvault.token')") == daemon.token
        assert page.evaluate("() => localStorage.length") == 0
        assert page.evaluate("() => document.cookie") == ""
        assert ctx.cookies() == []
        assert daemon.token not in page.url
        assert page.evaluate("() => document.getElementById('token-input').value") == ""
        sent = [(u, a) for u, a in seen if a]
        assert sent and all(u.startswith(base_url + "/v1/") and a == "Bearer " + daemon.token
                            for u, a in sent), sent
        assert not any(daemon.token in u for u, _ in seen)
        assert watch.problems == []
    finally:
        ctx.close()


def test_daemon_down_and_back(browser, daemon_factory):
    d = daemon_factory()
    base = f"http://127.0.0.1:{d.port}"
    ctx, page, watch = open_page(browser, base, "#models")
    try:
        d.stop()
        line = "#errors p.error-line[data-source='models'] span"
        page.wait_for_selector(line, timeout=10000)
        text = page.text_content(line)
        assert "GET /v1/models" in text and "daemon" in text, text
        # While it is down: one failed request per poll, a probe of /healthz.
        n = len(watch.problems)
        for _ in range(2):
            with page.expect_event("requestfailed", lambda r: "/healthz" in r.url, timeout=10000):
                pass
        page.evaluate(FLUSH)
        failed = [p for p in watch.problems[n:] if p.startswith("request failed")]
        assert len(failed) == 2 and all("/healthz" in p for p in failed), watch.problems[n:]
        assert page.text_content(line) == text
        d.spawn(port=d.port)
        deadline = time.monotonic() + 30
        while True:  # the daemon's own start, not the page: the page is waited on below
            try:
                if d.request("GET", "/healthz", token=None, timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, d.log_text()
            time.sleep(0.05)
        page.wait_for_selector("#errors p.error-line[data-source='models']", state="detached",
                               timeout=10000)
        assert page.text_content("#models-count") == "0 models"
        assert watch.other_than("ERR_CONNECTION_REFUSED", "Failed to fetch", "ERR_EMPTY_RESPONSE",
                                "ERR_CONNECTION_RESET") == []
    finally:
        ctx.close()


def test_long_names_fit_narrow(browser, base_url):
    """A 128-byte name (the longest the registry takes), unknown: the error
    line and the page's message wrap instead of widening the page."""
    name = "n" * 128
    ctx, page, watch = open_page(browser, base_url, "#models/" + name, size="narrow")
    try:
        page.wait_for_selector("#errors p.error-line[data-source='models']")
        page.wait_for_selector("#model-missing:not([hidden])")
        assert name in page.text_content("#errors")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        assert watch.other_than("404") == []
    finally:
        ctx.close()


def test_header_reads_the_version_once_a_token_is_entered(browser, daemon_factory):
    """http.anonymous_reads = never: the header's version line, refused at
    load, is read once a token is entered with the Token button."""
    d = daemon_factory({"http.anonymous_reads": "never"})
    ctx, page, watch = open_page(browser, f"http://127.0.0.1:{d.port}", "#overview")
    try:
        page.wait_for_selector("#errors p.error-line[data-source='status']")
        assert "v" not in page.text_content("#meta")
        page.click("#token-btn")
        page.fill("#token-input", d.token)
        page.click("#token-ok")
        version = d.ok("GET", "/v1/status")["version"]
        page.wait_for_function("v => document.getElementById('meta').textContent.startsWith('v' + v)",
                               arg=version, timeout=10000)
        page.wait_for_selector("#errors", state="hidden")
        assert watch.other_than("401") == []
    finally:
        ctx.close()


def test_route_change_under_an_open_confirmation(browser, base_url, daemon):
    """The hash changes (Back, say) while a confirmation is open: OK still
    sends what it said, the notice names that model, and the page re-reads
    what it now shows (no request for a model named "null")."""
    ctx, page, watch = open_page(browser, base_url, "#models/demo", token=daemon.token)
    urls = []
    page.on("request", lambda r: urls.append((r.method, r.url)))
    try:
        page.fill("#alias-name", "stable")
        page.click("#alias-set")
        page.wait_for_selector("#confirm-dialog[open]")
        assert "demo" in page.text_content("#confirm-message")
        page.evaluate("() => { location.hash = '#models'; }")
        page.wait_for_function("() => document.getElementById('page-models').dataset.view === 'list'"
                               " && document.getElementById('page-models').dataset.ready === '1'")
        with page.expect_response(lambda r: r.request.method == "PUT"):
            page.click("#confirm-ok")
        page.wait_for_selector("#notice:not([hidden])")
        page.wait_for_selector("#page-models[data-busy='0']")
        page.evaluate(FLUSH)
        assert page.text_content("#notice").startswith("demo: alias stable"), page.text_content("#notice")
        assert ("PUT", base_url + "/v1/models/demo/aliases/stable") in urls
        assert not any("/v1/models/null" in u for _, u in urls), urls
        assert page.is_visible("#models-table")
        assert watch.problems == []
    finally:
        ctx.close()


def test_rapid_hash_changes_end_on_the_last_route(browser, base_url):
    ctx, page, watch = open_page(browser, base_url, "#models")
    try:
        page.evaluate("""async () => {
          const hs = ['#models/demo', '#models', '#overview', '#models/demo', '#models/nosuch'];
          for (let i = 0; i < 40; i++) {
            location.hash = hs[i % hs.length];
            await new Promise(r => setTimeout(r, i % 3 ? 0 : 15));
          }
          location.hash = '#models/demo';
        }""")
        page.wait_for_function("() => { const s = document.getElementById('page-models');"
                               " return s.dataset.ready === '1' && s.dataset.view === 'model'"
                               " && location.hash === '#models/demo'; }")
        page.wait_for_selector("#gens-table tr.gen[data-gen='1']")
        page.wait_for_selector("#errors", state="hidden", timeout=10000)  # nosuch's 404 goes
        assert page.is_hidden("#models-table")
        assert page.text_content("#model-h .model-name") == "demo"
        assert page.is_hidden("#model-missing")
        assert watch.other_than("nosuch") == []
    finally:
        ctx.close()


def test_long_name_in_a_confirmation_wraps(browser, daemon):
    """A 128-byte model name in the confirmation's title and message wraps
    inside the dialog at 390 px (nothing wider than its box)."""
    name = "w" * 128
    if not any(m["name"] == name for m in daemon.ok("GET", "/v1/models")["models"]):
        daemon.import_ok(name, demo_checkpoint(os.path.join(daemon.workdir, "ckpt-long", "model.safetensors")),
                         activate=True)
    ctx, page, watch = open_page(browser, f"http://127.0.0.1:{daemon.port}", "#models/" + name, size="narrow")
    try:
        page.click("#deactivate-btn")
        page.wait_for_selector("#confirm-dialog[open]")
        sizes = page.evaluate("""() => [...document.querySelectorAll('#confirm-dialog, #confirm-dialog *')]
          .map(e => [e.id || e.tagName, e.getBoundingClientRect().right, e.scrollWidth, e.clientWidth])""")
        w = page.evaluate("() => innerWidth")
        assert all(r <= w + 0.5 and (cw == 0 or sw <= cw) for _, r, sw, cw in sizes), (w, sizes)
        assert name in page.text_content("#confirm-message")
        page.click("#confirm-cancel")
        page.wait_for_selector("#confirm-dialog", state="hidden")
        assert watch.problems == []
    finally:
        ctx.close()
