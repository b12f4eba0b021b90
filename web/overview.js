/* tensorvault dashboard, the Overview page: counts, devices with capacity
 * bars, the read/import throughput chart (from /metrics) and the models
 * table. Built on the shell in app.js (window.TV). */
"use strict";

(function () {
  var CHART_POINTS = 60;
  var lastCounters = null;
  var chart = null;
  var bytesCache = {}; // model name -> {key, bytes}
  var $ = TV.$, el = TV.el, fmtBytes = TV.fmtBytes, get = TV.get, track = TV.track;

  /* -- devices ---------------------------------------------------------- */
  function renderDevices(doc) {
    var box = $("devices");
    box.textContent = "";
    var devs = (doc && doc.devices) || [];
    if (devs.length === 0) { box.appendChild(el("p", "muted", "no devices")); return; }
    devs.forEach(function (d) {
      var used = d.used_bytes, free = d.free_bytes, total = used + free;
      var pct = total > 0 ? (100 * used / total) : 0;
      var row = el("div", "device");
      row.dataset.deviceId = String(d.id);
      row.dataset.usedBytes = String(used);
      row.dataset.freeBytes = String(free);
      var head = el("div", "head");
      var left = el("span");
      left.appendChild(el("strong", null, "#" + d.id + " "));
      left.appendChild(el("span", "path", d.path));
      left.appendChild(el("span", "muted", " (" + d.kind + ")"));
      head.appendChild(left);
      var st = el("span", d.status === "ok" ? "muted" : "status-bad",
                  d.status + (d.message ? ": " + d.message : ""));
      head.appendChild(st);
      row.appendChild(head);
      var bar = el("div", "bar");
      bar.setAttribute("role", "meter");
      bar.setAttribute("aria-label", "device " + d.id + " used space");
      bar.setAttribute("aria-valuemin", "0");
      bar.setAttribute("aria-valuemax", String(total));
      bar.setAttribute("aria-valuenow", String(used));
      var fill = el("div", "used");
      fill.style.width = pct.toFixed(2) + "%";
      bar.appendChild(fill);
      row.appendChild(bar);
      var legend = el("div", "muted small");
      var u = el("span", "dev-used", fmtBytes(used));
      var f = el("span", "dev-free", fmtBytes(free));
      legend.appendChild(document.createTextNode("used "));
      legend.appendChild(u);
      legend.appendChild(document.createTextNode(" (" + pct.toFixed(1) + "%) \u00b7 free "));
      legend.appendChild(f);
      legend.appendChild(document.createTextNode(" \u00b7 " + d.n_objects + " objects \u00b7 largest free " +
                                                 fmtBytes(d.largest_free_bytes)));
      row.appendChild(legend);
      box.appendChild(row);
    });
  }

  /* -- counts and models ------------------------------------------------ */
  function renderStatus(s) {
    if (!s) return;
    $("count-models").textContent = String(s.n_models);
    $("count-jobs").textContent = s.jobs.queued + " / " + s.jobs.running;
    $("count-jobs").dataset.queued = String(s.jobs.queued);
    $("count-jobs").dataset.running = String(s.jobs.running);
    var up = Math.floor(s.uptime_seconds);
    $("meta").textContent = "v" + s.version + " \u00b7 " + s.store + " \u00b7 up " +
      Math.floor(up / 3600) + "h " + Math.floor((up % 3600) / 60) + "m";
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

  function listModels() { return TV.getAll("/v1/models", "models"); }

  function refresh() {
    return Promise.all([
      track("status", get("/v1/status")).then(renderStatus),
      track("devices", get("/v1/devices")).then(function (d) { if (d) renderDevices(d); }),
      track("sessions", get("/v1/sessions")).then(function (d) {
        if (d) $("count-sessions").textContent = String((d.sessions || []).length);
      }),
      track("models", listModels()).then(renderModels),
      pollMetrics()
    ]);
  }

  TV.register("overview", {
    init: function () { initChart(); },
    show: function () { lastCounters = null; },
    refresh: refresh
  });
})();
