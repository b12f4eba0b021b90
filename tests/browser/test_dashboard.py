"""The dashboard served by tensorvaultd at /, Overview page, in
Chromium: it loads with no console error and no failed request, its device
bars and counts equal what the API answers, the throughput chart exists,
a failed API call shows its status and the API's message, keyboard focus is
visible, and it fits 1280 and 390 px wide in light and dark. Screenshots of
each go to the artifacts dir; TV_UPDATE_SCREENSHOT=1 also copies the light
wide one to docs/dashboard-overview.png (the README's picture)."""
import json
import os
import shutil
import urllib.request

import pytest

from harness import ROOT
from harness.browser import open_page, shoot

def open_overview(browser, base_url, scheme="light", size="wide", route=None):
    return open_page(browser, base_url, "#overview", scheme=scheme, size=size, route=route)


def test_overview_matches_api(browser, base_url, daemon):
    ctx, page, watch = open_overview(browser, base_url)
    try:
        # A second refresh (2 s later) gives the chart its first point.
        page.wait_for_function("() => window.Chart && Chart.getChart('throughput') && "
                               "Chart.getChart('throughput').data.datasets[0].data.length >= 1",
                               timeout=15000)
        status = daemon.ok("GET", "/v1/status")
        devices = daemon.ok("GET", "/v1/devices")["devices"]
        models = daemon.ok("GET", "/v1/models")["models"]
        sessions = daemon.ok("GET", "/v1/sessions")["sessions"]
        gens = daemon.generations("demo")

        assert page.text_content("#count-models") == str(status["n_models"]) == "1"
        assert page.text_content("#count-generations") == str(sum(m["n_generations"] for m in models))
        assert page.get_attribute("#count-jobs", "data-queued") == str(status["jobs"]["queued"])
        assert page.get_attribute("#count-jobs", "data-running") == str(status["jobs"]["running"])
        assert page.text_content("#count-sessions") == str(len(sessions))

        rows = page.query_selector_all("#devices .device")
        assert len(rows) == len(devices) >= 1
        for row, d in zip(rows, devices):
            assert row.get_attribute("data-device-id") == str(d["id"])
            assert row.get_attribute("data-used-bytes") == str(d["used_bytes"])
            assert row.get_attribute("data-free-bytes") == str(d["free_bytes"])
            assert d["used_bytes"] > 0  # the imported model
            width = row.eval_on_selector(".bar .used", "e => e.style.width")
            want = 100 * d["used_bytes"] / (d["used_bytes"] + d["free_bytes"])
            assert abs(float(width.rstrip("%")) - want) < 0.01, (width, want)
            assert d["path"] in row.text_content()

        tr = page.query_selector_all("#models tbody tr")
        assert len(tr) == 1
        cells = [c.text_content() for c in tr[0].query_selector_all("td")]
        assert cells[0] == "demo"
        assert cells[1] == str(models[0]["active_generation"]) == "1"
        assert "stable" in cells[2] and "1" in cells[2]
        assert cells[3] == str(models[0]["n_generations"])
        assert tr[0].eval_on_selector("td[data-bytes]", "e => e.dataset.bytes") == str(
            sum(g["total_bytes"] for g in gens if g["state"] != "retired"))

        # A tensor read shows up as read MB/s > 0 in a later point.
        r = daemon.get("/v1/models/demo/generations/1/tensors/embed.weight/data")
        assert r.status == 200 and len(r.body) == 256 * 64 * 4, r
        page.wait_for_function("() => Chart.getChart('throughput').data.datasets[0].data"
                               ".some(v => v > 0)", timeout=15000)

        assert page.is_visible("canvas#throughput")
        assert page.is_hidden("#chart-note")
        assert page.is_hidden("#errors")
        assert page.eval_on_selector_all("nav a", "as => as.map(a => a.textContent)") == [
            "Overview", "Models", "Tensors", "Imports", "Sessions", "Fleet", "Events"]
        assert page.get_attribute("nav a[aria-current='page']", "href") == "#overview"
        assert watch.problems == []
    finally:
        ctx.close()


