/* tensorvault dashboard, the Overview page: counts, devices with capacity
 * bars and LBA maps (GET /v1/devices/{id}/extents: every object coloured
 * by model, free gaps, the label; drawn to scale or by objects), the
 * read/import throughput chart (from /metrics, and on entering the page the
 * daemon's recent samples, GET /v1/metrics/history, so it never starts
 * empty) and the models table. Built
 * on the shell in app.js (window.TV). */
"use strict";

(function () {
  var CHART_POINTS = 300; // 10 minutes at 2 s: what GET /v1/metrics/history keeps
  var lastCounters = null;
  var chart = null;
  var bytesCache = {}; // model name -> {key, bytes}
  var $ = TV.$, el = TV.el, fmtBytes = TV.fmtBytes, get = TV.get, track = TV.track;

  /* -- devices ---------------------------------------------------------- */
  // Rows are kept per device id and updated in place, so the LBA map (and
  // the hover/focus on it) survives the 2 s refresh.
  var rows = {}; // device id -> {row, head, bar, fill, legend, map}

  function deviceRow(id) {
    var r = rows[id];
    if (r) return r;
    r = { row: el("div", "device"), head: el("div", "head"), bar: el("div", "bar"),
          fill: el("div", "used"), legend: el("div", "muted small"), map: newMap(id) };
    r.bar.setAttribute("role", "meter");
    r.bar.setAttribute("aria-label", "device " + id + " used space");
    r.bar.setAttribute("aria-valuemin", "0");
    r.bar.appendChild(r.fill);
    r.row.dataset.deviceId = String(id);
    [r.head, r.bar, r.legend, r.map.box].forEach(function (n) { r.row.appendChild(n); });
    rows[id] = r;
    return r;
  }

  function renderDevices(doc) {
    var box = $("devices");
    var devs = (doc && doc.devices) || [];
    var keep = {};
    devs.forEach(function (d) { keep[d.id] = true; });
    Object.keys(rows).forEach(function (id) { if (!keep[id]) delete rows[id]; });
    // Rows stay attached (detaching one would drop the focus inside it).
    Array.prototype.slice.call(box.children).forEach(function (c) {
      if (!c.dataset.deviceId || !rows[c.dataset.deviceId]) box.removeChild(c);
    });
    if (devs.length === 0) { box.appendChild(el("p", "muted", "no devices")); return []; }
    return devs.map(function (d, i) {
      var used = d.used_bytes, free = d.free_bytes, total = used + free;
      var pct = total > 0 ? (100 * used / total) : 0;
      var r = deviceRow(d.id);
      r.row.dataset.usedBytes = String(used);
      r.row.dataset.freeBytes = String(free);
      var head = TV.clear(r.head);
      var left = el("span");
      left.appendChild(el("strong", null, "#" + d.id + " "));
      left.appendChild(el("span", "path", d.path));
      left.appendChild(el("span", "muted", " (" + d.kind + ")"));
      head.appendChild(left);
      head.appendChild(el("span", d.status === "ok" ? "muted" : "status-bad",
                          d.status + (d.message ? ": " + d.message : "")));
      r.bar.setAttribute("aria-valuemax", String(total));
      r.bar.setAttribute("aria-valuenow", String(used));
      r.fill.style.width = pct.toFixed(2) + "%";
      var legend = TV.clear(r.legend);
      legend.appendChild(document.createTextNode("used "));
      legend.appendChild(el("span", "dev-used", fmtBytes(used)));
      legend.appendChild(document.createTextNode(" (" + pct.toFixed(1) + "%) \u00b7 free "));
      legend.appendChild(el("span", "dev-free", fmtBytes(free)));
      legend.appendChild(document.createTextNode(" \u00b7 " + d.n_objects + " objects \u00b7 largest free " +
                                                 fmtBytes(d.largest_free_bytes)));
      if (box.children[i] !== r.row) box.insertBefore(r.row, box.children[i] || null);
      return r;
    });
  }

  /* -- LBA map: GET /v1/devices/{id}/extents ----------------------------- */
  // A stable colour per model name (FNV-1a -> hue); a generation shifts the
  // lightness a little.
  function hue(name) {
    var h = 0x811c9dc5;
    for (var i = 0; i < name.length; i++) {
      h ^= name.charCodeAt(i);
      h = Math.imul(h, 0x01000193) >>> 0;
    }
    return h % 360;
  }
  function modelColour(name, generation) {
    var l = 40 + ((generation || 1) - 1) % 4 * 6;
    return "hsl(" + hue(name) + ", 62%, " + l + "%)";
  }

  function who(u) { return u.model + "@" + u.generation; }

  function describe(e) {
    var where = "offset " + e.offset + " (" + fmtBytes(e.offset) + ") \u00b7 " + fmtBytes(e.bytes) +
      " (" + e.bytes + " bytes)";
    if (e.kind === "free") return "free \u00b7 " + where;
    if (e.kind === "label") return "store label \u00b7 " + where;
    var users = e.users.length ? e.users.map(function (u) {
      return who(u) + " " + u.shard + " (" + u.state + ")";
    }).join("; ") : "no users (garbage until gc)";
    return users + " \u00b7 " + where + " \u00b7 sha256 " +
      (e.sha256 ? e.sha256.slice(0, 12) + "\u2026" : "\u2013") + " \u00b7 " + e.state +
      " \u00b7 object " + e.object_id;
  }

  /* The map's scale: "to-scale" (widths proportional to bytes) or
   * "objects" (each object and gap between objects a width that shows it,
   * 1 + log2 of its size in object_align units, at least MIN_PX wide
   * where the map has room; the trailing free extent a fixed TRAIL_PCT
   * (at least TRAIL_MIN_PX), marked as compressed, its size written on
   * it). Details on hover/focus stay exact. A choice is kept per device
   * id in localStorage; without one, "objects" when the objects cover
   * under AUTO_FRACTION of the region. Only the widths change: the
   * segments stay the same. */
  var SCALES = [["to-scale", "to scale"], ["objects", "objects"]];
  var MIN_PX = 8, TRAIL_PCT = 25, TRAIL_MIN_PX = 100, AUTO_FRACTION = 0.05;
  var SCALE_KEY = "tv.overview.lba-scale.";

  function storedScale(id) {
    var v = null;
    try { v = localStorage.getItem(SCALE_KEY + id); } catch (e) { /* storage disabled */ }
    return v === "to-scale" || v === "objects" ? v : null;
  }
  function storeScale(id, v) {
    try { localStorage.setItem(SCALE_KEY + id, v); } catch (e) { /* storage disabled */ }
  }

  function autoScale(doc) {
    var used = 0, n = 0;
    (doc.extents || []).forEach(function (e) {
      if (e.kind === "object") { used += e.bytes; n++; }
    });
    return n > 0 && used < AUTO_FRACTION * (doc.region_bytes || 1) ? "objects" : "to-scale";
  }

  function newMap(id) {
    var m = { id: id, text: null, doc: null, box: el("div", "lba"), strip: el("div", "lba-map"),
              details: el("p", "lba-details small muted", "hover or focus a segment for its details"),
              legend: el("ul", "lba-legend small"), tools: el("div", "lba-tools small"),
              buttons: {}, compressedKey: null };
    var group = el("div", "lba-scale");
    group.setAttribute("role", "group");
    group.setAttribute("aria-label", "device " + id + " LBA map scale");
    m.tools.appendChild(el("span", "muted", "LBA map scale"));
    SCALES.forEach(function (sc) {
      var b = el("button", "btn small-btn", sc[1]);
      b.type = "button";
      b.dataset.scale = sc[0];
      b.setAttribute("aria-pressed", "false");
      b.addEventListener("click", function () {
        storeScale(id, sc[0]);
        if (m.doc) applyScale(m);
      });
      m.buttons[sc[0]] = b;
      group.appendChild(b);
    });
    m.tools.appendChild(group);
    m.strip.setAttribute("role", "group");
    m.strip.setAttribute("aria-label", "device " + id + " LBA map (arrow keys move between extents)");
    m.details.setAttribute("role", "status");
    m.box.appendChild(m.tools);
    m.box.appendChild(m.strip);
    m.box.appendChild(m.details);
    m.box.appendChild(m.legend);
    function show(ev) {
      var s = ev.target.closest(".lba-seg");
      if (s && s.dataset.details) {
        m.details.textContent = s.dataset.details;
        m.details.classList.remove("muted");
      }
    }
    m.strip.addEventListener("mouseover", show);
    m.strip.addEventListener("focusin", show);
    m.strip.addEventListener("keydown", function (ev) {
      var segs = m.strip.children, cur = ev.target.closest(".lba-seg");
      if (!cur) return;
      var i = Array.prototype.indexOf.call(segs, cur), j = i;
      if (ev.key === "ArrowRight" || ev.key === "ArrowDown") j = Math.min(segs.length - 1, i + 1);
      else if (ev.key === "ArrowLeft" || ev.key === "ArrowUp") j = Math.max(0, i - 1);
      else if (ev.key === "Home") j = 0;
      else if (ev.key === "End") j = segs.length - 1;
      else return;
      ev.preventDefault();
      focusSeg(m, j);
    });
    return m;
  }

  // One tab stop per map (roving tabindex).
  function focusSeg(m, j) {
    var segs = m.strip.children;
    if (!segs.length) return;
    for (var k = 0; k < segs.length; k++) segs[k].tabIndex = k === j ? 0 : -1;
    segs[j].focus();
  }

  // Sets every segment's width for the current scale (the segments and
  // their data attributes stay as renderMap made them).
  function applyScale(m) {
    var scale = storedScale(m.id) || autoScale(m.doc);
    var segs = m.strip.children, n = segs.length, total = m.doc.region_bytes || 1;
    var unit = m.doc.object_align || 65536;
    var last = n - 1, trail = scale === "objects" && n > 1 && segs[last].dataset.kind === "free";
    var trailW = "max(" + TRAIL_PCT + "%, " + TRAIL_MIN_PX + "px)", rest = Math.max(trail ? n - 1 : n, 1);
    var minW = scale === "objects"
      ? "min(" + MIN_PX + "px, (100% - " + (trail ? trailW : "0px") + ") / " + rest + ")"
      : "min(2px, " + (100 / Math.max(n, 1)).toFixed(4) + "%)";
    m.box.dataset.scale = scale;
    Object.keys(m.buttons).forEach(function (k) {
      m.buttons[k].setAttribute("aria-pressed", k === scale ? "true" : "false");
    });
    for (var i = 0; i < n; i++) {
      var s = segs[i], bytes = Number(s.dataset.bytes), t = s.firstChild;
      var compressed = trail && i === last;
      s.classList.toggle("compressed", compressed);
      s.setAttribute("aria-label", s.dataset.details + (compressed ? " \u00b7 drawn compressed" : ""));
      t.hidden = !compressed;
      if (compressed) {
        t.textContent = fmtBytes(bytes) + " free";
        s.style.flexGrow = "0";
        s.style.flexShrink = "0";
        s.style.flexBasis = trailW;
        s.style.minWidth = "0";
        continue;
      }
      s.style.flexGrow = scale === "objects"
        ? String(1 + Math.log2(Math.max(1, bytes / unit)))
        : String(1e6 * bytes / total);
      s.style.flexShrink = "1";
      s.style.flexBasis = "0";
      s.style.minWidth = minW;
    }
    m.compressedKey.hidden = !trail;
  }

  function renderMap(m, doc) {
    var focused = m.strip.contains(document.activeElement) ? document.activeElement.dataset.offset : null;
    TV.clear(m.strip);
    TV.clear(m.legend);
    m.doc = doc;
    var ex = doc.extents || [], models = {};
    var refocus = -1;
    ex.forEach(function (e, i) {
      var s = el("button", "lba-seg " + e.kind);
      s.type = "button";
      s.tabIndex = i === 0 ? 0 : -1;
      s.dataset.kind = e.kind;
      s.dataset.offset = String(e.offset);
      s.dataset.bytes = String(e.bytes);
      var first = e.kind === "object" && e.users.length ? e.users[0] : null;
      if (first) {
        s.dataset.model = first.model;
        s.dataset.generation = String(first.generation);
        s.style.backgroundColor = modelColour(first.model, first.generation);
        e.users.forEach(function (u) { models[u.model] = true; });
      } else if (e.kind === "object") {
        s.classList.add("garbage");
      }
      if (e.kind === "object" && e.state === "writing") s.classList.add("writing");
      var text = describe(e);
      s.dataset.details = text;
      s.title = text;
      s.appendChild(el("span", "lba-seg-text")); // the compressed extent's visible size
      if (focused !== null && s.dataset.offset === focused) refocus = i;
      m.strip.appendChild(s);
    });
    function key(colour, label, cls) {
      var li = el("li");
      var sw = el("span", "swatch" + (cls ? " " + cls : ""));
      if (colour) sw.style.backgroundColor = colour;
      li.appendChild(sw);
      li.appendChild(document.createTextNode(label));
      m.legend.appendChild(li);
      return li;
    }
    Object.keys(models).sort().forEach(function (name) {
      key(modelColour(name, 1), name).dataset.model = name;
    });
    key(null, "free", "free");
    key(null, "label", "label");
    m.compressedKey = key(null, "free, drawn compressed (not to scale)", "free compressed");
    m.compressedKey.className = "compressed-key";
    applyScale(m);
    if (refocus >= 0) focusSeg(m, refocus);
  }

  function refreshMaps(list) {
    return Promise.all((list || []).map(function (r) {
      var id = r.row.dataset.deviceId;
      return track("extents-" + id, get("/v1/devices/" + id + "/extents", true)).then(function (text) {
        // rebuilt only when the extents change: hover and focus stay put
        if (text === null || text === r.map.text || rows[id] !== r) return;
        r.map.text = text;
        renderMap(r.map, JSON.parse(text));
      });
    }));
  }

  /* -- counts and models ------------------------------------------------ */
  function renderStatus(s) {
    if (!s) return;
    $("count-models").textContent = String(s.n_models);
    $("count-jobs").textContent = s.jobs.queued + " / " + s.jobs.running;
    $("count-jobs").dataset.queued = String(s.jobs.queued);
    $("count-jobs").dataset.running = String(s.jobs.running);
    var up = Math.floor(s.uptime_seconds);
    TV.setMeta("v" + s.version + " \u00b7 " + s.store + " \u00b7 up " +
               Math.floor(up / 3600) + "h " + Math.floor((up % 3600) / 60) + "m");
    renderTier(s.tier);
  }

  /* The memory tier card: resident bytes of the budget, and how often a
   * fast-path request found its chunk in memory. */
  function renderTier(t) {
    var v = $("tier-resident"), d = $("tier-detail");
    if (!t || !t.enabled) {
      v.textContent = "off";
      d.textContent = "no fast path";
      return;
    }
    v.dataset.residentBytes = String(t.resident_bytes);
    v.dataset.budgetBytes = String(t.budget_bytes);
    v.dataset.hits = String(t.hits);
    v.dataset.misses = String(t.misses);
    if (!t.budget_bytes) {
      v.textContent = "off";
      d.textContent = "cache.bytes = 0";
      return;
    }
    v.textContent = fmtBytes(t.resident_bytes) + " / " + fmtBytes(t.budget_bytes);
    d.textContent = TV.tierHits(t);
  }

  function modelBytes(name) {
    return get("/v1/models/" + TV.seg(name) + "/generations?limit=1000")
      .then(function (doc) {
        var sum = 0;
        (doc.generations || []).forEach(function (g) {
          if (g.state !== "retired") sum += g.total_bytes;
        });
        return sum;
      });
  }

  function renderModels(models) {
    if (!models) return;
    var gens = 0;
    models.forEach(function (m) { gens += m.n_generations; });
    $("count-generations").textContent = String(gens);
    var tbody = $("models").tBodies[0];
    tbody.textContent = "";
    if (models.length === 0) {
      var tr0 = el("tr");
      var td0 = el("td", "muted", "no models yet");
      td0.colSpan = 5;
      tr0.appendChild(td0);
      tbody.appendChild(tr0);
      return Promise.resolve();
    }
    // A model's bytes are refetched only when its generations change (not
    // every 2 s for every model).
    var seen = {};
    return Promise.all(models.map(function (m) {
      var key = m.n_generations + "/" + m.active_generation;
      seen[m.name] = true;
      var c = bytesCache[m.name];
      if (c && c.key === key) return c.bytes;
      return modelBytes(m.name).then(function (b) {
        bytesCache[m.name] = { key: key, bytes: b };
        return b;
      }, function () { return null; });
    })).then(function (bytes) {
      Object.keys(bytesCache).forEach(function (k) { if (!seen[k]) delete bytesCache[k]; });
      models.forEach(function (m, i) {
        var tr = el("tr");
        tr.dataset.model = m.name;
        var nameCell = el("td");
        var a = el("a", null, m.name);
        a.href = TV.href("models", [m.name]);
        nameCell.appendChild(a);
        tr.appendChild(nameCell);
        tr.appendChild(el("td", null, m.active_generation === null ? "\u2013" : String(m.active_generation)));
        var al = Object.keys(m.aliases || {}).sort().map(function (k) { return k + "\u2192" + m.aliases[k]; });
        tr.appendChild(el("td", null, al.length ? al.join(", ") : "\u2013"));
        tr.appendChild(el("td", "num", String(m.n_generations)));
        var bc = el("td", "num", bytes[i] === null ? "?" : fmtBytes(bytes[i]));
        if (bytes[i] !== null) { bc.dataset.bytes = String(bytes[i]); bc.title = bytes[i] + " bytes"; }
        tr.appendChild(bc);
        tbody.appendChild(tr);
      });
    });
  }

  /* -- throughput ------------------------------------------------------- */
  function parseCounters(text) {
    var read = 0, imp = 0;
    text.split("\n").forEach(function (line) {
      if (!line || line.charAt(0) === "#") return;
      var sp = line.lastIndexOf(" ");
      if (sp < 0) return;
      var name = line.slice(0, sp), v = parseFloat(line.slice(sp + 1));
      if (!isFinite(v)) return;
      var base = name.split("{")[0];
      if (base === "tensorvault_read_bytes_total" || base === "tensorvault_fastpath_delivered_bytes_total") read += v;
      else if (base === "tensorvault_imported_bytes_total") imp += v;
    });
    return { read: read, imp: imp, t: performance.now() };
  }

  function initChart() {
    if (typeof window.Chart !== "function") {
      $("chart-note").hidden = false;
      return;
    }
    var cs = getComputedStyle(document.documentElement);
    var fg = cs.getPropertyValue("--muted").trim() || "#888";
    var grid = cs.getPropertyValue("--border").trim() || "#ccc";
    var labels = [];
    chart = new window.Chart($("throughput").getContext("2d"), {
      type: "line",
      data: {
        labels: labels,
        datasets: [
          { label: "read MB/s", data: [], borderColor: "#1f6feb", backgroundColor: "#1f6feb", tension: 0.25, pointRadius: 0 },
          { label: "import MB/s", data: [], borderColor: "#d97706", backgroundColor: "#d97706", tension: 0.25, pointRadius: 0 }
        ]
      },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        scales: {
          x: { ticks: { display: false }, grid: { color: grid } },
          y: { beginAtZero: true, ticks: { color: fg }, grid: { color: grid } }
        },
        plugins: { legend: { labels: { color: fg } } }
      }
    });
  }

  function pushPoint(arr, v) {
    arr.push(v);
    while (arr.length > CHART_POINTS) arr.shift();
  }

  function pollMetrics() {
    return track("metrics", get("/metrics", true)).then(function (text) {
      if (text === null) return;
      var c = parseCounters(text);
      if (lastCounters && chart) {
        var dt = (c.t - lastCounters.t) / 1000;
        if (dt > 0) {
          pushPoint(chart.data.labels, "");
          pushPoint(chart.data.datasets[0].data, Math.max(0, (c.read - lastCounters.read) / dt / 1e6));
          pushPoint(chart.data.datasets[1].data, Math.max(0, (c.imp - lastCounters.imp) / dt / 1e6));
          chart.update();
        }
      }
      lastCounters = c;
    });
  }

  /* The chart from the daemon's recent samples (cumulative counters, oldest
   * first): one point per pair of neighbours. The 2 s polls go on from it. */
  function preloadChart() {
    if (!chart) return Promise.resolve();
    return track("history", get("/v1/metrics/history")).then(function (doc) {
      if (!doc || !chart) return;
      var s = doc.samples || [], labels = [], read = [], imp = [];
      for (var i = 1; i < s.length; i++) {
        var dt = (s[i].time_ms - s[i - 1].time_ms) / 1000;
        if (!(dt > 0)) continue;
        labels.push("");
        read.push(Math.max(0, (s[i].read_bytes - s[i - 1].read_bytes) / dt / 1e6));
        imp.push(Math.max(0, (s[i].import_bytes - s[i - 1].import_bytes) / dt / 1e6));
      }
      var k = Math.max(0, labels.length - CHART_POINTS);
      chart.data.labels = labels.slice(k);
      chart.data.datasets[0].data = read.slice(k);
      chart.data.datasets[1].data = imp.slice(k);
      chart.update();
    });
  }

  function listModels() { return TV.getAll("/v1/models", "models"); }

  function refresh() {
    return Promise.all([
      track("status", get("/v1/status")).then(renderStatus),
      track("devices", get("/v1/devices")).then(function (d) { if (d) return refreshMaps(renderDevices(d)); }),
      track("sessions", get("/v1/sessions")).then(function (d) {
        if (d) $("count-sessions").textContent = String((d.sessions || []).length);
      }),
      track("models", listModels()).then(renderModels),
      pollMetrics()
    ]);
  }

  TV.register("overview", {
    init: function () { initChart(); },
    show: function () { lastCounters = null; return preloadChart(); },
    refresh: refresh
  });
})();
