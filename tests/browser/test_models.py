"""The dashboard's Models page in Chromium: #models lists every
model as the API does, #models/demo shows its generations (state, active
and alias badges, sizes, shards with sha256 and replicas) as the API does;
its actions (activate, point an alias, rollback, retire, remove an alias)
change what the API says and the page follows, a Cancel in the confirmation
sends nothing; refused changes (no token, a bad token, 409) show the HTTP
status and the API's message and change nothing; an action can be done with
the keyboard alone; it fits 1280 and 390 px in light and dark (screenshots
in the artifacts dir)."""
import os

import pytest

from harness.browser import demo_checkpoint, open_page, shoot
from harness.daemon import seg


OTHER = "team/other.v2"  # a name with a "/" (percent-encoded in paths and the hash)


def make_demo(daemon_factory):
    """A daemon with model "demo" (3 generations of the small checkpoint,
    seeds 1-3; gen 2 active, alias prod -> 1) and model OTHER (1 gen)."""
    d = daemon_factory()
    for seed in (1, 2, 3):
        d.import_ok("demo", demo_checkpoint(os.path.join(d.workdir, f"ckpt{seed}", "model.safetensors"), seed))
    d.import_ok(OTHER, demo_checkpoint(os.path.join(d.workdir, "ckpt9", "model.safetensors"), 9),
                activate=True)
    d.ok("POST", "/v1/models/demo/generations/2/activate")
    d.ok("PUT", "/v1/models/demo/aliases/prod", body={"generation": 1})
    return d


@pytest.fixture(scope="module")
def demo(daemon_factory):
    return make_demo(daemon_factory)


def url(d):
    return f"http://127.0.0.1:{d.port}"


def api_state(d):
    return d.ok("GET", "/v1/models/demo"), d.generations("demo")


def gen_row(n):
    return f"#gens-table tr.gen[data-gen='{n}']"


def confirm(page, ok=True):
    """Waits for the confirmation dialog (focus on Cancel), answers it and
    returns its message."""
    page.wait_for_selector("#confirm-dialog[open]")
    assert page.evaluate("() => document.activeElement.id") == "confirm-cancel"
    msg = page.text_content("#confirm-message")
    page.click("#confirm-ok" if ok else "#confirm-cancel")
    page.wait_for_selector("#confirm-dialog", state="hidden")
    return msg


def wait_idle(page):
    page.wait_for_selector("#page-models[data-busy='0']")


def error_line(page):
    return page.text_content("#errors p.error-line[data-source='models action'] span")


