// sandrl view: the page of one run. Everything an episode holds came from a model or a sandbox:
// it is only ever set as text (textContent, SVG text nodes), never parsed as markup.
"use strict";

(function () {
  const COLORS = ["#2f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#0598bc", "#bf3989", "#57606a"];
  const PHASE_COLORS = { sandbox_create_s: "#8250df", setup_s: "#a475f9", model_s: "#2f6feb", sandbox_wait_s: "#d4a72c",
    verifier_s: "#1a7f37", close_s: "#57606a" };
  const PAGE = 100;
  const embedded = document.getElementById("sandrl-data");
  const state = { summary: null, offset: 0, filters: {}, selected: null };

  // -- where the data comes from: this app's JSON, or the data embedded in a report file -------------
  const source = embedded ? staticSource(JSON.parse(embedded.textContent)) : liveSource();

  function liveSource() {
    async function get(path) {
      const response = await fetch(path, { cache: "no-store" });
      const body = await response.json();
      if (!response.ok) throw new Error(body.error || response.statusText);
      return body;
    }
    return {
      live: true,
      summary: () => get("/api/summary"),
      episodes: (filters, offset) => {
        const query = new URLSearchParams({ offset: String(offset), limit: String(PAGE) });
        for (const [key, value] of Object.entries(filters)) if (value !== "" && value != null) query.set(key, value);
        return get("/api/episodes?" + query.toString());
      },
      episode: (n) => get("/api/episode/" + encodeURIComponent(n)),
    };
  }

  function staticSource(data) {
    const tests = {
      passed: (r) => r.passed === true, failed: (r) => r.passed === false, truncated: (r) => r.status === "truncated",
      agent_error: (r) => r.status === "agent_error", infra_error: (r) => r.status === "infra_error",
    };
    return {
      live: false,
      summary: async () => data.summary,
      episodes: async (filters, offset) => {
        const rows = data.rows.filter((r) =>
          (!filters.step || String(r.step) === String(filters.step)) && (!filters.task || r.task_id === filters.task) &&
          (!filters.source || r.task_set === filters.source) && (!filters.group || r.group_id === filters.group) &&
          (!filters.status || (tests[filters.status] && tests[filters.status](r))));
        return { total: rows.length, offset: offset, rows: rows.slice(offset, offset + PAGE) };
      },
      episode: async (n) => {
        const page = data.episodes[String(n)];
        if (!page) throw new Error("episode " + n + " is not in this report (it holds " + data.rows.length + "; `sandrl view RUN_DIR` reads them all)");
        return page;
      },
    };
  }

  // -- small DOM helpers: text only ----------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") for (const rule of String(value).split(";")) {
        // CSSOM, not a style attribute: the page's policy allows no inline style.
        const at = rule.indexOf(":");
        if (at > 0) node.style.setProperty(rule.slice(0, at).trim(), rule.slice(at + 1).trim());
      }
      else if (key === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) append(node, child);
    return node;
  }
  function append(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) child.forEach((c) => append(node, c));
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
  function svg(tag, attrs, text) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = String(text);
    return node;
  }
  function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
  function fmt(value, digits) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value) && Math.abs(value) < 1e6) return String(value);
    const d = digits === undefined ? 3 : digits;
    if (Math.abs(value) >= 1000) return value.toFixed(0);
    if (Math.abs(value) > 0 && Math.abs(value) < 0.001) return value.toExponential(2);
    return value.toFixed(d);
  }
  function pct(value) { return value === null || value === undefined ? "–" : (100 * value).toFixed(1) + "%"; }
  function badge(status, passed) {
    const name = status === "completed" || status === "truncated" ? (passed === true ? "passed" : passed === false ? "failed" : status) : status;
    return el("span", { class: "badge " + name }, name.replace("_", " "));
  }
  function notice(text) {
    const box = document.getElementById("notice");
    box.hidden = !text;
    box.textContent = text || "";
  }

  // -- curves ---------------------------------------------------------------------------------------
  function chart(title, keys, curves) {
    const steps = curves.steps;
    const lines = keys.map((key, i) => ({ key, color: COLORS[i % COLORS.length], values: curves.series[key] || [] }));
    const points = keys.flatMap((key, i) => (curves.points[key] || []).map((p) => ({ ...p, key, color: COLORS[i % COLORS.length] })));
    const all = lines.flatMap((l) => l.values.filter((v) => v !== null)).concat(points.map((p) => p.value));
    const box = el("div", { class: "chart", "data-chart": title }, el("h3", {}, title));
    if (!all.length) { box.appendChild(el("p", { class: "hint" }, "nothing measured yet")); return box; }
    let lo = Math.min(...all), hi = Math.max(...all);
    if (lo === hi) { lo -= Math.abs(lo) * 0.1 || 1; hi += Math.abs(hi) * 0.1 || 1; }
    const xs = steps.length ? steps : [0, 1];
    const x0 = Math.min(0, ...points.map((p) => p.step), xs[0]), x1 = Math.max(xs[xs.length - 1], ...points.map((p) => p.step), x0 + 1);
    const W = 420, H = 190, L = 44, R = 8, T = 8, B = 22;
    const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
    const sy = (y) => T + (1 - (y - lo) / (hi - lo)) * (H - T - B);
    const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
    for (let i = 0; i <= 4; i++) {
      const y = lo + ((hi - lo) * i) / 4;
      root.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
      root.appendChild(svg("text", { x: L - 4, y: sy(y) + 3, "text-anchor": "end" }, fmt(y, 2)));
    }
    root.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    for (const x of [x0, Math.round((x0 + x1) / 2), x1]) root.appendChild(svg("text", { x: sx(x), y: H - 6, "text-anchor": "middle" }, "step " + x));
    for (const line of lines) {
      let path = "", pen = false;
      line.values.forEach((v, i) => {
        if (v === null) { pen = false; return; }
        path += (pen ? "L" : "M") + sx(steps[i]).toFixed(1) + "," + sy(v).toFixed(1);
        pen = true;
      });
      if (path) root.appendChild(svg("path", { d: path, fill: "none", stroke: line.color, "stroke-width": 1.6 }));
      const solo = line.values.filter((v) => v !== null).length < 3;
      line.values.forEach((v, i) => {
        if (v === null || (!solo && line.values.length > 60)) return;
        const dot = svg("circle", { cx: sx(steps[i]), cy: sy(v), r: 2.2, fill: line.color });
        dot.appendChild(svg("title", {}, `${line.key} step ${steps[i]}: ${fmt(v)}`));
        root.appendChild(dot);
      });
    }
    for (const p of points) {
      const dot = svg("rect", { x: sx(p.step) - 4, y: sy(p.value) - 4, width: 8, height: 8, fill: p.color });
      dot.appendChild(svg("title", {}, `${p.label} (step ${p.step}): ${fmt(p.value)}`));
      root.appendChild(dot);
    }
    box.appendChild(root);
    box.appendChild(el("div", { class: "legend" }, lines.map((l) => {
      const last = l.values.filter((v) => v !== null).pop();
      return el("span", {}, el("i", { style: "background:" + l.color }), l.key + (last !== undefined ? " " + fmt(last) : ""));
    })));
    return box;
  }

  function renderCurves(summary) {
    const charts = clear(document.getElementById("charts"));
    const curves = summary.curves;
    if (!curves.steps.length && !Object.keys(curves.points).length) {
      charts.appendChild(el("p", { class: "hint" }, summary.run.kind === "eval"
        ? "An eval has no steps: its tasks and episodes are in the other views."
        : "No step has ended yet: the curves appear with the first line of metrics.jsonl."));
    }
    for (const panel of summary.panels) if (panel.series.length) charts.appendChild(chart(panel.title, panel.series, curves));
    const pick = document.getElementById("metric-pick");
    const chosen = pick.value;
    clear(pick).appendChild(el("option", { value: "" }, "choose..."));
    Object.keys(curves.series).sort().forEach((key) => pick.appendChild(el("option", { value: key }, key)));
    pick.value = chosen;
    if (chosen) charts.appendChild(chart(chosen, [chosen], curves));
    const reports = clear(document.getElementById("reports"));
    if (summary.reports.length) {
      reports.appendChild(el("h2", {}, "Reports"));
      for (const name of summary.reports) {
        reports.appendChild(source.live ? el("a", { href: "/reports/" + name.split("/").map(encodeURIComponent).join("/"), target: "_blank", rel: "noopener noreferrer" }, name) : el("span", { class: "label" }, name + " "));
      }
    }
  }

  // -- tasks ---------------------------------------------------------------------------------------
  function spark(buckets) {
    const W = 90, H = 18, root = svg("svg", { class: "spark", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
    if (!buckets.length) return root;
    const step = buckets.length > 1 ? (W - 4) / (buckets.length - 1) : 0;
    let path = "";
    buckets.forEach((b, i) => { path += (i ? "L" : "M") + (2 + i * step).toFixed(1) + "," + (H - 2 - b[2] * (H - 4)).toFixed(1); });
    root.appendChild(svg("path", { d: path, fill: "none", stroke: "#2f6feb", "stroke-width": 1.5 }));
    const title = buckets.map((b) => `steps ${b[0]}-${b[1] === null ? "" : b[1]}: ${pct(b[2])}`).join("\n");
    root.appendChild(svg("title", {}, title));
    return root;
  }

  const SORTS = {};
  const COLUMNS = [["name", "name"], ["episodes", "episodes"], ["pass rate", "pass_rate"], ["over steps", null],
    ["mean reward", "reward_mean"], ["retries", "retries"], ["truncated", "truncated"], ["agent errors", "agent_errors"],
    ["infra errors", "infra_errors"]];

  function taskTable(table, rows, key) {
    clear(table);
    const sort = SORTS[key];
    if (sort) {
      const [field, direction] = sort;
      rows = rows.slice().sort((a, b) => {
        const x = a[field], y = b[field];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * direction;
      });
    }
    table.appendChild(el("tr", {}, COLUMNS.map(([label, field]) => el("th", field ? {
      class: "click", title: "sort by " + label,
      on: { click: () => { SORTS[key] = [field, sort && sort[0] === field ? -sort[1] : (field === "name" ? 1 : -1)]; taskTable(table, rows, key); } },
    } : {}, label + (sort && sort[0] === field ? (sort[1] > 0 ? " \u25b2" : " \u25bc") : "")))));
    for (const row of rows.slice(0, 2000)) {
      table.appendChild(el("tr", { class: "click", title: "read its episodes", on: { click: () => go({ view: "episodes", [key]: row.name }) } },
        el("td", {}, row.name || "(none)"), el("td", {}, row.episodes), el("td", {}, pct(row.pass_rate)), el("td", {}, spark(row.over_steps)),
        el("td", {}, fmt(row.reward_mean)), el("td", {}, row.retries), el("td", {}, row.truncated), el("td", {}, row.agent_errors), el("td", {}, row.infra_errors)));
    }
    if (rows.length > 2000) table.appendChild(el("tr", {}, el("td", { colspan: 9 }, `... and ${rows.length - 2000} more`)));
  }

  // -- episodes ------------------------------------------------------------------------------------
  function fillFilters(summary) {
    const form = document.getElementById("filters");
    const fill = (name, values) => {
      const select = form.elements[name];
      const chosen = state.filters[name] || "";
      clear(select).appendChild(el("option", { value: "" }, "all"));
      values.forEach((v) => select.appendChild(el("option", { value: v }, v === "" ? "(none)" : String(v).replace("_", " "))));
      select.value = chosen;
    };
    fill("step", summary.filters.steps);
    fill("status", summary.filters.statuses);
    fill("source", summary.sources.map((s) => s.name));
    const names = clear(document.getElementById("task-names"));
    summary.tasks.slice(0, 5000).forEach((t) => names.appendChild(el("option", { value: t.name })));
    form.elements.task.value = state.filters.task || "";
  }

  async function loadList(more) {
    const list = document.getElementById("episode-list");
    if (!more) { state.offset = 0; clear(list); }
    const page = await source.episodes(state.filters, state.offset);
    const old = list.querySelector(".more");
    if (old) old.remove();
    document.getElementById("list-count").textContent = page.total + " episodes";
    for (const row of page.rows) {
      list.appendChild(el("div", { class: "ep" + (state.selected === row.n ? " on" : ""), "data-n": row.n, on: { click: () => go({ view: "episodes", ...state.filters, episode: row.n }) } },
        el("div", { class: "id" }, row.task_id + "  #" + row.episode_id.split("/").pop()),
        el("div", { class: "meta" }, badge(row.status, row.passed), " reward ", fmt(row.reward), row.step ? " · step " + row.step : "",
          " · ", row.stop_reason || "", " · ", fmt(row.total_s, 1), "s", row.error ? " · " + row.error : "")));
    }
    state.offset += page.rows.length;
    if (state.offset < page.total) list.appendChild(el("button", { class: "more", type: "button", on: { click: () => loadList(true) } }, `more (${page.total - state.offset} left)`));
  }

  function phases(timings) {
    const keys = ["sandbox_create_s", "setup_s", "model_s", "sandbox_wait_s", "verifier_s", "close_s"];
    const total = Math.max(timings.total_s || 0, keys.reduce((s, k) => s + (timings[k] || 0), 0)) || 1;
    const bar = el("div", { class: "phases" });
    for (const key of keys) {
      if (!timings[key]) continue;
      bar.appendChild(el("span", { style: `width:${(100 * timings[key] / total).toFixed(2)}%;background:${PHASE_COLORS[key]}`, title: `${key.replace("_s", "")} ${fmt(timings[key], 2)} s` }));
    }
    const legend = el("div", { class: "legend" }, keys.filter((k) => timings[k]).map((k) => el("span", {}, el("i", { style: "background:" + PHASE_COLORS[k] }), `${k.replace("_s", "").replace("sandbox_wait", "commands")} ${fmt(timings[k], 2)}s`)));
    return [bar, legend];
  }

  function pre(cls, text) { return el("pre", { class: cls }, text); }

  function tokenView(tokens, episode) {
    const box = el("div", { class: "tokens" });
    const newest = episode.weight_version;
    tokens.parts.forEach((part, p) => {
      if (p > 0) box.appendChild(el("span", { class: "gap" }, `[... tokens ${tokens.parts[p - 1].start + tokens.parts[p - 1].rows.length}-${part.start - 1} not shown ...]`));
      part.rows.forEach((row, i) => {
        const [piece, trained, version, logprob, id] = row;
        let cls = trained ? "trained" : "ctx";
        // An episode sampled across a weight update: its tokens from weights newer than its first.
        if (trained && version !== null && version !== undefined && newest !== null && version > newest) cls += " v-newer";
        const title = `#${part.start + i} id ${id} · ${trained ? "trained" : "loss-masked"}` + (version !== null && version !== undefined ? ` · weights v${version}` : "") + (logprob !== null && logprob !== undefined ? ` · logprob ${logprob}` : "");
        box.appendChild(el("span", { class: cls, title }, piece));
      });
    });
    return box;
  }

  function episodeView(e, compact) {
    const box = el("div", { class: "episode", "data-episode": e.number });
    box.appendChild(el("h2", {}, e.task_id, " ", badge(e.status, e.passed)));
    box.appendChild(el("div", { class: "facts" },
      el("span", {}, "reward ", el("b", {}, fmt(e.reward))), el("span", {}, "stop ", el("b", {}, e.stop_reason || "–")),
      e.step ? el("span", {}, "step ", el("b", {}, e.step)) : null, el("span", {}, "sample ", el("b", {}, e.sample_index)),
      el("span", {}, "attempt ", el("b", {}, e.attempt)), el("span", {}, "weights ", el("b", {}, e.weight_version === null ? "–" : "v" + e.weight_version)),
      el("span", {}, "total ", el("b", {}, fmt(e.timings.total_s, 2) + " s")), el("span", {}, "source ", el("b", {}, e.task_set || "–")),
      e.engine_moves ? el("span", { title: "calls that moved to another engine when theirs died (each a re-prefill)" }, "engine moves ", el("b", {}, e.engine_moves)) : null));
    box.appendChild(el("div", { class: "label" }, e.episode_id, e.image ? " · image " + e.image : ""));
    box.append(...phases(e.timings));
    if (!compact && e.group && e.group.length > 1) {
      box.appendChild(el("div", { class: "group" }, "Its group: ", e.group.filter((g) => g.n !== e.number).map((g) =>
        el("button", { type: "button", title: "side by side", on: { click: () => go({ view: "episodes", ...state.filters, episode: e.number, compare: g.n }) } },
          `sample ${g.sample_index} ${g.passed === true ? "passed" : g.passed === false ? "failed" : ""}`))));
    }
    if (e.error) box.appendChild(el("div", { class: "block" }, el("h4", {}, `error (${e.error.kind}, ${e.error.phase}): ${e.error.error_code}`), pre("bad", e.error.message)));
    for (const r of e.retried_errors) box.appendChild(el("div", { class: "label" }, `retried after: ${r.error_code} in ${r.phase}: ${r.message.slice(0, 300)}`));
    if (!e.decoded) box.appendChild(el("p", { class: "hint" }, "The ids are not decoded: no tokenizer for this run (`sandrl view RUN_DIR --model MODEL`)."));
    if (e.prompt) box.appendChild(el("details", {}, el("summary", {}, "prompt"), pre("", e.prompt)));
    for (const t of e.turns) {
      const turn = el("div", { class: "turn", "data-turn": t.index },
        el("h4", {}, `turn ${t.index + 1} · model ${fmt(t.model_s, 2)} s · ${t.output_tokens} tokens` + (t.weight_version !== null ? ` · v${t.weight_version}` : "") + (t.finish_reason ? ` · ${t.finish_reason}` : "")));
      if (t.reply) turn.appendChild(pre("reply", t.reply));
      for (const call of t.tool_calls) turn.appendChild(el("div", { class: "block" }, el("h4", {}, call.error ? "tool call (malformed)" : "tool call " + call.name), pre("command", call.error || call.arguments)));
      if (t.command !== null) {
        turn.appendChild(el("h4", {}, `command · exit ${t.exit_code === null ? "–" : t.exit_code}${t.timed_out ? " · timed out" : ""} · ${fmt(t.command_s, 3)} s`));
        turn.appendChild(pre("command", t.command));
      }
      if (t.output) turn.appendChild(el("div", { class: "block" }, el("h4", {}, "observation" + (t.output_truncated ? " (cut)" : "")), pre(t.exit_code ? "bad" : "", t.output)));
      box.appendChild(turn);
    }
    const v = e.verifier;
    box.appendChild(el("div", { class: "block verifier" }, el("h4", {}, `verifier · exit ${v.exit_code === null || v.exit_code === undefined ? "–" : v.exit_code}${v.timed_out ? " · timed out" : ""} · ${fmt(v.duration_s, 2)} s · reward ${fmt(e.reward)}`),
      v.error ? pre("bad", v.error) : null, v.output ? pre("", v.output) : el("div", { class: "label" }, "(it printed nothing that was kept)"),
      v.details ? el("details", {}, el("summary", {}, "details"), pre("", v.details)) : null));
    if (!compact && e.tokens.count) {
      box.appendChild(el("details", { open: e.tokens.count <= 4000 ? "" : null },
        el("summary", {}, `tokens as trained (${e.tokens.count}; shaded: loss-masked; hover: id, weights, logprob)`), tokenView(e.tokens, e)));
    }
    return box;
  }

  async function showEpisode(n, compare) {
    const view = clear(document.getElementById("episode-view"));
    state.selected = n;
    for (const item of document.querySelectorAll(".ep")) item.classList.toggle("on", item.getAttribute("data-n") === String(n));
    try {
      const first = await source.episode(n);
      if (compare === undefined || compare === null || compare === "") { view.appendChild(episodeView(first, false)); return; }
      const second = await source.episode(compare);
      view.appendChild(el("p", {}, el("button", { type: "button", class: "back", on: { click: () => go({ view: "episodes", ...state.filters, episode: n }) } }, "back to one episode")));
      view.appendChild(el("div", { class: "episodes-side" }, episodeView(first, true), episodeView(second, true)));
    } catch (error) {
      view.appendChild(el("p", { class: "hint" }, String(error.message || error)));
    }
  }

  // -- routing: #curves, #tasks, #episodes?step=3&status=failed&episode=12&compare=14 ----------------
  function parse() {
    const hash = location.hash.slice(1);
    const [view, query] = hash.split("?");
    const params = Object.fromEntries(new URLSearchParams(query || ""));
    return { view: view || "curves", ...params };
  }
  function go(route) {
    const { view, ...params } = route;
    const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== undefined && v !== null)).toString();
    location.hash = view + (query ? "?" + query : "");
  }
  let lastFilters = null;
  async function route() {
    const r = parse();
    for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== "view-" + r.view;
    for (const link of document.querySelectorAll("nav a")) link.classList.toggle("on", link.getAttribute("data-view") === r.view);
    if (r.view !== "episodes") return;
    state.filters = { step: r.step || "", status: r.status || "", source: r.source || "", task: r.task || "", group: r.group || "" };
    if (state.summary) fillFilters(state.summary);
    const key = JSON.stringify(state.filters);
    if (key !== lastFilters) { lastFilters = key; await loadList(false); }
    if (r.episode !== undefined) await showEpisode(Number(r.episode), r.compare);
  }

  async function refresh() {
    try {
      const summary = await source.summary();
      state.summary = summary;
      const run = summary.run;
      document.getElementById("run-name").textContent = run.name;
      document.title = "sandrl view · " + run.name;
      const parts = run.kind === "train"
        ? [(run.mode || "train") + " run", `${run.steps}${run.planned_steps ? "/" + run.planned_steps : ""} steps`, `${run.episodes} episodes`]
        : [run.kind === "eval" ? "eval" : "episodes", `${run.episodes} episodes`];
      const s = summary.statuses;
      parts.push(`${s.passed} passed, ${s.failed} failed, ${s.truncated} truncated, ${s.agent_error} agent errors, ${s.infra_error} infra errors`);
      if (summary.results && summary.results["pass@1"] !== undefined) parts.push("pass@1 " + fmt(summary.results["pass@1"]));
      document.getElementById("run-meta").textContent = parts.join(" · ");
      const notes = [];
      if (run.unreadable_count) notes.push(`${run.unreadable_count} lines of rollouts.jsonl are not episodes (${run.unreadable[0]})`);
      if (!summary.tokenizer.loaded && summary.tokenizer.note) notes.push(summary.tokenizer.note);
      notice(notes.join("; "));
      renderCurves(summary);
      taskTable(document.getElementById("sources"), summary.sources, "source");
      taskTable(document.getElementById("tasks"), summary.tasks, "task");
      fillFilters(summary);
      document.body.setAttribute("data-ready", "1");
    } catch (error) {
      notice("could not read the run: " + (error.message || error));
    }
  }

  document.getElementById("filters").addEventListener("change", (event) => {
    const form = event.currentTarget;
    go({ view: "episodes", step: form.elements.step.value, status: form.elements.status.value,
      source: form.elements.source.value, task: form.elements.task.value });
  });
  document.getElementById("metric-pick").addEventListener("change", () => state.summary && renderCurves(state.summary));
  window.addEventListener("hashchange", route);
  refresh().then(route);
  if (source.live) setInterval(() => { if (!document.hidden) refresh(); }, 10000);
})();
