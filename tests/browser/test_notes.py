"""The dashboard's Events page (#events, web/events.js) and the model page's
notes, compare picker and recent events (web/models.js) in Chromium: the
Events page lists an import and an activation as the API does; a tag
edited on the model page is in the API and still shown after a reload; the
compare picker shows what the diff route says."""
import os

from harness.browser import demo_checkpoint, open_page


def test_events_page_and_notes_on_the_model_page(browser, daemon_factory):
    d = daemon_factory()
    for seed in (1, 2):
        d.import_ok("demo", demo_checkpoint(os.path.join(d.workdir, f"ck{seed}", "model.safetensors"),
                                            seed))
    d.ok("POST", "/v1/models/demo/generations/2/activate")
    base = f"http://127.0.0.1:{d.port}"

    ctx, page, watch = open_page(browser, base, "#events", token=d.token)
    try:
        page.wait_for_selector("#events-table tr.event[data-action='activate']")
        rows = page.eval_on_selector_all(
            "#events-table tr.event",
            "rs => rs.map(r => [r.dataset.action, r.dataset.actor, r.dataset.model || null])")
        api = d.ok("GET", "/v1/events?limit=50")["events"]
        assert rows == [[e["action"], e["actor"], e["model"]] for e in api]
        assert ["activate", "admin", "demo"] in rows and ["import.queued", "admin", "demo"] in rows
        assert ["publish", "admin", "demo"] in rows

        # the model page: edit the tags, save, reload: still there
        page.goto(base + "/#models/demo")
        page.wait_for_selector("#page-models[data-ready='1']")
        page.wait_for_selector("#model-notes-edit")
        page.click("#model-notes-edit")
        page.fill("#model-notes-desc", "the demo model")
        page.fill("#model-notes-tags", "team=nlp\nstage=dev")
        page.click("#model-notes-save")
        page.wait_for_selector("#model-notes-tags-list li[data-key='team']")
        m = d.ok("GET", "/v1/models/demo")
        assert (m["description"], m["tags"]) == ("the demo model", {"team": "nlp", "stage": "dev"})
        page.reload()
        page.wait_for_selector("#model-notes-tags-list li[data-key='stage'][data-value='dev']")
        assert page.text_content("#model-notes-description") == "the demo model"
        # the recent events show the change, by the token's name
        page.wait_for_selector("#model-events tr.event[data-action='notes'][data-actor='admin']")
        # a generation's own notes, in its expanded row
        page.click("#gens-table button[data-key='expand:2']")
        page.wait_for_selector("#gen-notes-2-edit")
        page.click("#gen-notes-2-edit")
        page.fill("#gen-notes-2-tags", "data=march")
        page.click("#gen-notes-2-save")
        page.wait_for_selector("#gen-notes-2-tags-list li[data-key='data'][data-value='march']")
        assert d.ok("GET", "/v1/models/demo/generations/2")["tags"] == {"data": "march"}
        assert d.ok("GET", "/v1/models/demo/generations/1")["tags"] == {}
        # compare 1 -> 2: what the diff route says
        page.select_option("#diff-from", "1")
        page.select_option("#diff-to", "2")
        page.click("#diff-go")
        page.wait_for_selector("#diff-result .diff-summary")
        diff = d.ok("GET", "/v1/models/demo/diff?from=1&to=2")
        assert page.get_attribute("#diff-result", "data-unchanged") == str(diff["unchanged"])
        assert f"{len(diff['content_changed'])} changed in content" in \
            page.text_content("#diff-result .diff-summary")
        assert watch.other_than() == [], watch.problems
    finally:
        ctx.close()
