"""The dashboard's generation view lists the generation's sidecar files
(path, size, short sha256, a download link that answers the file's bytes)
and renders its config.json as a table of its top-level keys, nested
values as pretty-printed JSON; a value holding markup is shown as text,
never parsed as HTML; it fits 1280 and 390 px."""
import json
import os

from harness.browser import demo_checkpoint, open_page, shoot

CONFIG = {"model_type": "gpt2", "n_layer": 2, "tie": True,
          "architectures": ["GPT2LMHeadModel"],
          "note": "<img src=x onerror=\"window.pwned=1\"><b>bold</b>"}


def test_generation_files_and_config(browser, daemon_factory, artifacts_dir):
    d = daemon_factory()
    ckpt = os.path.join(d.workdir, "ck", "model.safetensors")
    demo_checkpoint(ckpt)
    root = os.path.dirname(ckpt)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    os.makedirs(os.path.join(root, "1_Pooling"))
    with open(os.path.join(root, "1_Pooling", "config.json"), "w") as f:
        f.write('{"pooling_mode_mean_tokens": true}')
    d.import_ok("m", root, activate=True)
    files = d.ok("GET", "/v1/models/m/generations/1/files")["files"]
    assert [f["path"] for f in files] == ["1_Pooling/config.json", "config.json"]

    ctx, page, watch = open_page(browser, f"http://127.0.0.1:{d.port}", "#models/m")
    try:
        page.click("#gens-table tr.gen[data-gen='1'] button.expand")
        page.wait_for_selector("#shards-1 table.config")
        rows = page.query_selector_all("#shards-1 table.files tr.file")
        assert [r.get_attribute("data-path") for r in rows] == [f["path"] for f in files]
        for r, f in zip(rows, files):
            assert r.eval_on_selector(".sha256", "e => e.textContent") == f["sha256"][:12]
            assert r.eval_on_selector(".sha256", "e => e.title") == f["sha256"]
        href = rows[1].eval_on_selector("a.download", "a => a.getAttribute('href')")
        assert href == "/v1/models/m/generations/1/files/config.json"
        got = page.evaluate("h => fetch(h).then(r => r.text())", href)
        assert json.loads(got) == CONFIG
        cfg = page.eval_on_selector_all(
            "#shards-1 table.config tr", "rs => rs.map(r => [r.dataset.key, "
            "r.querySelector('td').textContent, !!r.querySelector('td pre')])")
        assert cfg == [["model_type", "gpt2", False], ["n_layer", "2", False],
                       ["tie", "true", False],
                       ["architectures", json.dumps(["GPT2LMHeadModel"], indent=2), True],
                       ["note", CONFIG["note"], False]]
        assert page.query_selector("#shards-1 table.config img") is None
        assert page.evaluate("() => window.pwned === undefined")
        assert watch.problems == []
        shoot(page, artifacts_dir, "files", "light", "wide")
    finally:
        ctx.close()
    ctx, page, _ = open_page(browser, f"http://127.0.0.1:{d.port}", "#models/m", scheme="dark",
                             size="narrow")
    try:
        page.click("#gens-table tr.gen[data-gen='1'] button.expand")
        page.wait_for_selector("#shards-1 table.config")
        shoot(page, artifacts_dir, "files", "dark", "narrow")
    finally:
        ctx.close()
