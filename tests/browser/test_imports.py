"""The dashboard's Imports page (#imports, web/imports.js) in Chromium,
against a daemon with one import worker: an import started from the form
reaches 100% and links to the generation it published (what the page showed
while it ran is checked against the bytes it was showing); a queued job is
cancelled from the page (keyboard focus on its Cancel button survives the
refreshes), nothing is published for it, and a running one is cancelled
best-effort; a corrupt checkpoint's job shows the API's TV_E_ST_* code and
message; verify jobs are listed and the state/kind filters work; refused
starts (outside the import roots, a missing source, no token) show the
API's message under the form and in the error box; the form keeps what was
typed across refreshes; screenshots light/dark x wide/narrow."""
import os
import re
import struct

import pytest

from harness.browser import demo_checkpoint, open_page, shoot
from harness.daemon import big_checkpoint

PlaywrightTimeout = pytest.importorskip("playwright.sync_api").TimeoutError

JOBS = "#jobs li.job"

# Records every state each job row shows (a MutationObserver on the list:
# it runs after each render, so every record is one consistent row).
RECORDER = """() => {
  window.__tvSeen = [];
  const list = document.getElementById('jobs');
  const snap = () => list.querySelectorAll('li.job').forEach(li => window.__tvSeen.push({
    id: li.dataset.jobId, state: li.dataset.state, progress: li.dataset.progress,
    done: li.dataset.bytesDone, total: li.dataset.bytesTotal,
    valuenow: li.querySelector('[role=progressbar]').getAttribute('aria-valuenow'),
    pct: li.querySelector('.job-pct').textContent,
    badge: li.querySelector('.badge.state').textContent}));
  new MutationObserver(snap).observe(list, {subtree: true, childList: true, attributes: true,
                                            characterData: true});
}"""


@pytest.fixture(scope="module")
def idaemon(daemon_factory):
    """A daemon with a single import worker (jobs queue behind each other)
    and room for the big checkpoints."""
    return daemon_factory({"import.workers": "1", "store.image_size": "2G"})


def url(d):
    return f"http://127.0.0.1:{d.port}"


def open_imports(browser, d, scheme="light", size="wide", token=True):
    return open_page(browser, url(d), "#imports", scheme=scheme, size=size,
                     token=d.token if token else None)


def row(job_id):
    return f"{JOBS}[data-job-id='{job_id}']"


def is_post(path):
    return lambda r: r.request.method == "POST" and r.url.endswith(path)


def fill_form(page, model, source, activate=False, alias="", strict=False):
    page.fill("#imp-model", model)
    page.fill("#imp-source", str(source))
    page.fill("#imp-alias", alias)
    page.set_checked("#imp-activate", activate)
    page.set_checked("#imp-strict", strict)


def start_from_page(page, model, source, **kw):
    """Fills the form, clicks Start import; returns the POST's response."""
    fill_form(page, model, source, **kw)
    with page.expect_response(is_post("/v1/imports")) as info:
        page.click("#imp-start")
    return info.value


def wait_polled(page, n=1):
    """Waits until the job list has been rendered n more times."""
    n0 = int(page.get_attribute("#jobs", "data-polls") or 0)
    page.wait_for_function(f"() => Number(document.getElementById('jobs').dataset.polls) >= {n0 + n}",
                           timeout=15000)


def published(d, model):
    return [g for g in d.generations(model) if g["state"] in ("ready", "importing")]


