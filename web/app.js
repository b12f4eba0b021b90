/* tensorvault dashboard, Overview page: vanilla JS, talks only to the REST
 * API (/v1/...) and /metrics of the daemon that served it. */
"use strict";

(function () {
  var POLL_MS = 2000;
  var CHART_POINTS = 60;
  var errors = {};     // source -> message shown in the error box
  var lastCounters = null;
  var chart = null;
  var bytesCache = {}; // model name -> {key, bytes}

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtBytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "?";
    var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    var i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + u[i];
  }

  function showErrors() {
    var box = $("errors");
    var keys = Object.keys(errors);
    box.textContent = "";
    keys.forEach(function (k) { box.appendChild(el("p", null, errors[k])); });
    box.hidden = keys.length === 0;
  }

  function setError(src, msg) {
    if (msg) errors[src] = msg; else delete errors[src];
    showErrors();
  }

  /* GET path; resolves to the parsed JSON (or text), rejects with an Error
   * whose message holds the status and the API's error message. */
  function get(path, asText) {
    return fetch(path, { headers: { Accept: asText ? "text/plain" : "application/json" },
                         cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (r.ok) return asText ? r.text() : r.json();
        return r.text().then(function (body) {
          var msg = body;
          try {
            var j = JSON.parse(body);
            if (j && j.error) msg = (j.error.code ? j.error.code + ": " : "") + j.error.message;
          } catch (e) { /* not JSON: the body as is */ }
          throw new Error("GET " + path + " failed: HTTP " + r.status + (msg ? " \u2014 " + msg : ""));
        });
      }, function (e) {
        throw new Error("GET " + path + " failed: " + (e && e.message ? e.message : "network error"));
      });
  }

  function track(src, promise) {
    return promise.then(function (v) { setError(src, null); return v; },
                        function (e) { setError(src, e.message); return null; });
  }

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

  function listModels() {
    var all = [];
    function page(cursor) {
      var p = "/v1/models?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      return get(p).then(function (doc) {
        all = all.concat(doc.models || []);
        return doc.next_cursor ? page(doc.next_cursor) : all;
      });
    }
    return page(null);
  }

  function modelBytes(name) {
    return get("/v1/models/" + encodeURIComponent(name) + "/generations?limit=1000")
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
        tr.appendChild(el("td", null, m.name));
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

  /* -- refresh loop ----------------------------------------------------- */
  var busy = false;
  function refresh() {
    if (busy) return Promise.resolve();
    busy = true;
    return Promise.all([
      track("status", get("/v1/status")).then(renderStatus),
      track("devices", get("/v1/devices")).then(function (d) { if (d) renderDevices(d); }),
      track("sessions", get("/v1/sessions")).then(function (d) {
        if (d) $("count-sessions").textContent = String((d.sessions || []).length);
      }),
      track("models", listModels()).then(renderModels),
      pollMetrics()
    ]).then(function () {
      busy = false;
      document.body.dataset.loaded = "1";
    }, function () { busy = false; });
  }

  function start() {
    initChart();
    refresh();
    setInterval(refresh, POLL_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
