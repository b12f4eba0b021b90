"""The Overview page's LBA map (issue 12, API12.md): a daemon with models
alpha (generations 1 and 3), beta and gamma, alpha@2 retired and gc'd so a
hole lies between objects. The map's segments equal GET
/v1/devices/1/extents (kind, offset, bytes, model and generation, in
order); different models get different colours, free extents the free
colour; hovering a segment and moving the keyboard focus along the map show
its details; the 2 s refresh keeps the focus (the map is rebuilt only when
the extents change, and then the focused extent keeps it); it fits 390 px;
screenshots in light/dark x wide/narrow."""
import os

import pytest

from conftest import SIZES, demo_checkpoint, open_page, shoot

SEGS_JS = """() => Array.from(document.querySelectorAll('#devices .device .lba-seg')).map(s => [
    s.dataset.kind, Number(s.dataset.offset), Number(s.dataset.bytes),
    s.dataset.model || null, s.dataset.generation ? Number(s.dataset.generation) : null])"""


@pytest.fixture(scope="module")
def d(daemon_factory):
    dm = daemon_factory()

    def ckpt(name, seed):
        return demo_checkpoint(os.path.join(dm.workdir, name, "model.safetensors"), seed)

    dm.import_ok("alpha", ckpt("a1", 1))
    dm.import_ok("alpha", ckpt("a2", 2))
    dm.import_ok("beta", ckpt("b1", 3), activate=True)
    dm.import_ok("gamma", ckpt("g1", 4), activate=True)
    dm.import_ok("alpha", ckpt("a3", 5), activate=True)
    dm.ok("POST", "/v1/models/alpha/generations/2/retire")
    assert dm.ok("POST", "/v1/gc")["n_objects_freed"] == 1
    return dm


def url(d):
    return f"http://127.0.0.1:{d.port}"


def want_segments(doc):
    out = []
    for e in doc["extents"]:
        u = e.get("users") or [None]
        out.append([e["kind"], e["offset"], e["bytes"], u[0] and u[0]["model"],
                    u[0] and u[0]["generation"]])
    return out


def wait_map(page, doc):
    want = want_segments(doc)
    page.wait_for_function(f"() => ({SEGS_JS})().length === {len(want)}", timeout=10000)
    return want


def seg(page, kind, model=None):
    sel = f"#devices .lba-seg[data-kind='{kind}']" + (f"[data-model='{model}']" if model else "")
    return page.query_selector(sel)


def test_map_equals_extents(browser, d):
    ctx, page, watch = open_page(browser, url(d), "#overview")
    try:
        doc = d.ok("GET", "/v1/devices/1/extents")
        want = wait_map(page, doc)
        assert page.evaluate(SEGS_JS) == want
        kinds = [w[0] for w in want]
        assert kinds[0] == "label" and kinds.count("object") == 4
        # the hole alpha@2 left lies between two objects
        assert any(a == "object" and b == "free" and c == "object"
                   for a, b, c in zip(kinds, kinds[1:], kinds[2:])), kinds
        bg = {m: seg(page, "object", m).evaluate("e => getComputedStyle(e).backgroundColor")
              for m in ("alpha", "beta", "gamma")}
        assert len(set(bg.values())) == 3, bg
        free = seg(page, "free").evaluate("e => getComputedStyle(e).backgroundColor")
        assert free == "rgb(227, 232, 238)"  # --free (light)
        label = seg(page, "label").evaluate("e => getComputedStyle(e).backgroundColor")
        assert label not in bg.values() and label != free
        # the legend names every model with its colour
        legend = page.eval_on_selector_all(
            "#devices .lba-legend li[data-model]",
            "ls => ls.map(l => [l.dataset.model, getComputedStyle(l.firstChild).backgroundColor])")
        assert [m for m, _ in legend] == ["alpha", "beta", "gamma"]
        assert dict(legend)["beta"] == bg["beta"]
        # every segment is visible and inside the map
        box = page.eval_on_selector("#devices .lba-map", "e => e.getBoundingClientRect().toJSON()")
        rects = page.eval_on_selector_all("#devices .lba-seg",
                                          "ss => ss.map(s => s.getBoundingClientRect().toJSON())")
        assert all(r["width"] >= 1.5 and r["left"] >= box["left"] - 0.5 and
                   r["right"] <= box["right"] + 0.5 for r in rects), (box, rects)
        assert watch.problems == []
    finally:
        ctx.close()


