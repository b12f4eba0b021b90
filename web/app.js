/* tensorvault dashboard, the shell every page builds on: the TV namespace
 * (DOM and number helpers, the REST calls with the browser session's
 * token, the error box, the confirmation and token dialogs) and the hash
 * router. Pages (overview.js, models.js, ...) call TV.register(name, page);
 * the router shows one <section id="page-NAME"> at a time and refreshes it
 * every TV.POLL_MS. Talks only to the daemon that served it (/v1, /metrics).
 *
 * Page object: { show(args) -> Promise|undefined  (route entered; args are
 * the hash segments after the name, decoded), refresh() -> Promise|undefined
 * (every POLL_MS while shown), hide() }. After the first show+refresh the
 * section gets data-ready="1" and <body> data-loaded="1" (tests wait on it).
 */
"use strict";

(function () {
  var TOKEN_KEY = "tensorvault.token";
  var pages = {};
  var current = null; // {name, args, query, gen, shown}
  var errors = {};    // source -> message
  var timer = null;
  var running = null; // the refresh in flight (a promise), or null
  var offline = false; // the last call got no answer at all (daemon down)
  var metaLoaded = false; // the header's version line was read (or is being read)
  var noticeTimer = null;

  function $(id) { return document.getElementById(id); }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }

  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }

  function fmtBytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "?";
    var u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    var i = 0;
    while (Math.abs(n) >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n < 10 ? 2 : 1)) + " " + u[i];
  }

  function fmtRate(bps) {
    if (typeof bps !== "number" || !isFinite(bps) || bps <= 0) return "\u2013";
    return (bps / 1e6).toFixed(bps < 1e7 ? 2 : 1) + " MB/s";
  }

  function fmtDuration(s) {
    if (typeof s !== "number" || !isFinite(s) || s < 0) return "\u2013";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  /* The memory tier's hit line (GET /v1/status or /v1/sessions "tier"):
   * "hits 96.0% of 250 MiB · 0 evictions" ("no reads yet" before any). */
  function tierHits(t) {
    var hit = t.hit_bytes || 0, miss = t.miss_bytes || 0;
    if (hit + miss === 0) return "no reads yet";
    return "hits " + (100 * hit / (hit + miss)).toFixed(1) + "% of " + fmtBytes(hit + miss) +
      " \u00b7 " + t.evictions + " evictions";
  }

  /* Unix seconds (or an ISO string) -> "2026-12-01 13:00:00 UTC". */
  function fmtTime(t) {
    if (t === null || t === undefined) return "\u2013";
    var d = typeof t === "number" ? new Date(t * 1000) : new Date(t);
    if (isNaN(d.getTime())) return String(t);
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  /* A path segment: every byte that is not unreserved percent-encoded
   * (model and tensor names may hold '/', '.', '@', ...). */
  function seg(s) {
    return encodeURIComponent(String(s)).replace(/[!'()*]/g, function (c) {
      return "%" + c.charCodeAt(0).toString(16).toUpperCase();
    });
  }

  /* -- errors and notices ---------------------------------------------- */
  function showErrors() {
    var box = $("errors");
    clear(box);
    var keys = Object.keys(errors);
    keys.forEach(function (k) {
      var p = el("p", "error-line");
      p.dataset.source = k;
      p.appendChild(el("span", null, errors[k]));
      var x = el("button", "btn link-btn", "dismiss");
      x.type = "button";
      x.setAttribute("aria-label", "dismiss this message");
      x.addEventListener("click", function () { setError(k, null); });
      p.appendChild(x);
      box.appendChild(p);
    });
    box.hidden = keys.length === 0;
  }

  function setError(src, msg) {
    if ((errors[src] || null) === (msg || null)) return; // unchanged: keep the box (and its focus)
    if (msg) errors[src] = msg; else delete errors[src];
    showErrors();
  }

  /* A short success message in the status line (role=status). */
  function notify(msg) {
    var n = $("notice");
    n.textContent = msg;
    n.hidden = false;
    if (noticeTimer) clearTimeout(noticeTimer);
    noticeTimer = setTimeout(function () { n.hidden = true; }, 8000);
  }

  /* -- HTTP ------------------------------------------------------------- */
  /* A body that is not the API's error (a proxy's HTML page, say): its
   * title or text, whitespace folded, at most 160 characters. */
  function excerpt(body) {
    var t = String(body || "");
    var m = /<title[^>]*>([^<]*)<\/title>/i.exec(t);
    t = (m ? m[1] : t.replace(/<[^>]*>/g, " ")).replace(/\s+/g, " ").trim();
    return t.length > 160 ? t.slice(0, 159) + "\u2026" : t;
  }

  function apiError(method, path, status, body) {
    var msg = null, code = null;
    try {
      var j = JSON.parse(body);
      if (j && j.error) {
        code = j.error.code || null;
        msg = (code ? code + ": " : "") + (j.error.message || "");
      }
    } catch (e) { /* not JSON */ }
    if (msg === null) msg = excerpt(body);
    var err = new Error(method + " " + path + " failed: HTTP " + status + (msg ? " \u2014 " + msg : ""));
    err.status = status;
    err.code = code;
    return err;
  }

  /* One call of the daemon. opts: text (resolve with the body as text),
   * blob (as a Blob), token (overrides the session's; null sends none).
   * Rejects with an Error naming the call (.status, .code: the API's). */
  function request(method, path, body, opts) {
    opts = opts || {};
    var headers = { Accept: opts.text ? "text/plain" : opts.blob ? "*/*" : "application/json" };
    var tok = opts.token === undefined ? tokenGet() : opts.token;
    if (tok) headers.Authorization = "Bearer " + tok;
    var init = { method: method, headers: headers, cache: "no-store", credentials: "same-origin" };
    if (body !== undefined && body !== null) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return fetch(path, init).then(function (r) {
      offline = false;
      if (r.ok) {
        if (opts.text) return r.text();
        if (opts.blob) return r.blob();
        return r.text().then(function (t) {
          if (!t) return null;
          try { return JSON.parse(t); } catch (e) {
            var x = new Error(method + " " + path + " failed: HTTP " + r.status + ", the answer is not JSON" +
                              (excerpt(t) ? " \u2014 " + excerpt(t) : ""));
            x.status = r.status;
            throw x;
          }
        });
      }
      return r.text().then(function (t) { throw apiError(method, path, r.status, t); });
    }, function (e) {
      offline = true;
      throw new Error(method + " " + path + " failed: no answer from the daemon (" +
                      (e && e.message ? e.message : "network error") + ")");
    });
  }

  /* GET path -> parsed JSON (or text when asText). */
  function get(path, asText) { return request("GET", path, null, { text: !!asText }); }

  /* A change (POST/PUT/DELETE). Asks for the token first when the browser
   * session has none (Cancel sends the request without one, so the daemon's
   * refusal is what the user sees). A 401 forgets the token, so the next
   * change asks again. Errors go to the error box under `src` and reject. */
  function send(method, path, body, src) {
    src = src || (method + " " + path);
    var ready = tokenGet() ? Promise.resolve(tokenGet()) : askToken();
    return ready.then(function (tok) {
      return request(method, path, body, { token: tok || null });
    }).then(function (v) {
      setError(src, null);
      return v;
    }, function (e) {
      if (e.status === 401) {
        tokenClear();
        e.message += " (set a valid admin token with the Token button)";
      } else if (e.status === 403 && e.code === "TV_E_FORBIDDEN") {
        e.message += " (this token may not make changes)";
      }
      setError(src, e.message);
      throw e;
    });
  }

  /* promise -> its value, or null with the error shown under src. */
  function track(src, promise) {
    return promise.then(function (v) { setError(src, null); return v; },
                        function (e) {
                          var m = e.message;
                          if (e.status === 401)
                            m += tokenGet() ? " (the token was refused: set another with the Token button)"
                                            : " (this daemon wants a token for reads from here: use the Token button)";
                          setError(src, m);
                          return null;
                        });
  }

  /* Every item of a paged list route (`key` is the array's field). */
  function getAll(path, key) {
    var all = [];
    var sep = path.indexOf("?") < 0 ? "?" : "&";
    function page(cursor) {
      var p = path + sep + "limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      return get(p).then(function (doc) {
        all = all.concat((doc && doc[key]) || []);
        return doc && doc.next_cursor ? page(doc.next_cursor) : all;
      });
    }
    return page(null);
  }

  /* -- token ------------------------------------------------------------ */
  function tokenGet() {
    try { return sessionStorage.getItem(TOKEN_KEY) || null; } catch (e) { return null; }
  }
  function tokenSet(t) {
    try { sessionStorage.setItem(TOKEN_KEY, t); } catch (e) { /* storage disabled */ }
    tokenLabel();
  }
  function tokenClear() {
    try { sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* storage disabled */ }
    tokenLabel();
  }
  function tokenLabel() {
    var b = $("token-btn");
    if (b) {
      b.textContent = tokenGet() ? "Token: set" : "Token: none";
      b.dataset.token = tokenGet() ? "set" : "none";
    }
  }

  /* Opens the token dialog; resolves with the token entered, or null. */
  function askToken() {
    var dlg = $("token-dialog"), form = $("token-form"), input = $("token-input");
    return new Promise(function (resolve) {
      input.value = "";
      function done(v) {
        input.value = ""; // the token lives in sessionStorage only, not in the closed dialog
        form.removeEventListener("submit", onSubmit);
        $("token-cancel").removeEventListener("click", onCancel);
        $("token-forget").removeEventListener("click", onForget);
        dlg.removeEventListener("cancel", onCancel);
        if (dlg.open) dlg.close();
        resolve(v);
      }
      function onSubmit(ev) {
        ev.preventDefault();
        var t = input.value.trim();
        if (t) tokenSet(t);
        done(t || null);
      }
      function onCancel(ev) { if (ev) ev.preventDefault(); done(null); }
      function onForget() { tokenClear(); done(null); }
      form.addEventListener("submit", onSubmit);
      $("token-cancel").addEventListener("click", onCancel);
      $("token-forget").addEventListener("click", onForget);
      dlg.addEventListener("cancel", onCancel);
      dlg.showModal();
      input.focus();
    });
  }

  /* -- confirmation ----------------------------------------------------- */
  /* opts: {title, message, ok (button label), danger} -> Promise<bool>. */
  function confirmAction(opts) {
    var dlg = $("confirm-dialog"), form = $("confirm-form"), ok = $("confirm-ok");
    $("confirm-title").textContent = opts.title || "Are you sure?";
    $("confirm-message").textContent = opts.message || "";
    ok.textContent = opts.ok || "Confirm";
    ok.classList.toggle("danger", !!opts.danger);
    return new Promise(function (resolve) {
      function done(v) {
        form.removeEventListener("submit", onSubmit);
        $("confirm-cancel").removeEventListener("click", onCancel);
        dlg.removeEventListener("cancel", onCancel);
        if (dlg.open) dlg.close();
        resolve(v);
      }
      function onSubmit(ev) { ev.preventDefault(); done(true); }
      function onCancel(ev) { if (ev) ev.preventDefault(); done(false); }
      form.addEventListener("submit", onSubmit);
      $("confirm-cancel").addEventListener("click", onCancel);
      dlg.addEventListener("cancel", onCancel);
      dlg.showModal();
      $("confirm-cancel").focus();
    });
  }

  /* -- router ----------------------------------------------------------- */
  function register(name, page) { pages[name] = page; }

  /* "#models/demo" -> {name: "models", args: ["demo"]}; "" -> overview. */
  function parseHash() {
    var h = location.hash.replace(/^#\/?/, "");
    var q = "";
    var qi = h.indexOf("?");
    if (qi >= 0) { q = h.slice(qi + 1); h = h.slice(0, qi); }
    var parts = h ? h.split("/") : [];
    var name = "overview";
    try { if (parts.length) name = decodeURIComponent(parts[0]); } catch (e) { /* not a page */ }
    if (!Object.prototype.hasOwnProperty.call(pages, name)) name = "overview";
    var args = parts.slice(1).map(function (s) {
      try { return decodeURIComponent(s); } catch (e) { return s; }
    });
    var query = {};
    q.split("&").forEach(function (kv) {
      if (!kv) return;
      var i = kv.indexOf("=");
      var k = i < 0 ? kv : kv.slice(0, i), v = i < 0 ? "" : kv.slice(i + 1);
      try { query[decodeURIComponent(k)] = decodeURIComponent(v.replace(/\+/g, " ")); } catch (e) { /* skip */ }
    });
    return { name: name, args: args, query: query };
  }

  /* "#" + name + "/" + encoded args (+ "?k=v"). */
  function href(name, args, query) {
    var h = "#" + name + (args || []).map(function (a) { return "/" + seg(a); }).join("");
    var q = Object.keys(query || {}).filter(function (k) { return query[k] !== "" && query[k] !== null && query[k] !== undefined; })
      .map(function (k) { return seg(k) + "=" + seg(query[k]); });
    return q.length ? h + "?" + q.join("&") : h;
  }

  function go(name, args, query) { location.hash = href(name, args, query); }

  function markNav(name) {
    Array.prototype.forEach.call(document.querySelectorAll("#nav a"), function (a) {
      var on = a.dataset.page === name;
      a.classList.toggle("active", on);
      if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
      // A phone's nav scrolls sideways: keep the current section in sight.
      var nav = $("nav");
      if (on && nav.scrollWidth > nav.clientWidth) nav.scrollLeft = Math.max(0, a.offsetLeft - nav.offsetLeft - 12);
    });
  }

  function section(name) { return $("page-" + name); }

  function failed(name, e) {
    setError("page " + name, "the " + name + " page failed: " + (e && e.message ? e.message : e));
  }

  /* One refresh of the current route, only once its show has resolved and
   * never two at once (also across routes). wait: run after the refresh in
   * flight instead of skipping (a route's first refresh). */
  function tick(wait) {
    if (running) return wait ? running.then(function () { return tick(true); }) : Promise.resolve();
    var cur = current;
    if (!cur || !cur.shown) return Promise.resolve();
    if (offline) {
      // No answer last time: one probe per poll (not every call of the
      // page, each a console error), and the page again once it answers.
      running = fetch("/healthz", { cache: "no-store", credentials: "same-origin" })
        .then(function () { offline = false; }, function () { /* still down */ })
        .then(function () {
          running = null;
          if (offline) return null;
          if (!metaLoaded) loadMeta();
          return tick(wait);
        });
      return running;
    }
    var p = pages[cur.name], r;
    try { r = Promise.resolve(p.refresh ? p.refresh(cur.args, cur.query) : undefined); } catch (e) { r = Promise.reject(e); }
    running = r.then(function () {
      if (errors["page " + cur.name]) setError("page " + cur.name, null); // it works again
    }, function (e) { failed(cur.name, e); }).then(function () { running = null; });
    return running;
  }

  function route() {
    var r = parseHash();
    var prev = current;
    if (prev && prev.name !== r.name && pages[prev.name].hide) {
      try { pages[prev.name].hide(); } catch (e) { failed(prev.name, e); } // the next page still shows
    }
    Object.keys(pages).forEach(function (n) {
      var s = section(n);
      if (s) s.hidden = n !== r.name;
    });
    markNav(r.name);
    document.body.dataset.page = r.name;
    var sec = section(r.name);
    if (sec) delete sec.dataset.ready;
    var cur = { name: r.name, args: r.args, query: r.query, gen: (prev ? prev.gen : 0) + 1, shown: false };
    current = cur;
    var p = pages[r.name];
    var shown;
    try { shown = Promise.resolve(p.show ? p.show(r.args, r.query) : undefined); } catch (e) { shown = Promise.reject(e); }
    // A newer route makes this one's show and refresh moot: only the
    // current route is refreshed and marked ready.
    return shown.then(function () {
      if (current !== cur) return null;
      cur.shown = true;
      return tick(true);
    }, function (e) {
      cur.shown = true; // later polls retry the page
      failed(r.name, e);
    }).then(function () {
      if (current === cur && sec) {
        sec.dataset.ready = "1";
        document.body.dataset.loaded = "1";
      }
    });
  }

  /* The header's version line; also the brand's title, since phones hide
   * the line to keep the header short. */
  function setMeta(text) {
    $("meta").textContent = text;
    $("meta").title = text;
    document.querySelector(".top .brand").title = text;
  }

  /* The header's "vVERSION · STORE" (again after a token was entered or the
   * daemon answers again, when it could not be read before). */
  function loadMeta() {
    metaLoaded = true;
    track("status", get("/v1/status")).then(function (st) {
      if (st) setMeta("v" + st.version + " \u00b7 " + st.store);
      else metaLoaded = false;
    });
  }

  function start() {
    tokenLabel();
    // A token entered from the button re-enters the page, so that views a
    // 401 left empty load now.
    $("token-btn").addEventListener("click", function () {
      askToken().then(function (t) { if (t) { errors = {}; showErrors(); loadMeta(); route(); } });
    });
    window.addEventListener("hashchange", route);
    Object.keys(pages).forEach(function (n) { if (pages[n].init) pages[n].init(section(n)); });
    loadMeta();
    route();
    timer = setInterval(function () { tick(false); }, window.TV.POLL_MS);
  }

  window.TV = {
    POLL_MS: 2000,
    $: $, el: el, clear: clear, seg: seg,
    fmtBytes: fmtBytes, fmtRate: fmtRate, fmtDuration: fmtDuration, fmtTime: fmtTime,
    tierHits: tierHits,
    get: get, getAll: getAll, send: send, request: request, track: track,
    setError: setError, notify: notify, setMeta: setMeta,
    confirm: confirmAction, askToken: askToken,
    token: { get: tokenGet, set: tokenSet, clear: tokenClear },
    register: register, go: go, href: href,
    route: function () { return current; },
    section: section
  };

  // Deferred page scripts run after this one and before DOMContentLoaded.
  if (document.readyState !== "complete") document.addEventListener("DOMContentLoaded", start);
  else setTimeout(start, 0);
})();
