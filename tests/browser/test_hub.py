"""The dashboard and Hugging Face Hub imports (hf://, server/import/src_hub.c)
in Chromium: the import form refuses a malformed hf:// source before any
request and starts a well-formed one; the generation it published shows
its repository and the commit its revision resolved to (web/models.js
hubOrigin), as the API's source_repo and source_commit say."""
import pytest
from safetensors.numpy import save

from harness.browser import open_page
from harness.fleet import sample_tensors
from harness.hub import Hub, Repo

pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def hub():
    h = Hub().start()
    r = Repo()
    h.commit = r.commit({"model.safetensors": save(sample_tensors(5)), "config.json": b"{}"},
                        refs=("main",))
    h.repos["org/webm"] = r
    try:
        yield h
    finally:
        h.stop()


def test_hub_import_from_the_form_and_its_generation(browser, daemon_factory, hub):
    d = daemon_factory({"import.hf_endpoint": hub.url, "import.hf_redirect_http": "true",
                        "import.hf_redirect_private": "true"})
    base = f"http://127.0.0.1:{d.port}"
    ctx, page, _ = open_page(browser, base, "#imports", token=d.token)
    try:
        posts = []
        page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
        page.fill("#imp-model", "web/hub")
        page.fill("#imp-source", "hf://org/a--b")
        page.click("#imp-start")
        page.wait_for_selector("#imp-error:not([hidden])")
        assert "hf://ORG/REPO" in page.text_content("#imp-error")
        assert posts == []
        page.fill("#imp-source", "hf://org/webm@main")
        with page.expect_response(lambda r: r.request.method == "POST"
                                  and r.url.endswith("/v1/imports")) as info:
            page.click("#imp-start")
        assert info.value.status == 202, info.value.text()
        job = d.wait_job(info.value.json()["id"])
        assert job["state"] == "succeeded", job
    finally:
        ctx.close()
    g = d.generations("web/hub")[-1]
    assert g["source_repo"] == "org/webm" and g["source_commit"] == hub.commit
    ctx, page, _ = open_page(browser, base, "#models/web%2Fhub")
    try:
        cell = f"#gens-table tr.gen[data-gen='{g['generation']}'] td.src"
        page.wait_for_selector(cell + " .hub-commit")
        assert page.text_content(cell + " .hub-repo") == "hf://org/webm"
        assert page.text_content(cell + " .hub-commit") == "@" + hub.commit[:12]
        assert hub.commit in page.get_attribute(cell, "title")
    finally:
        ctx.close()