def test_hover_and_keyboard_show_details(browser, d):
    ctx, page, watch = open_page(browser, url(d), "#overview")
    try:
        doc = d.ok("GET", "/v1/devices/1/extents")
        wait_map(page, doc)
        details = "#devices .lba-details[role='status']"
        beta = [e for e in doc["extents"] if e.get("users") and e["users"][0]["model"] == "beta"][0]
        seg(page, "object", "beta").hover()
        text = page.text_content(details)
        assert "beta@1" in text and "model.safetensors" in text and "ready" in text, text
        assert str(beta["offset"]) in text and beta["sha256"][:12] in text, text
        assert seg(page, "object", "beta").get_attribute("title") == text
        # keyboard: Tab reaches the map (one tab stop), arrows walk it
        for _ in range(40):
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.classList.contains('lba-seg')"):
                break
        assert page.evaluate("() => document.activeElement.dataset.kind") == "label"
        assert page.text_content(details).startswith("store label")
        page.keyboard.press("ArrowRight")
        first = doc["extents"][1]
        assert page.evaluate("() => Number(document.activeElement.dataset.offset)") == first["offset"]
        assert str(first["offset"]) in page.text_content(details)
        style = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
        assert style != "none"
        page.keyboard.press("End")
        last = doc["extents"][-1]
        assert last["kind"] == "free"
        assert page.text_content(details).startswith("free \u00b7 offset " + str(last["offset"]))
        # the next refreshes keep the focused element (nothing was rebuilt)
        page.evaluate("() => { document.activeElement.dataset.mark = '1'; }")
        for _ in range(2):
            with page.expect_response(lambda r: r.url.endswith("/v1/devices/1/extents")):
                pass
        assert page.evaluate("() => document.activeElement.dataset.mark") == "1"
        # a change rebuilds the map; the focused extent keeps the focus
        d.import_ok("delta", demo_checkpoint(os.path.join(d.workdir, "d1", "model.safetensors"), 9))
        doc2 = d.ok("GET", "/v1/devices/1/extents")
        want2 = wait_map(page, doc2)
        page.wait_for_function("() => document.querySelector(\"#devices .lba-seg[data-model='delta']\")")
        assert page.evaluate(SEGS_JS) == want_segments(d.ok("GET", "/v1/devices/1/extents")) == want2
        assert page.evaluate("() => document.activeElement.classList.contains('lba-seg')")
        assert page.evaluate("() => document.activeElement.dataset.mark") is None  # rebuilt
        assert page.evaluate("() => document.activeElement.tabIndex") == 0
        assert watch.problems == []
    finally:
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_map_screenshots(browser, artifacts_dir, d, scheme, size):
    ctx, page, watch = open_page(browser, url(d), "#overview", scheme=scheme, size=size)
    try:
        wait_map(page, d.ok("GET", "/v1/devices/1/extents"))
        right = page.eval_on_selector("#devices .device", "e => e.getBoundingClientRect().right")
        assert page.eval_on_selector("#devices .lba-map",
                                     "e => e.getBoundingClientRect().right") <= right + 0.5
        assert page.evaluate("() => document.querySelector('#devices .lba-map').scrollWidth <= "
                             "document.querySelector('#devices .lba-map').clientWidth + 2")
        seg(page, "object", "beta").hover()
        shoot(page, artifacts_dir, "overview-map", scheme, size)
        assert SIZES[size][0] >= page.evaluate("() => document.documentElement.scrollWidth")
        assert watch.problems == []
    finally:
        ctx.close()
