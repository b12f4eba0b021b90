/* tensorvault dashboard, the Events page: #events lists the registry's
 * event log newest first (GET /v1/events: when, who, what, which model and
 * generation, the state before and after), optionally of one model
 * (#events?model=NAME), with "Older events" paging by the log's cursor
 * (before = the last id shown). What the daemon shows is filtered by its
 * access rules. Built on app.js; also exports TV.eventsTable for the model
 * page's recent events (models.js). */
"use strict";

(function () {
  var el = TV.el;
  var SRC = "events";
  var PAGE = 50;
  var COLS = [["Time"], ["Actor"], ["Action"], ["Model"], ["Before"], ["After"]];
  var ui = {};
  var shown = [];    // events on screen, newest first
  var next = null;   // the cursor of the page after the last shown
  var filter = "";   // model name, or ""
  var extra = false; // older pages were added: refresh keeps them

  function brief(o) {
    if (o === null || o === undefined) return "\u2013";
    return Object.keys(o).sort().map(function (k) {
      var v = o[k];
      return k + ": " + (v !== null && typeof v === "object" ? JSON.stringify(v) : String(v));
    }).join(", ");
  }

  /* A <table class="events"> of evs (newest first). */
  function eventsTable(evs, withModel) {
    var t = el("table", "events");
    var head = el("thead"), hr = el("tr");
    COLS.forEach(function (c) {
      if (!withModel && c[0] === "Model") return;
      var th = el("th", null, c[0]);
      th.scope = "col";
      hr.appendChild(th);
    });
    head.appendChild(hr);
    t.appendChild(head);
    var body = el("tbody");
    evs.forEach(function (e) {
      var tr = el("tr", "event");
      tr.dataset.id = String(e.id);
      tr.dataset.action = e.action;
      tr.dataset.actor = e.actor;
      if (e.model !== null) tr.dataset.model = e.model;
      tr.appendChild(el("td", "time", TV.fmtTime(e.time)));
      tr.appendChild(el("td", "actor", e.actor));
      tr.appendChild(el("td", "action mono", e.action));
      if (withModel) {
        var td = el("td", "model");
        if (e.model !== null) {
          var a = el("a", "mono", e.model + (e.generation ? "@" + e.generation : ""));
          a.href = TV.href("models", [e.model]);
          td.appendChild(a);
        } else {
          td.textContent = "\u2013";
        }
        tr.appendChild(td);
      }
      tr.appendChild(el("td", "before small", brief(e.before)));
      tr.appendChild(el("td", "after small", brief(e.after)));
      Array.prototype.forEach.call(tr.children, function (c, i) {
        c.dataset.label = (withModel ? COLS : COLS.filter(function (x) { return x[0] !== "Model"; }))[i][0];
      });
      body.appendChild(tr);
    });
    t.appendChild(body);
    return t;
  }

  function query(before) {
    var q = "?limit=" + PAGE;
    if (filter) q += "&model=" + TV.seg(filter);
    if (before) q += "&before=" + before;
    return "/v1/events" + q;
  }

  function render() {
    var wrap = TV.clear(ui.wrap);
    ui.empty.hidden = shown.length !== 0;
    if (shown.length) wrap.appendChild(eventsTable(shown, true));
    ui.more.hidden = next === null;
    ui.count.textContent = "(" + shown.length + (next !== null ? "+" : "") + ")";
  }

  function load() {
    if (extra) return null; // the older pages stay as they are until the filter changes
    return TV.track(SRC, TV.get(query(null))).then(function (doc) {
      if (!doc) return;
      shown = doc.events;
      next = doc.next;
      render();
    });
  }

  function older() {
    if (next === null) return null;
    return TV.track(SRC, TV.get(query(next))).then(function (doc) {
      if (!doc) return;
      shown = shown.concat(doc.events);
      next = doc.next;
      extra = true;
      render();
    });
  }

  TV.eventsTable = eventsTable;

  TV.register("events", {
    init: function (sec) {
      var p = el("section", "panel");
      p.setAttribute("aria-labelledby", "events-h");
      var h = el("h2", null, "Events ");
      h.id = "events-h";
      ui.count = el("span", "muted small");
      ui.count.id = "events-count";
      h.appendChild(ui.count);
      p.appendChild(h);
      p.appendChild(el("p", "muted small intro",
        "What changed in the registry, newest first: imports, activations and rollbacks, aliases, " +
        "retires, deletes, descriptions and tags, tokens, gc; who did it (a token's name, " +
        "\u201clocal uid N\u201d, \u201ccli\u201d) and the state before and after."));
      var form = el("form", "toolbar");
      form.noValidate = true;
      var f = el("div", "field");
      var l = el("label", null, "Model");
      l.htmlFor = "events-model";
      ui.model = el("input");
      ui.model.type = "text";
      ui.model.id = "events-model";
      ui.model.placeholder = "every model";
      ui.model.autocomplete = "off";
      ui.model.spellcheck = false;
      f.appendChild(l);
      f.appendChild(ui.model);
      form.appendChild(f);
      var go = el("button", "btn", "Filter");
      go.type = "submit";
      form.appendChild(go);
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        TV.go("events", [], { model: ui.model.value.trim() });
      });
      p.appendChild(form);
      ui.wrap = el("div", "table-wrap");
      ui.wrap.id = "events-table";
      p.appendChild(ui.wrap);
      ui.empty = el("p", "muted", "no events");
      ui.empty.id = "events-empty";
      ui.empty.hidden = true;
      p.appendChild(ui.empty);
      ui.more = el("button", "btn", "Older events");
      ui.more.type = "button";
      ui.more.id = "events-older";
      ui.more.hidden = true;
      ui.more.addEventListener("click", older);
      p.appendChild(ui.more);
      sec.appendChild(p);
    },
    show: function () {
      var r = TV.route();
      var m = (r && r.query && r.query.model) || "";
      if (m !== filter) { filter = m; shown = []; next = null; }
      extra = false;
      ui.model.value = filter;
    },
    refresh: load,
    hide: function () { TV.setError(SRC, null); }
  });
})();