def test_import_from_page_reaches_100(browser, idaemon):
    d = idaemon
    src = big_checkpoint(os.path.join(d.workdir, "big-a", "model.safetensors"), 640 << 20, seed=1)
    ctx, page, watch = open_imports(browser, d)
    try:
        page.evaluate(RECORDER)
        assert "import roots" in page.text_content("#imp-source-hint")
        r = start_from_page(page, "bigA", src, activate=True, alias="latest", strict=True)
        assert r.status == 202, r.text()
        jid = r.json()["id"]
        page.wait_for_selector(row(jid))
        page.wait_for_selector(row(jid) + "[data-state='succeeded']", timeout=60000)

        api = d.wait_job(jid)
        assert api["state"] == "succeeded" and api["kind"] == "import", api
        assert api["activate"] is True and api["strict"] is True and api["alias"] == "latest", api
        assert api["bytes_done"] == api["bytes_total"] >= 640 << 20, api
        sel = row(jid)
        assert page.get_attribute(sel, "data-progress") == "100"
        assert page.get_attribute(sel, "data-bytes-done") == str(api["bytes_done"])
        assert page.get_attribute(sel, "data-bytes-total") == str(api["bytes_total"])
        assert page.get_attribute(sel + " [role=progressbar]", "aria-valuenow") == "100"
        assert page.text_content(sel + " .job-pct") == "100%"
        assert page.text_content(sel + " .badge.state") == "succeeded"
        assert page.is_hidden(sel + " .job-cancel")
        assert "created " in page.text_content(sel + " .job-times")
        assert "finished " in page.text_content(sel + " .job-times")

        # the generation it published, linked
        gen = api["generation"]
        gens = {g["generation"]: g for g in d.generations("bigA")}
        assert gen in gens and gens[gen]["state"] == "ready", gens
        link = page.query_selector(sel + " a.job-gen")
        assert link.get_attribute("href") == "#models/bigA"
        assert link.get_attribute("data-generation") == str(gen)
        assert link.text_content() == f"bigA generation {gen}"
        result = page.text_content(sel + " .job-result")
        assert "active" in result and "latest" in result, result
        assert page.get_attribute(sel + " a.job-tensors", "href") == f"#tensors/bigA/{gen}"

        # What the page showed while it ran: a row whose bytes were part-way
        # showed a running badge and a percentage strictly between 0 and 100.
        seen = [s for s in page.evaluate("window.__tvSeen") if s["id"] == str(jid)]
        assert seen, "the job's row was never rendered"
        mid = [s for s in seen if s["state"] == "running" and 0 < int(s["done"]) < int(s["total"])]
        for s in mid:
            assert s["badge"] == "running" and 0 < int(s["progress"]) < 100, s
            assert s["valuenow"] == s["progress"] and s["pct"] == s["progress"] + "%", s
        print(f"job {jid}: the page saw {len(mid)} mid-step state(s) of {len(seen)} renders")

        # the form kept what was typed across the refreshes
        wait_polled(page)
        assert page.input_value("#imp-model") == "bigA"
        assert page.input_value("#imp-source") == src
        assert page.input_value("#imp-alias") == "latest"
        assert page.is_checked("#imp-activate") and page.is_checked("#imp-strict")
        assert watch.problems == []
    finally:
        ctx.close()


def test_cancel_queued_and_running(browser, idaemon):
    """One worker: big imports queued ahead (the same 512 MiB checkpoint,
    deduplicated after the first: each one re-reads and hashes it) keep the
    job started from the page queued while it is cancelled."""
    d = idaemon
    src = big_checkpoint(os.path.join(d.workdir, "big-b", "model.safetensors"), 512 << 20, seed=2)
    small = demo_checkpoint(os.path.join(d.workdir, "small-b", "model.safetensors"), seed=3)
    ctx, page, watch = open_imports(browser, d)
    blockers = []
    try:
        for attempt in range(3):
            blockers += [d.submit_import(f"blk{attempt}-{i}", src)["id"] for i in range(8)]
            model = f"queued{attempt}"
            r = start_from_page(page, model, small)
            assert r.status == 202, r.text()
            qid = r.json()["id"]
            sel = row(qid)
            page.wait_for_selector(sel)
            if page.get_attribute(sel, "data-state") != "queued":
                continue  # the worker got to it first: try again with more ahead
            btn = sel + " .job-cancel"
            # keyboard focus on its Cancel button survives a refresh
            page.focus(btn)
            wait_polled(page)
            assert page.evaluate("() => document.activeElement.closest('li.job') && "
                                 "document.activeElement.closest('li.job').dataset.jobId") == str(qid)
            assert page.evaluate("() => document.activeElement.classList.contains('job-cancel')")
            page.keyboard.press("Enter")
            page.wait_for_selector("#confirm-dialog[open]")
            assert f"#{qid}" in page.text_content("#confirm-title")
            with page.expect_response(is_post(f"/v1/jobs/{qid}/cancel")) as info:
                page.click("#confirm-ok")
            assert info.value.status == 200, info.value.text()
            page.wait_for_selector(sel + "[data-state='cancelled']")
            api = d.job(qid)
            assert api["state"] == "cancelled" and api["generation"] is None, api
            if api["started_at"] is None:
                break  # cancelled while queued
        else:
            pytest.fail("three times the job started from the page left the queue before it "
                        "could be cancelled")
        assert page.text_content(sel + " .badge.state") == "cancelled"
        assert page.is_hidden(sel + " .job-cancel")
        assert published(d, model) == []
        assert "cancelled" in page.text_content("#notice")

        # a running one, best-effort (it may finish before the click lands)
        refused = False
        try:
            page.click(f"{JOBS}[data-state='running'] .job-cancel", timeout=5000)
        except PlaywrightTimeout:
            rid = None  # nothing ran long enough to be clicked
        else:
            page.wait_for_selector("#confirm-dialog[open]")
            rid = re.search(r"#(\d+)", page.text_content("#confirm-title")).group(1)
            with page.expect_response(is_post(f"/v1/jobs/{rid}/cancel")) as info:
                page.click("#confirm-ok")
            end = d.wait_job(int(rid))
            if info.value.status == 200:
                assert end["state"] in ("cancelled", "succeeded"), end
            else:
                assert info.value.status == 409 and end["state"] == "succeeded", (info.value, end)
                refused = True
                page.wait_for_selector(f"#errors p.error-line[data-source='cancel job {rid}']")
            page.wait_for_selector(row(rid) + f"[data-state='{end['state']}']")
            if end["state"] == "cancelled":
                assert end["generation"] is None and published(d, end["model"]) == [], end
            print(f"running job {rid}: cancel answered {info.value.status}, it ended {end['state']}")
        problems = watch.other_than("/cancel") if refused else watch.problems
        assert problems == []
    finally:
        for b in blockers:  # stop wasting the worker's time
            d.request("POST", f"/v1/jobs/{b}/cancel")
        for b in blockers:
            d.wait_job(b)
        ctx.close()


