/* tensorvault dashboard, the Models page: #models lists every model (its
 * active generation, aliases, generation count); #models/NAME shows one
 * model's generations (state, active and alias badges, sizes, shards with
 * their sha256 and replicas when expanded, and its sidecar files: path,
 * size, short sha256, a download link, config.json as a table of its
 * top-level keys, every value set with textContent; a model the daemon does not
 * have says so, with a link back) and its actions: activate,
 * retire, rollback, deactivate, point / remove an alias. Every action asks
 * for confirmation (TV.confirm), is sent with TV.send (token dialog, the
 * daemon's refusal in the error box) and the page is then re-read from the
 * API: nothing is shown before the daemon has said so. Built on app.js. */
"use strict";

(function () {
  var el = TV.el, fmtBytes = TV.fmtBytes, fmtTime = TV.fmtTime;
  var SRC_LOAD = "models", SRC_ACT = "models action";
  var GEN_COLS = [["Generation"], ["State"], ["Size", "num"], ["Tensors", "num"], ["Shards", "num"], ["Source"],
                  ["Created"], ["Actions"]];
  var LIST_COLS = [["Model"], ["Active"], ["Aliases"], ["Generations", "num"], ["Created"]];

  var sec = null;
  var view = {};      // DOM built once in init
  var mode = null;    // "list" | "model"
  var name = null;    // the model shown (mode "model")
  var model = null;   // GET /v1/models/NAME
  var missing = false; // the daemon said 404 to it
  var gens = [];      // its generations, newest first
  var details = {};   // generation -> GenerationDetail (the shards), when expanded
  var expanded = {};  // generation -> true
  var models = [];    // the list (mode "list")
  var inflight = false;
  var lastSig = null; // what the current DOM shows (skip identical re-renders)
  var loadSeq = 0;    // a reload started later wins

  function mpath(n) { return "/v1/models/" + TV.seg(n); }
  function gpath(n, g) { return mpath(n) + "/generations/" + TV.seg(String(g)); }

  function badge(cls, text, title) {
    var b = el("span", "badge " + cls, text);
    if (title) b.title = title;
    return b;
  }

  function aliasPairs(m) {
    var a = (m && m.aliases) || {};
    return Object.keys(a).sort().map(function (k) { return [k, a[k]]; });
  }

  /* A focusable control keyed for focus restoration across re-renders. */
  function button(text, key, cls) {
    var b = el("button", "btn small-btn" + (cls ? " " + cls : ""), text);
    b.type = "button";
    b.dataset.key = key;
    b.dataset.action = "1";
    b.disabled = inflight;
    return b;
  }

  function focusedKey() {
    var a = document.activeElement;
    return a && sec.contains(a) && a.dataset ? a.dataset.key || null : null;
  }

  function restoreFocus(key) {
    if (!key) return;
    var e = sec.querySelector('[data-key="' + key.replace(/["\\]/g, "\\$&") + '"]');
    if (e && !e.disabled) e.focus();
  }

  function setInflight(on) {
    inflight = on;
    Array.prototype.forEach.call(sec.querySelectorAll("[data-action]"), function (b) {
      b.disabled = on || b.dataset.off === "1";
    });
    sec.dataset.busy = on ? "1" : "0";
  }

  /* -- DOM built once ----------------------------------------------------- */
  function buildList() {
    var p = el("section", "panel");
    p.setAttribute("aria-labelledby", "models-list-h");
    p.appendChild(el("h2", null, "Models")).id = "models-list-h";
    var bar = el("div", "toolbar");
    var f = el("div", "field");
    var lab = el("label", null, "Filter by name");
    lab.htmlFor = "models-filter";
    var inp = el("input");
    inp.type = "search";
    inp.id = "models-filter";
    inp.autocomplete = "off";
    inp.spellcheck = false;
    inp.addEventListener("input", function () { renderList(true); });
    f.appendChild(lab);
    f.appendChild(inp);
    bar.appendChild(f);
    var count = el("span", "muted small");
    count.id = "models-count";
    bar.appendChild(count);
    p.appendChild(bar);
    var wrap = el("div", "table-wrap");
    var t = el("table");
    t.id = "models-table";
    var cap = el("caption", "sr-only", "Every model in the registry");
    t.appendChild(cap);
    var head = el("thead");
    var hr = el("tr");
    LIST_COLS.forEach(function (h) {
      var th = el("th", h[1] || null, h[0]);
      th.scope = "col";
      hr.appendChild(th);
    });
    head.appendChild(hr);
    t.appendChild(head);
    view.listBody = el("tbody");
    t.appendChild(view.listBody);
    wrap.appendChild(t);
    p.appendChild(wrap);
    view.listEmpty = el("p", "muted", "");
    view.listEmpty.id = "models-empty";
    view.listEmpty.hidden = true;
    p.appendChild(view.listEmpty);
    view.filter = inp;
    view.count = count;
    view.list = p;
    return p;
  }

  function buildModel() {
    var box = el("div", "model-view");
    var head = el("section", "panel");
    head.setAttribute("aria-labelledby", "model-h");
    var back = el("a", "back", "\u2190 all models");
    back.href = TV.href("models");
    head.appendChild(back);
    var h = el("h2", "model-title");
    h.id = "model-h";
    head.appendChild(h);
    var facts = el("p", "muted model-facts");
    facts.id = "model-facts";
    head.appendChild(facts);
    var acts = el("div", "model-actions toolbar");
    acts.id = "model-actions";
    head.appendChild(acts);
    box.appendChild(head);

    var ap = el("section", "panel");
    ap.setAttribute("aria-labelledby", "aliases-h");
    ap.appendChild(el("h2", null, "Aliases")).id = "aliases-h";
    var alist = el("ul", "alias-list");
    alist.id = "alias-list";
    ap.appendChild(alist);
    var form = el("form", "toolbar alias-form");
    form.id = "alias-form";
    form.noValidate = true;
    var f1 = el("div", "field");
    var l1 = el("label", null, "Alias name");
    l1.htmlFor = "alias-name";
    var in1 = el("input");
    in1.type = "text";
    in1.id = "alias-name";
    in1.dataset.key = "alias-name";
    in1.autocomplete = "off";
    in1.spellcheck = false;
    in1.maxLength = 64;
    in1.placeholder = "prod";
    f1.appendChild(l1);
    f1.appendChild(in1);
    var f2 = el("div", "field");
    var l2 = el("label", null, "Generation");
    l2.htmlFor = "alias-gen";
    var sel = el("select");
    sel.id = "alias-gen";
    f2.appendChild(l2);
    f2.appendChild(sel);
    var go = el("button", "btn primary", "Point alias");
    go.type = "submit";
    go.id = "alias-set";
    go.dataset.action = "1";
    form.appendChild(f1);
    form.appendChild(f2);
    form.appendChild(go);
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      pointAlias(in1.value.trim(), sel.value);
    });
    ap.appendChild(form);
    var hint = el("p", "muted small", "An alias names a ready generation (letters, digits, . _ -; starts with a letter). Pointing an existing alias moves it.");
    ap.appendChild(hint);
    box.appendChild(ap);

    var gp = el("section", "panel");
    gp.setAttribute("aria-labelledby", "gens-h");
    gp.appendChild(el("h2", null, "Generations")).id = "gens-h";
    var wrap = el("div", "table-wrap");
    var t = el("table", "gens");
    t.id = "gens-table";
    var head2 = el("thead");
    var hr = el("tr");
    GEN_COLS.forEach(function (c) {
      var th = el("th", c[1] || null, c[0]);
      th.scope = "col";
      hr.appendChild(th);
    });
    head2.appendChild(hr);
    t.appendChild(head2);
    view.gensBody = el("tbody");
    t.appendChild(view.gensBody);
    wrap.appendChild(t);
    gp.appendChild(wrap);
    view.gensEmpty = el("p", "muted", "no generations");
    view.gensEmpty.hidden = true;
    gp.appendChild(view.gensEmpty);
    box.appendChild(gp);

    view.title = h;
    view.facts = facts;
    view.actions = acts;
    view.aliasList = alist;
    view.aliasName = in1;
    view.aliasGen = sel;
    view.aliasSet = go;
    view.model = box;
    view.aliasPanel = ap;
    view.gensPanel = gp;
    view.missing = el("p", "missing-model", "");
    view.missing.id = "model-missing";
    view.missing.hidden = true;
    head.appendChild(view.missing);
    return box;
  }

  /* -- list ---------------------------------------------------------------- */
  function renderList(force) {
    var q = view.filter.value.trim().toLowerCase();
    var shown = models.filter(function (m) { return !q || m.name.toLowerCase().indexOf(q) >= 0; });
    var sig = JSON.stringify(["list", q, shown]);
    if (!force && sig === lastSig) return;
    lastSig = sig;
    var body = TV.clear(view.listBody);
    shown.forEach(function (m) {
      var tr = el("tr");
      tr.dataset.model = m.name;
      var td = el("td", "name");
      var a = el("a", null, m.name);
      a.href = TV.href("models", [m.name]);
      td.appendChild(a);
      tr.appendChild(td);
      td = el("td", "active-gen");
      if (m.active_generation !== null && m.active_generation !== undefined) {
        td.appendChild(badge("active", String(m.active_generation), "active generation " + m.active_generation));
      } else {
        td.appendChild(el("span", "muted", "none"));
      }
      tr.appendChild(td);
      td = el("td", "aliases");
      aliasPairs(m).forEach(function (p) {
        td.appendChild(badge("alias", p[0] + "\u2192" + p[1], "alias " + p[0] + " is generation " + p[1]));
      });
      if (!td.firstChild) td.appendChild(el("span", "muted", "none"));
      tr.appendChild(td);
      tr.appendChild(el("td", "num n-gens", String(m.n_generations)));
      tr.appendChild(el("td", "created", fmtTime(m.created_at)));
      Array.prototype.forEach.call(tr.children, function (c, i) { c.dataset.label = LIST_COLS[i][0]; });
      body.appendChild(tr);
    });
    view.count.textContent = models.length === shown.length ? models.length + " models"
      : shown.length + " of " + models.length + " models";
    view.listEmpty.hidden = shown.length !== 0;
    view.listEmpty.textContent = models.length === 0 ? "no models yet: import a checkpoint (Imports page or `tensorvault import`)"
      : "no model name contains \u201c" + view.filter.value.trim() + "\u201d";
  }

  function loadList() {
    var seq = ++loadSeq;
    return TV.track(SRC_LOAD, TV.getAll("/v1/models", "models")).then(function (list) {
      if (seq !== loadSeq || mode !== "list") return;
      if (list) { models = list; renderList(false); }
    });
  }

  /* -- one model ----------------------------------------------------------- */
  function readyBelow(g) {
    var best = null;
    gens.forEach(function (x) {
      if (x.state === "ready" && x.generation < g && (best === null || x.generation > best)) best = x.generation;
    });
    return best;
  }

  function renderModel(force) {
    var sig = JSON.stringify(["model", name, model, missing, gens, details, expanded]);
    if (!force && sig === lastSig) return;
    lastSig = sig;
    var key = focusedKey();
    view.title.textContent = "";
    view.title.appendChild(document.createTextNode("Model "));
    view.title.appendChild(el("span", "mono model-name", name));
    view.aliasPanel.hidden = view.gensPanel.hidden = !model;
    if (!model) {
      // Nothing to act on: no alias form, no empty table; a way back.
      view.facts.textContent = "";
      TV.clear(view.actions);
      TV.clear(view.aliasList);
      TV.clear(view.gensBody);
      view.missing.hidden = false;
      view.missing.dataset.reason = missing ? "not-found" : "unreadable";
      TV.clear(view.missing).appendChild(document.createTextNode(missing
        ? "No such model: the registry has no model named \u201c" + name + "\u201d. "
        : "Model \u201c" + name + "\u201d could not be read (see the error above). "));
      var back = el("a", "missing-back", "See every model on the models list");
      back.href = TV.href("models");
      view.missing.appendChild(back);
      return;
    }
    view.missing.hidden = true;
    var act = model.active_generation;
    view.facts.textContent = "";
    view.facts.appendChild(document.createTextNode("active generation: "));
    if (act !== null && act !== undefined) view.facts.appendChild(badge("active", String(act)));
    else view.facts.appendChild(document.createTextNode("none"));
    view.facts.appendChild(document.createTextNode(" \u00b7 " + model.n_generations + " generations \u00b7 created " +
                                                   fmtTime(model.created_at)));
    view.facts.dataset.active = act === null || act === undefined ? "" : String(act);

    // Model-level actions.
    TV.clear(view.actions);
    if (act !== null && act !== undefined) {
      var target = readyBelow(act);
      var rb = button("Rollback", "rollback");
      rb.id = "rollback-btn";
      rb.title = target ? "activate generation " + target + " (the highest ready generation below " + act + ")"
        : "no ready generation below " + act;
      rb.addEventListener("click", function () { rollback(act, target); });
      view.actions.appendChild(rb);
      var da = button("Deactivate", "deactivate");
      da.id = "deactivate-btn";
      da.title = "clear the active generation (readers of " + name + " get 404)";
      da.addEventListener("click", function () { deactivate(act); });
      view.actions.appendChild(da);
    }

    // Aliases.
    TV.clear(view.aliasList);
    var pairs = aliasPairs(model);
    if (pairs.length === 0) view.aliasList.appendChild(el("li", "muted", "no aliases"));
    pairs.forEach(function (p) {
      var li = el("li");
      li.dataset.alias = p[0];
      li.dataset.generation = String(p[1]);
      li.appendChild(badge("alias", p[0] + "\u2192" + p[1]));
      var rm = button("remove", "alias-rm:" + p[0], "link-btn");
      rm.setAttribute("aria-label", "remove alias " + p[0]);
      rm.addEventListener("click", function () { removeAlias(p[0], p[1]); });
      li.appendChild(rm);
      view.aliasList.appendChild(li);
    });
    // The generation select: ready generations; keeps the user's choice.
    var sel = view.aliasGen, keep = sel.value;
    var ready = gens.filter(function (g) { return g.state === "ready"; }).map(function (g) { return String(g.generation); });
    var have = Array.prototype.map.call(sel.options, function (o) { return o.value; });
    if (JSON.stringify(have) !== JSON.stringify(ready)) {
      TV.clear(sel);
      ready.forEach(function (g) {
        var o = el("option", null, g + (String(act) === g ? " (active)" : ""));
        o.value = g;
        sel.appendChild(o);
      });
      if (ready.indexOf(keep) >= 0) sel.value = keep;
    }
    view.aliasSet.dataset.off = ready.length ? "0" : "1";
    view.aliasSet.disabled = inflight || !ready.length;

    // Generations, newest first.
    var body = TV.clear(view.gensBody);
    view.gensEmpty.hidden = gens.length !== 0;
    gens.forEach(function (g) { renderGen(body, g); });
    restoreFocus(key);
  }

  function renderGen(body, g) {
    var n = g.generation, tr = el("tr", "gen");
    tr.dataset.gen = String(n);
    tr.dataset.state = g.state;
    tr.dataset.active = g.active ? "1" : "0";
    var td = el("td", "gen-no");
    var ex = button((expanded[n] ? "\u25be " : "\u25b8 ") + n, "expand:" + n, "expand link-btn");
    delete ex.dataset.action; // expanding is not a change: never disabled
    ex.disabled = false;
    ex.setAttribute("aria-expanded", expanded[n] ? "true" : "false");
    ex.setAttribute("aria-controls", "shards-" + n);
    ex.setAttribute("aria-label", (expanded[n] ? "hide" : "show") + " the shards of generation " + n);
    ex.addEventListener("click", function () { toggle(n); });
    td.appendChild(ex);
    tr.appendChild(td);
    td = el("td", "badges");
    td.appendChild(badge(g.state, g.state));
    if (g.active) td.appendChild(badge("active", "active"));
    (g.aliases || []).forEach(function (a) { td.appendChild(badge("alias", a)); });
    tr.appendChild(td);
    td = el("td", "num size", fmtBytes(g.total_bytes));
    td.title = g.total_bytes + " bytes";
    td.dataset.bytes = String(g.total_bytes);
    tr.appendChild(td);
    tr.appendChild(el("td", "num n-tensors", String(g.n_tensors)));
    tr.appendChild(el("td", "num n-shards", String(g.n_shards)));
    td = el("td", "src mono", g.source === null || g.source === undefined ? "\u2013" : g.source);
    if (g.source) td.title = g.source;
    tr.appendChild(td);
    tr.appendChild(el("td", "created", fmtTime(g.created_at)));
    td = el("td", "gen-actions");
    var cell = el("div", "actions-cell");
    td.appendChild(cell);
    if (g.state === "ready" && !g.active) {
      var a = button("Activate", "activate:" + n, "primary");
      a.setAttribute("aria-label", "activate generation " + n);
      a.addEventListener("click", function () { activate(n); });
      cell.appendChild(a);
    }
    if (g.state === "ready") {
      var r = button("Retire", "retire:" + n);
      r.setAttribute("aria-label", "retire generation " + n);
      if ((g.aliases || []).length) {
        // The daemon refuses it (409): not offered, and the title says why.
        r.dataset.off = "1";
        r.disabled = true;
        r.title = "aliases point at generation " + n + " (" + g.aliases.join(", ") +
          "): it can't be retired until they move to another generation or are removed";
      } else if (g.active) {
        r.title = "the daemon refuses to retire the active generation (activate another one first)";
      }
      r.addEventListener("click", function () { retire(g); });
      cell.appendChild(r);
    }
    if (g.state !== "retired") {
      var l = el("a", "tensors-link", "tensors");
      l.href = TV.href("tensors", [name, String(n)]);
      l.dataset.key = "tensors:" + n;
      l.setAttribute("aria-label", "tensors of generation " + n);
      cell.appendChild(l);
    }
    tr.appendChild(td);
    Array.prototype.forEach.call(tr.children, function (c, i) { c.dataset.label = GEN_COLS[i][0]; });
    body.appendChild(tr);

    if (!expanded[n]) return;
    var sr = el("tr", "shards-row");
    sr.id = "shards-" + n;
    sr.dataset.gen = String(n);
    cell = el("td");
    cell.colSpan = 8;
    var d = details[n];
    if (!d) {
      cell.appendChild(el("p", "muted", "loading the shards\u2026"));
    } else if (!d.shards.length) {
      cell.appendChild(el("p", "muted", "no shards"));
    } else {
      var list = el("ul", "shards");
      d.shards.forEach(function (s) {
        var li = el("li", "shard");
        li.dataset.name = s.name;
        li.dataset.sha256 = s.sha256;
        li.dataset.fileBytes = String(s.file_bytes);
        var top = el("div", "shard-head");
        top.appendChild(el("span", "mono shard-name", s.name));
        var b = el("span", "muted shard-bytes", fmtBytes(s.file_bytes) + " (" + s.file_bytes + " bytes)");
        top.appendChild(b);
        li.appendChild(top);
        var dl = el("dl", "shard-facts");
        dl.appendChild(el("dt", null, "sha256"));
        dl.appendChild(el("dd", "mono sha256", s.sha256));
        dl.appendChild(el("dt", null, "replicas"));
        var rd = el("dd", "replicas");
        if (!s.replicas.length) rd.textContent = "none";
        s.replicas.forEach(function (rp) {
          var x = el("span", "replica mono", "device " + rp.device_id + " @ " + rp.device_offset);
          x.dataset.deviceId = String(rp.device_id);
          x.dataset.deviceOffset = String(rp.device_offset);
          x.title = "object " + rp.object_id + ", device offset " + rp.device_offset + " bytes";
          rd.appendChild(x);
        });
        dl.appendChild(rd);
        li.appendChild(dl);
        list.appendChild(li);
      });
      cell.appendChild(list);
    }
    if (d) renderFiles(cell, name, d);
    sr.appendChild(cell);
    body.appendChild(sr);
  }

  /* -- sidecar files ------------------------------------------------------- */

  function filePath(n, g, p) {
    return gpath(n, g) + "/files/" + TV.seg(p); // its "/"s as %2F: any depth
  }

  /* The files of generation g and, when it has one, config.json's text
   * (null files: the daemon has no files route). */
  function loadFiles(n, g) {
    return TV.get(gpath(n, g) + "/files").then(function (doc) {
      var files = (doc && doc.files) || [];
      var has = files.some(function (f) { return f.path === "config.json"; });
      if (!has) return { files: files, config: null };
      return TV.get(filePath(n, g, "config.json"), true).then(function (t) {
        return { files: files, config: t };
      }, function () { return { files: files, config: null }; });
    }, function () { return { files: null, config: null }; });
  }

  /* config.json: its top-level keys, scalars as they are, the rest as
   * pretty-printed JSON; text that is no JSON object as it is. */
  function renderConfig(box, text) {
    var obj = null;
    try { obj = JSON.parse(text); } catch (e) { obj = null; }
    if (!obj || typeof obj !== "object" || Array.isArray(obj)) {
      box.appendChild(el("pre", "config-raw mono", text));
      return;
    }
    var t = el("table", "config");
    Object.keys(obj).forEach(function (k) {
      var v = obj[k], tr = el("tr");
      tr.dataset.key = k;
      tr.appendChild(el("th", "mono", k));
      var td = el("td", "mono");
      if (v !== null && typeof v === "object") td.appendChild(el("pre", null, JSON.stringify(v, null, 2)));
      else td.textContent = typeof v === "string" ? v : String(v);
      tr.appendChild(td);
      t.appendChild(tr);
    });
    box.appendChild(t);
  }

  function renderFiles(cell, model, d) {
    var box = el("div", "gen-files");
    box.appendChild(el("h4", null, "Files"));
    if (!d.files) {
      box.appendChild(el("p", "muted", "this daemon lists no files"));
    } else if (!d.files.length) {
      box.appendChild(el("p", "muted", "no sidecar files (config, tokenizer, ...) were imported with this generation"));
    } else {
      var t = el("table", "files");
      var hr = el("tr");
      ["Path", "Size", "SHA-256", ""].forEach(function (h) { hr.appendChild(el("th", null, h)); });
      t.appendChild(hr);
      d.files.forEach(function (f) {
        var tr = el("tr", "file");
        tr.dataset.path = f.path;
        tr.appendChild(el("td", "mono file-path", f.path));
        var sz = el("td", "num", fmtBytes(f.size));
        sz.title = f.size + " bytes";
        tr.appendChild(sz);
        var sh = el("td", "mono sha256", String(f.sha256).slice(0, 12));
        sh.title = f.sha256;
        tr.appendChild(sh);
        var a = el("a", "download", "download");
        a.href = filePath(model, d.generation, f.path);
        a.setAttribute("download", f.path.split("/").pop());
        var td = el("td");
        td.appendChild(a);
        tr.appendChild(td);
        t.appendChild(tr);
      });
      box.appendChild(t);
    }
    if (d.config !== null && d.config !== undefined) {
      box.appendChild(el("h4", null, "config.json"));
      renderConfig(box, d.config);
    }
    cell.appendChild(box);
  }

  function loadModel() {
    var seq = ++loadSeq, n = name;
    var nf = false;
    var p = Promise.all([TV.get(mpath(n)), TV.getAll(mpath(n) + "/generations", "generations")])
      .then(null, function (e) { nf = e.status === 404; throw e; });
    return TV.track(SRC_LOAD, p).then(function (r) {
      if (seq !== loadSeq || mode !== "model" || n !== name) return null;
      missing = nf;
      if (!r) {
        model = null;
        gens = [];
        renderModel(false);
        return null;
      }
      model = r[0];
      gens = r[1].slice().sort(function (a, b) { return b.generation - a.generation; });
      var byGen = {};
      gens.forEach(function (g) { byGen[g.generation] = g; });
      var want = Object.keys(expanded).filter(function (g) {
        // Shards change only with the state (a retired one is freed).
        return byGen[g] && !(details[g] && details[g].state === byGen[g].state);
      });
      return Promise.all(want.map(function (g) {
        return TV.track(SRC_LOAD, TV.get(gpath(n, g))).then(function (d) {
          if (!d) return null;
          return loadFiles(n, g).then(function (f) {
            d.files = f.files;
            d.config = f.config;
            details[g] = d;
          });
        });
      })).then(function () {
        if (seq === loadSeq && mode === "model" && n === name) renderModel(false);
      });
    });
  }

  function toggle(n) {
    if (expanded[n]) delete expanded[n]; else expanded[n] = true;
    renderModel(false);
    restoreFocus("expand:" + n);
    if (expanded[n] && !details[n]) return loadModel();
    return null;
  }

  /* -- actions ------------------------------------------------------------- */
  /* confirm -> TV.send -> notify -> re-read from the API (also on failure:
   * the page shows what the daemon has, never what was hoped for). */
  function act(opts, method, path, body, done, focusKey) {
    if (inflight) return Promise.resolve(false);
    return TV.confirm(opts).then(function (yes) {
      if (!yes) return false;
      setInflight(true);
      return TV.send(method, path, body, SRC_ACT).then(function (v) {
        TV.notify(done(v));
        return true;
      }, function () { return false; }).then(function (ok) {
        setInflight(false);
        // Re-read what the page shows now (the route may have changed
        // while the confirmation was open).
        return Promise.resolve(mode === "model" ? loadModel() : loadList()).then(function () {
          // The button pressed may be gone (or was disabled): keep the
          // keyboard user near where they were.
          var a = document.activeElement;
          if (!a || a === document.body || !sec.contains(a)) restoreFocus(focusKey);
          return ok;
        });
      });
    });
  }

  function activate(n) {
    var m = name; // the model the confirmation names, even if the page moves on
    var cur = model.active_generation;
    return act({
      title: "Activate generation " + n + "?",
      message: "Model " + m + ": the active generation moves from " + (cur === null ? "none" : cur) + " to " + n +
        ". Readers of \u201c" + m + "\u201d get generation " + n + " from now on.",
      ok: "Activate " + n
    }, "POST", gpath(m, n) + "/activate", null, function () {
      return m + ": generation " + n + " is active (was " + (cur === null ? "none" : cur) + ")";
    }, "expand:" + n);
  }

  function retire(g) {
    var m = name; // the model the confirmation names, even if the page moves on
    var n = g.generation, why = "";
    if (g.active) why = " It is the active generation: the daemon will refuse (activate another one first).";
    else if ((g.aliases || []).length) why = " Aliases point at it (" + g.aliases.join(", ") + "): the daemon will refuse (move or remove them first).";
    return act({
      title: "Retire generation " + n + "?",
      message: "Model " + m + ": generation " + n + " is retired and its storage freed; it can no longer be read or activated." + why,
      ok: "Retire " + n,
      danger: true
    }, "POST", gpath(m, n) + "/retire", null, function () {
      return m + ": generation " + n + " is retired";
    }, "expand:" + n);
  }

  function rollback(cur, target) {
    var m = name; // the model the confirmation names, even if the page moves on
    return act({
      title: "Roll back " + m + "?",
      message: target ? "Model " + m + ": the active generation moves from " + cur + " to " + target +
        " (the highest ready generation below " + cur + ")."
        : "Model " + m + ": there is no ready generation below " + cur + ", the daemon will refuse.",
      ok: "Roll back"
    }, "POST", mpath(m) + "/rollback", null, function (v) {
      return m + ": rolled back, generation " + (v && v.generation) + " is active (was " + cur + ")";
    }, "rollback");
  }

  function deactivate(cur) {
    var m = name; // the model the confirmation names, even if the page moves on
    return act({
      title: "Deactivate " + m + "?",
      message: "Model " + m + ": generation " + cur + " is no longer active; readers of \u201c" + m +
        "\u201d get 404 until a generation is activated (NAME@GEN and aliases still open).",
      ok: "Deactivate",
      danger: true
    }, "POST", mpath(m) + "/deactivate", null, function () {
      return m + ": no active generation (was " + cur + ")";
    }, "alias-name");
  }

  function pointAlias(alias, gen) {
    var m = name; // the model the confirmation names, even if the page moves on
    if (!alias) {
      TV.setError(SRC_ACT, "Point alias: enter an alias name");
      view.aliasName.focus();
      return Promise.resolve(false);
    }
    if (!/^[A-Za-z][A-Za-z0-9._-]{0,63}$/.test(alias)) {
      TV.setError(SRC_ACT, "Point alias: \u201c" + alias + "\u201d is not an alias name (a letter, then up to 63 letters, digits, . _ -)");
      view.aliasName.focus();
      return Promise.resolve(false);
    }
    if (!gen) {
      TV.setError(SRC_ACT, "Point alias: there is no ready generation to point at");
      return Promise.resolve(false);
    }
    TV.setError(SRC_ACT, null);
    var g = Number(gen), prev = model.aliases ? model.aliases[alias] : undefined;
    var msg = alias === "active"
      ? "Model " + m + ": \u201cactive\u201d is the active generation: it moves from " + model.active_generation + " to " + g + "."
      : prev !== undefined
        ? "Model " + m + ": alias " + alias + " moves from " + prev + " to " + g + "."
        : "Model " + m + ": a new alias " + alias + " names generation " + g + ".";
    return act({ title: "Point alias " + alias + " at generation " + g + "?", message: msg, ok: "Point alias" },
               "PUT", mpath(m) + "/aliases/" + TV.seg(alias), { generation: g }, function () {
                 return m + ": alias " + alias + " \u2192 generation " + g +
                   (prev !== undefined && prev !== g ? " (was " + prev + ")" : "");
               }, "alias-name").then(function (ok) {
      if (ok) view.aliasName.value = "";
      return ok;
    });
  }

  function removeAlias(alias, gen) {
    var m = name; // the model the confirmation names, even if the page moves on
    return act({
      title: "Remove alias " + alias + "?",
      message: "Model " + m + ": alias " + alias + " (generation " + gen + ") is removed; readers of " + m + "@" + alias +
        " get 404. Generation " + gen + " itself stays.",
      ok: "Remove alias",
      danger: true
    }, "DELETE", mpath(m) + "/aliases/" + TV.seg(alias), null, function () {
      return m + ": alias " + alias + " removed (was generation " + gen + ")";
    }, "alias-name");
  }

  /* -- page object --------------------------------------------------------- */
  TV.register("models", {
    init: function (s) {
      sec = s;
      sec.appendChild(buildList());
      sec.appendChild(buildModel());
      view.list.hidden = true;
      view.model.hidden = true;
    },
    show: function (args) {
      var n = args && args.length ? args[0] : null;
      var newMode = n === null ? "list" : "model";
      if (newMode !== mode || n !== name) {
        lastSig = null;
        if (n !== name) { model = null; missing = false; gens = []; details = {}; expanded = {}; }
      }
      mode = newMode;
      name = n;
      view.list.hidden = mode !== "list";
      view.model.hidden = mode !== "model";
      sec.dataset.view = mode;
      if (mode === "model") {
        TV.clear(view.title).appendChild(document.createTextNode("Model "));
        view.title.appendChild(el("span", "mono model-name", name));
      }
    },
    refresh: function () {
      if (inflight) return null; // the action re-reads when it is done
      return mode === "model" ? loadModel() : loadList();
    },
    hide: function () {
      TV.setError(SRC_LOAD, null);
    }
  });
})();