def test_page_has_no_inline_script_or_style(base_url):
    with urllib.request.urlopen(base_url + "/") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        html = r.read().decode()
    assert "<style" not in html and " style=" not in html
    assert "<script>" not in html and "<script " in html  # every script has a src
    for tag in html.split("<script")[1:]:
        assert "src=" in tag.split(">")[0], tag
    assert "http://" not in html and "https://" not in html  # nothing external


def test_failed_request_shows_status_and_message(browser, base_url):
    body = json.dumps({"error": {"code": "TV_E_IO", "message": "device 1: input/output error (test)",
                                 "errno": -5}})
    route = ("**/v1/devices", lambda r: r.fulfill(status=500, content_type="application/json",
                                                  body=body))
    ctx, page, watch = open_overview(browser, base_url, route=route)
    try:
        page.wait_for_selector("#errors:not([hidden])", timeout=10000)
        text = page.text_content("#errors")
        assert "/v1/devices" in text and "HTTP 500" in text, text
        assert "device 1: input/output error (test)" in text, text
        # the rest of the page still loaded
        assert page.text_content("#count-models") == "1"
        assert [p for p in watch.problems if "/v1/devices" not in p] == []
    finally:
        ctx.close()


def test_keyboard_focus_is_visible(browser, base_url):
    ctx, page, watch = open_overview(browser, base_url)
    try:
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"
        page.keyboard.press("Tab")
        focused = page.evaluate("() => document.activeElement.textContent")
        assert focused == "Overview"
        style = page.evaluate("() => { const s = getComputedStyle(document.activeElement);"
                              " return [s.outlineStyle, s.outlineWidth]; }")
        assert style[0] != "none" and style[1] != "0px", style
        assert watch.problems == []
    finally:
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_screenshots(browser, base_url, artifacts_dir, scheme, size):
    ctx, page, watch = open_overview(browser, base_url, scheme=scheme, size=size)
    try:
        page.wait_for_function("() => !window.Chart || Chart.getChart('throughput')")
        path = shoot(page, artifacts_dir, "overview", scheme, size)
        if scheme == "light" and size == "wide" and os.environ.get("TV_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(path, os.path.join(ROOT, "docs", "dashboard-overview.png"))
        assert watch.problems == []
    finally:
        ctx.close()


def test_reads_follow_the_read_policy(browser, daemon_factory):
    """http.anonymous_reads = never: without a token the page shows the
    daemon's 401 and a hint; a token entered with the Token button (kept in
    sessionStorage) makes the same page load."""
    d = daemon_factory({"http.anonymous_reads": "never"})
    base = f"http://127.0.0.1:{d.port}"
    ctx, page, watch = open_page(browser, base, "#overview")
    try:
        page.wait_for_selector("#errors:not([hidden])")
        text = page.text_content("#errors")
        assert "HTTP 401" in text and "/v1/status" in text and "Token button" in text, text
        assert page.text_content("#count-models") != "0"
        assert watch.other_than("401") == []
        page.click("#token-btn")
        page.fill("#token-input", d.token)
        page.click("#token-ok")
        page.wait_for_function("() => document.querySelector('#count-models').textContent === '0'")
        page.wait_for_selector("#errors", state="hidden")
        assert page.get_attribute("#token-btn", "data-token") == "set"
        assert page.evaluate("() => sessionStorage.getItem('tensorvault.token')") == d.token
        # kept for the browser session: a reload needs no new token
        n = len(watch.problems)
        page.reload()
        page.wait_for_selector("#page-overview[data-ready='1']")
        page.wait_for_function("() => document.querySelector('#count-models').textContent === '0'")
        # the reload itself aborts the polls in flight (net::ERR_ABORTED): those only
        after = [p for p in watch.problems[n:] if "net::ERR_ABORTED" not in p]
        assert page.is_hidden("#errors") and after == []
    finally:
        ctx.close()