def test_list_and_model_view_match_api(browser, demo):
    ctx, page, watch = open_page(browser, url(demo), "#models")
    try:
        models = demo.ok("GET", "/v1/models")["models"]
        rows = page.query_selector_all("#models-table tbody tr")
        assert [r.get_attribute("data-model") for r in rows] == [m["name"] for m in models] == ["demo", OTHER]
        for r, m in zip(rows, models):
            assert r.eval_on_selector("td.name a", "a => a.getAttribute('href')") == "#models/" + seg(m["name"])
            assert r.eval_on_selector("td.n-gens", "e => e.textContent") == str(m["n_generations"])
        demo_row = rows[0]
        assert demo_row.eval_on_selector("td.active-gen .badge.active", "e => e.textContent") == "2"
        assert demo_row.eval_on_selector_all("td.aliases .badge.alias", "es => es.map(e => e.textContent)") == [
            "prod\u21921"]
        assert demo_row.eval_on_selector("td.n-gens", "e => e.textContent") == "3"
        assert rows[1].eval_on_selector("td.active-gen .badge.active", "e => e.textContent") == "1"

        # The filter is a substring match on the name, typed in place.
        page.fill("#models-filter", "th")
        page.wait_for_function("() => document.querySelectorAll('#models-table tbody tr').length === 1")
        assert page.get_attribute("#models-table tbody tr", "data-model") == OTHER
        page.fill("#models-filter", "zzz")
        page.wait_for_selector("#models-empty:visible")
        page.fill("#models-filter", "")

        # Into the model view through its link.
        page.click("#models-table tr[data-model='demo'] td.name a")
        page.wait_for_selector("#page-models[data-view='model'][data-ready='1']")
        page.wait_for_selector(gen_row(3))
        m, gens = api_state(demo)
        assert page.get_attribute("#model-facts", "data-active") == str(m["active_generation"]) == "2"
        trs = page.query_selector_all("#gens-table tr.gen")
        assert [t.get_attribute("data-gen") for t in trs] == ["3", "2", "1"]
        by_gen = {g["generation"]: g for g in gens}
        for t in trs:
            g = by_gen[int(t.get_attribute("data-gen"))]
            badges = t.eval_on_selector_all("td.badges .badge", "es => es.map(e => e.className + ':' + e.textContent)")
            want = [f"badge {g['state']}:{g['state']}"] + (["badge active:active"] if g["active"] else []) + [
                f"badge alias:{a}" for a in g["aliases"]]
            assert badges == want
            assert t.eval_on_selector("td.size", "e => e.dataset.bytes") == str(g["total_bytes"])
            assert t.eval_on_selector("td.size", "e => e.title") == f"{g['total_bytes']} bytes"
            assert t.eval_on_selector("td.n-tensors", "e => e.textContent") == str(g["n_tensors"]) == "3"
            assert t.eval_on_selector("td.n-shards", "e => e.textContent") == str(g["n_shards"])
            assert t.eval_on_selector("a.tensors-link", "a => a.getAttribute('href')") == \
                f"#tensors/demo/{g['generation']}"
            buttons = t.eval_on_selector_all("td.gen-actions button", "bs => bs.map(b => b.textContent)")
            assert buttons == (["Retire"] if g["active"] else ["Activate", "Retire"])
        assert page.eval_on_selector_all("#alias-list li", "ls => ls.map(l => l.dataset.alias + '=' + "
                                         "l.dataset.generation)") == ["prod=1"]
        assert page.eval_on_selector_all("#alias-gen option", "os => os.map(o => o.value)") == ["3", "2", "1"]

        # Expanding a generation shows its shards as GET .../generations/N says.
        shas = set()
        for n in (3, 2, 1):
            btn = f"{gen_row(n)} button.expand"
            assert page.get_attribute(btn, "aria-expanded") == "false"
            page.click(btn)
            page.wait_for_selector(f"#shards-{n} li.shard")
            assert page.get_attribute(btn, "aria-expanded") == "true"
            detail = demo.ok("GET", f"/v1/models/demo/generations/{n}")
            lis = page.query_selector_all(f"#shards-{n} li.shard")
            assert len(lis) == len(detail["shards"]) == 1
            for li, s in zip(lis, detail["shards"]):
                assert li.get_attribute("data-name") == s["name"] == "model.safetensors"
                assert li.eval_on_selector(".sha256", "e => e.textContent") == s["sha256"]
                assert li.get_attribute("data-file-bytes") == str(s["file_bytes"])
                reps = li.eval_on_selector_all(".replica", "es => es.map(e => [+e.dataset.deviceId, "
                                               "+e.dataset.deviceOffset])")
                assert reps == [[r["device_id"], r["device_offset"]] for r in s["replicas"]]
                assert len(reps) == 1
                shas.add(s["sha256"])
        assert len(shas) == 3  # three seeds, three different files
        page.click(f"{gen_row(1)} button.expand")
        page.wait_for_selector("#shards-1", state="detached")
        assert page.is_hidden("#errors")

        # The other model, by its encoded name; then one that does not exist.
        page.click("#page-models .back")
        page.click(f"#models-table tr[data-model='{OTHER}'] td.name a")
        page.wait_for_selector("#page-models[data-view='model'] #gens-table tr.gen[data-gen='1'][data-active='1']")
        assert page.text_content("#model-h .model-name") == OTHER
        assert page.eval_on_selector(f"{gen_row(1)} a.tensors-link", "a => a.getAttribute('href')") == \
            "#tensors/" + seg(OTHER) + "/1"
        assert watch.problems == []
        page.evaluate("() => { location.hash = '#models/nope' }")
        page.wait_for_selector("#model-missing:visible")
        assert "HTTP 404" in page.text_content("#errors p.error-line[data-source='models'] span")
        assert page.query_selector("#gens-table tr.gen") is None
        assert watch.other_than("404") == []
    finally:
        ctx.close()


