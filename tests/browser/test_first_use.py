"""What a new user of the dashboard meets first, in Chromium at 1400x900 and
390x844, against a daemon holding a GPT-2-shaped model "demo" (three
generations: 2 active, aliases prod -> 1 and staging-candidate -> 2,
canary-for-the-night -> 2):

- the model page's Actions column is in sight at 1400 px (no sideways
  scrolling of the generations table);
- an error line's "dismiss" button stays on one line next to a long message
  (390 and 1400 px);
- the phone header is compact (at most 100 px: the sections scroll
  sideways, the version line is hidden and kept as the brand's title);
- every alias of the phone models list is in sight;
- Retire is disabled for an aliased generation, with a title saying why,
  and enabled again once its alias is removed;
- #models/<missing> says there is no such model, links back to the list and
  shows no alias form and no generations table;
- the throughput chart has points right after the page loads (from
  GET /v1/metrics/history, whose samples follow the counters of /metrics);
- the tensor search matches a part of the name anywhere (case-sensitive),
  as the API's `contains` does, and its placeholder is a part of the
  generation's own first tensor name that finds something."""
import json
import os
import time

import numpy as np
import pytest

from harness.browser import Watch, open_page
from harness.daemon import make_checkpoint, seg

GPT2 = ["wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
        "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.mlp.c_fc.weight",
        "h.1.ln_1.weight", "h.1.attn.c_attn.weight", "h.1.mlp.c_fc.weight", "ln_f.weight"]


def gpt2_checkpoint(path, seed):
    rng = np.random.default_rng(seed)
    return make_checkpoint(path, {n: rng.standard_normal((8, 16)).astype(np.float32) for n in GPT2})


@pytest.fixture(scope="module")
def env(daemon_factory):
    d = daemon_factory()
    for seed in (1, 2, 3):
        d.import_ok("demo", gpt2_checkpoint(os.path.join(d.workdir, f"gpt{seed}", "model.safetensors"), seed))
    d.ok("POST", "/v1/models/demo/generations/2/activate")
    for alias, gen in (("prod", 1), ("staging-candidate", 2), ("canary-for-the-night", 2)):
        d.ok("PUT", f"/v1/models/demo/aliases/{alias}", body={"generation": gen})
    d.base = f"http://127.0.0.1:{d.port}"
    return d


