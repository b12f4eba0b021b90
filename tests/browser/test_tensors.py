"""The dashboard's Tensors page in Chromium, against a daemon
holding "demo", "odd" (tensor names with '/', ' ', 'é', '%2F') and "wide":
ONE shard of 120,000 small tensors whose header this file writes itself.
The table equals the API's pages in every order (name / size / file, from
the column headers and the select), Load more appends the next page, the
search (a part of the name, typed into the box) finds one tensor among 120,000 — the
time from the last keystroke to the row is printed and written to
artifacts/tensor-search.json — while the page never holds more rows than
the pages loaded; reload and back keep the query; the detail equals
GET .../tensors/{t} and its download link gives the checkpoint's bytes;
odd names round-trip through links; a missing generation shows the API's
error, a retired one its state; the picker (#tensors) navigates to a
generation. Screenshots: tensors and tensor-detail, light/dark x
wide/narrow."""
import json
import os
import struct
import time
import types

import numpy as np
import pytest
from safetensors import safe_open

from harness.browser import demo_checkpoint, open_page, shoot
from harness.daemon import make_checkpoint, seg

PAGE = 200
N_WIDE = 120_000
TARGET = 98_765


def wide_name(idx):
    i, r = divmod(idx, 1200)
    j, k = divmod(r, 3)
    return f"model.layers.{i}.mlp.experts.{j}.w{k + 1}.weight"