def test_actions_change_the_api_and_the_page(browser, daemon_factory):
    d = make_demo(daemon_factory)
    ctx, page, watch = open_page(browser, url(d), "#models/demo", token=d.token)
    sent = []
    page.on("request", lambda r: r.method != "GET" and sent.append((r.method, r.url)))
    try:
        page.wait_for_selector(gen_row(3))
        # Every action button is disabled while its request is in flight.
        page.evaluate("""() => { window.__disabled = []; const f = window.fetch;
          window.fetch = function (u, init) {
            if (init && init.method && init.method !== 'GET')
              window.__disabled.push([...document.querySelectorAll('#page-models [data-action]')]
                                     .every(b => b.disabled));
            return f.apply(this, arguments); }; }""")

        # A Cancel sends nothing and changes nothing.
        before = api_state(d)
        page.click(f"{gen_row(3)} button[data-key='activate:3']")
        msg = confirm(page, ok=False)
        assert "demo" in msg and "from 2 to 3" in msg
        assert sent == [] and api_state(d) == before
        assert page.get_attribute(gen_row(2), "data-active") == "1"

        # Activate 3.
        page.click(f"{gen_row(3)} button[data-key='activate:3']")
        msg = confirm(page)
        assert "Model demo" in msg and "from 2 to 3" in msg
        page.wait_for_selector(f"{gen_row(3)}[data-active='1'] .badge.active")
        wait_idle(page)
        assert page.get_attribute("#model-facts", "data-active") == "3"
        assert page.get_attribute(gen_row(2), "data-active") == "0"
        assert d.ok("GET", "/v1/models/demo")["active_generation"] == 3
        assert "generation 3 is active" in page.text_content("#notice")
        assert sent[-1][0] == "POST" and sent[-1][1].endswith("/v1/models/demo/generations/3/activate")

        # Move alias prod 1 -> 3 with the form.
        page.fill("#alias-name", "prod")
        page.select_option("#alias-gen", "3")
        page.click("#alias-set")
        msg = confirm(page)
        assert "prod moves from 1 to 3" in msg and "demo" in msg
        page.wait_for_selector("#alias-list li[data-alias='prod'][data-generation='3']")
        wait_idle(page)
        assert d.ok("GET", "/v1/models/demo")["aliases"] == {"prod": 3}
        assert page.eval_on_selector_all(f"{gen_row(3)} .badge.alias", "es => es.map(e => e.textContent)") == ["prod"]
        assert page.query_selector(f"{gen_row(1)} .badge.alias") is None
        assert page.input_value("#alias-name") == ""

        # Rollback: 3 -> 2 (the highest ready generation below 3).
        page.click("#rollback-btn")
        msg = confirm(page)
        assert "from 3 to 2" in msg
        page.wait_for_selector(f"{gen_row(2)}[data-active='1']")
        wait_idle(page)
        assert d.ok("GET", "/v1/models/demo")["active_generation"] == 2
        assert "rolled back" in page.text_content("#notice")

        # Retire 1 (no longer aliased, not active).
        page.click(f"{gen_row(1)} button[data-key='retire:1']")
        msg = confirm(page)
        assert "generation 1" in msg and "demo" in msg
        page.wait_for_selector(f"{gen_row(1)}[data-state='retired'] .badge.retired")
        wait_idle(page)
        assert {g["generation"]: g["state"] for g in d.generations("demo")} == {
            1: "retired", 2: "ready", 3: "ready"}
        assert page.query_selector(f"{gen_row(1)} td.gen-actions button") is None
        assert page.eval_on_selector_all("#alias-gen option", "os => os.map(o => o.value)") == ["3", "2"]

        # Remove alias prod.
        page.click("#alias-list button[data-key='alias-rm:prod']")
        msg = confirm(page)
        assert "prod" in msg and "generation 3" in msg
        page.wait_for_selector("#alias-list li[data-alias='prod']", state="detached")
        wait_idle(page)
        assert d.ok("GET", "/v1/models/demo")["aliases"] == {}

        # Deactivate: no active generation, so no Rollback either.
        page.click("#deactivate-btn")
        msg = confirm(page)
        assert "generation 2" in msg and "demo" in msg
        page.wait_for_selector("#model-facts[data-active='']")
        wait_idle(page)
        assert d.ok("GET", "/v1/models/demo")["active_generation"] is None
        assert page.query_selector("#rollback-btn") is None
        assert page.query_selector("#gens-table .badge.active") is None

        assert [m for m, _ in sent] == ["POST", "PUT", "POST", "POST", "DELETE", "POST"]
        assert page.evaluate("() => window.__disabled") == [True] * 6
        assert page.is_hidden("#errors")
        assert watch.problems == []
    finally:
        ctx.close()