def corrupt_checkpoint(path):
    """A shard whose header is not JSON."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    header = b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'  # no closing brace
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    return path


def test_failed_import_shows_code_and_message(browser, idaemon):
    d = idaemon
    src = corrupt_checkpoint(os.path.join(d.workdir, "bad", "model.safetensors"))
    ctx, page, watch = open_imports(browser, d)
    try:
        r = start_from_page(page, "broken", src)
        assert r.status == 202, r.text()
        jid = r.json()["id"]
        page.wait_for_selector(row(jid) + "[data-state='failed']", timeout=30000)
        api = d.wait_job(jid)
        err = api["error"]
        assert api["state"] == "failed" and err["code"].startswith("TV_E_ST_"), api
        shown = page.text_content(row(jid) + " .job-error")
        assert err["code"] in shown and err["message"] in shown, (shown, err)
        assert page.text_content(row(jid) + " .job-error code") == err["code"]
        assert page.text_content(row(jid) + " .badge.state") == "failed"
        assert page.is_hidden(row(jid) + " .job-cancel")
        assert page.is_hidden(row(jid) + " .job-result")
        assert published(d, "broken") == []
        assert watch.problems == []
    finally:
        ctx.close()


def test_verify_jobs_and_filters(browser, idaemon):
    d = idaemon
    d.import_ok("small-v", demo_checkpoint(os.path.join(d.workdir, "small-v", "model.safetensors"), 5))
    vid = d.ok("POST", "/v1/verify", status=202)["id"]
    v = d.wait_job(vid)
    assert v["state"] == "succeeded" and v["kind"] == "verify", v
    ctx, page, watch = open_imports(browser, d)
    try:
        sel = row(vid)
        page.wait_for_selector(sel + "[data-kind='verify'][data-state='succeeded']")
        assert page.text_content(sel + " .badge.kind") == "verify"
        res = v["result"]
        text = page.text_content(sel + " .job-result")
        assert f"Verified {res['n_objects']} object" in text and f"{res['n_failed']} failed" in text
        # newest first, as the API lists them
        api_ids = [j["id"] for j in d.ok("GET", "/v1/jobs?limit=100")["jobs"]]
        page_ids = page.eval_on_selector_all(JOBS, "ls => ls.map(l => Number(l.dataset.jobId))")
        assert page_ids == api_ids
        # the kind filter: only verify jobs, and the route says so
        page.select_option("#imp-filter-kind", "verify")
        page.wait_for_function("() => location.hash === '#imports?kind=verify'")
        page.wait_for_selector("#page-imports[data-ready='1']")
        page.wait_for_function("() => [...document.querySelectorAll('#jobs li.job')]"
                               ".every(l => l.dataset.kind === 'verify')")
        want = [j["id"] for j in d.ok("GET", "/v1/jobs?kind=verify&limit=100")["jobs"]]
        assert page.eval_on_selector_all(JOBS, "ls => ls.map(l => Number(l.dataset.jobId))") == want
        # a state filter with nothing in it says so
        page.select_option("#imp-filter-state", "running")
        page.wait_for_function("() => location.hash === '#imports?state=running&kind=verify'")
        page.wait_for_selector("#jobs-empty:not([hidden])")
        assert "No job matches" in page.text_content("#jobs-empty")
        assert watch.problems == []
    finally:
        ctx.close()


def test_refused_starts_show_the_api_message(browser, idaemon):
    d = idaemon
    ctx, page, watch = open_imports(browser, d)
    try:
        for source, status in (("/etc", 403), (os.path.join(d.workdir, "no-such-dir"), 404)):
            want = d.request("POST", "/v1/imports", body={"model": "refused", "source": source})
            assert want.status == status, want
            msg = want.json()["error"]["message"]
            r = start_from_page(page, "refused", source)
            assert r.status == status, r.text()
            page.wait_for_selector("#imp-error:not([hidden])")
            inline = page.text_content("#imp-error")
            assert f"HTTP {status}" in inline and msg in inline, inline
            box = page.text_content("#errors p.error-line[data-source='import']")
            assert msg in box, box
            assert page.input_value("#imp-source") == source  # kept for fixing
        # a valid start clears the inline error
        ok = start_from_page(page, "fine", demo_checkpoint(
            os.path.join(d.workdir, "fine", "model.safetensors"), 7))
        assert ok.status == 202
        page.wait_for_selector("#imp-error", state="hidden")
        page.wait_for_selector("#errors p.error-line[data-source='import']", state="detached")
        d.wait_job(ok.json()["id"])
        assert watch.other_than("/v1/imports") == []
        assert any("HTTP 403" in p for p in watch.problems), watch.problems
    finally:
        ctx.close()

    # no token: the dialog asks, Cancel sends it without one, 401 shown
    ctx, page, watch = open_imports(browser, d, token=False)
    try:
        assert page.text_content("#token-btn") == "Token: none"
        fill_form(page, "tokenless", os.path.join(d.workdir, "fine", "model.safetensors"))
        with page.expect_response(is_post("/v1/imports")) as info:
            page.click("#imp-start")
            page.wait_for_selector("#token-dialog[open]")
            page.click("#token-cancel")
        assert info.value.status == 401
        page.wait_for_selector("#imp-error:not([hidden])")
        inline = page.text_content("#imp-error")
        assert "HTTP 401" in inline and "token" in inline, inline
        assert "HTTP 401" in page.text_content("#errors p.error-line[data-source='import']")
        assert d.generations("tokenless") == []
        assert watch.other_than("/v1/imports") == []
        assert any("HTTP 401" in p for p in watch.problems), watch.problems
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def listed(idaemon):
    """A few finished jobs of each outcome to show."""
    d = idaemon
    d.import_ok("shot", demo_checkpoint(os.path.join(d.workdir, "shot", "model.safetensors"), 9),
                activate=True, alias="stable")
    d.wait_job(d.submit_import("shot-bad", corrupt_checkpoint(
        os.path.join(d.workdir, "shot-bad", "model.safetensors")))["id"])
    d.wait_job(d.ok("POST", "/v1/verify", status=202)["id"])
    return d


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", ["wide", "narrow"])
def test_screenshots(browser, listed, artifacts_dir, scheme, size):
    ctx, page, watch = open_imports(browser, listed, scheme=scheme, size=size)
    try:
        page.wait_for_selector(f"{JOBS}[data-state='failed']")
        page.wait_for_selector(f"{JOBS}[data-state='succeeded'] a.job-gen")
        page.fill("#imp-model", "llama-3-8b")
        page.fill("#imp-source", os.path.join(listed.workdir, "llama-3-8b"))
        shoot(page, artifacts_dir, "imports", scheme, size)
        assert watch.problems == []
    finally:
        ctx.close()