def wide_checkpoint(path, n=N_WIDE, seed=5):
    """One safetensors file of n small tensors (F32/F16/BF16/I32, shapes
    [1..5, 1..3], so sizes tie a lot), header written here: the official
    writer would take a while over 120,000 numpy arrays. Returns the
    header length (without the 8-byte prefix)."""
    dts = [("F32", 4), ("F16", 2), ("BF16", 2), ("I32", 4)]
    header, off = {}, 0
    for idx in range(n):
        dt, size = dts[idx % 4]
        shape = [1 + idx % 5, 1 + (idx // 5) % 3]
        nb = size * shape[0] * shape[1]
        header[wide_name(idx)] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    data = np.random.default_rng(seed).integers(0, 256, size=off, dtype=np.uint8).tobytes()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    return len(h)


ODD = ["a/b.c", "x y", "\u00e9", "%2F", "plain"]


@pytest.fixture(scope="module")
def env(daemon_factory):
    d = daemon_factory()
    d.import_ok("demo", demo_checkpoint(os.path.join(d.workdir, "demo", "model.safetensors")),
                activate=True)
    rng = np.random.default_rng(3)
    odd = make_checkpoint(os.path.join(d.workdir, "odd", "model.safetensors"),
                          {n: rng.standard_normal((3 + i, 2)).astype(np.float32) for i, n in enumerate(ODD)})
    d.import_ok("odd", odd, activate=True)
    d.import_ok("odd", odd)  # generation 2, retired below
    r = d.request("POST", "/v1/models/odd/generations/2/retire")
    assert r.status == 200, r
    wide = os.path.join(d.workdir, "wide", "model.safetensors")
    t = time.monotonic()
    hlen = wide_checkpoint(wide)
    made = time.monotonic() - t
    t = time.monotonic()
    job = d.import_ok("wide", wide, activate=True)
    imported = time.monotonic() - t
    assert job["result"]["n_tensors"] == N_WIDE
    print(f"\nwide checkpoint: {N_WIDE} tensors, header {hlen} bytes, written in {made:.2f} s, "
          f"imported in {imported:.2f} s")
    return types.SimpleNamespace(d=d, base=f"http://127.0.0.1:{d.port}", wide=wide, odd=odd,
                                 hlen=hlen, import_s=imported)


def api_page(d, model, gen, query="", cursor=None):
    q = f"limit={PAGE}" + (f"&{query}" if query else "")
    if cursor:
        q += "&cursor=" + seg(cursor)
    return d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}/tensors?{q}")


def table(page):
    """The rows on the page: [{col: data-value}] (data-value is what the
    page computed; the text is its formatted form)."""
    return page.eval_on_selector_all(
        "#tensors-rows tr",
        "trs => trs.map(tr => Object.fromEntries([...tr.cells].map(td => [td.dataset.col, td.dataset.value])))")


def expected_rows(d, model, gen, tensors):
    """The rows the page should show for API tensors, the offsets computed
    here from the generation's shards."""
    g = d.ok("GET", f"/v1/models/{seg(model)}/generations/{gen}")
    shards = {s["index"]: s for s in g["shards"]}
    out = []
    for t in tensors:
        s = shards[t["shard_index"]]
        fo = 8 + s["header_bytes"] + t["data_offsets"][0]
        out.append({"name": t["name"], "dtype": t["dtype"], "shape": json.dumps(t["shape"], separators=(",", ":")),
                    "bytes": str(t["nbytes"]), "shard": t["shard"], "offset": str(t["data_offsets"][0]),
                    "file_offset": str(fo),
                    "device_offset": ",".join(str(r["device_offset"] + fo) for r in s["replicas"])})
    return out


def wait_query(page, text, order, rows=None):
    page.wait_for_function(
        "([q, n]) => { const l = document.getElementById('tensors-list');"
        " return l.dataset.query === q && (n === null || document.querySelectorAll('#tensors-rows tr').length === n)"
        " && !document.getElementById('tensors-table').hasAttribute('aria-busy'); }",
        arg=[json.dumps([text, order], separators=(",", ":")), rows], timeout=15000)


def test_table_equals_api_pages_in_every_order(browser, env):
    d = env.d
    ctx, page, watch = open_page(browser, env.base, "#tensors/wide/1")
    try:
        first = api_page(d, "wide", 1)
        assert len(first["tensors"]) == PAGE and first["next_cursor"]
        assert table(page) == expected_rows(d, "wide", 1, first["tensors"])
        # the page's offsets are the API's TensorDetail ones
        for row in table(page)[:3] + table(page)[-1:]:
            det = d.ok("GET", f"/v1/models/wide/generations/1/tensors/{seg(row['name'])}")
            assert row["file_offset"] == str(det["file_offset"])
            assert row["device_offset"] == ",".join(str(r["device_offset"]) for r in det["replicas"])
        assert row["file_offset"] == str(8 + env.hlen + det["data_offsets"][0])
        count = page.locator("#tensors-count")
        assert count.get_attribute("data-rows") == str(PAGE) and count.get_attribute("data-more") == "1"
        assert "showing 200 of 120,000" in count.text_content()
        assert page.get_attribute("th[data-col='file_offset']", "aria-sort") == "ascending"

        # Load more appends the next page (and nothing else)
        page.click("#tensors-more")
        page.wait_for_function("() => document.querySelectorAll('#tensors-rows tr').length === 400")
        second = api_page(d, "wide", 1, cursor=first["next_cursor"])
        assert table(page) == expected_rows(d, "wide", 1, first["tensors"] + second["tensors"])
        assert count.get_attribute("data-rows") == "400"

        # column headers: name, bytes (size), file offset; the select too
        for how, order in [("th[data-col='name'] button", "name"), ("th[data-col='bytes'] button", "size"),
                           ("select", "file"), ("select", "size"), ("th[data-col='file_offset'] button", "file")]:
            if how == "select":
                page.select_option("#tensors-order", order)
            else:
                page.click(how)
            wait_query(page, "", order, PAGE)
            want = api_page(d, "wide", 1, "" if order == "file" else f"order={order}")["tensors"]
            assert table(page) == expected_rows(d, "wide", 1, want), order
            col = {"name": "name", "size": "bytes", "file": "file_offset"}[order]
            assert page.get_attribute(f"th[data-col='{col}']", "aria-sort") == (
                "descending" if order == "size" else "ascending")
            assert page.input_value("#tensors-order") == order
            others = page.eval_on_selector_all("th[data-order]", "ts => ts.map(t => t.getAttribute('aria-sort'))")
            assert sorted(others) == ["ascending" if order != "size" else "descending", "none", "none"]
            assert page.evaluate("location.hash") == "#tensors/wide/1" + ("" if order == "file" else f"?order={order}")
        # size order: ties by name, and Load more follows the size cursor
        page.click("th[data-col='bytes'] button")
        wait_query(page, "", "size", PAGE)
        page.click("#tensors-more")
        page.wait_for_function("() => document.querySelectorAll('#tensors-rows tr').length === 400")
        p1 = api_page(d, "wide", 1, "order=size")
        p2 = api_page(d, "wide", 1, "order=size", p1["next_cursor"])
        assert table(page) == expected_rows(d, "wide", 1, p1["tensors"] + p2["tensors"])
        sizes = [int(r["bytes"]) for r in table(page)]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) < len(sizes)
        assert watch.problems == []
    finally:
        ctx.close()


