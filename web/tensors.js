/* tensorvault dashboard, the Tensors page: one generation's tensors,
 * searched by a part of the name (anywhere in it, case-sensitive) and
 * sorted by the daemon (GET .../tensors?contains=&order=file|name|size,
 * pages of PAGE rows through next_cursor, so a
 * generation of 120,000 tensors costs one page at a time and the table
 * holds only the pages loaded), with each tensor's file and device offsets
 * computed from the generation's shards (file offset = 8 + header_bytes +
 * data_offsets[0]; device offset = a replica's device_offset + file
 * offset), and one tensor's detail with a download link to its bytes.
 *
 * Routes: #tensors (pick a model and generation), #tensors/MODEL/GEN
 * ?contains=S&order=file|name|size (the list; an older link's ?prefix=P
 * is searched the same way), #tensors/MODEL/GEN/TENSOR (the detail; its
 * query is the list's, for the way back). The search box's placeholder is
 * a part of the generation's own first tensor name. The search box
 * and the sort controls put their query into the hash with
 * history.replaceState (no hashchange, so the box is never rebuilt while
 * the user types). Generations are immutable: refresh does nothing. */
"use strict";

(function () {
  var PAGE = 200, DEBOUNCE_MS = 150, SRC = "tensors", PLACEHOLDER = "part of a name";
  var ORDERS = { file: "file offset", name: "name", size: "size, largest first" };
  var COLS = [
    { key: "name", label: "Name", order: "name" },
    { key: "dtype", label: "Dtype" },
    { key: "shape", label: "Shape" },
    { key: "bytes", label: "Bytes", order: "size", num: true },
    { key: "shard", label: "Shard" },
    { key: "offset", label: "Offset", num: true, title: "data_offsets[0]: from the start of the shard's data section" },
    { key: "file_offset", label: "File offset", order: "file", num: true, title: "8 + header bytes + offset: from the start of the shard file" },
    { key: "device_offset", label: "Device offset", num: true, title: "the replica's device offset + file offset" }
  ];
  var el = TV.el, seg = TV.seg;
  var ui = {};
  var view = null; // the list: {model, gen, text, order, genDoc, cursor, rows}
  var seq = 0;     // bumped by every new listing; an older listing's answer is dropped
  var dseq = 0;    // the same for the detail
  var typing = null;

  function genPath(m, g) { return "/v1/models/" + seg(m) + "/generations/" + seg(g); }
  function tensorPath(m, g, t) { return genPath(m, g) + "/tensors/" + seg(t); }
  function orderOf(q) { return q && ORDERS.hasOwnProperty(q.order) ? q.order : "file"; }
  function listQuery(text, order) { return { contains: text || "", order: order === "file" ? "" : order }; }
  function searchOf(q) { return (q && (q.contains || q.prefix)) || ""; }

  /* A search that finds something in this generation: its first tensor
   * name up to the second dot ("h.0." of "h.0.attn.c_attn.weight"), or
   * the whole name. */
  function hint(name) {
    var parts = name.split(".");
    return parts.length >= 3 ? parts.slice(0, 2).join(".") + "." : name;
  }
  function num(n) { return typeof n === "number" ? String(n) : "\u2013"; }

  function field(labelText, control) {
    var f = el("div", "field");
    var l = el("label", null, labelText);
    l.htmlFor = control.id;
    f.appendChild(l);
    f.appendChild(control);
    return f;
  }

  /* The API's error, in the error box (TV.track: with the shell's hint on
   * a 401) and above the table. */
  function failed(e) {
    TV.track(SRC, Promise.reject(e));
    ui.problem.textContent = e && e.message ? e.message : String(e);
    ui.problem.hidden = false;
  }

  function ok() {
    TV.setError(SRC, null);
    ui.problem.hidden = true;
    ui.problem.textContent = "";
  }

  /* -- the model and generation picker --------------------------------- */
  var models = [];

  function option(value, text) {
    var o = el("option", null, text);
    o.value = value;
    return o;
  }

  function genLabel(g) {
    var tags = [g.state];
    if (g.active) tags.push("active");
    (g.aliases || []).forEach(function (a) { tags.push(a); });
    return g.generation + " (" + tags.join(", ") + ")";
  }

  /* Fills the generation select for model m, choosing spec (a number, an
   * alias or "active") or else the active generation, else the newest. */
  function fillGens(m, spec) {
    var sel = ui.gen;
    TV.clear(sel);
    sel.disabled = true;
    ui.go.disabled = true;
    if (!m) return Promise.resolve();
    var model = models.filter(function (x) { return x.name === m; })[0] || null;
    return TV.getAll("/v1/models/" + seg(m) + "/generations", "generations").then(function (gens) {
      if (ui.model.value !== m) return; // the model changed meanwhile
      TV.clear(sel);
      var want = spec;
      if (model && spec === "active") want = model.active_generation;
      else if (model && spec && model.aliases && model.aliases.hasOwnProperty(spec)) want = model.aliases[spec];
      if (want === undefined || want === null || want === "") {
        want = model && model.active_generation ? model.active_generation : (gens.length ? gens[gens.length - 1].generation : "");
      }
      gens.forEach(function (g) { sel.appendChild(option(String(g.generation), genLabel(g))); });
      if (want !== "" && !gens.some(function (g) { return String(g.generation) === String(want); })) {
        sel.appendChild(option(String(want), String(want)));
      }
      sel.value = String(want);
      sel.disabled = gens.length === 0 && want === "";
      ui.go.disabled = sel.disabled;
    });
  }

  function fillPicker(m, g) {
    return TV.getAll("/v1/models", "models").then(function (all) {
      models = all;
      var sel = ui.model;
      TV.clear(sel);
      all.forEach(function (x) { sel.appendChild(option(x.name, x.name)); });
      if (m && !all.some(function (x) { return x.name === m; })) sel.appendChild(option(m, m));
      var pick = m || (all.length ? all[0].name : "");
      sel.value = pick;
      sel.disabled = !pick;
      ui.pickNote.hidden = all.length > 0;
      return fillGens(pick, g);
    });
  }

  /* -- the list --------------------------------------------------------- */
  function shardOf(doc, idx) {
    var s = doc && doc.shards ? doc.shards[idx] : null;
    return s && s.index === idx ? s : (doc && doc.shards ? doc.shards.filter(function (x) { return x.index === idx; })[0] : null);
  }

  function offsets(t) {
    var s = shardOf(view.genDoc, t.shard_index);
    if (!s) return { file: null, device: [] };
    var file = 8 + s.header_bytes + t.data_offsets[0];
    return { file: file, device: (s.replicas || []).map(function (r) { return { id: r.device_id, off: r.device_offset + file }; }) };
  }

  function cell(tr, col, text, value) {
    var td = el("td", col.num ? "num" : null, text);
    td.dataset.col = col.key;
    if (value !== undefined) td.dataset.value = String(value);
    tr.appendChild(td);
    return td;
  }

  function row(t) {
    var v = view, o = offsets(t);
    var tr = el("tr");
    tr.dataset.name = t.name;
    var name = el("td", "name");
    name.dataset.col = "name";
    name.dataset.value = t.name;
    var a = el("a", null, t.name);
    a.href = TV.href("tensors", [v.model, v.gen, t.name], listQuery(v.text, v.order));
    name.appendChild(a);
    tr.appendChild(name);
    cell(tr, COLS[1], t.dtype, t.dtype);
    cell(tr, COLS[2], "[" + t.shape.join(", ") + "]", JSON.stringify(t.shape));
    cell(tr, COLS[3], TV.fmtBytes(t.nbytes), t.nbytes).title = t.nbytes + " bytes";
    cell(tr, COLS[4], t.shard, t.shard);
    cell(tr, COLS[5], num(t.data_offsets[0]), t.data_offsets[0]);
    cell(tr, COLS[6], num(o.file), o.file === null ? "" : o.file);
    var dev = o.device.map(function (d) { return String(d.off); });
    cell(tr, COLS[7], o.device.length === 1 ? dev[0] : o.device.map(function (d) { return "dev " + d.id + ": " + d.off; }).join(", ") || "\u2013",
         dev.join(","));
    return tr;
  }

  function renderCount() {
    var v = view, c = ui.count, total = v.genDoc ? v.genDoc.n_tensors : null;
    c.dataset.rows = String(v.rows);
    c.dataset.more = v.cursor ? "1" : "0";
    var s = "showing " + v.rows.toLocaleString("en-US");
    if (v.cursor) s += v.text ? " (more\u2026)" : " of " + (total || 0).toLocaleString("en-US") + " (more\u2026)";
    else if (v.text) s += v.rows === 1 ? " tensor whose name contains \u201c" + v.text + "\u201d" :
      " tensors whose names contain \u201c" + v.text + "\u201d";
    else s += v.rows === 1 ? " tensor" : " tensors";
    c.textContent = s;
    ui.more.hidden = !v.cursor;
    ui.more.disabled = !!v.loading;
  }

  function renderSort(order) {
    ui.order.value = order;
    Array.prototype.forEach.call(ui.table.querySelectorAll("th"), function (th) {
      var o = th.dataset.order;
      if (!o) return;
      th.setAttribute("aria-sort", o === order ? (o === "size" ? "descending" : "ascending") : "none");
      th.querySelector(".arrow").textContent = o === order ? (o === "size" ? " \u25bc" : " \u25b2") : "";
    });
  }

  function renderGenInfo(doc) {
    ui.title.textContent = doc.model + " \u00b7 generation " + doc.generation;
    var info = TV.clear(ui.info);
    var b = el("span", "badge " + doc.state, doc.state);
    info.appendChild(b);
    if (doc.active) info.appendChild(el("span", "badge active", "active"));
    (doc.aliases || []).forEach(function (a) { info.appendChild(el("span", "badge alias", a)); });
    info.appendChild(document.createTextNode(doc.n_tensors.toLocaleString("en-US") + " tensors in " +
      doc.n_shards + (doc.n_shards === 1 ? " shard \u00b7 " : " shards \u00b7 ") + TV.fmtBytes(doc.total_bytes)));
    ui.stateNote.hidden = doc.state === "ready";
    ui.stateNote.textContent = doc.state === "retired" ?
      "This generation is retired: its bytes go once gc reclaims them (the data links then fail)." :
      "This generation is " + doc.state + ": it has no bytes to read.";
  }

  function replaceHash() {
    var v = view;
    try {
      history.replaceState(history.state, "", TV.href("tensors", [v.model, v.gen], listQuery(v.text, v.order)));
    } catch (e) { /* a sandboxed document: the hash simply stays */ }
  }

  /* reset: the first page of view's query (a new listing); else the next page. */
  function fetchPage(reset) {
    var v = view;
    if (!reset && (!v.cursor || v.loading)) return Promise.resolve();
    var my = reset ? ++seq : seq;
    var q = "?limit=" + PAGE + "&order=" + v.order;
    if (v.text) q += "&contains=" + encodeURIComponent(v.text);
    if (!reset) q += "&cursor=" + encodeURIComponent(v.cursor);
    v.loading = true;
    if (!reset) renderCount();
    ui.table.setAttribute("aria-busy", "true");
    return TV.get(genPath(v.model, v.gen) + "/tensors" + q).then(function (doc) {
      if (my !== seq || v !== view) return; // an older query's answer
      var body = ui.rows;
      if (reset) { TV.clear(body); v.rows = 0; }
      var frag = document.createDocumentFragment();
      (doc.tensors || []).forEach(function (t) { frag.appendChild(row(t)); });
      if (reset && !v.text && doc.tensors && doc.tensors.length) ui.search.placeholder = hint(doc.tensors[0].name);
      body.appendChild(frag);
      v.rows += (doc.tensors || []).length;
      v.cursor = doc.next_cursor || null;
      v.loading = false;
      ui.list.dataset.query = JSON.stringify([v.text, v.order]);
      ui.list.dataset.loaded = String(v.rows);
      renderCount();
      ok();
    }, function (e) {
      if (my !== seq || v !== view) return;
      v.loading = false;
      renderCount();
      failed(e);
    }).then(function () {
      if (my === seq) ui.table.removeAttribute("aria-busy");
    });
  }

  /* A new listing of the same generation (search or sort): the box's
   * text (typed or not yet debounced) in order. */
  function relist(order) {
    var v = view, text = ui.search.value;
    if (typing) { clearTimeout(typing); typing = null; }
    if (!v) return Promise.resolve();
    renderSort(order);
    if (!v.genDoc) { // the generation is still loading: showList lists this query
      v.text = text;
      v.order = order;
      replaceHash();
      return Promise.resolve();
    }
    view = { model: v.model, gen: v.gen, genDoc: v.genDoc, text: text, order: order, cursor: null, rows: 0 };
    replaceHash();
    return fetchPage(true);
  }

  function onInput() {
    seq++; // whatever is in flight answers an older query now
    if (typing) clearTimeout(typing);
    typing = setTimeout(function () {
      typing = null;
      relist(view ? view.order : "file");
    }, DEBOUNCE_MS);
  }

  function showList(m, g, text, order) {
    ui.list.hidden = false;
    ui.detail.hidden = true;
    if (ui.search.value !== text && !typing) ui.search.value = text;
    renderSort(order);
    var v = view;
    if (v && v.model === m && v.gen === g && v.genDoc && v.text === text && v.order === order && !v.loading) {
      return Promise.resolve(); // back from a detail: the loaded pages stay
    }
    var same = v && v.model === m && v.gen === g && v.genDoc;
    view = { model: m, gen: g, genDoc: same ? v.genDoc : null, text: text, order: order, cursor: null, rows: 0 };
    var mine = view;
    if (!same) {
      ui.search.placeholder = PLACEHOLDER;
      TV.clear(ui.rows);
      ui.title.textContent = m + " \u00b7 generation " + g;
      TV.clear(ui.info);
      ui.stateNote.hidden = true;
      ui.count.textContent = "";
      ui.more.hidden = true;
    }
    seq++;
    var doc = same ? Promise.resolve(v.genDoc) : TV.get(genPath(m, g));
    return doc.then(function (d) {
      if (mine !== view) return null; // another generation was asked for meanwhile
      mine.genDoc = d;
      renderGenInfo(d);
      return fetchPage(true);
    }, function (e) {
      if (mine !== view) return;
      TV.clear(ui.rows);
      ui.count.textContent = "";
      failed(e);
    });
  }

  /* -- the detail ------------------------------------------------------- */
  function fmtField(k, v) {
    if (k === "shape") return "[" + v.join(", ") + "]";
    if (k === "data_offsets") return "[" + v.join(", ") + ")";
    if (k === "nbytes") return v + " bytes (" + TV.fmtBytes(v) + ")";
    if (k === "replicas") return v.length + (v.length === 1 ? " replica" : " replicas");
    if (v !== null && typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function showDetail(m, g, t, query) {
    ui.list.hidden = true;
    ui.detail.hidden = false;
    ui.back.href = TV.href("tensors", [m, g], listQuery(searchOf(query), orderOf(query)));
    ui.dname.textContent = t;
    TV.clear(ui.fields);
    TV.clear(ui.reps);
    ui.download.hidden = true;
    delete ui.detail.dataset.name;
    var my = ++dseq, path = tensorPath(m, g, t);
    return TV.get(path).then(function (doc) {
      if (my !== dseq) return;
      ui.detail.dataset.name = doc.name;
      ui.dname.textContent = doc.name;
      Object.keys(doc).forEach(function (k) {
        var dt = el("dt", null, k), dd = el("dd", null, fmtField(k, doc[k]));
        dd.dataset.field = k;
        dd.dataset.json = JSON.stringify(doc[k]);
        ui.fields.appendChild(dt);
        ui.fields.appendChild(dd);
      });
      (doc.replicas || []).forEach(function (r) {
        var tr = el("tr");
        tr.appendChild(el("td", "num", String(r.device_id)));
        var off = el("td", "num", String(r.device_offset));
        off.dataset.value = String(r.device_offset);
        tr.appendChild(off);
        ui.reps.appendChild(tr);
      });
      if (!doc.replicas || !doc.replicas.length) {
        var none = el("tr");
        var td = el("td", "muted", "no replicas");
        td.colSpan = 2;
        none.appendChild(td);
        ui.reps.appendChild(none);
      }
      ui.download.href = path + "/data";
      ui.download.setAttribute("download", doc.name + ".bin");
      ui.download.textContent = "Download " + doc.name + ".bin (" + TV.fmtBytes(doc.nbytes) + ")";
      ui.download.hidden = false;
      ok();
    }, function (e) {
      if (my === dseq) failed(e);
    });
  }

  /* The download link works as a plain link where the daemon lets this
   * browser read without a token. With a token in the session, the bytes
   * are fetched with it and saved from a blob (the whole tensor in memory:
   * a link cannot carry an Authorization header). */
  function download(ev) {
    var tok = TV.token.get(), a = ui.download;
    if (!tok) return;
    ev.preventDefault();
    var path = a.getAttribute("href"), name = a.getAttribute("download");
    a.setAttribute("aria-busy", "true");
    TV.request("GET", path, null, { blob: true, token: tok })
      .then(function (blob) {
        var url = URL.createObjectURL(blob), tmp = el("a");
        tmp.href = url;
        tmp.download = name;
        tmp.hidden = true;
        document.body.appendChild(tmp);
        tmp.click();
        document.body.removeChild(tmp);
        setTimeout(function () { URL.revokeObjectURL(url); }, 60000);
        ok();
      }, function (e) {
        failed(e.message ? e : new Error("GET " + path + " failed: " + e));
      })
      .then(function () { a.removeAttribute("aria-busy"); });
  }

  /* -- the page --------------------------------------------------------- */
  function build(sec) {
    var pick = el("form", "panel");
    pick.id = "tensors-pick";
    pick.appendChild(el("h2", null, "Tensors"));
    var bar = el("div", "toolbar");
    ui.model = el("select");
    ui.model.id = "tensors-model";
    ui.gen = el("select");
    ui.gen.id = "tensors-gen";
    ui.go = el("button", "btn primary", "Show tensors");
    ui.go.type = "submit";
    ui.go.id = "tensors-go";
    bar.appendChild(field("Model", ui.model));
    bar.appendChild(field("Generation", ui.gen));
    bar.appendChild(ui.go);
    pick.appendChild(bar);
    ui.pickNote = el("p", "muted", "No models yet: import one on the Imports page.");
    ui.pickNote.hidden = true;
    pick.appendChild(ui.pickNote);
    ui.model.addEventListener("change", function () { track(fillGens(ui.model.value, null)); });
    pick.addEventListener("submit", function (ev) {
      ev.preventDefault();
      if (ui.model.value && ui.gen.value) TV.go("tensors", [ui.model.value, ui.gen.value]);
    });
    sec.appendChild(pick);

    ui.problem = el("p", "tensors-problem");
    ui.problem.id = "tensors-problem";
    ui.problem.setAttribute("role", "alert");
    ui.problem.hidden = true;
    sec.appendChild(ui.problem);

    var list = el("section", "panel");
    list.id = "tensors-list";
    list.setAttribute("aria-labelledby", "tensors-title");
    ui.list = list;
    ui.title = el("h2");
    ui.title.id = "tensors-title";
    list.appendChild(ui.title);
    ui.info = el("p", "muted gen-info");
    ui.info.id = "tensors-info";
    list.appendChild(ui.info);
    ui.stateNote = el("p", "state-note");
    ui.stateNote.id = "tensors-state-note";
    ui.stateNote.hidden = true;
    list.appendChild(ui.stateNote);
    var tools = el("div", "toolbar");
    ui.search = el("input");
    ui.search.type = "search";
    ui.search.id = "tensors-search";
    ui.search.autocomplete = "off";
    ui.search.spellcheck = false;
    ui.search.placeholder = PLACEHOLDER;
    ui.search.addEventListener("input", onInput);
    var sf = field("Name contains", ui.search);
    sf.classList.add("search-field");
    tools.appendChild(sf);
    ui.order = el("select");
    ui.order.id = "tensors-order";
    Object.keys(ORDERS).forEach(function (k) { ui.order.appendChild(option(k, ORDERS[k])); });
    ui.order.addEventListener("change", function () { relist(ui.order.value); });
    tools.appendChild(field("Sort by", ui.order));
    list.appendChild(tools);
    ui.count = el("p", "muted count");
    ui.count.id = "tensors-count";
    ui.count.setAttribute("role", "status");
    list.appendChild(ui.count);
    var wrap = el("div", "table-wrap");
    ui.table = el("table");
    ui.table.id = "tensors-table";
    var head = el("thead"), hr = el("tr");
    COLS.forEach(function (c) {
      var th = el("th", c.num ? "num" : null);
      th.scope = "col";
      th.dataset.col = c.key;
      if (c.title) th.title = c.title;
      if (c.order) {
        th.dataset.order = c.order;
        var b = el("button", "sort-btn", c.label);
        b.type = "button";
        b.dataset.order = c.order;
        b.appendChild(el("span", "arrow"));
        b.setAttribute("aria-label", "sort by " + ORDERS[c.order]);
        b.addEventListener("click", function () { relist(c.order); });
        th.appendChild(b);
      } else {
        th.textContent = c.label;
      }
      hr.appendChild(th);
    });
    head.appendChild(hr);
    ui.table.appendChild(head);
    ui.rows = el("tbody");
    ui.rows.id = "tensors-rows";
    ui.table.appendChild(ui.rows);
    wrap.appendChild(ui.table);
    list.appendChild(wrap);
    ui.more = el("button", "btn", "Load more");
    ui.more.type = "button";
    ui.more.id = "tensors-more";
    ui.more.hidden = true;
    ui.more.addEventListener("click", function () { fetchPage(false); });
    list.appendChild(ui.more);
    sec.appendChild(list);

    var det = el("section", "panel");
    det.id = "tensors-detail";
    det.setAttribute("aria-labelledby", "tensors-detail-name");
    ui.detail = det;
    ui.back = el("a", "back", "\u2190 back to the list");
    ui.back.id = "tensors-back";
    det.appendChild(ui.back);
    ui.dname = el("h2", "mono");
    ui.dname.id = "tensors-detail-name";
    det.appendChild(ui.dname);
    ui.fields = el("dl", "fields");
    ui.fields.id = "tensors-fields";
    det.appendChild(ui.fields);
    det.appendChild(el("h3", null, "Replicas"));
    var rw = el("div", "table-wrap"), rt = el("table");
    rt.id = "tensors-replicas";
    var rh = el("thead"), rr = el("tr");
    var h1 = el("th", "num", "Device"), h2 = el("th", "num", "Device offset");
    h1.scope = h2.scope = "col";
    rr.appendChild(h1);
    rr.appendChild(h2);
    rh.appendChild(rr);
    rt.appendChild(rh);
    ui.reps = el("tbody");
    rt.appendChild(ui.reps);
    rw.appendChild(rt);
    det.appendChild(rw);
    ui.download = el("a", "btn primary download");
    ui.download.id = "tensors-download";
    ui.download.hidden = true;
    ui.download.addEventListener("click", download);
    var p = el("p");
    p.appendChild(ui.download);
    det.appendChild(p);
    sec.appendChild(det);
    list.hidden = det.hidden = true;
  }

  function track(promise) {
    return promise.then(function (v) { return v; }, function (e) { failed(e); });
  }

  TV.register("tensors", {
    init: build,
    show: function (args, query) {
      var m = args[0] || "", g = args[1] || "", t = args.length > 2 ? args.slice(2).join("/") : null;
      query = query || {};
      ok();
      var picker = track(fillPicker(m, g));
      if (!m || !g) {
        ui.list.hidden = ui.detail.hidden = true;
        return picker;
      }
      var main = t !== null ? showDetail(m, g, t, query) : showList(m, g, searchOf(query), orderOf(query));
      return Promise.all([picker, main]);
    },
    refresh: function () { /* generations are immutable */ },
    hide: function () {
      if (typing) { clearTimeout(typing); typing = null; }
      TV.setError(SRC, null);
    }
  });
})();
