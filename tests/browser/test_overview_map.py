"""The Overview page's LBA map (GET /v1/devices/{id}/extents): a daemon with models
alpha (generations 1 and 3), beta and gamma, alpha@2 retired and gc'd so a
hole lies between objects. The map's segments equal GET
/v1/devices/1/extents (kind, offset, bytes, model and generation, in
order); different models get different colours, free extents the free
colour; hovering a segment and moving the keyboard focus along the map show
its details; the 2 s refresh keeps the focus (the map is rebuilt only when
the extents change, and then the focused extent keeps it); it fits 390 px.
The scale control ("objects", the default here, or "to scale") changes
only the widths: in "objects" every object is at least 6 px wide at 1280
and 390 px and the trailing free extent is compressed and labelled with
its size; keyboard-usable, aria-pressed, kept across reloads per device.
Screenshots in light/dark x wide/narrow (objects scale), plus to-scale
wide and objects narrow from the scale test."""
import json
import os

import pytest

from harness.browser import SIZES, demo_checkpoint, open_page, shoot

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


ATTRS_JS = """() => Array.from(document.querySelectorAll('#devices .device .lba-seg')).map(
    s => Object.assign({}, s.dataset))"""
WIDTHS_JS = """() => Array.from(document.querySelectorAll('#devices .device .lba-seg')).map(
    s => [s.dataset.kind, s.getBoundingClientRect().width])"""
MIN_OBJECT_PX = 6


def scale_of(page):
    return page.eval_on_selector("#devices .lba", "e => e.dataset.scale")


def pressed(page):
    return page.eval_on_selector_all("#devices .lba-scale button",
                                     "bs => bs.map(b => [b.dataset.scale, b.getAttribute('aria-pressed')])")


def check_objects_scale(page, doc, width):
    """Every object (and the label and every gap between objects) at least
    MIN_OBJECT_PX wide; the trailing free extent compressed to about a
    quarter, its size written on it; the map fits."""
    page.set_viewport_size({"width": width, "height": SIZES["wide"][1]})
    box = page.eval_on_selector("#devices .lba-map", "e => e.getBoundingClientRect().toJSON()")
    widths = page.evaluate(WIDTHS_JS)
    assert [k for k, _ in widths] == [e["kind"] for e in doc["extents"]]
    assert all(w >= MIN_OBJECT_PX for _, w in widths[:-1]), (width, widths)
    # the minimum width is a valid CSS min() (an invalid one would be dropped)
    assert page.evaluate("""() => Array.from(document.querySelectorAll(
        '#devices .lba-seg:not(:last-child)')).every(s => s.style.minWidth.startsWith('min('))""")
    assert sum(w for _, w in widths) <= box["width"] + 1, (width, box, widths)
    last = doc["extents"][-1]
    trail = page.query_selector("#devices .lba-seg:last-child")
    assert "compressed" in trail.get_attribute("class")
    assert 0.2 * box["width"] <= widths[-1][1] <= 0.4 * box["width"], (width, box, widths)
    size = page.evaluate(f"() => TV.fmtBytes({last['bytes']})")
    text = trail.inner_text()
    assert text == size + " free", text
    assert trail.evaluate("e => e.firstChild.scrollWidth <= e.firstChild.clientWidth"), text
    assert "drawn compressed" in trail.get_attribute("aria-label")
    assert page.is_visible("#devices .lba-legend li.compressed-key")
    # the details stay exact
    trail.hover()
    details = page.text_content("#devices .lba-details")
    assert details.startswith(f"free \u00b7 offset {last['offset']} ") and \
        f"({last['bytes']} bytes)" in details, details
    objects = [w for k, w in widths if k == "object"]
    return objects