WATCH_ROWS = """target => {
    const box = document.getElementById('tensors-search');
    const list = document.getElementById('tensors-list');
    const rows = document.getElementById('tensors-rows');
    window.__t = {lastKey: null, shown: null, maxRows: rows.rows.length};
    box.addEventListener('input', () => { window.__t.lastKey = performance.now(); window.__t.shown = null; });
    new MutationObserver(() => {
        window.__t.maxRows = Math.max(window.__t.maxRows, rows.rows.length);
        if (window.__t.shown === null && list.dataset.query === JSON.stringify([target, 'file'])
            && rows.rows.length === 1 && rows.rows[0].dataset.name === target)
            window.__t.shown = performance.now();
    }).observe(list, {attributes: true, childList: true, subtree: true});
}"""


def watch_rows(page, target):
    """In the page: the time of the last input event (lastKey), the time the
    target's one-row listing was shown (shown), the most rows the table
    ever held (maxRows)."""
    page.evaluate(WATCH_ROWS, target)


def test_search_finds_one_among_120000(browser, env, artifacts_dir):
    d = env.d
    target = wide_name(TARGET)
    assert api_page(d, "wide", 1, "contains=" + seg(target))["tensors"][0]["name"] == target
    ctx, page, watch = open_page(browser, env.base, "#tensors/wide/1")
    try:
        # in the page: the time of the last input event, the time the
        # target's listing was shown, and the most rows the table ever held
        watch_rows(page, target)
        page.click("#tensors-search")
        page.keyboard.type(target[:-1], delay=15)
        t0 = time.monotonic()
        page.keyboard.type(target[-1])
        page.wait_for_function("() => window.__t.shown !== null", timeout=15000)
        outside_ms = (time.monotonic() - t0) * 1000
        t = page.evaluate("window.__t")
        search_ms = t["shown"] - t["lastKey"]
        print(f"\nsearch among {N_WIDE} tensors: {search_ms:.1f} ms from the last keystroke to the row "
              f"({outside_ms:.1f} ms seen from the test; debounce 150 ms included)")
        with open(os.path.join(artifacts_dir, "tensor-search.json"), "w") as f:
            json.dump({"n_tensors": N_WIDE, "search_ms": round(search_ms, 1),
                       "search_ms_from_test": round(outside_ms, 1), "import_s": round(env.import_s, 2)}, f)
        assert t["maxRows"] <= PAGE
        assert table(page) == expected_rows(d, "wide", 1, api_page(d, "wide", 1, "contains=" + seg(target))["tensors"])
        assert page.get_attribute("#tensors-count", "data-more") == "0"
        assert page.evaluate("location.hash") == "#tensors/wide/1?contains=" + seg(target)

        # reload keeps the query; so does the way back from a detail
        page.reload()
        page.wait_for_selector("#page-tensors[data-ready='1']")
        wait_query(page, target, "file", 1)
        assert page.input_value("#tensors-search") == target
        watch_rows(page, target)
        page.click(f"#tensors-rows tr[data-name='{target}'] a")
        page.wait_for_selector(f"#tensors-detail[data-name='{target}']")
        page.go_back()
        page.wait_for_selector("#tensors-list:not([hidden])")
        wait_query(page, target, "file", 1)
        assert page.input_value("#tensors-search") == target
        # a search with many matches, in size order, and clearing the box
        page.fill("#tensors-search", "model.layers.82.")
        page.select_option("#tensors-order", "size")
        wait_query(page, "model.layers.82.", "size", PAGE)
        assert table(page) == expected_rows(d, "wide", 1, api_page(
            d, "wide", 1, "order=size&contains=" + seg("model.layers.82."))["tensors"])
        assert page.evaluate("location.hash") == "#tensors/wide/1?contains=model.layers.82.&order=size"
        assert "(more\u2026)" in page.text_content("#tensors-count")
        page.fill("#tensors-search", "")
        wait_query(page, "", "size", PAGE)
        assert page.evaluate("window.__t.maxRows") <= PAGE
        assert watch.problems == []
    finally:
        ctx.close()