def open_at(browser, base, hash_, width, height, ready=True):
    """open_page at any viewport size."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light")
    page = ctx.new_page()
    watch = Watch(page)
    page.goto(base + "/" + hash_)
    if ready:
        name = hash_.lstrip("#").split("/")[0].split("?")[0] or "overview"
        page.wait_for_selector(f"#page-{name}[data-ready='1']", timeout=15000)
    return ctx, page, watch


def test_model_actions_in_sight_at_1400(browser, env):
    ctx, page, watch = open_at(browser, env.base, "#models/demo", 1400, 900)
    try:
        page.wait_for_selector("#gens-table tr.gen[data-gen='1']")
        wrap = page.evaluate("""() => { const w = document.querySelector('#gens-table').parentElement;
                                        const r = w.getBoundingClientRect();
                                        return [w.scrollWidth, w.clientWidth, r.left, r.right]; }""")
        assert wrap[0] <= wrap[1], f"the generations table scrolls sideways: {wrap}"
        cells = page.eval_on_selector_all("#gens-table td.gen-actions .actions-cell > *",
                                          "es => es.map(e => { const r = e.getBoundingClientRect();"
                                          " return [e.textContent, r.left, r.right]; })")
        assert [c[0] for c in cells if c[0] == "tensors"] == ["tensors"] * 3
        for text, left, right in cells:
            assert wrap[2] <= left and right <= wrap[3] + 0.5, (text, left, right, wrap)
        assert watch.problems == []
    finally:
        ctx.close()


@pytest.mark.parametrize("width,height", [(390, 844), (1400, 900)])
def test_dismiss_stays_on_one_line(browser, env, width, height):
    name = "n" * 128  # no such model: a long error line
    ctx, page, watch = open_at(browser, env.base, "#models/" + name, width, height)
    try:
        btn = "#errors p.error-line[data-source='models'] button"
        page.wait_for_selector(btn)
        assert page.text_content(btn) == "dismiss"
        lines = page.eval_on_selector(btn, """b => { const r = document.createRange();
            r.selectNodeContents(b);
            return new Set(Array.from(r.getClientRects()).map(x => Math.round(x.top))).size; }""")
        assert lines == 1, f"'dismiss' is broken over {lines} lines at {width} px"
        assert page.eval_on_selector(btn, "b => b.scrollWidth <= b.clientWidth")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
        page.click(btn)
        page.wait_for_selector("#errors", state="hidden")
        assert watch.other_than("404") == []
    finally:
        ctx.close()


@pytest.mark.parametrize("width", [1280, 1400])
def test_wide_header_is_one_line(browser, env, width):
    """Brand, every section, the version line and Token on one line: the
    version line (a long store path) is cut with an ellipsis and keeps its
    whole text in its title."""
    ctx, page, watch = open_at(browser, env.base, "#overview", width, 900)
    try:
        page.wait_for_function("() => document.getElementById('meta').title.startsWith('v')")
        tops = page.evaluate("""() => ['.brand', '#nav', '#meta', '#token-btn'].map(
            q => Math.round(document.querySelector('.top ' + q).getBoundingClientRect().top))""")
        box = page.evaluate("() => document.querySelector('header.top').getBoundingClientRect().height")
        assert box <= 70, f"the header is {box} px tall at {width} px"
        assert max(tops) - min(tops) <= 12, tops
        assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    finally:
        ctx.close()


def test_phone_header_is_compact(browser, env):
    ctx, page, watch = open_at(browser, env.base, "#overview", 390, 844)
    try:
        h = page.evaluate("() => document.querySelector('header.top').getBoundingClientRect().height")
        assert h <= 100, f"the phone header is {h} px tall"
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        nav = page.evaluate("""() => { const n = document.getElementById('nav');
            return [getComputedStyle(n).overflowX, n.scrollWidth, n.clientWidth]; }""")
        assert nav[0] == "auto" and nav[1] > nav[2], nav  # the sections scroll sideways
        assert page.is_hidden("#meta")
        page.wait_for_function("() => document.querySelector('.top .brand').title.startsWith('v')")
        assert page.is_visible("#token-btn")
        # The section entered last is scrolled into the nav's sight.
        page.evaluate("() => { location.hash = '#fleet'; }")
        page.wait_for_selector("#page-fleet[data-ready='1']")
        seen = page.evaluate("""() => { const n = document.getElementById('nav').getBoundingClientRect();
            const a = document.querySelector('#nav a.active').getBoundingClientRect();
            return [a.left >= n.left - 0.5, a.right <= n.right + 0.5]; }""")
        assert seen == [True, True]
        assert page.evaluate("() => document.querySelector('#nav a.active').dataset.page") == "fleet"
        assert watch.problems == []
    finally:
        ctx.close()


def test_phone_models_list_shows_every_alias(browser, env):
    ctx, page, watch = open_at(browser, env.base, "#models", 390, 844)
    try:
        page.wait_for_selector("#models-table tr[data-model='demo'] td.aliases .badge.alias")
        wrap = page.evaluate("""() => { const w = document.querySelector('#models-table').parentElement;
            const r = w.getBoundingClientRect(); return [w.scrollWidth, w.clientWidth, r.left, r.right]; }""")
        assert wrap[0] <= wrap[1], f"the models list scrolls sideways: {wrap}"
        badges = page.eval_on_selector_all("#models-table tr[data-model='demo'] td.aliases .badge.alias",
                                           "es => es.map(e => { const r = e.getBoundingClientRect();"
                                           " return [e.textContent, r.left, r.right]; })")
        assert sorted(b[0] for b in badges) == ["canary-for-the-night\u21922", "prod\u21921",
                                                "staging-candidate\u21922"]
        for text, left, right in badges:
            assert wrap[2] - 0.5 <= left and right <= wrap[3] + 0.5, (text, left, right, wrap)
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        assert watch.problems == []
    finally:
        ctx.close()


def test_retire_is_not_offered_for_an_aliased_generation(browser, daemon_factory):
    d = daemon_factory()
    for seed in (1, 2):
        d.import_ok("demo", gpt2_checkpoint(os.path.join(d.workdir, f"gpt{seed}", "model.safetensors"), seed))
    d.ok("PUT", "/v1/models/demo/aliases/prod", body={"generation": 1})
    ctx, page, watch = open_page(browser, f"http://127.0.0.1:{d.port}", "#models/demo", token=d.token)
    try:
        one = "#gens-table tr.gen[data-gen='1'] button[data-key='retire:1']"
        two = "#gens-table tr.gen[data-gen='2'] button[data-key='retire:2']"
        page.wait_for_selector(one)
        assert page.is_disabled(one)
        title = page.get_attribute(one, "title")
        assert "prod" in title and "can't be retired" in title and "move" in title, title
        assert page.is_enabled(two)
        # The alias removed elsewhere: the next poll offers Retire again.
        r = d.request("DELETE", "/v1/models/demo/aliases/prod")
        assert r.status in (200, 204), r
        page.wait_for_selector(one + ":not([disabled])", timeout=10000)
        assert not page.get_attribute(one, "title")
        assert watch.problems == []
    finally:
        ctx.close()


def test_missing_model_says_so(browser, env):
    ctx, page, watch = open_at(browser, env.base, "#models/nosuch", 1400, 900)
    try:
        page.wait_for_selector("#model-missing:visible")
        text = page.text_content("#model-missing")
        assert "No such model" in text and "nosuch" in text, text
        assert page.get_attribute("#model-missing a", "href") == "#models"
        assert page.is_hidden("#alias-form")
        assert page.is_hidden("#gens-table")
        assert page.is_hidden("#model-actions")
        page.click("#model-missing a")
        page.wait_for_selector("#models-table tr[data-model='demo']")
        # A model that exists shows its panels again.
        page.click("#models-table tr[data-model='demo'] td.name a")
        page.wait_for_selector("#gens-table tr.gen[data-gen='1']")
        assert page.is_visible("#alias-form") and page.is_hidden("#model-missing")
        assert watch.other_than("404") == []
    finally:
        ctx.close()


def test_throughput_chart_has_points_right_after_load(browser, env):
    # The daemon samples every 2 s from its start (before the imports).
    deadline = time.monotonic() + 20
    while True:
        hist = env.ok("GET", "/v1/metrics/history")
        if len(hist["samples"]) >= 4:
            break
        assert time.monotonic() < deadline, hist
        time.sleep(0.5)
    assert hist["interval_ms"] == 2000
    s = hist["samples"]
    assert all(set(x) == {"time_ms", "read_bytes", "import_bytes"} for x in s)
    assert all(a["time_ms"] < b["time_ms"] and a["import_bytes"] <= b["import_bytes"] and
               a["read_bytes"] <= b["read_bytes"] for a, b in zip(s, s[1:]))
    assert s[0]["import_bytes"] == 0 and s[-1]["import_bytes"] > 0
    assert s[-1]["import_bytes"] <= env.metrics()["tensorvault_imported_bytes_total"]

    ctx, page, watch = open_at(browser, env.base, "#overview", 1400, 900)
    try:
        pts = page.evaluate("""() => { const c = Chart.getChart(document.getElementById('throughput'));
            return [c.data.datasets[0].data, c.data.datasets[1].data]; }""")
        assert len(pts[0]) >= len(s) - 1 and len(pts[1]) == len(pts[0]), pts
        assert max(pts[1]) > 0, pts  # the imports after the daemon's start
        assert watch.problems == []
    finally:
        ctx.close()


def wait_search(page, text, rows):
    page.wait_for_function(
        "([q, n]) => { const l = document.getElementById('tensors-list');"
        " return l.dataset.query === q && document.querySelectorAll('#tensors-rows tr').length === n; }",
        arg=[json.dumps([text, "file"], separators=(",", ":")), rows], timeout=15000)


def test_tensor_search_matches_anywhere(browser, env):
    api = env.ok("GET", "/v1/models/demo/generations/1/tensors?limit=1000")["tensors"]
    in_file_order = [t["name"] for t in api]
    ctx, page, watch = open_at(browser, env.base, "#tensors/demo/1", 1400, 900)
    try:
        wait_search(page, "", len(GPT2))
        hint = page.get_attribute("#tensors-search", "placeholder")
        assert hint == ".".join(in_file_order[0].split(".")[:2]) + "."
        page.fill("#tensors-search", hint)
        want = [n for n in in_file_order if hint in n]
        assert want
        wait_search(page, hint, len(want))
        for part in ("attn.c_attn", "c_fc", "weight"):
            want = [n for n in in_file_order if part in n]
            page.fill("#tensors-search", part)
            wait_search(page, part, len(want))
            assert page.eval_on_selector_all("#tensors-rows tr", "rs => rs.map(r => r.dataset.name)") == want
            got = env.ok("GET", "/v1/models/demo/generations/1/tensors?limit=1000&contains=" + seg(part))
            assert [t["name"] for t in got["tensors"]] == want
        assert page.evaluate("location.hash") == "#tensors/demo/1?contains=weight"
        assert "contain" in page.text_content("#tensors-count")
        page.fill("#tensors-search", "ATTN")  # case-sensitive
        wait_search(page, "ATTN", 0)
        # An older link's ?prefix= searches the same way.
        page.evaluate("() => { location.hash = '#tensors/demo/1?prefix=c_proj'; }")
        wait_search(page, "c_proj", 1)
        assert watch.problems == []
    finally:
        ctx.close()