def test_scale_control(browser, artifacts_dir, d):
    """The objects scale (the default: the objects cover under 5% of the
    256 MiB region) gives every object a visible width at 1280 and 390 px;
    switching to "to scale" and back by keyboard changes only the widths
    (the segments' data attributes stay identical, in order); the choice
    survives a reload; aria-pressed follows."""
    ctx, page, watch = open_page(browser, url(d), "#overview")
    try:
        doc = d.ok("GET", "/v1/devices/1/extents")
        wait_map(page, doc)
        assert sum(e["bytes"] for e in doc["extents"] if e["kind"] == "object") < \
            0.05 * doc["region_bytes"]
        assert scale_of(page) == "objects"
        assert pressed(page) == [["to-scale", "false"], ["objects", "true"]]
        attrs = page.evaluate(ATTRS_JS)
        assert [a["offset"] for a in attrs] == [str(e["offset"]) for e in doc["extents"]]
        for width in (SIZES["wide"][0], SIZES["narrow"][0]):
            objects = check_objects_scale(page, doc, width)
            assert len(objects) == sum(e["kind"] == "object" for e in doc["extents"])
        shoot(page, artifacts_dir, "overview-map-objects", "light", "narrow")
        page.set_viewport_size(dict(zip(("width", "height"), SIZES["wide"])))

        # keyboard: Tab to "to scale", Enter; Tab to "objects", Space
        page.evaluate("() => document.activeElement.blur()")  # from the body
        for _ in range(40):
            page.keyboard.press("Tab")
            if page.evaluate("() => document.activeElement.dataset.scale === 'to-scale'"):
                break
        assert page.evaluate("() => document.activeElement.dataset.scale") == "to-scale"
        assert page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle") != "none"
        page.keyboard.press("Enter")
        assert scale_of(page) == "to-scale"
        assert pressed(page) == [["to-scale", "true"], ["objects", "false"]]
        assert page.evaluate(ATTRS_JS) == attrs
        assert page.evaluate(SEGS_JS) == want_segments(doc)
        box = page.eval_on_selector("#devices .lba-map", "e => e.getBoundingClientRect().toJSON()")
        widths = page.evaluate(WIDTHS_JS)
        # to scale: the trailing free extent is nearly all of it, not compressed
        assert widths[-1][1] >= 0.9 * box["width"], (box, widths)
        trail = page.query_selector("#devices .lba-seg:last-child")
        assert "compressed" not in trail.get_attribute("class") and trail.inner_text() == ""
        assert trail.get_attribute("aria-label") == trail.get_attribute("data-details")
        assert not page.is_visible("#devices .lba-legend li.compressed-key")
        shoot(page, artifacts_dir, "overview-map-to-scale", "light", "wide")

        # the choice survives a reload (kept per device id)
        page.reload()
        page.wait_for_selector("#page-overview[data-ready='1']", timeout=15000)
        wait_map(page, doc)
        assert scale_of(page) == "to-scale"
        assert page.evaluate("() => localStorage.getItem('tv.overview.lba-scale.1')") == "to-scale"
        assert page.evaluate(ATTRS_JS) == attrs

        # ... and the 2 s refresh keeps it and the focus on the button
        page.focus("#devices .lba-scale button[data-scale='to-scale']")
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.dataset.scale") == "objects"
        page.keyboard.press("Space")
        assert scale_of(page) == "objects"
        assert pressed(page) == [["to-scale", "false"], ["objects", "true"]]
        with page.expect_response(lambda r: r.url.endswith("/v1/devices/1/extents")):
            pass
        assert scale_of(page) == "objects"
        assert page.evaluate("() => document.activeElement.dataset.scale") == "objects"
        assert page.evaluate(ATTRS_JS) == attrs
        check_objects_scale(page, doc, SIZES["wide"][0])
        assert watch.problems == []
    finally:
        ctx.close()


def test_objects_scale_with_many_objects_fits_390(browser, d):
    """400 objects (a synthetic extents answer): the objects scale still
    fits the map at 390 px, every segment drawn, the trailing free extent
    compressed and labelled."""
    real = d.ok("GET", "/v1/devices/1/extents")
    ex, pos, k = [real["extents"][0]], real["data_offset"], 16384
    for i in range(400):
        ex.append({"offset": pos, "bytes": k, "kind": "object", "object_id": i + 1,
                   "state": "committed", "canonical_bytes": k, "sha256": "ab" * 32,
                   "users": [{"model": f"m{i % 7}", "generation": 1, "shard": "model.safetensors",
                              "state": "ready"}]})
        pos += k
        if i % 3 == 0:
            ex.append({"offset": pos, "bytes": k, "kind": "free"})
            pos += k
    end = real["region_offset"] + real["region_bytes"]
    ex.append({"offset": pos, "bytes": end - pos, "kind": "free"})
    doc = {**real, "extents": ex}
    route = ("**/v1/devices/1/extents", lambda r: r.fulfill(
        status=200, content_type="application/json", body=json.dumps(doc)))
    ctx, page, watch = open_page(browser, url(d), "#overview", size="narrow", route=route)
    try:
        wait_map(page, doc)
        assert scale_of(page) == "objects"
        box = page.eval_on_selector("#devices .lba-map", "e => e.getBoundingClientRect().toJSON()")
        widths = page.evaluate(WIDTHS_JS)
        assert all(w > 0 for _, w in widths), widths  # 534 extents in ~230 px
        assert sum(w for _, w in widths) <= box["width"] + 1, (box, sum(w for _, w in widths))
        assert page.evaluate("() => document.querySelector('#devices .lba-map').scrollWidth <= "
                             "document.querySelector('#devices .lba-map').clientWidth + 2")
        assert widths[-1][1] >= 0.25 * box["width"] - 1
        assert page.inner_text("#devices .lba-seg:last-child") == page.evaluate(
            f"() => TV.fmtBytes({end - pos})") + " free"
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
        assert scale_of(page) == "objects"
        assert all(w >= MIN_OBJECT_PX for _, w in page.evaluate(WIDTHS_JS)[:-1])
        seg(page, "object", "beta").hover()
        shoot(page, artifacts_dir, "overview-map", scheme, size)
        assert SIZES[size][0] >= page.evaluate("() => document.documentElement.scrollWidth")
        assert watch.problems == []
    finally:
        ctx.close()