def test_detail_and_download(browser, env):
    d = env.d
    name = wide_name(TARGET)
    ctx, page, watch = open_page(browser, env.base, f"#tensors/wide/1/{seg(name)}?contains=model.layers.8")
    try:
        page.wait_for_selector(f"#tensors-detail[data-name='{name}']")
        det = d.ok("GET", f"/v1/models/wide/generations/1/tensors/{seg(name)}")
        fields = page.eval_on_selector_all("#tensors-fields dd",
                                           "ds => ds.map(x => [x.dataset.field, JSON.parse(x.dataset.json)])")
        assert dict(fields) == det and [k for k, _ in fields] == list(det)
        reps = page.eval_on_selector_all("#tensors-replicas tbody tr",
                                         "trs => trs.map(tr => [...tr.cells].map(c => c.textContent))")
        assert reps == [[str(r["device_id"]), str(r["device_offset"])] for r in det["replicas"]]
        link = page.locator("#tensors-download")
        assert link.get_attribute("download") == name + ".bin"
        href = link.get_attribute("href")
        assert href == f"/v1/models/wide/generations/1/tensors/{seg(name)}/data"
        body = page.request.get(env.base + href).body()
        with open(env.wide, "rb") as f:
            raw = f.read()
        b, e = det["data_offsets"]
        assert body == raw[8 + env.hlen + b: 8 + env.hlen + e] and len(body) == det["nbytes"] > 0
        with safe_open(env.wide, framework="numpy") as st:
            assert body == st.get_tensor(name).tobytes()
        # the real download
        with page.expect_download() as dl:
            link.click()
        with open(dl.value.path(), "rb") as f:
            assert f.read() == body
        assert dl.value.suggested_filename == name + ".bin"
        # back keeps the list's query
        assert page.get_attribute("#tensors-back", "href") == "#tensors/wide/1?contains=model.layers.8"
        page.click("#tensors-back")
        wait_query(page, "model.layers.8", "file", PAGE)
        assert page.input_value("#tensors-search") == "model.layers.8"
        assert watch.problems == []
    finally:
        ctx.close()


def test_odd_names_round_trip(browser, env):
    d = env.d
    ctx, page, watch = open_page(browser, env.base, "#tensors/odd/1?order=name")
    try:
        wait_query(page, "", "name", len(ODD))
        assert [r["name"] for r in table(page)] == sorted(ODD, key=lambda s: s.encode())
        with safe_open(env.odd, framework="numpy") as st:
            ref = {n: st.get_tensor(n).tobytes() for n in ODD}
        for name in ODD:
            page.click(f"#tensors-rows tr[data-name={json.dumps(name, ensure_ascii=False)}] a")
            page.wait_for_function("n => document.getElementById('tensors-detail').dataset.name === n", arg=name)
            assert page.evaluate("location.hash") == f"#tensors/odd/1/{seg(name)}?order=name"
            det = d.ok("GET", f"/v1/models/odd/generations/1/tensors/{seg(name)}")
            fields = page.eval_on_selector_all("#tensors-fields dd",
                                               "ds => ds.map(x => [x.dataset.field, JSON.parse(x.dataset.json)])")
            assert dict(fields) == det
            assert page.text_content("#tensors-detail-name") == name
            href = page.get_attribute("#tensors-download", "href")
            assert page.request.get(env.base + href).body() == ref[name], name
            page.click("#tensors-back")
            wait_query(page, "", "name", len(ODD))
        # the search box takes them too
        page.fill("#tensors-search", "%2")
        wait_query(page, "%2", "name", 1)
        assert table(page)[0]["name"] == "%2F"
        assert page.evaluate("location.hash") == "#tensors/odd/1?contains=%252&order=name"
        assert watch.problems == []
    finally:
        ctx.close()


def test_missing_and_retired_generations(browser, env):
    ctx, page, watch = open_page(browser, env.base, "#tensors/odd/99")
    try:
        msg = env.d.get("/v1/models/odd/generations/99").json()["error"]["message"]
        page.wait_for_selector("#tensors-problem:not([hidden])")
        assert msg in page.text_content("#tensors-problem") and "404" in page.text_content("#tensors-problem")
        assert msg in page.text_content("#errors")
        assert page.locator("#tensors-rows tr").count() == 0
        assert watch.other_than("/v1/models/odd/generations/99") == []
        page.evaluate("location.hash = '#tensors/odd/2'")
        page.wait_for_selector("#tensors-state-note:not([hidden])")
        assert "retired" in page.text_content("#tensors-state-note")
        assert page.locator("#tensors-info .badge.retired").count() == 1
        assert page.is_hidden("#tensors-problem") and page.is_hidden("#errors")
        assert watch.other_than("/v1/models/odd/generations/99") == []
    finally:
        ctx.close()


