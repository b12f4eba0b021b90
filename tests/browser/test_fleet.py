"""The dashboard's Fleet page (#fleet, web/fleet.js) in Chromium: a
standalone daemon says it is standalone and how to enable fleet mode
(fleet.postgres); a fleet node (fleet.postgres on the PostgreSQL that
the `postgres` fixture starts) lists itself, an alias moved through the
Move alias dialog shows version 1 and the node's state, and a move that
expects a version that moved shows the API's 409 message and re-reads.
Screenshots light/dark x wide/narrow of the fleet node's page."""
import os

import pytest

from harness.browser import demo_checkpoint, open_page, shoot
from harness.postgres import fresh_db
from harness.wait import wait_for


def test_standalone(browser, daemon_factory):
    d = daemon_factory()
    ctx, page, watch = open_page(browser, f"http://127.0.0.1:{d.port}", "#fleet")
    try:
        page.wait_for_selector("#fleet-standalone")
        text = page.text_content("#fleet-standalone")
        assert "standalone" in text and "fleet.postgres" in text
        assert page.is_hidden("#fleet-move-new")
        assert watch.problems == []
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def fleet_node(daemon_factory, postgres):
    db, dsn = fresh_db(postgres, "tvweb_")
    d = daemon_factory({"fleet.postgres": dsn, "fleet.node": "web-a"})
    d.import_ok("demo", demo_checkpoint(os.path.join(d.workdir, "ckpt", "model.safetensors")))
    wait_for(lambda: any(g["model"] == "demo" for g in d.ok("GET", "/v1/fleet")["generations"]),
             what="generation in the catalog")
    return d


def move(page, generation, model=None, alias=None):
    if model is not None:
        page.click("#fleet-move-new")
        page.fill("#fleet-move-form input[name=model]", model)
        page.fill("#fleet-move-form input[name=alias]", alias)
    page.fill("#fleet-move-form input[name=generation]", str(generation))
    page.click("#fleet-move-submit")


def test_fleet_node_move_and_conflict(browser, fleet_node, artifacts_dir):
    d = fleet_node
    base = f"http://127.0.0.1:{d.port}"
    ctx, page, watch = open_page(browser, base, "#fleet", token=d.token)
    try:
        page.wait_for_selector("#fleet-nodes tr.fleet-node[data-node='web-a'][data-up='1']")
        assert "connected" in page.text_content("#fleet-catalog")
        page.wait_for_selector("#fleet-generations tr[data-model='demo'][data-number='1']")

        move(page, 1, model="demo", alias="prod")
        card = ".fleet-alias[data-model='demo'][data-alias='prod']"
        page.wait_for_selector(f"{card}[data-version='1'][data-generation='1']", timeout=15000)
        page.wait_for_selector(f"{card} tr.fleet-placed[data-node='web-a']", timeout=15000)
        state = page.get_attribute(f"{card} tr.fleet-placed[data-node='web-a']", "data-state")
        assert state in ("missing", "pulling", "ready", "failed")

        # another move behind the page's back: the page still shows version 1
        r = d.request("PUT", "/v1/fleet/aliases/demo/prod",
                      body={"generation": 1, "expect_version": 1, "placement": None,
                            "quorum": 0, "timeout_s": 0})
        assert r.status == 200, r
        page.click(f"{card} button")
        move(page, 1)
        page.wait_for_selector("#fleet-move-error:not([hidden])")
        assert "409" in page.text_content("#fleet-move-error")
        page.click("#fleet-move-form button[type=button]")  # Cancel: the page re-read
        page.wait_for_selector(f"{card}[data-version='2']", timeout=15000)
        assert watch.other_than("/v1/fleet/aliases/demo/prod") == []
        for scheme in ("light", "dark"):
            for size in ("wide", "narrow"):
                c2, p2, _ = open_page(browser, base, "#fleet", scheme=scheme, size=size)
                try:
                    p2.wait_for_selector(card)
                    shoot(p2, artifacts_dir, "fleet", scheme, size)
                finally:
                    c2.close()
    finally:
        ctx.close()
