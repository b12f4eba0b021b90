/* tensorvault dashboard, the Fleet page (#fleet): GET /v1/fleet every
 * TV.POLL_MS while visible. The catalog line (where, connected or its
 * error), the nodes (up/down, age), one card per fleet alias (generation,
 * version, placement, quorum / timeout, each placed node's state with a
 * progress bar while pulling, the generation it serves, its error) and the
 * catalog's generations with their holders. "Move alias" opens a dialog
 * (model, alias, generation, placement, quorum, timeout) and sends
 * PUT /v1/fleet/aliases/{model}/{alias} with the version shown as
 * expect_version (TV.send: the token flow of the other pages); a 409 shows
 * the API's message and the page re-reads. A standalone node: one line
 * saying so and how to enable fleet mode. */
"use strict";

(function () {
  var ui = {};
  var last = null; // the last document rendered

  function td(tr, text, cls) { var c = TV.el("td", cls || null, text); tr.appendChild(c); return c; }

  function table(cls, cols) {
    var t = TV.el("table", cls);
    var head = TV.el("tr");
    cols.forEach(function (c) { var th = TV.el("th", null, c); th.scope = "col"; head.appendChild(th); });
    var thead = TV.el("thead");
    thead.appendChild(head);
    t.appendChild(thead);
    var body = TV.el("tbody");
    t.appendChild(body);
    return { table: t, body: body };
  }

  function badge(text, cls) { return TV.el("span", "badge " + (cls || ""), text); }

  function nodeRow(tb, n) {
    var tr = TV.el("tr", "fleet-node");
    tr.dataset.node = n.name;
    var up = typeof n.up === "boolean" ? n.up : n.age_s < 30; /* fleet.node_down_s */
    tr.dataset.up = up ? "1" : "0";
    td(tr, n.name);
    td(tr, n.url);
    td(tr).appendChild(badge(up ? "up" : "down", up ? "ok" : "bad"));
    td(tr, n.state);
    td(tr, TV.fmtDuration(n.age_s) + " ago", "num");
    tb.appendChild(tr);
  }

  function placedRow(tb, p) {
    var tr = TV.el("tr", "fleet-placed");
    tr.dataset.node = p.node;
    tr.dataset.state = p.state;
    td(tr, p.node);
    var st = td(tr);
    st.appendChild(badge(p.state, p.state === "ready" ? "ok" : p.state === "failed" ? "bad" : ""));
    if (!p.up) st.appendChild(badge("down", "bad"));
    var prog = td(tr, null, "fleet-progress");
    if (p.state === "pulling" || p.bytes_total) {
      var pct = p.bytes_total ? Math.min(100, 100 * p.bytes_done / p.bytes_total) : 0;
      if (p.state === "pulling") {
        var bar = TV.el("progress");
        bar.max = 100;
        bar.value = pct;
        bar.setAttribute("aria-label", "pulled " + pct.toFixed(1) + "%");
        prog.appendChild(bar);
      }
      prog.appendChild(TV.el("span", "muted small", TV.fmtBytes(p.bytes_done) + " / " +
        TV.fmtBytes(p.bytes_total) + " (" + pct.toFixed(1) + "%)" +
        (p.state === "pulling" ? ", " + TV.fmtRate(p.rate_bps) : "")));
    } else {
      prog.appendChild(TV.el("span", "muted", "-"));
    }
    td(tr, p.serving === null || p.serving === undefined ? "-" : "gen " + p.serving);
    td(tr, p.error || "", p.error ? "fleet-error" : null);
    tb.appendChild(tr);
  }

  function aliasCard(a) {
    var card = TV.el("div", "panel fleet-alias");
    card.dataset.model = a.model;
    card.dataset.alias = a.alias;
    card.dataset.version = String(a.version);
    card.dataset.generation = String(a.generation);
    var h = TV.el("h3", null, a.model + "@" + a.alias + " \u2192 generation " + a.generation);
    card.appendChild(h);
    card.appendChild(TV.el("p", "muted small fleet-alias-meta",
      "version " + a.version + " \u00b7 placement " + (a.placement ? a.placement.join(", ") : "every node") +
      " \u00b7 quorum " + (a.quorum ? a.quorum : "every placed node") + " / timeout " +
      (a.timeout_s || 600) + " s" + (a.age_s !== undefined ? " \u00b7 moved " + TV.fmtDuration(a.age_s) + " ago" : "")));
    var t = table("fleet-placed", ["Node", "State", "Pulled", "Serving", "Error"]);
    (a.nodes || []).forEach(function (p) { placedRow(t.body, p); });
    card.appendChild(t.table);
    var b = TV.el("button", "btn small-btn", "Move alias");
    b.type = "button";
    b.addEventListener("click", function () { openMove(a); });
    card.appendChild(b);
    return card;
  }

  function render(doc) {
    last = doc;
    TV.clear(ui.body);
    if (doc.mode !== "fleet") {
      var p = TV.el("p", "fleet-standalone", doc.mode === "starting"
        ? "This node is starting its fleet thread; the fleet shows here in a moment."
        : "This node runs standalone: it is not part of a fleet. Set fleet.postgres (the catalog's " +
          "PostgreSQL connection) and fleet.node in the daemon's configuration to join one.");
      p.id = "fleet-standalone";
      ui.body.appendChild(p);
      ui.moveNew.hidden = true;
      return;
    }
    ui.moveNew.hidden = false;
    var c = doc.catalog;
    var line = TV.el("p", "fleet-catalog");
    line.id = "fleet-catalog";
    line.appendChild(TV.el("span", null, "node " + (doc.node || "-") + " (" + (doc.url || "-") + ") \u00b7 catalog " +
      (c ? c.where : "-") + " "));
    if (c) line.appendChild(badge(c.connected ? "connected" : "not connected", c.connected ? "ok" : "bad"));
    if (c && c.error) line.appendChild(TV.el("span", "fleet-error", " " + c.error));
    ui.body.appendChild(line);

    ui.body.appendChild(TV.el("h3", null, "Nodes"));
    var nt = table("fleet-nodes", ["Node", "URL", "Up", "State", "Last seen"]);
    nt.table.id = "fleet-nodes";
    (doc.nodes || []).forEach(function (n) { nodeRow(nt.body, n); });
    ui.body.appendChild(nt.table);

    ui.body.appendChild(TV.el("h3", null, "Aliases"));
    if (!(doc.aliases || []).length) ui.body.appendChild(TV.el("p", "muted", "no fleet aliases yet"));
    (doc.aliases || []).forEach(function (a) { ui.body.appendChild(aliasCard(a)); });

    ui.body.appendChild(TV.el("h3", null, "Generations"));
    var gt = table("fleet-generations", ["Model", "Generation", "Size", "Shards", "Published by", "Holders"]);
    gt.table.id = "fleet-generations";
    (doc.generations || []).forEach(function (g) {
      var tr = TV.el("tr", "fleet-generation");
      tr.dataset.model = g.model;
      tr.dataset.number = String(g.number);
      td(tr, g.model);
      td(tr, String(g.number), "num");
      td(tr, TV.fmtBytes(g.total_bytes), "num");
      td(tr, String(g.n_shards), "num");
      td(tr, g.published_by || "-");
      td(tr, (g.holders || []).join(", ") || "none");
      gt.body.appendChild(tr);
    });
    ui.body.appendChild(gt.table);
  }

  /* The Move alias dialog; a = the alias shown (null: a new one, version 0). */
  function field(form, label, name, value, type) {
    var l = TV.el("label", null, label + " ");
    var i = TV.el("input");
    i.name = name;
    i.type = type || "text";
    i.value = value === null || value === undefined ? "" : String(value);
    l.appendChild(i);
    form.appendChild(l);
    return i;
  }

  function openMove(a) {
    var d = ui.dialog;
    var f = TV.clear(ui.form);
    f.appendChild(TV.el("h2", null, "Move a fleet alias"));
    var expect = a ? a.version : 0;
    var inp = {
      model: field(f, "Model", "model", a ? a.model : ""),
      alias: field(f, "Alias", "alias", a ? a.alias : ""),
      generation: field(f, "Generation", "generation", a ? a.generation : "", "number"),
      placement: field(f, "Placement (nodes, comma-separated; empty = every node)", "placement",
                       a && a.placement ? a.placement.join(",") : ""),
      quorum: field(f, "Quorum (0 = every placed node)", "quorum", a && a.quorum ? a.quorum : 0, "number"),
      timeout: field(f, "Timeout (s, 0 = 600)", "timeout", a ? a.timeout_s : 0, "number")
    };
    if (a) { inp.model.readOnly = true; inp.alias.readOnly = true; }
    var ex = TV.el("p", "muted small", "expects version " + expect + " (the one shown)");
    ex.id = "fleet-move-expect";
    f.appendChild(ex);
    var msg = TV.el("p", "fleet-error");
    msg.id = "fleet-move-error";
    msg.hidden = true;
    f.appendChild(msg);
    var btns = TV.el("div", "dialog-buttons");
    var cancel = TV.el("button", "btn", "Cancel");
    cancel.type = "button";
    cancel.addEventListener("click", function () { d.close(); });
    var ok = TV.el("button", "btn primary", "Move");
    ok.type = "submit";
    ok.id = "fleet-move-submit";
    btns.appendChild(cancel);
    btns.appendChild(ok);
    f.appendChild(btns);
    f.onsubmit = function (ev) {
      ev.preventDefault();
      var pl = inp.placement.value.split(",").map(function (s) { return s.trim(); })
        .filter(function (s) { return s; });
      var body = { generation: parseInt(inp.generation.value, 10), expect_version: expect,
                   placement: pl.length ? pl : null, quorum: parseInt(inp.quorum.value, 10) || 0,
                   timeout_s: parseInt(inp.timeout.value, 10) || 0 };
      var path = "/v1/fleet/aliases/" + TV.seg(inp.model.value) + "/" + TV.seg(inp.alias.value);
      ok.disabled = true;
      TV.send("PUT", path, body, "fleet-move").then(function (r) {
        d.close();
        TV.notify("moved " + r.model + "@" + r.alias + " to generation " + r.generation + " (version " + r.version + ")");
        refresh();
      }, function (e) {
        ok.disabled = false;
        msg.textContent = e.message;
        msg.hidden = false;
        if (e.status === 409) refresh();
      });
    };
    if (d.showModal) d.showModal(); else d.setAttribute("open", "");
    (a ? inp.generation : inp.model).focus();
  }

  function refresh() {
    return TV.track("fleet", TV.get("/v1/fleet")).then(function (doc) {
      if (doc) render(doc);
    });
  }

  TV.register("fleet", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.setAttribute("aria-labelledby", "fleet-h");
      var h = TV.el("h2", null, "Fleet");
      h.id = "fleet-h";
      p.appendChild(h);
      ui.moveNew = TV.el("button", "btn small-btn", "Move alias");
      ui.moveNew.type = "button";
      ui.moveNew.id = "fleet-move-new";
      ui.moveNew.hidden = true;
      ui.moveNew.addEventListener("click", function () { openMove(null); });
      p.appendChild(ui.moveNew);
      ui.body = TV.el("div", "fleet-body");
      ui.body.id = "fleet-body";
      p.appendChild(ui.body);
      sec.appendChild(p);
      ui.dialog = TV.el("dialog");
      ui.dialog.id = "fleet-move-dialog";
      ui.form = TV.el("form", "dialog-form");
      ui.form.id = "fleet-move-form";
      ui.dialog.appendChild(ui.form);
      document.body.appendChild(ui.dialog);
    },
    refresh: function () {
      // no re-render under an open dialog's feet: the poll waits for it to close
      if (ui.dialog && ui.dialog.open && last) return Promise.resolve();
      return refresh();
    }
  });
})();
