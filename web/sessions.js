/* tensorvault dashboard, the Sessions page (#sessions): the fast path's
 * connected workers (GET /v1/sessions every TV.POLL_MS), one table row
 * each: id, peer pid/uid/gid, when it connected, bytes delivered, requests
 * done, staging slots held, and its open handles (the spec it opened, the
 * generation that resolved to, bytes delivered; the model links to
 * #models/NAME). A row is rebuilt only when its session changed. Above
 * the table, the memory tier the sessions share (its "tier" object):
 * resident of the budget, hits, device and shared bytes, evictions,
 * views, members left behind. */
"use strict";

(function () {
  var ui = {};
  var rows = {}; // session id -> {node, key}

  var COLS = [["Session", "num"], ["PID", "num"], ["UID / GID", "num"], ["Connected"],
              ["Delivered", "num"], ["Requests", "num"], ["Slots held", "num"],
              ["Open models (spec, generation, delivered)"]];

  /* A cell; data-label names its column for the narrow layout (sessions.css). */
  function cell(tr, text, cls) {
    var td = TV.el("td", cls || null, text);
    td.dataset.label = COLS[tr.children.length][0];
    tr.appendChild(td);
    return td;
  }

  function handleList(s) {
    if (!s.handles.length) return TV.el("span", "muted", "none open");
    var ul = TV.el("ul", "handles");
    s.handles.forEach(function (h) {
      var li = TV.el("li", "handle");
      li.dataset.handle = String(h.handle);
      li.dataset.model = h.model;
      li.dataset.generation = String(h.generation);
      li.dataset.bytesDelivered = String(h.bytes_delivered);
      var a = TV.el("a", "handle-model", h.spec);
      a.href = TV.href("models", [h.model]);
      a.title = "model " + h.model;
      li.appendChild(a);
      li.appendChild(TV.el("span", "badge", "gen " + h.generation));
      var b = TV.el("span", "muted num", TV.fmtBytes(h.bytes_delivered));
      b.title = h.bytes_delivered + " bytes delivered through this handle";
      li.appendChild(b);
      ul.appendChild(li);
    });
    return ul;
  }

  function fillRow(tr, s) {
    TV.clear(tr);
    tr.dataset.sessionId = String(s.id);
    tr.dataset.pid = String(s.pid);
    tr.dataset.bytesDelivered = String(s.bytes_delivered);
    tr.dataset.requestsDone = String(s.requests_done);
    tr.dataset.slotsHeld = String(s.slots_held);
    cell(tr, String(s.id), "num");
    cell(tr, String(s.pid), "num");
    cell(tr, s.uid + " / " + s.gid, "num");
    cell(tr, TV.fmtTime(s.connected));
    var b = cell(tr, TV.fmtBytes(s.bytes_delivered), "num");
    b.title = s.bytes_delivered + " bytes";
    cell(tr, String(s.requests_done), "num");
    cell(tr, String(s.slots_held), "num");
    var h = cell(tr, null, "handles-cell");
    h.appendChild(handleList(s));
  }

  function renderTier(t) {
    var box = TV.clear(ui.tier);
    if (!t || !t.enabled) { box.hidden = true; return; }
    box.hidden = false;
    ["resident_bytes", "budget_bytes", "hits", "misses", "device_read_bytes", "shared_bytes",
     "evictions", "views", "member_stalls"].forEach(function (k) {
      box.dataset[k.replace(/_([a-z])/g, function (m, c) { return c.toUpperCase(); })] = String(t[k]);
    });
    box.appendChild(TV.el("strong", null, "Memory tier "));
    if (!t.budget_bytes) {
      box.appendChild(TV.el("span", "muted", "off (cache.bytes = 0): chunks are kept only while read"));
      return;
    }
    var parts = [TV.fmtBytes(t.resident_bytes) + " of " + TV.fmtBytes(t.budget_bytes) + " resident (" +
                 t.generations + " generations, " + t.pages + " pages)",
                 TV.tierHits(t),
                 "device " + TV.fmtBytes(t.device_read_bytes) + ", shared " + TV.fmtBytes(t.shared_bytes),
                 t.views + " views (" + TV.fmtBytes(t.view_bytes) + " pinned)",
                 t.member_stalls + " members left behind"];
    box.appendChild(TV.el("span", "tier-figures", parts.join(" \u00b7 ")));
  }

  function render(doc) {
    renderTier(doc.tier);
    var list = doc.sessions || [];
    var seen = {};
    list.forEach(function (s, i) {
      var key = JSON.stringify(s);
      var r = rows[s.id];
      if (!r) { r = { node: TV.el("tr", "session"), key: null }; rows[s.id] = r; }
      if (r.key !== key) { fillRow(r.node, s); r.key = key; }
      seen[s.id] = true;
      var at = ui.body.children[i];
      if (at !== r.node) ui.body.insertBefore(r.node, at || null);
    });
    Object.keys(rows).forEach(function (id) {
      if (!seen[id]) {
        if (rows[id].node.parentNode) rows[id].node.parentNode.removeChild(rows[id].node);
        delete rows[id];
      }
    });
    ui.count.textContent = "(" + list.length + " connected)";
    ui.wrap.hidden = list.length === 0;
    ui.empty.hidden = list.length > 0;
  }

  TV.register("sessions", {
    init: function (sec) {
      var p = TV.el("section", "panel");
      p.setAttribute("aria-labelledby", "sessions-h");
      var h = TV.el("h2", null, "Fast-path sessions ");
      h.id = "sessions-h";
      ui.count = TV.el("span", "muted small");
      ui.count.id = "sessions-count";
      h.appendChild(ui.count);
      p.appendChild(h);
      p.appendChild(TV.el("p", "muted small intro",
        "Co-located workers reading tensors through the daemon's fast-path socket (tensorvault.safe_open " +
        "and the vLLM loader), in connection order, with the models they have open."));

      ui.tier = TV.el("p", "tier small");
      ui.tier.id = "sessions-tier";
      ui.tier.hidden = true;
      p.appendChild(ui.tier);

      ui.empty = TV.el("div", "empty");
      ui.empty.id = "sessions-empty";
      ui.empty.appendChild(TV.el("p", null, "no fast-path sessions"));
      ui.empty.appendChild(TV.el("p", "muted small",
        "Nothing is connected to the fast-path socket now. The list is empty too when the fast path " +
        "is disabled (fastpath.enabled = false in the daemon's configuration)."));
      ui.empty.hidden = true;
      p.appendChild(ui.empty);

      ui.wrap = TV.el("div", "table-wrap");
      ui.wrap.hidden = true;
      var t = TV.el("table", "sessions");
      t.id = "sessions";
      var head = TV.el("tr");
      COLS.forEach(function (c) {
        var th = TV.el("th", c[1] || null, c[0]);
        th.scope = "col";
        head.appendChild(th);
      });
      var thead = TV.el("thead");
      thead.appendChild(head);
      t.appendChild(thead);
      ui.body = TV.el("tbody");
      t.appendChild(ui.body);
      ui.wrap.appendChild(t);
      p.appendChild(ui.wrap);
      sec.appendChild(p);
    },
    refresh: function () {
      return TV.track("sessions", TV.get("/v1/sessions")).then(function (doc) {
        if (doc) render(doc);
      });
    }
  });
})();