def test_refused_actions_show_the_api_message(browser, demo):
    before = api_state(demo)
    ctx, page, watch = open_page(browser, url(demo), "#models/demo")
    auth = []
    page.on("request", lambda r: r.method == "POST" and auth.append(r.headers.get("authorization")))
    try:
        page.wait_for_selector(gen_row(3))
        assert page.get_attribute("#token-btn", "data-token") == "none"

        # No token: the dialog asks, Cancel sends it without one -> 401.
        page.click(f"{gen_row(3)} button[data-key='activate:3']")
        confirm(page)
        page.wait_for_selector("#token-dialog[open]")
        with page.expect_response(lambda r: r.url.endswith("/generations/3/activate")) as ri:
            page.click("#token-cancel")
        r = ri.value
        assert r.status == 401
        api_msg = r.json()["error"]["message"]
        page.wait_for_selector("#errors p.error-line[data-source='models action']")
        wait_idle(page)
        text = error_line(page)
        assert "HTTP 401" in text and api_msg in text, text
        assert auth == [None]
        assert api_state(demo) == before
        assert page.get_attribute(gen_row(2), "data-active") == "1"
        assert page.get_attribute(gen_row(3), "data-active") == "0"

        # A bad token: 401, and the page forgets it.
        page.click("#errors p.error-line[data-source='models action'] button")
        page.click(f"{gen_row(3)} button[data-key='activate:3']")
        confirm(page)
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", "tvk_bad0123456789")
        with page.expect_response(lambda r: r.url.endswith("/generations/3/activate")) as ri:
            page.click("#token-ok")
        assert ri.value.status == 401
        page.wait_for_selector("#errors p.error-line[data-source='models action']")
        wait_idle(page)
        assert "HTTP 401" in error_line(page)
        assert auth[-1] == "Bearer tvk_bad0123456789"
        assert page.get_attribute("#token-btn", "data-token") == "none"
        assert api_state(demo) == before

        # A good token, but retiring the active generation: 409, its message shown.
        page.click("#errors p.error-line[data-source='models action'] button")
        page.click(f"{gen_row(2)} button[data-key='retire:2']")
        msg = confirm(page)
        assert "active" in msg
        page.wait_for_selector("#token-dialog[open]")
        page.fill("#token-input", demo.token)
        with page.expect_response(lambda r: r.url.endswith("/generations/2/retire")) as ri:
            page.click("#token-ok")
        r = ri.value
        assert r.status == 409
        api_msg = r.json()["error"]["message"]
        page.wait_for_selector("#errors p.error-line[data-source='models action']")
        wait_idle(page)
        text = error_line(page)
        assert "HTTP 409" in text and api_msg in text, text
        assert page.get_attribute("#token-btn", "data-token") == "set"
        assert api_state(demo) == before
        assert page.get_attribute(gen_row(2), "data-state") == "ready"

        base = url(demo) + "/v1/models/demo/generations"
        assert [p for p in watch.problems if p.startswith("HTTP ")] == [
            f"HTTP 401: POST {base}/3/activate", f"HTTP 401: POST {base}/3/activate",
            f"HTTP 409: POST {base}/2/retire"]
        assert watch.other_than("401", "409") == []
    finally:
        ctx.close()


