"""The dashboard's Sessions page (#sessions, web/sessions.js) in Chromium:
with nothing connected it says "no fast-path sessions"; a model opened from
this process through the daemon's fast-path socket (tensorvault.safe_open)
shows up as a session with this pid, the model, its generation and the bytes
delivered the API reports, its model linked to #models/NAME; closing it
removes the row. Screenshots light/dark x wide/narrow with a session open."""
import contextlib
import os

import pytest
import tensorvault  # installed into .venv by scripts/deps

from harness.browser import open_page, shoot


def open_sessions(browser, base_url, scheme="light", size="wide"):
    return open_page(browser, base_url, "#sessions", scheme=scheme, size=size)


@contextlib.contextmanager
def reading(daemon):
    """A fast-path session of this process with "demo" open and one tensor
    read; yields (the file, the tensor, the API's session)."""
    daemon.wait_socket()
    f = tensorvault.safe_open("demo", framework="numpy", socket=daemon.socket_path)
    try:
        t = f.get_tensor("embed.weight")
        mine = [s for s in daemon.sessions() if s["pid"] == os.getpid()]
        assert len(mine) == 1, mine
        yield f, t, mine[0]
    finally:
        f.close()


def row(s):
    return f"#sessions tbody tr[data-session-id='{s['id']}']"


def test_session_listed_then_gone(browser, base_url, daemon):
    ctx, page, watch = open_sessions(browser, base_url)
    try:
        # wait_socket's probe (and any earlier session) is gone soon
        page.wait_for_selector("#sessions-empty:not([hidden])")
        assert "no fast-path sessions" in page.text_content("#sessions-empty")
        assert "fastpath.enabled" in page.text_content("#sessions-empty")
        assert page.is_hidden("#sessions")

        with reading(daemon) as (f, t, s):
            assert t.shape == (256, 64) and s["bytes_delivered"] >= t.nbytes, s
            sel = row(s)
            page.wait_for_selector(f"{sel}[data-bytes-delivered='{s['bytes_delivered']}']",
                                   timeout=15000)
            assert page.is_hidden("#sessions-empty")
            s = [x for x in daemon.sessions() if x["id"] == s["id"]][0]  # as the page saw it
            page.wait_for_selector(f"{sel}[data-requests-done='{s['requests_done']}']"
                                   f"[data-slots-held='{s['slots_held']}']")
            assert page.get_attribute(sel, "data-pid") == str(os.getpid()) == str(s["pid"])
            cells = page.eval_on_selector_all(sel + " > td", "tds => tds.map(t => t.textContent)")
            assert cells[0] == str(s["id"]) and cells[1] == str(os.getpid())
            assert cells[2] == f"{s['uid']} / {s['gid']}" == f"{os.getuid()} / {os.getgid()}"
            assert cells[3] == page.evaluate("t => TV.fmtTime(t)", s["connected"])
            assert cells[3].endswith(" UTC") and cells[3][:10] == s["connected"][:10]
            assert cells[5] == str(s["requests_done"]) and cells[6] == str(s["slots_held"])
            assert page.text_content("#sessions-count") == "(1 connected)"

            assert len(s["handles"]) == 1, s
            h = s["handles"][0]
            assert h["model"] == "demo" and h["generation"] == 1, h
            li = f"{sel} li.handle[data-handle='{h['handle']}']"
            assert page.get_attribute(li, "data-model") == "demo"
            assert page.get_attribute(li, "data-generation") == "1"
            assert page.get_attribute(li, "data-bytes-delivered") == str(h["bytes_delivered"])
            assert page.text_content(li + " .badge") == "gen 1"
            link = page.query_selector(li + " a")
            assert link.text_content() == h["spec"] == "demo"
            assert link.get_attribute("href") == "#models/demo"

        page.wait_for_selector(sel, state="detached", timeout=15000)
        page.wait_for_selector("#sessions-empty:not([hidden])")
        assert watch.problems == []
    finally:
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_screenshots(browser, base_url, daemon, artifacts_dir, scheme, size):
    ctx, page, watch = open_sessions(browser, base_url, scheme=scheme, size=size)
    try:
        with reading(daemon) as (f, t, s):
            page.wait_for_selector(f"{row(s)}[data-bytes-delivered='{s['bytes_delivered']}'] li.handle")
            shoot(page, artifacts_dir, "sessions", scheme, size)
        assert watch.problems == []
    finally:
        ctx.close()


def test_memory_tier_shown(browser, base_url, daemon):
    """The memory tier's figures on the Sessions page and the Overview card
    are the API's: after a read, its resident bytes, budget, hits and
    misses; its hit line says what share of the bytes came from memory."""
    with reading(daemon) as (f, t, s):
        f.get_tensor("embed.weight")  # the second read of it: a hit
        tier = daemon.ok("GET", "/v1/sessions")["tier"]
        assert tier["enabled"] and tier["budget_bytes"] > 0, tier
        assert tier["resident_bytes"] >= t.nbytes and tier["hits"] >= 1, tier
        ctx, page, watch = open_sessions(browser, base_url)
        try:
            sel = (f"#sessions-tier[data-resident-bytes='{tier['resident_bytes']}']"
                   f"[data-budget-bytes='{tier['budget_bytes']}'][data-hits='{tier['hits']}']")
            page.wait_for_selector(sel, timeout=15000)
            text = page.text_content("#sessions-tier")
            budget = page.evaluate("n => TV.fmtBytes(n)", tier["budget_bytes"])
            assert f"of {budget} resident" in text, text
            assert page.evaluate("t => TV.tierHits(t)", tier) in text, text
            assert "hits " in text and "% of " in text, text

            page.goto(base_url + "/#overview")
            page.wait_for_selector(f"#tier-resident[data-budget-bytes='{tier['budget_bytes']}']",
                                   timeout=15000)
            status = daemon.ok("GET", "/v1/status")["tier"]
            assert status["budget_bytes"] == tier["budget_bytes"], status
            assert page.text_content("#tier-resident").endswith(" / " + budget)
            assert "hits " in page.text_content("#tier-detail")
            assert watch.problems == []
        finally:
            ctx.close()
