(function () {
  "use strict";
  // Every piece of run data reaches the page through text nodes (el / textContent), never
  // through HTML parsing: model output and observations are untrusted text.

  var RUN = window.TOOLSELF_RUN;
  var DETAILS = window.TOOLSELF_DETAILS || [];
  var $ = function (id) { return document.getElementById(id); };

  function el(tag, props) {
    var node = document.createElement(tag);
    if (props) {
      for (var key in props) {
        var value = props[key];
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") node.className = value;
        else if (key === "text") node.textContent = value;
        else if (key === "on") { for (var ev in value) node.addEventListener(ev, value[ev]); }
        else if (key === "data") { for (var d in value) node.dataset[d] = value[d]; }
        else if (key === "style") node.style.cssText = value;
        else node.setAttribute(key, value);
      }
    }
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }
  function append(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { append(node, c); }); return; }
    node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }

  if (!RUN) {
    $("content").appendChild(el("div", { class: "empty" },
      "The report's data did not load. If it was written as a separate .data.js file, keep that file next to this page."));
    return;
  }

  // ---------- formatting ----------
  var NUM = new Intl.NumberFormat("en-US");
  function num(n) { return n === null || n === undefined ? "—" : NUM.format(Math.round(n)); }
  function dec(n, digits) { return n === null || n === undefined ? "—" : n.toFixed(digits === undefined ? 1 : digits); }
  function pct(x) { return x === null || x === undefined ? "—" : (100 * x).toFixed(1) + "%"; }
  function secs(s) {
    if (s === null || s === undefined) return "—";
    if (s < 1) return Math.round(s * 1000) + " ms";
    if (s < 60) return s.toFixed(1) + " s";
    var m = Math.floor(s / 60), r = Math.round(s - 60 * m);
    return m + "m " + (r < 10 ? "0" : "") + r + "s";
  }
  function word(n, w) { return w + (n === 1 ? "" : "s"); }
  function plural(n, w) { return num(n) + " " + word(n, w); }
  var OUTCOME_LABEL = { correct: "correct", wrong: "wrong", error: "error", timeout: "timeout", unscored: "unscored" };
  var OUTCOME_MARK = { correct: "✓", wrong: "✗", error: "!", timeout: "⏱", unscored: "·" };

  // ---------- tasks: the list groups the attempts of every method at one task ----------
  var rows = RUN.rows;
  var tasks = [], taskByKey = new Map();
  rows.forEach(function (row) {
    var key = row.dataset + "/" + row.task_id;
    var task = taskByKey.get(key);
    if (!task) {
      task = { key: key, task_id: row.task_id, dataset: row.dataset, family: row.family, question: row.question,
               reference: row.reference, attempts: [], text: "" };
      taskByKey.set(key, task);
      tasks.push(task);
    }
    if (!task.question && row.question) task.question = row.question;
    if (task.reference === null && row.reference !== null) task.reference = row.reference;
    task.attempts.push(row);
  });
  var methodRank = new Map(RUN.methods.map(function (m, i) { return [m, i]; }));
  tasks.forEach(function (task) {
    task.attempts.sort(function (a, b) { return (methodRank.get(a.method) - methodRank.get(b.method)) || a.repeat - b.repeat; });
    task.text = [task.task_id, task.dataset, task.family, task.question, task.reference].concat(
      task.attempts.map(function (a) { return [a.answer, a.subgoals, a.end_reason, a.error].join(" "); })
    ).join(" ").toLowerCase();
  });

  var state = { q: "", outcome: "", method: "", dataset: "", selected: null, a: null, b: null };
  var filtered = tasks;

  function matches(task) {
    var atts = task.attempts;
    if (state.method) atts = atts.filter(function (a) { return a.method === state.method; });
    if (!atts.length) return false;
    if (state.dataset && task.dataset !== state.dataset) return false;
    if (state.outcome === "disagree") {
      var scored = task.attempts.filter(function (a) { return a.outcome !== "unscored"; });
      var right = scored.filter(function (a) { return a.outcome === "correct"; }).length;
      if (right === 0 || right === scored.length) return false;
    } else if (state.outcome && !atts.some(function (a) { return a.outcome === state.outcome; })) return false;
    if (state.q) {
      var words = state.q.toLowerCase().split(/\s+/).filter(Boolean);
      for (var i = 0; i < words.length; i++) if (task.text.indexOf(words[i]) < 0) return false;
    }
    return true;
  }

  // ---------- the virtual list: only the rows in view exist in the DOM ----------
  var list = $("list"), spacer = $("list-spacer");
  var ROW = 68, drawn = { first: -1, last: -1, version: -1 }, version = 0;

  function applyFilters() {
    filtered = tasks.filter(matches);
    version++;
    spacer.style.height = filtered.length * ROW + "px";
    var attempts = filtered.reduce(function (n, t) { return n + t.attempts.length; }, 0);
    $("count").textContent = num(filtered.length) + " of " + plural(tasks.length, "task") + " · " + plural(attempts, "attempt");
    drawList();
  }

  function drawList() {
    var top = list.scrollTop, height = list.clientHeight || 800;
    var first = Math.max(0, Math.floor(top / ROW) - 6);
    var last = Math.min(filtered.length, Math.ceil((top + height) / ROW) + 6);
    if (first === drawn.first && last === drawn.last && version === drawn.version) return;
    drawn = { first: first, last: last, version: version };
    var nodes = [];
    for (var i = first; i < last; i++) nodes.push(taskRow(filtered[i], i));
    spacer.replaceChildren.apply(spacer, nodes);
    if (!filtered.length) spacer.appendChild(el("div", { class: "empty" }, "No task matches these filters."));
  }

  function taskRow(task, i) {
    var chips = task.attempts.map(function (a) {
      return el("span", { class: "chip o-" + a.outcome, title: a.method + (a.repeat ? " #" + a.repeat : "") + ": " + a.outcome },
        OUTCOME_MARK[a.outcome] + " " + a.method + (a.repeat ? " #" + a.repeat : ""));
    });
    return el("div", {
      class: "task-row" + (state.selected === task.key ? " selected" : ""), style: "top:" + i * ROW + "px",
      data: { task: task.key }, title: task.question,
      on: { click: function () { selectTask(task.key); } }
    },
      el("div", { class: "id" }, el("span", null, task.task_id), el("span", { class: "ds" }, task.dataset)),
      el("div", { class: "q" }, task.question || "(no trajectory)"),
      el("div", { class: "chips" }, chips));
  }

  var pending = false;
  list.addEventListener("scroll", function () {
    if (pending) return;
    pending = true;
    requestAnimationFrame(function () { pending = false; drawList(); });
  });
  window.addEventListener("resize", function () { drawn.version = -1; drawList(); });

  // ---------- filters ----------
  function fillSelect(select, label, values, labels) {
    select.appendChild(el("option", { value: "" }, label));
    values.forEach(function (v, i) { select.appendChild(el("option", { value: v }, labels ? labels[i] : (v || "(none)"))); });
  }
  var present = RUN.outcomes.filter(function (o) { return rows.some(function (r) { return r.outcome === o; }); });
  var outcomeValues = present.slice(), outcomeLabels = present.map(function (o) { return OUTCOME_LABEL[o]; });
  if (RUN.methods.length > 1) { outcomeValues.push("disagree"); outcomeLabels.push("methods disagree"); }
  fillSelect($("f-outcome"), "Any outcome", outcomeValues, outcomeLabels);
  fillSelect($("f-method"), "All methods", RUN.methods);
  fillSelect($("f-dataset"), "All datasets", RUN.datasets);

  function setFilters(changes) {
    for (var k in changes) state[k] = changes[k];
    $("q").value = state.q;
    $("f-outcome").value = state.outcome;
    $("f-method").value = state.method;
    $("f-dataset").value = state.dataset;
    applyFilters();
  }
  var typing = null;
  $("q").addEventListener("input", function () {
    clearTimeout(typing);
    typing = setTimeout(function () { state.q = $("q").value.trim(); applyFilters(); }, 80);
  });
  [["f-outcome", "outcome"], ["f-method", "method"], ["f-dataset", "dataset"]].forEach(function (pair) {
    $(pair[0]).addEventListener("change", function (e) { state[pair[1]] = e.target.value; applyFilters(); });
  });

  // ---------- routing: #task=KEY&a=ROW&b=ROW ----------
  function parseHash() {
    var out = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var i = part.indexOf("=");
      if (i > 0) out[part.slice(0, i)] = decodeURIComponent(part.slice(i + 1));
    });
    return out;
  }
  function go(params) {
    var parts = [];
    for (var k in params) if (params[k] !== null && params[k] !== undefined && params[k] !== "") parts.push(k + "=" + encodeURIComponent(params[k]));
    var hash = parts.length ? "#" + parts.join("&") : "#";
    if (location.hash === hash || (hash === "#" && !location.hash)) route();
    else location.hash = hash;
  }
  function selectTask(key) {
    var task = taskByKey.get(key);
    var a = defaultAttempt(task);
    go({ task: key, a: a === null ? null : a.key });
  }
  function defaultAttempt(task) {
    var atts = task.attempts.filter(function (r) { return !state.method || r.method === state.method; });
    return (atts.length ? atts : task.attempts)[0] || null;
  }
  function route() {
    var h = parseHash();
    var task = h.task ? taskByKey.get(h.task) : null;
    state.selected = task ? task.key : null;
    drawn.version = -1;
    drawList();
    var content = $("content");
    content.scrollTop = 0;
    if (!task) { content.replaceChildren(overview()); return; }
    var a = rowByKey(h.a, task) || defaultAttempt(task), b = rowByKey(h.b, task);
    content.replaceChildren(taskView(task, a, b));
  }
  function rowByKey(key, task) {
    if (key === undefined || key === null || key === "") return null;
    var row = rows[Number(key)];
    return row && task.attempts.indexOf(row) >= 0 ? row : null;
  }
  window.addEventListener("hashchange", route);
  $("nav-overview").addEventListener("click", function (e) { e.preventDefault(); go({}); });

  // ---------- overview ----------
  function overview() {
    var scored = rows.filter(function (r) { return r.outcome !== "unscored"; });
    var correct = scored.filter(function (r) { return r.outcome === "correct"; }).length;
    var stat = function (v, k) { return el("div", { class: "card stat" }, el("div", { class: "v" }, v), el("div", { class: "k" }, k)); };
    var multiDataset = RUN.datasets.length > 1;
    var body = el("tbody");
    RUN.summary.forEach(function (s) {
      if (s.dataset !== null && !multiDataset) return;
      var isMethod = s.dataset === null;
      var accuracy = s.accuracy === null ? el("span", { class: "muted" }, "—") :
        el("span", { class: "acc" }, el("span", { class: "bar" }, el("i", { style: "width:" + (100 * s.accuracy).toFixed(1) + "%" })),
          el("span", { class: "p" }, pct(s.accuracy)), el("span", { class: "muted n" }, num(s.correct) + "/" + num(s.scored)));
      body.appendChild(el("tr", {
        class: isMethod ? "method-row" : "ds-row", data: { method: s.method, dataset: s.dataset === null ? "" : s.dataset },
        title: "Show these tasks in the list",
        on: { click: function () { setFilters({ method: s.method, dataset: isMethod ? "" : s.dataset }); } }
      },
        el("td", null, s.method), el("td", null, isMethod ? (multiDataset ? "all datasets" : (RUN.datasets[0] || "—")) : (s.dataset || "(none)")),
        el("td", null, num(s.attempts)), el("td", null, accuracy), el("td", null, num(s.errors)),
        el("td", null, num(s.tokens)), el("td", null, dec(s.steps)), el("td", null, dec(s.stages)),
        el("td", null, dec(s.reconfigurations)), el("td", null, secs(s.duration))));
    });
    var head = el("tr", null, ["Method", "Dataset", "Attempts", "Accuracy", "Errors", "Tokens", "Steps", "Stages", "Reconfig.", "Time"].map(function (h) { return el("th", null, h); }));

    var outcomeLines = RUN.methods.map(function (m) {
      var mine = rows.filter(function (r) { return r.method === m; });
      var bar = el("div", { class: "stack", title: m });
      RUN.outcomes.forEach(function (o) {
        var n = mine.filter(function (r) { return r.outcome === o; }).length;
        if (n) bar.appendChild(el("i", { class: "s-" + o, style: "width:" + (100 * n / mine.length) + "%", title: o + ": " + n }));
      });
      return el("div", { class: "outcome-line" }, el("span", { class: "mono" }, m), bar);
    });
    var legend = el("div", { class: "legend" }, present.map(function (o) { return el("span", null, el("i", { class: "s-" + o }), OUTCOME_LABEL[o]); }));

    return el("div", { id: "overview" },
      el("div", { class: "crumbs" }, "Run overview"),
      el("h2", null, RUN.title),
      el("div", { class: "muted" }, "Generated " + RUN.generated + " from " + RUN.sources.join(", ")),
      el("h3", null, "At a glance"),
      el("div", { class: "stats" },
        stat(num(tasks.length), "tasks"), stat(num(rows.length), "attempts"), stat(num(RUN.methods.length), RUN.methods.length === 1 ? "method" : "methods"),
        stat(pct(scored.length ? correct / scored.length : null), "correct (all methods)"),
        stat(num(avg(rows, "tokens")), "tokens per attempt"), stat(dec(avg(rows, "stages")), "stages per attempt")),
      el("h3", null, "By method" + (multiDataset ? " and dataset" : "")),
      el("div", { class: "card" }, el("table", { class: "summary" }, el("thead", null, head), body)),
      el("h3", null, "Outcomes"),
      el("div", { class: "card" }, el("div", { class: "outcomes" }, outcomeLines), legend),
      el("div", { class: "hint" }, "Pick a task on the left to see how its configuration evolved, stage by stage. ",
        el("kbd", null, "/"), " search · ", el("kbd", null, "↑"), " ", el("kbd", null, "↓"), " move · ", el("kbd", null, "Esc"), " overview"));
  }
  function avg(items, field) { return items.length ? items.reduce(function (n, r) { return n + (r[field] || 0); }, 0) / items.length : null; }

  // ---------- task view ----------
  var cache = new Map();
  function detail(row) {
    if (!row.has_detail) return null;
    if (!cache.has(row.key)) cache.set(row.key, JSON.parse(DETAILS[row.key]));
    return cache.get(row.key);
  }
  function attemptLabel(r) { return r.method + (r.repeat ? " · repeat " + r.repeat : "") + " — " + OUTCOME_LABEL[r.outcome]; }

  function taskView(task, a, b) {
    var pick = function (current, allowNone, choices, onChange) {
      var select = el("select", { on: { change: function (e) { onChange(e.target.value); } } });
      if (allowNone) select.appendChild(el("option", { value: "" }, "— nothing —"));
      choices.forEach(function (r) { select.appendChild(el("option", { value: String(r.key) }, attemptLabel(r))); });
      select.value = current ? String(current.key) : "";
      return select;
    };
    var others = task.attempts.filter(function (r) { return r !== a; });
    if (b === a) b = null;
    var selectA = pick(a, false, task.attempts, function (v) { go({ task: task.key, a: v, b: b ? b.key : null }); });
    selectA.id = "pick-a";
    var selectB = pick(b, true, others, function (v) { go({ task: task.key, a: a.key, b: v }); });
    selectB.id = "pick-b";
    var picker = el("div", { class: "picker" }, el("span", { class: "muted" }, "Attempt"), selectA);
    if (others.length) picker.appendChild(el("span", { class: "muted" }, "side by side with"));
    if (others.length) picker.appendChild(selectB);
    var cols = el("div", { class: "cols" + (b ? " two" : "") }, attemptColumn(a, "a"));
    if (b) cols.appendChild(attemptColumn(b, "b"));
    return el("div", { id: "task", data: { task: task.key } },
      el("div", { class: "crumbs" }, el("a", { href: "#" }, "Overview"), " / " + (task.dataset || "—") + " / ", el("span", { class: "mono" }, task.task_id)),
      el("h2", { class: "question" }, (a && detail(a) ? detail(a).question : task.question) || "(no trajectory)"),
      task.reference !== null ? el("div", { class: "ref" }, "Reference answer: ", el("b", null, task.reference)) : null,
      picker, cols);
  }

  function attemptColumn(row, side) {
    var d = detail(row);
    var head = el("div", { class: "card attempt-head" },
      el("div", { class: "attempt-title" }, el("span", { class: "name" }, row.method + (row.repeat ? " #" + row.repeat : "")),
        el("span", { class: "badge o-" + row.outcome }, OUTCOME_MARK[row.outcome] + " " + OUTCOME_LABEL[row.outcome]),
        row.model ? el("span", { class: "muted" }, row.model) : null),
      el("div", { class: "answer" }, el("span", { class: "label" }, "Answer: "),
        el("span", { class: "text" }, answerOf(row, d))),
      el("div", { class: "facts" },
        fact(num(row.tokens), "tokens", d ? num(d.usage.prompt) + " prompt + " + num(d.usage.completion) + " completion" : null),
        fact(num(row.steps), word(row.steps, "step")), fact(num(row.stages), word(row.stages, "stage")),
        fact(num(row.reconfigurations), word(row.reconfigurations, "reconfiguration")),
        fact(secs(row.duration), ""), row.end_reason ? fact(row.end_reason, "end") : null),
      d && d.scorer && d.scorer.reason ? el("div", { class: "muted", style: "font-size:12px" }, "Scorer" + (d.scorer.name ? " (" + d.scorer.name + ")" : "") + ": " + d.scorer.reason) : null,
      (d && d.error) || row.error ? el("pre", { class: "error-box" }, (d && d.error) || row.error) : null);
    var col = el("div", { class: "attempt", data: { side: side, key: String(row.key) } }, head);
    if (!d) { col.appendChild(el("div", { class: "empty" }, "No trajectory was recorded for this attempt.")); return col; }
    col.appendChild(strip(d.stages, side));
    d.stages.forEach(function (s, i) { col.appendChild(stageCard(s, i, side)); });
    return col;
  }
  function answerOf(row, d) {
    var answer = d ? d.answer : row.answer;
    return answer === null || answer === undefined ? "(none)" : answer;
  }
  function fact(value, label, title) {
    return el("span", { title: title }, el("b", null, value), label ? " " + label : "");
  }

  function strip(stages, side) {
    return el("ol", { class: "strip" }, stages.map(function (s, i) {
      var steps = s.events.filter(function (e) { return e.kind === "step"; }).length;
      return el("li", { title: s.configuration.subgoal, on: { click: function () {
        var target = document.getElementById("stage-" + side + "-" + i);
        if (target) target.scrollIntoView({ behavior: "smooth", block: "start" });
      } } },
        el("div", null, el("span", { class: "n" }, "Stage " + (i + 1)), el("span", { class: "m" }, " · " + plural(steps, "step"))),
        el("div", { class: "sg" }, s.configuration.subgoal));
    }));
  }

  var FIELDS = [["subgoal", "Sub-goal"], ["strategy", "Strategy"], ["toolbox", "Toolbox"], ["knowledge", "Knowledge"],
                ["knowledge_summary", "Carried summary"], ["context_mode", "Context mode"]];

  function stageCard(s, i, side) {
    var c = s.configuration, ch = s.change, changed = {};
    ch.changed.forEach(function (f) { changed[f] = true; });
    var tokens = s.tokens.prompt + s.tokens.completion;
    var nsteps = s.events.filter(function (e) { return e.kind === "step"; }).length;
    var card = el("section", { class: "card stage", id: "stage-" + side + "-" + i, data: { stage: String(i) } },
      el("header", { class: "stage-head" },
        el("span", { class: "stage-num" }, "Stage " + (i + 1)),
        el("span", { class: "stage-subgoal" }, c.subgoal),
        el("span", { class: "stage-stats", title: num(s.tokens.prompt) + " prompt + " + num(s.tokens.completion) + " completion tokens, of which " +
          num(s.config_tokens.prompt + s.config_tokens.completion) + " writing this configuration" },
          plural(nsteps, "step") + " · " + num(tokens) + " tokens · " + secs(s.duration))));
    if (i > 0 && s.request && s.request.reason) {
      card.appendChild(el("div", { class: "opened" }, "Opened by reconfigure: ", el("q", null, s.request.reason)));
    }
    var dl = el("dl", { class: "config" });
    FIELDS.forEach(function (pair) {
      var f = pair[0];
      if (f === "knowledge_summary" && !c.knowledge_summary && !changed[f]) return;
      var row = el("div", { class: "cfg-row" + (changed[f] ? " changed" : ""), data: { field: f } });
      var dd;
      if (f === "toolbox") {
        dd = el("dd", null, el("div", { class: "tools" },
          ch.kept.map(function (t) { return el("span", { class: "tool" }, t); }),
          ch.added.map(function (t) { return el("span", { class: "tool added", title: "added in this stage" }, "+ " + t); }),
          ch.removed.map(function (t) { return el("span", { class: "tool removed", title: "removed in this stage" }, "− " + t); }),
          !c.toolbox.length && !ch.removed.length ? el("span", { class: "muted" }, "(no tools)") : null));
      } else {
        dd = el("dd", null, c[f] === "" ? el("span", { class: "muted" }, "(empty)") : c[f]);
        if (changed[f]) dd.appendChild(el("span", { class: "was" }, "was: ", el("s", null, String(ch.previous[f] || "(empty)"))));
      }
      row.appendChild(el("dt", null, pair[1], changed[f] ? el("span", { class: "tag" }, "changed") : null));
      row.appendChild(dd);
      dl.appendChild(row);
    });
    var meta = el("div", { class: "opened" }, "Configuration written by ", el("span", { class: "src src-" + s.source }, s.source),
      s.frozen && s.frozen.length ? " · frozen: " + s.frozen.join(", ") : "");
    card.appendChild(meta);
    card.appendChild(dl);
    if (s.problems && s.problems.length) {
      card.appendChild(el("div", { class: "problems" }, "Problems with the configuration the policy wrote:",
        el("ul", null, s.problems.map(function (p) { return el("li", null, p); }))));
    }
    var ol = el("ol", { class: "steps" });
    var n = 0;
    s.events.forEach(function (e) { if (e.kind === "step") n++; ol.appendChild(stepItem(e, n)); });
    card.appendChild(ol);
    if (s.summary !== null && s.summary !== undefined && !s.events.some(function (e) { return e.tool === "reconfigure" && !e.error; })) {
      card.appendChild(el("div", { class: "archived" }, el("span", { class: "label" }, "Archived summary"), s.summary));
    }
    return card;
  }

  function shortValue(v) { return typeof v === "string" ? JSON.stringify(v) : JSON.stringify(v); }

  function stepItem(e, n) {
    var li = el("li", { class: "step" + (e.error ? " error" : "") + (e.kind === "text" ? " textonly" : ""), data: { tool: e.tool || "" } });
    var thought = (e.thought || "").trim();
    if (e.reasoning) li.appendChild(collapsible("thought", e.reasoning, 4, 400, "div"));
    if (thought && e.kind === "step") li.appendChild(el("div", { class: "thought" }, thought));
    var metaBits = [];
    if (e.duration) metaBits.push(secs(e.duration));
    if (e.tokens) metaBits.push(num(e.tokens.prompt + e.tokens.completion) + " tok");
    if (e.kind === "text") {
      li.appendChild(el("div", { class: "step-head" }, el("span", { class: "step-n" }, ""), el("span", { class: "tool-name" }, "no tool call"),
        el("span", { class: "step-meta" }, metaBits.join(" · "))));
      li.appendChild(el("div", { class: "obs" }, el("pre", null, thought || "(empty reply)")));
      return li;
    }
    var args = e.arguments || {};
    var special = e.tool === "reconfigure" || e.tool === "terminate";
    var inline = "", block = false;
    if (!special) {
      var keys = Object.keys(args);
      inline = keys.map(function (k) { return k + ": " + shortValue(args[k]); }).join(", ");
      block = inline.length > 90 || keys.some(function (k) { return typeof args[k] === "string" && args[k].indexOf("\n") >= 0; });
    }
    li.appendChild(el("div", { class: "step-head" },
      el("span", { class: "step-n" }, String(n)), el("span", { class: "tool-name" }, e.tool || "(unreadable call)"),
      !special && !block ? el("span", { class: "args-inline", title: inline }, inline) : null,
      el("span", { class: "step-meta" }, metaBits.join(" · "))));
    if (special && !e.error) {
      li.appendChild(specialBox(e.tool, args));
      return li;
    }
    if (block || (special && e.error)) {
      li.appendChild(el("div", { class: "args" }, Object.keys(args).map(function (k) {
        var v = typeof args[k] === "string" ? args[k] : JSON.stringify(args[k], null, 2);
        return el("div", { class: "arg" }, el("div", { class: "k" }, k), collapsible("argval", v, 12, 900, "pre"));
      })));
    }
    li.appendChild(collapsible("obs", e.observation, 10, 700, "pre"));
    return li;
  }

  function specialBox(tool, args) {
    var box = el("div", { class: "special " + tool });
    var line = function (label, value) {
      if (value === null || value === undefined || value === "") return;
      box.appendChild(el("div", null, el("span", { class: "label" }, label), el("span", { class: "val" }, typeof value === "string" ? value : JSON.stringify(value))));
    };
    if (tool === "terminate") { line("answer", args.answer); return box; }
    line("archived summary", args.summary);
    line("reason", args.reason);
    line("next sub-goal", args.next_subgoal);
    line("toolbox request", args.toolbox_request);
    line("knowledge request", args.knowledge_request);
    line("strategy request", args.strategy_request);
    line("mode request", args.context_mode_request);
    return box;
  }

  // Long text shows its first lines, with a button for the rest; the full text is only put
  // in the DOM when asked for.
  function collapsible(kind, text, maxLines, maxChars, tag) {
    text = text === null || text === undefined ? "" : String(text);
    var wrap = el("div", { class: kind === "obs" ? "obs" : kind === "thought" ? "thought" : "argv" });
    var lines = text.split("\n");
    var long = lines.length > maxLines || text.length > maxChars;
    if (!long) { wrap.appendChild(el(tag, null, text)); return wrap; }
    var preview = lines.slice(0, maxLines).join("\n");
    if (preview.length > maxChars) preview = preview.slice(0, maxChars);
    var body = el(tag, null, preview);
    wrap.classList.add("clipped");
    var button = el("button", { class: "more", type: "button" }, "Show all · " + plural(lines.length, "line") + ", " + plural(text.length, "character"));
    var open = false;
    button.addEventListener("click", function () {
      open = !open;
      body.textContent = open ? text : preview;
      wrap.classList.toggle("clipped", !open);
      button.textContent = open ? "Show less" : "Show all · " + plural(lines.length, "line") + ", " + plural(text.length, "character");
    });
    wrap.appendChild(body);
    wrap.appendChild(button);
    return wrap;
  }

  // ---------- keyboard ----------
  document.addEventListener("keydown", function (e) {
    var typingInField = /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement && document.activeElement.tagName);
    if (e.key === "/" && !typingInField) { e.preventDefault(); $("q").focus(); return; }
    if (e.key === "Escape") { if (typingInField) document.activeElement.blur(); else go({}); return; }
    if ((e.key === "ArrowDown" || e.key === "ArrowUp" || e.key === "j" || e.key === "k") && !typingInField) {
      if (!filtered.length) return;
      e.preventDefault();
      var i = filtered.findIndex(function (t) { return t.key === state.selected; });
      var next = e.key === "ArrowDown" || e.key === "j" ? Math.min(filtered.length - 1, i + 1) : Math.max(0, i - 1);
      var top = next * ROW;
      if (top < list.scrollTop) list.scrollTop = top;
      else if (top + ROW > list.scrollTop + list.clientHeight) list.scrollTop = top + ROW - list.clientHeight;
      selectTask(filtered[next].key);
    }
  });

  // ---------- start ----------
  $("run-title").textContent = RUN.title;
  $("run-meta").textContent = plural(tasks.length, "task") + " · " + plural(rows.length, "attempt") + " · " + plural(RUN.methods.length, "method");
  document.title = RUN.title + " · toolself";
  applyFilters();
  route();
  window.TOOLSELF_READY = performance.now();
  document.body.dataset.ready = "1";
})();
