/* tensorvault dashboard, the Imports page (#imports, #imports?state=S&kind=K):
 * a form that queues an import (POST /v1/imports) and the job list
 * (GET /v1/jobs, newest first, every TV.POLL_MS and every 500 ms while a
 * job runs) with each job's step, progress, rate, ETA and times, a Cancel
 * button for queued and running jobs (POST /v1/jobs/ID/cancel), a failed
 * job's error and a finished import's generation. The form is built once (its inputs survive every
 * refresh); a job's row is built once and updated in place, so focus on
 * its Cancel button survives a refresh. */
"use strict";

(function () {
  var LIMIT = 100;
  var STATES = ["queued", "running", "succeeded", "failed", "cancelled"];
  var KINDS = ["import", "verify"];
  var ui = {};          // the page's fixed elements
  var rows = {};        // job id -> {node, key, parts}
  var pending = null;   // the jobs request in flight
  var again = false;    // another refresh asked for while one is in flight
  var shown = false;    // the route is #imports
  var fastTimer = null; // the next in-between refresh while a job runs
  var FAST_MS = 500;

  function field(labelText, input, hint) {
    var f = TV.el("div", "field");
    var l = TV.el("label", null, labelText);
    l.htmlFor = input.id;
    f.appendChild(l);
    f.appendChild(input);
    if (hint) f.appendChild(hint);
    return f;
  }

  function textInput(id, placeholder) {
    var i = document.createElement("input");
    i.type = "text";
    i.id = id;
    i.autocomplete = "off";
    i.spellcheck = false;
    if (placeholder) i.placeholder = placeholder;
    return i;
  }

  function checkbox(id, labelText) {
    var wrap = TV.el("div", "check");
    var i = document.createElement("input");
    i.type = "checkbox";
    i.id = id;
    var l = TV.el("label", null, labelText);
    l.htmlFor = id;
    wrap.appendChild(i);
    wrap.appendChild(l);
    return { wrap: wrap, input: i };
  }

  function select(id, all, values) {
    var s = document.createElement("select");
    s.id = id;
    [""].concat(values).forEach(function (v) {
      var o = TV.el("option", null, v || all);
      o.value = v;
      s.appendChild(o);
    });
    return s;
  }

  /* -- the form --------------------------------------------------------- */
  function buildForm() {
    var p = TV.el("section", "panel");
    p.setAttribute("aria-labelledby", "imp-form-h");
    var h = TV.el("h2", null, "Start an import");
    h.id = "imp-form-h";
    p.appendChild(h);
    var form = TV.el("form", "import-form");
    form.id = "import-form";
    form.noValidate = true;

    ui.model = textInput("imp-model", "e.g. llama-3-8b");
    ui.model.required = true;
    ui.source = textInput("imp-source", "/data/checkpoints/llama-3-8b");
    ui.source.required = true;
    var hint = TV.el("p", "hint muted",
      "A .safetensors file, an index file (*.safetensors.index.json) or a directory of shards, " +
      "as a path on the daemon's machine under its import roots (import.roots); or " +
      "hf://ORG/REPO[@REVISION] from the Hugging Face Hub (the daemon resolves the revision " +
      "to a commit and fetches with its own token, HF_TOKEN).");
    hint.id = "imp-source-hint";
    ui.source.setAttribute("aria-describedby", hint.id);
    ui.alias = textInput("imp-alias", "optional");
    var act = checkbox("imp-activate", "Activate when ready");
    var strict = checkbox("imp-strict", "Strict (read back and re-hash after writing)");
    ui.activate = act.input;
    ui.strict = strict.input;
    ui.start = TV.el("button", "btn primary", "Start import");
    ui.start.type = "submit";
    ui.start.id = "imp-start";

    var row1 = TV.el("div", "import-row");
    row1.appendChild(field("Model", ui.model));
    row1.appendChild(field("Alias", ui.alias));
    form.appendChild(row1);
    var src = field("Source path", ui.source, hint);
    src.classList.add("wide-field");
    form.appendChild(src);
    var row2 = TV.el("div", "import-row checks");
    row2.appendChild(act.wrap);
    row2.appendChild(strict.wrap);
    row2.appendChild(ui.start);
    form.appendChild(row2);

    ui.formError = TV.el("p", "form-error");
    ui.formError.id = "imp-error";
    ui.formError.setAttribute("role", "alert");
    ui.formError.hidden = true;
    form.appendChild(ui.formError);
    form.addEventListener("submit", onStart);
    p.appendChild(form);
    return p;
  }

  // hf://ORG/REPO[@REVISION]: the shape the daemon takes (import/src_hub.c),
  // checked before the request; null when fine or not a Hub source.
  function hubSourceError(source) {
    if (!/^hf:\/\//i.test(source)) return null;
    var m = /^hf:\/\/([^@]+)(?:@(.+))?$/i.exec(source);
    var part = /^[A-Za-z0-9_]([A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?$/;
    var parts = m ? m[1].split("/") : [];
    if (!m || parts.length > 2 || !parts.every(function (p) {
      return part.test(p) && p.indexOf("--") < 0 && p.indexOf("..") < 0;
    }))
      return "A Hub source is hf://ORG/REPO or hf://ORG/REPO@REVISION (a branch, tag or commit).";
    if (m[2] !== undefined && (!/^[A-Za-z0-9._\/+-]{1,255}$/.test(m[2]) || m[2].indexOf("..") >= 0))
      return "The revision after '@' must be a branch, a tag or a 40-hex commit.";
    return null;
  }

  function formError(msg) {
    ui.formError.textContent = msg || "";
    ui.formError.hidden = !msg;
  }

  function onStart(ev) {
    ev.preventDefault();
    var model = ui.model.value.trim(), source = ui.source.value.trim(), alias = ui.alias.value.trim();
    if (!model || !source) {
      formError(!model ? "Enter the model's name." : "Enter the source path.");
      (!model ? ui.model : ui.source).focus();
      return;
    }
    var hubErr = hubSourceError(source);
    if (hubErr) {
      formError(hubErr);
      ui.source.focus();
      return;
    }
    var body = { model: model, source: source, activate: ui.activate.checked, strict: ui.strict.checked };
    if (alias) body.alias = alias;
    formError(null);
    ui.start.disabled = true;
    TV.send("POST", "/v1/imports", body, "import").then(function (job) {
      TV.notify("Import job #" + job.id + " of " + model + " queued.");
      return refreshJobs();
    }, function (e) {
      formError(e.message);
    }).then(function () { ui.start.disabled = false; });
  }

  /* -- the job list ----------------------------------------------------- */
  function buildJobs() {
    var p = TV.el("section", "panel");
    p.setAttribute("aria-labelledby", "imp-jobs-h");
    var h = TV.el("h2", null, "Jobs ");
    h.id = "imp-jobs-h";
    h.appendChild(TV.el("span", "muted small", "(newest first; refreshed every 2 s, twice a second while one runs)"));
    p.appendChild(h);
    var bar = TV.el("div", "toolbar");
    ui.state = select("imp-filter-state", "all states", STATES);
    ui.kind = select("imp-filter-kind", "all kinds", KINDS);
    bar.appendChild(field("State", ui.state));
    bar.appendChild(field("Kind", ui.kind));
    [ui.state, ui.kind].forEach(function (s) {
      s.addEventListener("change", function () {
        TV.go("imports", [], { state: ui.state.value, kind: ui.kind.value });
      });
    });
    p.appendChild(bar);
    ui.empty = TV.el("p", "muted", "loading\u2026");
    ui.empty.id = "jobs-empty";
    p.appendChild(ui.empty);
    ui.list = TV.el("ul", "jobs");
    ui.list.id = "jobs";
    p.appendChild(ui.list);
    ui.more = TV.el("p", "muted small");
    ui.more.hidden = true;
    p.appendChild(ui.more);
    return p;
  }

  /* Whole percent of the current step; 1..99 while it is under way (never
   * 0% with bytes written, never 100% with bytes to go). */
  function pct(j) {
    if (j.state === "succeeded") return 100;
    if (!(j.bytes_total > 0) || !(j.bytes_done > 0)) return 0;
    if (j.bytes_done >= j.bytes_total) return 100;
    return Math.max(1, Math.min(99, Math.floor((100 * j.bytes_done) / j.bytes_total)));
  }

  function fillTimes(node, j) {
    TV.clear(node);
    [["created", j.created_at], ["started", j.started_at], ["finished", j.finished_at]].forEach(function (t) {
      if (t[1] === null || t[1] === undefined) return;
      node.appendChild(TV.el("span", "job-time", t[0] + " " + TV.fmtTime(t[1])));
    });
  }

  /* The step now (running) or where it ended (failed, cancelled). */
  function stepText(j) {
    if (!j.step || j.state === "succeeded" || j.state === "queued") return "";
    return (j.state === "running" ? "step: " : "at step ") + j.step;
  }

  function newRow(j) {
    var li = TV.el("li", "job");
    var r = { node: li, key: null, parts: {} };
    var P = r.parts;
    li.dataset.jobId = String(j.id);
    li.tabIndex = -1;
    var head = TV.el("div", "job-head");
    P.id = TV.el("strong", "job-id", "#" + j.id);
    P.kind = TV.el("span", "badge kind", j.kind);
    P.state = TV.el("span", "badge");
    P.model = TV.el("span", "job-model");
    P.step = TV.el("span", "job-step muted");
    [P.id, P.kind, P.state, P.model, P.step].forEach(function (e) { head.appendChild(e); });
    P.cancel = TV.el("button", "btn small-btn job-cancel", "Cancel");
    P.cancel.type = "button";
    P.cancel.setAttribute("aria-label", "Cancel job " + j.id);
    P.cancel.addEventListener("click", function () { cancelJob(j.id, P.cancel); });
    head.appendChild(P.cancel);
    li.appendChild(head);

    P.source = TV.el("div", "job-source mono");
    li.appendChild(P.source);

    var prog = TV.el("div", "job-progress");
    P.bar = TV.el("div", "bar");
    P.bar.setAttribute("role", "progressbar");
    P.bar.setAttribute("aria-valuemin", "0");
    P.bar.setAttribute("aria-valuemax", "100");
    P.bar.setAttribute("aria-label", "Progress of job " + j.id);
    P.fill = TV.el("div", "fill");
    P.bar.appendChild(P.fill);
    prog.appendChild(P.bar);
    P.pct = TV.el("span", "job-pct num");
    prog.appendChild(P.pct);
    li.appendChild(prog);

    P.stats = TV.el("div", "job-stats");
    P.bytes = TV.el("span", "job-bytes");
    P.rate = TV.el("span", "job-rate");
    P.eta = TV.el("span", "job-eta");
    [P.bytes, P.rate, P.eta].forEach(function (e) { P.stats.appendChild(e); });
    li.appendChild(P.stats);

    P.times = TV.el("div", "job-times muted small");
    li.appendChild(P.times);
    P.error = TV.el("p", "job-error");
    li.appendChild(P.error);
    P.result = TV.el("p", "job-result");
    li.appendChild(P.result);
    return r;
  }

  function fillResult(P, j) {
    TV.clear(P.result);
    P.result.hidden = true;
    if (j.state !== "succeeded") return;
    if (j.kind === "import" && j.generation !== null && j.model !== null) {
      P.result.appendChild(document.createTextNode("Published "));
      var a = TV.el("a", "job-gen", j.model + " generation " + j.generation);
      a.href = TV.href("models", [j.model]);
      a.dataset.generation = String(j.generation);
      P.result.appendChild(a);
      var res = j.result || {};
      var bits = [];
      if (res.active) bits.push("active");
      if (res.aliases && res.aliases.length) bits.push("alias " + res.aliases.join(", "));
      if (typeof res.n_tensors === "number") bits.push(res.n_tensors + " tensors");
      if (typeof res.written_bytes === "number") bits.push(TV.fmtBytes(res.written_bytes) + " written");
      if (typeof res.deduplicated_bytes === "number" && res.deduplicated_bytes > 0)
        bits.push(TV.fmtBytes(res.deduplicated_bytes) + " deduplicated");
      if (bits.length) P.result.appendChild(document.createTextNode(" (" + bits.join(", ") + ") \u00b7 "));
      else P.result.appendChild(document.createTextNode(" \u00b7 "));
      var t = TV.el("a", "job-tensors", "tensors");
      t.href = TV.href("tensors", [j.model, String(j.generation)]);
      P.result.appendChild(t);
      P.result.hidden = false;
    } else if (j.kind === "verify" && j.result) {
      var v = j.result;
      P.result.textContent = "Verified " + v.n_objects + " object" + (v.n_objects === 1 ? "" : "s") +
        " (" + TV.fmtBytes(v.verified_bytes) + "), " + v.n_failed + " failed";
      if (v.n_failed > 0) P.result.classList.add("bad");
      P.result.hidden = false;
    }
  }

  function updateRow(r, j) {
    var key = JSON.stringify(j);
    if (r.key === key) return;
    r.key = key;
    var P = r.parts, li = r.node, p = pct(j);
    li.dataset.state = j.state;
    li.dataset.kind = j.kind;
    li.dataset.progress = String(p);
    li.dataset.bytesDone = String(j.bytes_done);
    li.dataset.bytesTotal = String(j.bytes_total);
    li.dataset.generation = j.generation === null ? "" : String(j.generation);
    P.state.className = "badge state " + j.state;
    P.state.textContent = j.state;
    P.model.textContent = j.kind === "verify" && j.model === null ? "all objects" : (j.model || "");
    P.step.textContent = stepText(j);
    P.step.hidden = !P.step.textContent;
    P.source.textContent = j.source || "";
    P.source.hidden = !j.source;
    P.fill.style.width = p + "%";
    P.bar.setAttribute("aria-valuenow", String(p));
    P.bar.setAttribute("aria-valuetext", p + "% (" + TV.fmtBytes(j.bytes_done) + " of " + TV.fmtBytes(j.bytes_total) + ")");
    P.bar.classList.toggle("done", j.state === "succeeded");
    P.bar.classList.toggle("bad", j.state === "failed" || j.state === "cancelled");
    P.pct.textContent = p + "%";
    P.bytes.textContent = TV.fmtBytes(j.bytes_done) + " / " + TV.fmtBytes(j.bytes_total);
    var live = j.state === "running";
    P.rate.textContent = live ? TV.fmtRate(j.rate_bytes_per_s) : "";
    P.rate.hidden = !live;
    P.eta.textContent = live ? "ETA " + TV.fmtDuration(j.eta_seconds === null ? NaN : j.eta_seconds) : "";
    P.eta.hidden = !live;
    fillTimes(P.times, j);
    var cancellable = j.state === "queued" || j.state === "running";
    // A focused Cancel button that goes away hands focus to its row.
    if (!cancellable && document.activeElement === P.cancel) li.focus();
    P.cancel.hidden = !cancellable;
    if (j.error) {
      TV.clear(P.error);
      P.error.appendChild(TV.el("code", "err-code", j.error.code || ("errno " + j.error.errno)));
      P.error.appendChild(document.createTextNode(" " + (j.error.message || "")));
      P.error.hidden = false;
    } else {
      P.error.hidden = true;
    }
    fillResult(P, j);
  }

  function render(doc) {
    var jobs = doc.jobs || [];
    ui.list.dataset.polls = String(Number(ui.list.dataset.polls || 0) + 1);
    var seen = {};
    jobs.forEach(function (j, i) {
      var r = rows[j.id];
      if (!r) { r = newRow(j); rows[j.id] = r; }
      seen[j.id] = true;
      updateRow(r, j);
      var at = ui.list.children[i];
      if (at !== r.node) ui.list.insertBefore(r.node, at || null);
    });
    Object.keys(rows).forEach(function (id) {
      if (!seen[id]) {
        if (rows[id].node.parentNode) rows[id].node.parentNode.removeChild(rows[id].node);
        delete rows[id];
      }
    });
    var filtered = ui.state.value || ui.kind.value;
    ui.empty.textContent = filtered ? "No job matches these filters." : "No jobs yet: start an import above.";
    ui.empty.hidden = jobs.length > 0;
    ui.more.textContent = "Showing the " + LIMIT + " newest jobs; filter by state or kind to see others.";
    ui.more.hidden = !doc.next_cursor;
    // Imports run at GB/s: while one runs the list refreshes every FAST_MS
    // between the router's refreshes, so its progress is seen moving.
    if (shown && !fastTimer && jobs.some(function (j) { return j.state === "running"; })) {
      fastTimer = setTimeout(function () {
        fastTimer = null;
        if (shown) refreshJobs();
      }, FAST_MS);
    }
  }

  function jobsPath() {
    var q = "?limit=" + LIMIT;
    if (ui.state.value) q += "&state=" + TV.seg(ui.state.value);
    if (ui.kind.value) q += "&kind=" + TV.seg(ui.kind.value);
    return "/v1/jobs" + q;
  }

  /* One jobs request at a time; a refresh asked for meanwhile runs after. */
  function refreshJobs() {
    if (pending) { again = true; return pending; }
    pending = TV.track("jobs", TV.get(jobsPath())).then(function (doc) {
      if (doc) render(doc);
      pending = null;
      if (again) { again = false; return refreshJobs(); }
    });
    return pending;
  }

  function cancelJob(id, btn) {
    TV.confirm({
      title: "Cancel job #" + id + "?",
      message: "Nothing of it is published and the space it reserved is released. A finished job cannot be cancelled.",
      ok: "Cancel job",
      danger: true
    }).then(function (yes) {
      if (!yes) { btn.focus(); return null; }
      btn.disabled = true;
      return TV.send("POST", "/v1/jobs/" + id + "/cancel", null, "cancel job " + id).then(function (j) {
        TV.notify("Job #" + id + (j && j.state === "cancelled" ? " cancelled." : " is being cancelled."));
      }, function () { /* shown in the error box */ }).then(function () {
        btn.disabled = false;
        if (!btn.hidden) btn.focus();
        return refreshJobs();
      });
    });
  }

  TV.register("imports", {
    init: function (sec) {
      sec.appendChild(buildForm());
      sec.appendChild(buildJobs());
    },
    show: function (args, query) {
      shown = true;
      query = query || {};
      ui.state.value = STATES.indexOf(query.state) >= 0 ? query.state : "";
      ui.kind.value = KINDS.indexOf(query.kind) >= 0 ? query.kind : "";
    },
    refresh: function () { return refreshJobs(); },
    hide: function () {
      shown = false;
      if (fastTimer) { clearTimeout(fastTimer); fastTimer = null; }
    }
  });
})();