def test_read_token_is_refused_with_403(browser, demo):
    tok = demo.ok("POST", "/v1/tokens", status=201, body={"name": "reader", "scope": "read"})["token"]
    before = api_state(demo)
    ctx, page, watch = open_page(browser, url(demo), "#models/demo", token=tok)
    try:
        page.wait_for_selector(gen_row(3))
        page.click(f"{gen_row(3)} button[data-key='retire:3']")
        with page.expect_response(lambda r: r.url.endswith("/generations/3/retire")) as ri:
            confirm(page)
        r = ri.value
        assert r.status == 403
        api_msg = r.json()["error"]["message"]
        page.wait_for_selector("#errors p.error-line[data-source='models action']")
        wait_idle(page)
        text = error_line(page)
        assert "HTTP 403" in text and api_msg in text and "may not make changes" in text, text
        assert page.get_attribute("#token-btn", "data-token") == "set"  # a 403 keeps the token
        assert api_state(demo) == before
        assert page.get_attribute(gen_row(3), "data-state") == "ready"
        assert watch.other_than("403") == []
    finally:
        ctx.close()


def test_keyboard_only(browser, demo):
    ctx, page, watch = open_page(browser, url(demo), "#models/demo", token=demo.token)
    try:
        page.wait_for_selector(gen_row(3))
        page.focus("#page-models .back")
        for _ in range(80):
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.dataset.key") == "activate:3":
                break
        else:
            pytest.fail("Tab never reached generation 3's Activate button")
        # The focus ring is visible.
        assert page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle") != "none"
        page.keyboard.press("Enter")
        page.wait_for_selector("#confirm-dialog[open]")
        assert page.evaluate("() => document.activeElement.id") == "confirm-cancel"
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.id") == "confirm-ok"
        page.keyboard.press("Space")
        page.wait_for_selector(f"{gen_row(3)}[data-active='1']")
        wait_idle(page)
        assert demo.ok("GET", "/v1/models/demo")["active_generation"] == 3
        # The pressed button is gone: the focus stays on that generation's row.
        page.wait_for_function("() => document.activeElement.dataset.key === 'expand:3'")
        # Expanding with the keyboard too.
        page.focus(f"{gen_row(2)} button.expand")
        page.keyboard.press("Enter")
        page.wait_for_selector("#shards-2 li.shard")
        assert page.evaluate("() => document.activeElement.dataset.key") == "expand:2"
        assert watch.problems == []
    finally:
        demo.ok("POST", "/v1/models/demo/generations/2/activate")
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_screenshots(browser, demo, artifacts_dir, scheme, size):
    ctx, page, watch = open_page(browser, url(demo), "#models", scheme=scheme, size=size)
    try:
        page.wait_for_selector("#models-table tr[data-model='demo']")
        shoot(page, artifacts_dir, "models-list", scheme, size)
        page.click("#models-table tr[data-model='demo'] td.name a")
        page.wait_for_selector("#page-models[data-view='model'][data-ready='1']")
        page.click(f"{gen_row(2)} button.expand")
        page.wait_for_selector("#shards-2 li.shard")
        shoot(page, artifacts_dir, "models", scheme, size)
        assert watch.problems == []
    finally:
        ctx.close()