def test_picker_navigates(browser, env):
    d = env.d
    ctx, page, watch = open_page(browser, env.base, "#tensors")
    try:
        models = [m["name"] for m in d.ok("GET", "/v1/models")["models"]]
        assert page.eval_on_selector_all("#tensors-model option", "os => os.map(o => o.value)") == models
        assert page.input_value("#tensors-model") == models[0] == "demo"
        page.wait_for_function("() => !document.getElementById('tensors-gen').disabled")
        assert page.input_value("#tensors-gen") == "1"
        assert page.is_hidden("#tensors-list") and page.is_hidden("#tensors-detail")
        page.click("#tensors-go")
        page.wait_for_function("() => location.hash === '#tensors/demo/1'")
        wait_query(page, "", "file", 3)
        page.select_option("#tensors-model", "odd")
        page.wait_for_function("() => document.getElementById('tensors-gen').options.length === 2")
        assert page.input_value("#tensors-gen") == "1"  # the active one
        page.select_option("#tensors-gen", "2")
        page.focus("#tensors-gen")
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")  # the button, by keyboard
        page.wait_for_function("() => location.hash === '#tensors/odd/2'")
        wait_query(page, "", "file", len(ODD))
        assert watch.problems == []
    finally:
        ctx.close()


def test_reads_behind_a_token(browser, daemon_factory, env):
    """http.anonymous_reads = never: without a token the page shows the
    daemon's 401; with the session's token the list loads and the download
    link (which cannot carry the header itself) still gives the bytes."""
    d = daemon_factory({"http.anonymous_reads": "never"})
    src = os.path.join(d.workdir, "odd", "model.safetensors")
    os.makedirs(os.path.dirname(src))
    with open(env.odd, "rb") as f, open(src, "wb") as g:
        g.write(f.read())
    d.import_ok("odd", src, activate=True)
    base = f"http://127.0.0.1:{d.port}"
    ctx, page, watch = open_page(browser, base, "#tensors/odd/1")
    try:
        page.wait_for_selector("#tensors-problem:not([hidden])")
        text = page.text_content("#errors")
        assert "HTTP 401" in text and "Token button" in text, text
        assert "HTTP 401" in page.text_content("#tensors-problem")
        assert page.locator("#tensors-rows tr").count() == 0
        assert watch.other_than("401") == []
    finally:
        ctx.close()
    name = "x y"
    ctx, page, watch = open_page(browser, base, f"#tensors/odd/1/{seg(name)}", token=d.token)
    try:
        page.wait_for_selector("#tensors-download:not([hidden])")
        href = page.get_attribute("#tensors-download", "href")
        assert page.request.get(base + href).status == 401  # the plain link alone would not do
        with page.expect_download() as dl:
            page.click("#tensors-download")
        with open(dl.value.path(), "rb") as f:
            got = f.read()
        with safe_open(src, framework="numpy") as st:
            assert got == st.get_tensor(name).tobytes()
        assert dl.value.suggested_filename == name + ".bin"
        page.click("#tensors-back")
        wait_query(page, "", "file", len(ODD))
        assert watch.other_than(href) == []
    finally:
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_screenshots(browser, env, artifacts_dir, scheme, size):
    ctx, page, watch = open_page(browser, env.base, "#tensors/wide/1?contains=model.layers.82.mlp.experts.1",
                                 scheme=scheme, size=size)
    try:
        if size == "narrow":
            page.select_option("#tensors-order", "size")
            wait_query(page, "model.layers.82.mlp.experts.1", "size")
        shoot(page, artifacts_dir, "tensors", scheme, size)
        page.click("#tensors-rows tr:first-child a")
        page.wait_for_selector("#tensors-download:not([hidden])")
        shoot(page, artifacts_dir, "tensor-detail", scheme, size)
        assert watch.problems == []
    finally:
        ctx.close()
