"use strict";
// The lineage view of `roar ui` and `roar dag --html`. No library: a layered layout (longest
// path, barycentre ordering) drawn as SVG, sized for the graphs roar records (hundreds to a few
// thousand nodes once directories are collapsed). Every recorded string reaches the page through
// textContent or an SVG text node, never as markup.
(() => {
  const config = JSON.parse(document.getElementById("roar-config").textContent);
  const embedded = JSON.parse(document.getElementById("roar-data").textContent);
  const token = new URLSearchParams(location.search).get("token") || "";
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  // ---- Data: the JSON the commands print, fetched from `roar ui` or embedded in the file.
  async function get(path) {
    const r = await fetch(path, { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
    if (!r.ok) throw new Error((await r.text()).trim() || r.statusText);
    return r.json();
  }
  const pair = (a, b) => (a < b ? [a, b] : [b, a]);
  const source = config.mode === "file"
    ? {
        dag: async () => embedded.dag,
        status: async () => embedded.status,
        job: async (id) => embedded.jobs[id] || null,
        diff: async (a, b) => embedded.diffs[pair(a, b).join("-")] || null,
        runs: async (id) => { const name = (embedded.run_of || {})[id]; return { name: name || null, runs: name ? embedded.runs[name] : [] }; },
      }
    : {
        dag: () => get("/api/dag"),
        status: () => get("/api/status").catch(() => null),
        job: (id) => get("/api/job/" + id),
        diff: (a, b) => { const [x, y] = pair(a, b); return get(`/api/diff?a=${x}&b=${y}`); },
        runs: (id) => get(`/api/runs?job=${id}`),
      };

  // ---- Small helpers.
  const rel = (p) => (p.startsWith(config.root + "/") ? p.slice(config.root.length + 1) : p);
  const parentOf = (p) => { const i = p.lastIndexOf("/"); return i === 0 ? "/" : i < 0 ? "" : p.slice(0, i); };
  const baseName = (p) => p.slice(p.lastIndexOf("/") + 1) || p;
  const short = (h) => (h ? h.blake3.slice(0, 12) : "?".repeat(12));
  const quote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'");
  const argvText = (argv) => argv.map(quote).join(" ");
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);
  const time = (ns) => (ns ? new Date(ns / 1e6).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "");
  const size = (n) => (n < 1024 ? n + " B" : n < 1 << 20 ? (n / 1024).toFixed(1) + " KiB" : n < 1 << 30 ? (n / (1 << 20)).toFixed(1) + " MiB" : (n / (1 << 30)).toFixed(2) + " GiB");
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "onclick") e.addEventListener("click", v);
      else if (v !== null && v !== undefined) e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  // ---- The graph model: job nodes and file-version nodes (a location at the content one
  // producer left there; root inputs keyed by content), directories of many files of one role of
  // one job collapsed into one node as `roar dag` does, unless expanded.
  const state = { dag: { steps: [] }, status: null, expanded: new Set(), selected: null, highlight: null, compareFrom: null, view: null, model: null, allRuns: false };

  // The steps drawn: the latest runs (a run a later run of the same command replaced, and that
  // nothing current read, is `superseded` in the record: SEMANTICS.md "Latest runs"), or all.
  const drawn = () => state.dag.steps.filter((s) => state.allRuns || !s.superseded);

  function collapsedDirs(steps) {
    const out = new Set();
    for (const s of steps) {
      for (const edges of [s.inputs, s.outputs]) {
        const count = new Map();
        for (const e of edges) count.set(parentOf(e.path), (count.get(parentOf(e.path)) || 0) + 1);
        for (const [d, n] of count) if (n >= config.collapse_at && !state.expanded.has(d)) out.add(d);
      }
    }
    return out;
  }

  // A job, or one of its steps (a job that has steps is drawn as its steps: `3.2`).
  const nodeOf = (job, step) => (step ? `${job}.${step}` : `${job}`);

  function fileKey(e, at) {
    return at ? `v${e.path}@${at}` : `v${e.path}#${e.hash ? e.hash.blake3 : "?"}`;
  }

  function buildModel(dag) {
    const nodes = new Map();
    const edges = [];
    const seen = new Set();
    const link = (from, to, kind) => {
      if (!seen.has(from + "\n" + to)) { seen.add(from + "\n" + to); edges.push({ from, to, kind }); }
    };
    const steps = drawn();
    const dirs = collapsedDirs(steps);
    // `producer`: the job that made the version; `at`: that job or its step (the node's key).
    const addFile = (e, producer, at) => {
      const d = parentOf(e.path);
      if (dirs.has(d)) {
        const key = `d${d}@${at || 0}`;
        let n = nodes.get(key);
        if (!n) nodes.set(key, (n = { key, kind: "dir", dir: d, producer, files: new Map(), readers: new Set() }));
        n.files.set(e.path, e);
        return n;
      }
      const key = fileKey(e, at);
      let n = nodes.get(key);
      if (!n) nodes.set(key, (n = { key, kind: "file", path: e.path, hash: e.hash, producer, copyOf: e.copy_of, readers: new Set() }));
      return n;
    };
    for (const s of steps) {
      const key = "j" + nodeOf(s.job_id, s.step);
      nodes.set(key, { key, kind: "job", step: s });
    }
    for (const s of steps) {
      const j = "j" + nodeOf(s.job_id, s.step);
      for (const e of s.inputs) {
        const at = e.producer ? nodeOf(e.producer, e.producer_step) : null;
        const n = addFile(e, e.producer, at);
        n.readers.add(s.job_id);
        link(n.key, j, "in");
        // The same bytes found at another location, where its producer wrote them.
        if (n.kind === "file" && e.copy_of && at && nodes.has(`v${e.copy_of}@${at}`)) link(`v${e.copy_of}@${at}`, n.key, "copy");
      }
      for (const e of s.outputs) {
        link(j, addFile(e, s.job_id, nodeOf(s.job_id, s.step)).key, "out");
      }
    }
    // Versions of a location other than the last one recorded there are old.
    const latest = new Map();
    for (const n of nodes.values()) {
      if (n.kind !== "file") continue;
      const when = Math.max(n.producer || 0, ...n.readers);
      if (!latest.has(n.path) || latest.get(n.path).when < when) latest.set(n.path, { when, key: n.key });
    }
    for (const n of nodes.values()) if (n.kind === "file") n.old = latest.get(n.path).key !== n.key;
    return { nodes, edges, dirs };
  }

  // ---- Status: stale jobs and their outputs, files modified or deleted since recorded.
  // Indexed once per report: every node asks.
  let index = null;
  function statusIndex() {
    const st = state.status;
    if (!index || index.of !== st) {
      index = { of: st, changed: new Map(), staleJobs: new Set(), staleOutputs: new Set() };
      for (const c of st.changed) index.changed.set(c.path, c);
      for (const s of st.stale) {
        index.staleJobs.add(s.job);
        for (const o of s.outputs) index.staleOutputs.add(s.job + "\n" + o);
      }
    }
    return index;
  }
  function statusOf(n) {
    if (!state.status) return null;
    const ix = statusIndex();
    if (n.kind === "job") {
      if (ix.staleJobs.has(n.step.job_id)) return "stale";
      // Nor is it "up to date" when a version it made that is still the latest at its location
      // is gone or changed.
      const at = nodeOf(n.step.job_id, n.step.step);
      const latest = n.step.outputs.filter((e) => { const f = state.model.nodes.get(fileKey(e, at)); return !f || !f.old; });
      const change = latest.map((e) => ix.changed.get(e.path)).filter(Boolean);
      if (!change.length) return "ok";
      return change.length === latest.length && change.every((c) => c.state === "deleted") ? "missing" : "modified";
    }
    if (n.kind === "file" && n.old) return "old";
    const paths = n.kind === "dir" ? [...n.files.keys()] : [n.path];
    for (const p of paths) {
      const c = ix.changed.get(p);
      if (c) return c.state === "deleted" ? "missing" : "modified";
    }
    if (n.producer && paths.some((p) => ix.staleOutputs.has(n.producer + "\n" + p))) return "stale";
    return "ok";
  }
  const STATUS_TEXT = { ok: "up to date", stale: "stale", modified: "modified since recorded", missing: "deleted since recorded", old: "an older version" };
  const JOB_STATUS_TEXT = { ...STATUS_TEXT, modified: "outputs changed since recorded", missing: "outputs deleted since recorded" };
  const statusText = (n, st) => (n.kind === "job" ? JOB_STATUS_TEXT : STATUS_TEXT)[st];

  // ---- Layout (Sugiyama's method, simply): layers by longest path with root inputs pulled next
  // to their first reader; an edge that spans layers gets a lane point in each layer it crosses;
  // order in each layer by barycentre sweeps; then each layer is placed near its neighbours
  // without overlap. Left to right, like `roar dag --dot`.
  const W = 260, H_JOB = 46, H_FILE = 36, H_LANE = 4, GAP_X = 90, GAP_Y = 14;
  function layout(model) {
    const { nodes, edges } = model;
    const succ = new Map(), pred = new Map();
    for (const k of nodes.keys()) { succ.set(k, []); pred.set(k, []); }
    for (const e of edges) { succ.get(e.from).push(e.to); pred.get(e.to).push(e.from); }
    const indeg = new Map([...nodes.keys()].map((k) => [k, pred.get(k).length]));
    const queue = [...nodes.keys()].filter((k) => indeg.get(k) === 0);
    const layer = new Map(queue.map((k) => [k, 0]));
    for (let i = 0; i < queue.length; i++) {
      const k = queue[i];
      for (const t of succ.get(k)) {
        layer.set(t, Math.max(layer.get(t) || 0, layer.get(k) + 1));
        indeg.set(t, indeg.get(t) - 1);
        if (indeg.get(t) === 0) queue.push(t);
      }
    }
    // A cycle cannot be recorded (a producer starts before its reader); drawn all the same.
    let top = Math.max(0, ...layer.values());
    for (const k of nodes.keys()) if (!layer.has(k)) layer.set(k, ++top);
    for (const k of nodes.keys()) {
      if (pred.get(k).length === 0 && succ.get(k).length > 0) {
        layer.set(k, Math.min(...succ.get(k).map((t) => layer.get(t))) - 1);
      }
    }
    // The layout graph: the nodes, and lanes (`~N`) for edges longer than one layer.
    const lsucc = new Map(), lpred = new Map();
    for (const k of nodes.keys()) { lsucc.set(k, []); lpred.set(k, []); }
    let lanes = 0;
    for (const e of edges) {
      let from = e.from;
      e.via = [];
      for (let l = layer.get(e.from) + 1; l < layer.get(e.to); l++) {
        const d = "~" + lanes++;
        layer.set(d, l);
        lsucc.set(d, []);
        lpred.set(d, [from]);
        lsucc.get(from).push(d);
        e.via.push(d);
        from = d;
      }
      lsucc.get(from).push(e.to);
      lpred.get(e.to).push(from);
    }
    const layers = [];
    for (const [k, l] of layer) (layers[l] ||= []).push(k);
    for (let l = 0; l < layers.length; l++) layers[l] ||= [];
    const pos = new Map();
    layers.forEach((ks) => ks.forEach((k, i) => pos.set(k, i)));
    const bary = (k, nbrs) => {
      const ps = nbrs.get(k).map((t) => pos.get(t));
      return ps.length ? ps.reduce((a, b) => a + b, 0) / ps.length : pos.get(k);
    };
    for (let sweep = 0; sweep < 8; sweep++) {
      const down = sweep % 2 === 0;
      for (const l of down ? [...layers.keys()] : [...layers.keys()].reverse()) {
        const b = new Map(layers[l].map((k) => [k, bary(k, down ? lpred : lsucc)]));
        layers[l].sort((x, y) => b.get(x) - b.get(y) || pos.get(x) - pos.get(y));
        layers[l].forEach((k, i) => pos.set(k, i));
      }
    }
    const height = (k) => (k[0] === "~" ? H_LANE : nodes.get(k).kind === "job" ? H_JOB : H_FILE);
    const y = new Map();
    for (const ks of layers) ks.reduce((acc, k) => (y.set(k, acc), acc + height(k) + GAP_Y), 0);
    const mid = (k) => y.get(k) + height(k) / 2;
    for (let sweep = 0; sweep < 6; sweep++) {
      const down = sweep % 2 === 0;
      for (const l of down ? [...layers.keys()] : [...layers.keys()].reverse()) {
        const ks = layers[l];
        if (!ks.length) continue;
        const want = ks.map((k) => {
          const nb = (down ? lpred : lsucc).get(k);
          return nb.length ? nb.reduce((a, t) => a + mid(t), 0) / nb.length - height(k) / 2 : y.get(k);
        });
        // In order and apart, each as near its neighbours as the ones above it allow; then the
        // whole layer shifted by its mean pull.
        let next = -Infinity, pull = 0;
        ks.forEach((k, i) => {
          const v = Math.max(want[i], next);
          y.set(k, v);
          pull += want[i] - v;
          next = v + height(k) + GAP_Y;
        });
        for (const k of ks) y.set(k, y.get(k) + pull / ks.length);
      }
    }
    const low = Math.min(0, ...y.values());
    model.lanes = new Map();
    for (const [l, ks] of layers.entries()) {
      for (const k of ks) {
        const at = { x: l * (W + GAP_X), y: y.get(k) - low, w: W, h: height(k) };
        if (k[0] === "~") model.lanes.set(k, at);
        else Object.assign(nodes.get(k), at);
      }
    }
    model.width = layers.length * (W + GAP_X) - GAP_X;
    model.height = Math.max(0, ...[...y.keys()].map((k) => y.get(k) - low + height(k)));
    model.succ = succ;
    model.pred = pred;
  }

  // ---- Drawing.
  function label(n) {
    if (n.kind === "job") {
      const s = n.step;
      const title = `job ${s.job_id}` + (s.step ? ` step ${s.step}` : "") + (s.name ? ` [${s.name}]` : "") + (s.status === "running" ? " (running)" : s.exit_code ? ` (exit ${s.exit_code})` : "") + (s.earlier_runs && !state.allRuns ? ` +${s.earlier_runs} earlier` : "");
      return [title, argvText(s.argv)];
    }
    if (n.kind === "dir") return [rel(n.dir) + "/", `${n.files.size} files` + (n.producer ? ` · job ${n.producer}` : "")];
    return [rel(n.path), short(n.hash) + (n.hash ? "  " + size(n.hash.size) : "")];
  }

  /** `8 of 200 jobs (latest runs) · 12 steps · 40 file nodes`: jobs are jobs, not steps. */
  function counts(model) {
    const all = new Set(state.dag.steps.map((s) => s.job_id)).size;
    const steps = drawn();
    const shown = new Set(steps.map((s) => s.job_id)).size;
    const nsteps = steps.filter((s) => s.step).length;
    const files = [...model.nodes.values()].filter((n) => n.kind !== "job").length;
    const n = (k, one) => `${k} ${one}${k === 1 ? "" : "s"}`;
    return (shown === all ? n(all, "job") : `${shown} of ${n(all, "job")} (latest runs)`) + (nsteps ? ` · ${n(nsteps, "step")}` : "") + ` · ${n(files, "file node")}`;
  }

  /** The steps of one job drawn together: a box behind them, named by the job. */
  function groups(model) {
    const g = $("groups");
    g.replaceChildren();
    const byJob = new Map();
    for (const n of model.nodes.values()) if (n.kind === "job" && n.step.step) (byJob.get(n.step.job_id) || byJob.set(n.step.job_id, []).get(n.step.job_id)).push(n);
    for (const [job, ns] of byJob) {
      if (ns.length < 2) continue;
      const x0 = Math.min(...ns.map((n) => n.x)) - 10, y0 = Math.min(...ns.map((n) => n.y)) - 24;
      const x1 = Math.max(...ns.map((n) => n.x + n.w)) + 10, y1 = Math.max(...ns.map((n) => n.y + n.h)) + 10;
      const box = svg("g", { class: "group" });
      box.dataset.job = job;
      box.append(svg("rect", { x: x0, y: y0, width: x1 - x0, height: y1 - y0, rx: 8 }));
      const t = svg("text", { x: x0 + 8, y: y0 + 15 });
      const top = state.dag.steps.find((s) => s.job_id === job);
      t.textContent = `job ${job}` + (top && top.name ? ` [${top.name}]` : "") + ` · ${ns.length} steps`;
      box.append(t);
      g.append(box);
    }
  }

  function draw() {
    const model = state.model;
    const gE = $("edges"), gN = $("nodes");
    gE.replaceChildren();
    gN.replaceChildren();
    groups(model);
    for (const e of model.edges) {
      const a = model.nodes.get(e.from), b = model.nodes.get(e.to);
      // Through the lane points of the layers it crosses, straight across each column.
      let d = `M${a.x + a.w},${a.y + a.h / 2}`, x = a.x + a.w, yy = a.y + a.h / 2;
      const to = (x2, y2) => { const mx = (x + x2) / 2; d += ` C${mx},${yy} ${mx},${y2} ${x2},${y2}`; };
      for (const k of e.via) {
        const l = model.lanes.get(k), ly = l.y + l.h / 2;
        to(l.x, ly);
        d += ` L${l.x + l.w},${ly}`;
        x = l.x + l.w;
        yy = ly;
      }
      to(b.x, b.y + b.h / 2);
      const p = svg("path", { d, class: "edge " + e.kind });
      p.dataset.from = e.from;
      p.dataset.to = e.to;
      e.el = p;
      gE.append(p);
    }
    for (const n of model.nodes.values()) {
      const g = svg("g", { class: `node ${n.kind}`, transform: `translate(${n.x},${n.y})` });
      g.dataset.key = n.key;
      g.dataset.label = n.kind === "job" ? `job ${n.step.job_id}` + (n.step.step ? ` step ${n.step.step}` : "") : n.kind === "dir" ? rel(n.dir) + "/" : rel(n.path);
      g.append(svg("rect", { width: n.w, height: n.h, rx: n.kind === "job" ? 5 : 2 }));
      const [l1, l2] = label(n);
      const t1 = svg("text", { x: 8, y: 15, class: "title" });
      t1.textContent = clip(l1, 33);
      const t2 = svg("text", { x: 8, y: n.kind === "job" ? 33 : 29, class: "sub" });
      t2.textContent = clip(l2, 35);
      const tip = svg("title");
      tip.textContent = `${l1}\n${l2}`;
      g.append(tip, t1, t2);
      g.addEventListener("click", (ev) => { ev.stopPropagation(); clickNode(n); });
      n.el = g;
      gN.append(g);
    }
    marks();
    $("empty").hidden = model.nodes.size > 0;
    $("count").textContent = counts(model);
    applyClasses();
  }

  /** Status marks (stale, modified...) on the drawn nodes, from the last status report. */
  const MARKS = ["stale", "modified", "missing", "old"];
  function marks() {
    for (const n of state.model.nodes.values()) {
      const st = statusOf(n);
      n.el.classList.remove(...MARKS);
      if (st && st !== "ok") n.el.classList.add(st);
      const [l1, l2] = label(n);
      n.el.querySelector("title").textContent = `${l1}\n${l2}` + (st && st !== "ok" ? `\n${statusText(n, st)}` : "");
    }
  }

  // ---- Pan and zoom: a transform on one group; wheel zooms about the pointer, drag pans.
  const view = { x: 20, y: 20, k: 1 };
  function applyView() { $("viewport").setAttribute("transform", `translate(${view.x},${view.y}) scale(${view.k})`); }
  /** The whole graph in the window (Fit); `legible`: no smaller than 1:1, where labels are
   * readable, showing the most recent job when the graph is larger than the window. */
  function fit(legible) {
    const box = $("svg").getBoundingClientRect(), m = state.model;
    if (!m || !m.nodes.size || !box.width) return;
    view.k = Math.min(1.5, (box.width - 40) / Math.max(m.width, 1), (box.height - 40) / Math.max(m.height, 1));
    view.x = (box.width - m.width * view.k) / 2;
    view.y = (box.height - m.height * view.k) / 2;
    const jobs = [...m.nodes.values()].filter((n) => n.kind === "job");
    if (legible === true && view.k < 1 && jobs.length) {
      const last = jobs.reduce((a, b) => (b.step.job_id > a.step.job_id || (b.step.job_id === a.step.job_id && (b.step.step || 0) > (a.step.step || 0)) ? b : a));
      view.k = 1;
      // The latest job two thirds across, what it made to its right; no blank margin past the graph's ends.
      view.x = Math.min(20, Math.max(box.width - 20 - m.width, box.width * 0.6 - (last.x + last.w / 2)));
      view.y = Math.min(20, Math.max(box.height - 20 - m.height, box.height / 2 - (last.y + last.h / 2)));
    }
    applyView();
  }
  function setAllRuns(on) {
    state.allRuns = on;
    $("all-runs").checked = on;
    rebuild(true);
  }
  /** Shows the given nodes whole (a highlighted lineage), zoomed no closer than 1:1. */
  function fitTo(keys) {
    const box = $("svg").getBoundingClientRect(), m = state.model;
    const ns = [...keys].map((k) => m.nodes.get(k)).filter(Boolean);
    if (!ns.length || !box.width) return;
    const x0 = Math.min(...ns.map((n) => n.x)), y0 = Math.min(...ns.map((n) => n.y));
    const x1 = Math.max(...ns.map((n) => n.x + n.w)), y1 = Math.max(...ns.map((n) => n.y + n.h));
    view.k = Math.min(1, (box.width - 40) / (x1 - x0), (box.height - 40) / (y1 - y0));
    view.x = (box.width - (x1 + x0) * view.k) / 2;
    view.y = (box.height - (y1 + y0) * view.k) / 2;
    applyView();
  }
  function centre(n) {
    const box = $("svg").getBoundingClientRect();
    view.k = Math.max(view.k, 0.8);
    view.x = box.width / 2 - (n.x + n.w / 2) * view.k;
    view.y = box.height / 2 - (n.y + n.h / 2) * view.k;
    applyView();
  }
  (() => {
    const s = $("svg");
    s.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const r = s.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      const k = Math.min(4, Math.max(0.05, view.k * Math.exp(-ev.deltaY * 0.0015)));
      view.x = px - ((px - view.x) * k) / view.k;
      view.y = py - ((py - view.y) * k) / view.k;
      view.k = k;
      applyView();
    }, { passive: false });
    let drag = null;
    s.addEventListener("pointerdown", (ev) => {
      if (ev.target.closest(".node")) return;
      drag = { x: ev.clientX, y: ev.clientY, vx: view.x, vy: view.y, moved: false };
      s.setPointerCapture(ev.pointerId);
      s.classList.add("panning");
    });
    s.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      view.x = drag.vx + ev.clientX - drag.x;
      view.y = drag.vy + ev.clientY - drag.y;
      drag.moved ||= Math.abs(ev.clientX - drag.x) + Math.abs(ev.clientY - drag.y) > 3;
      applyView();
    });
    s.addEventListener("pointerup", () => {
      if (drag && !drag.moved) select(null);
      drag = null;
      s.classList.remove("panning");
    });
  })();

  // ---- Selection and lineage highlights.
  function closure(start, next) {
    const seen = new Set();
    const stack = [start];
    while (stack.length) {
      const k = stack.pop();
      for (const t of next.get(k) || []) if (!seen.has(t)) { seen.add(t); stack.push(t); }
    }
    return seen;
  }
  function applyClasses() {
    const m = state.model;
    for (const n of m.nodes.values()) n.el.classList.remove("sel", "up", "down");
    for (const e of m.edges) e.el.classList.remove("up", "down");
    $("svg").classList.toggle("dim", !!state.highlight);
    const sel = state.selected && m.nodes.get(state.selected);
    if (sel) sel.el.classList.add("sel");
    if (state.highlight && sel) {
      const dir = state.highlight;
      const set = closure(sel.key, dir === "up" ? m.pred : m.succ);
      for (const k of set) m.nodes.get(k).el.classList.add(dir);
      set.add(sel.key);
      for (const e of m.edges) if (set.has(e.from) && set.has(e.to)) e.el.classList.add(dir);
    }
    for (const b of document.querySelectorAll("[data-highlight]")) b.classList.toggle("active", b.dataset.highlight === state.highlight);
  }
  function select(key, keepHighlight) {
    state.selected = key;
    if (!keepHighlight) state.highlight = null;
    applyClasses();
    showDetails();
  }
  function clickNode(n) {
    if (state.compareFrom !== null && n.kind === "job") {
      const a = state.compareFrom;
      state.compareFrom = null;
      if (a !== n.step.job_id) return compare(a, n.step.job_id);
    }
    if (n.kind === "dir" && state.selected !== n.key) {
      // A collapsed directory opens where it is.
      state.expanded.add(n.dir);
      rebuild(false);
      const first = [...state.model.nodes.values()].find((m) => m.kind === "file" && parentOf(m.path) === n.dir && (m.producer || 0) === (n.producer || 0));
      return select(first ? first.key : null);
    }
    select(n.key);
  }
  function highlight(dir) {
    state.highlight = state.highlight === dir ? null : dir;
    applyClasses();
    const m = state.model;
    if (state.highlight && state.selected) fitTo([state.selected, ...closure(state.selected, dir === "up" ? m.pred : m.succ)]);
  }

  // ---- The details panel.
  function row(name, ...value) { return el("tr", {}, el("th", {}, name), el("td", {}, ...value)); }
  function jobLink(id) { return el("a", { class: "link", onclick: () => { const n = state.model.nodes.get("j" + id); if (n) { select(n.key); centre(n); } } }, `job ${id}`); }
  function badge(st, n) { return st ? el("span", { class: "badge " + st }, n ? statusText(n, st) : STATUS_TEXT[st]) : null; }
  function fileTable(files) {
    const t = el("table", {});
    for (const f of files) {
      const c = state.status && statusIndex().changed.get(f.path);
      const changed = c && c.now !== (f.hash && f.hash.blake3) ? c : null;
      t.append(el("tr", {}, el("td", { class: "hash", title: f.hash ? f.hash.blake3 : "content unknown" }, short(f.hash)), el("td", { class: "path" }, rel(f.path), f.producer ? el("span", { class: "muted" }, " (", jobLink(f.producer), ")") : null, changed ? badge(changed.state === "deleted" ? "missing" : "modified") : null)));
    }
    return t;
  }
  function actions(n) {
    const a = el("div", { class: "actions" },
      el("button", { "data-highlight": "up", onclick: () => highlight("up") }, "How was this made"),
      el("button", { "data-highlight": "down", onclick: () => highlight("down") }, "What depends on this"));
    if (n.kind === "job") a.append(el("button", { id: "compare-with", onclick: () => { state.compareFrom = n.step.job_id; showDetails(); } }, "Compare with…"));
    if (n.kind === "file" && state.expanded.has(parentOf(n.path))) a.append(el("button", { onclick: () => { state.expanded.delete(parentOf(n.path)); rebuild(false); select(null); } }, `Collapse ${rel(parentOf(n.path))}/`));
    return a;
  }
  async function showDetails() {
    const panel = $("details");
    const n = state.selected && state.model.nodes.get(state.selected);
    if (!n) return panel.replaceChildren(el("p", { class: "hint" }, "Click a job or a file for its details."));
    const asked = state.selected;
    if (n.kind === "job") {
      const s = n.step;
      panel.replaceChildren(el("h2", {}, `job ${s.job_id}`, s.name ? ` [${s.name}]` : "", badge(statusOf(n), n)), actions(n), el("p", { class: "muted" }, "loading…"));
      if (s.earlier_runs && !state.allRuns) panel.insertBefore(el("p", { class: "hint" }, `${s.earlier_runs > 1 ? `${s.earlier_runs} earlier runs of this command are` : "An earlier run of this command is"} folded into this one. `, el("a", { class: "link", onclick: () => setAllRuns(true) }, "Show all runs")), panel.children[2]);
      if (state.compareFrom === s.job_id) panel.insertBefore(el("p", { class: "hint" }, "Now click another job to compare it with this one."), panel.children[2]);
      let job;
      try { job = await source.job(s.job_id); } catch (e) { job = null; }
      if (state.selected !== asked) return;
      panel.lastChild.remove();
      renderJob(panel, s, job);
    } else if (n.kind === "dir") {
      panel.replaceChildren(el("h2", {}, rel(n.dir) + "/", badge(statusOf(n))), actions(n),
        el("p", {}, `${n.files.size} files `, ...(n.producer ? ["written by ", jobLink(n.producer)] : ["that no recorded job made (root inputs)"]), ". Click the directory in the graph to expand it."),
        fileTable([...n.files.values()]));
    } else {
      const st = statusOf(n);
      const t = el("table", {});
      t.append(row("path", el("span", { class: "mono" }, n.path)));
      t.append(row("blake3", el("span", { class: "mono" }, n.hash ? n.hash.blake3 : "content unknown")));
      if (n.hash && n.hash.sha256) t.append(row("sha256", el("span", { class: "mono" }, n.hash.sha256)));
      if (n.hash) t.append(row("size", size(n.hash.size)));
      t.append(row("made by", n.producer ? jobLink(n.producer) : "no recorded job: a root input"));
      if (n.copyOf) t.append(row("copy of", el("span", { class: "mono" }, rel(n.copyOf))));
      const readers = el("span", {});
      [...n.readers].sort((a, b) => a - b).forEach((r, i) => { if (i) readers.append(", "); readers.append(jobLink(r)); });
      t.append(row("read by", n.readers.size ? readers : "no recorded job"));
      if (st) t.append(row("status", badge(st)));
      panel.replaceChildren(el("h2", {}, baseName(n.path)), actions(n), t);
    }
    applyClasses();
  }
  function renderJob(panel, s, job) {
    const t = el("table", {});
    t.append(row("argv", el("pre", { class: "argv" }, argvText(s.argv))));
    const labels = Object.entries((job && job.labels) || s.labels || {});
    if (labels.length) t.append(row("labels", ...labels.map(([k, v]) => el("span", { class: "label" }, `${k}=${v}`))));
    // The runs of its name, as `roar runs NAME` lists them.
    source.runs(s.job_id).then((r) => {
      if (!r || !r.runs || r.runs.length < 2 || state.selected !== "j" + nodeOf(s.job_id, s.step)) return;
      const acts = panel.querySelector(".actions");
      if (acts) acts.append(el("button", { id: "show-runs", onclick: () => showRuns(r.name, r.runs) }, `Runs of ${r.name} (${r.runs.length})`));
    }).catch(() => {});
    t.append(row("cwd", el("span", { class: "mono" }, s.cwd)));
    t.append(row("status", s.status + (s.exit_code !== null && s.exit_code !== undefined ? ` (exit ${s.exit_code})` : "")));
    t.append(row("started", time(s.started_ns)));
    if (s.ended_ns) t.append(row("took", ((s.ended_ns - s.started_ns) / 1e9).toFixed(3) + " s"));
    t.append(row("observed by", s.backend), row("host", s.host || "?"));
    const git = job && job.git;
    if (git) t.append(row("git", el("span", { class: "mono" }, (git.commit || "no commit").slice(0, 12)), git.branch ? ` on ${git.branch}` : "", git.dirty ? " (dirty" + (git.diff ? ", diff kept: roar show " + s.job_id + " --patch" : "") + ")" : "", git.remote ? el("div", { class: "mono muted" }, git.remote) : null));
    else t.append(row("git", "not a git tree"));
    panel.append(t);
    if (job && job.environment) {
      const rt = job.environment.runtime;
      if (rt) {
        panel.append(el("h3", {}, "runtime"));
        const r = el("table", {});
        const gpus = (rt.gpus || []).map((g) => g.model + (g.driver ? ` (driver ${g.driver})` : "")).join(", ");
        for (const [k, v] of [["os", rt.os], ["kernel", rt.kernel], ["arch", rt.arch], ["cpu", rt.cpu_model && `${rt.cpu_model} × ${rt.cpus}`], ["memory", rt.memory_bytes && size(rt.memory_bytes)], ["gpus", gpus], ["container", rt.container]]) if (v) r.append(row(k, v));
        panel.append(r);
      }
      const pk = job.environment.packages || [];
      if (pk.length) {
        panel.append(el("h3", {}, `packages (${pk.length})`));
        const p = el("table", {});
        for (const x of pk) p.append(el("tr", {}, el("td", { class: "muted" }, x.kind), el("td", {}, x.name), el("td", { class: "mono" }, x.version)));
        panel.append(p);
      }
    }
    const s3 = [...s.inputs, ...s.outputs].filter((e) => e.path.startsWith("s3://"));
    if (s3.length) { panel.append(el("h3", {}, `S3 objects (${s3.length})`), fileTable(s3)); }
    panel.append(el("h3", {}, `inputs (${s.inputs.length})`), fileTable(s.inputs));
    panel.append(el("h3", {}, `outputs (${s.outputs.length})`), fileTable(s.outputs));
    const stale = state.status && state.status.stale.find((x) => x.job === s.job_id);
    if (stale) panel.append(el("p", {}, el("span", { class: "badge stale" }, "stale"), ` ${rel(stale.because.path)} ${stale.because.change} (`, ...stale.because.chain.flatMap((j, i) => (i ? [" → ", jobLink(j)] : [jobLink(j)])), ")"));
  }

  // ---- Two jobs side by side, as `roar diff` ranks their differences.
  async function compare(a, b) {
    const [x, y] = pair(a, b);
    const box = $("compare");
    box.hidden = false;
    box.replaceChildren(el("button", { class: "close", onclick: () => { box.hidden = true; } }, "Close"), el("h2", {}, `job ${x} ↔ job ${y}`), el("p", { class: "muted" }, "loading…"));
    let d = null, err = null;
    try { d = await source.diff(x, y); } catch (e) { err = e.message; }
    box.lastChild.remove();
    if (!d) return box.append(el("p", {}, err || `This file holds no comparison of jobs ${x} and ${y} (it keeps those of reruns of one command); \`roar diff ${x} ${y}\` or \`roar ui\` shows it.`));
    const t = el("table", {}, el("tr", {}, el("th", {}, ""), el("th", {}, `A: job ${x}`), el("th", {}, `B: job ${y}`)));
    const add = (name, va, vb) => t.append(el("tr", { class: "changed" }, el("td", { class: "name" }, name), el("td", { class: "mono" }, va ?? "(none)"), el("td", { class: "mono" }, vb ?? "(none)")));
    for (const p of d.parameters) add("parameter " + p.name, p.a, p.b);
    if (d.argv) add("argv", argvText(d.argv.a), argvText(d.argv.b));
    if (d.cwd) add("cwd", d.cwd.a, d.cwd.b);
    if (d.git) add("code", d.git.a, d.git.b);
    for (const p of d.packages) add(`${p.kind} ${p.name}`, p.a, p.b);
    for (const m of d.machine) add("machine " + m.name, m.a, m.b);
    for (const v of d.env) add("env " + v.name, v.a, v.b);
    for (const [title, list] of [["input", d.inputs], ["output", d.outputs], ["root input", d.root_inputs]]) {
      for (const f of list) add(`${title} ${f.change}`, f.a ? `${short(f.a)}  ${rel(f.path)}` : null, f.b ? `${short(f.b)}  ${rel(f.path)}` : null);
    }
    if (t.children.length === 1) box.append(el("p", {}, "No difference in argv, code, packages, machine, environment or files."));
    else box.append(t);
    box.append(el("p", { class: "muted" }, `${d.same_inputs} inputs with the same path and content on both sides.`));
  }

  // ---- The runs of one name as a table (`roar runs NAME`): parameters and metrics as columns,
  // sorted by any column, filtered by text; two rows ticked are compared.
  function showRuns(name, runs) {
    const box = $("runs-table");
    box.hidden = false;
    const keys = (f) => [...new Set(runs.flatMap((r) => Object.keys(r[f] || {})))].sort();
    const cols = [
      { title: "job", get: (r) => r.job },
      { title: "status", get: (r) => r.status },
      { title: "labels", get: (r) => Object.entries(r.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ") },
      ...keys("params").map((k) => ({ title: k, kind: "param", get: (r) => (r.params || {})[k] })),
      ...keys("metrics").map((k) => ({ title: k, kind: "metric", get: (r) => (r.metrics || {})[k] })),
    ];
    const st = { sort: null, desc: true, filter: "", picked: [] };
    const num = (v) => (v === undefined || v === null || v === "" || isNaN(Number(v)) ? null : Number(v));
    function render() {
      let rows = runs.filter((r) => !st.filter || cols.some((c) => String(c.get(r) ?? "").toLowerCase().includes(st.filter)));
      if (st.sort !== null) {
        const c = cols[st.sort];
        rows = [...rows].sort((a, b) => {
          const [x, y] = [c.get(a), c.get(b)], [nx, ny] = [num(x), num(y)];
          const o = nx !== null && ny !== null ? nx - ny : x === undefined ? -1 : y === undefined ? 1 : String(x).localeCompare(String(y));
          return st.desc ? -o : o;
        });
      }
      const head = el("tr", {}, el("th", {}, ""), ...cols.map((c, i) => el("th", { class: c.kind || null, onclick: () => { st.desc = st.sort === i ? !st.desc : true; st.sort = i; render(); } }, c.title + (st.sort === i ? (st.desc ? " ▾" : " ▴") : ""))));
      const body = rows.map((r) => {
        const tick = el("input", { type: "checkbox" });
        tick.checked = st.picked.includes(r.job);
        tick.addEventListener("change", () => { st.picked = tick.checked ? [...st.picked, r.job].slice(-2) : st.picked.filter((j) => j !== r.job); render(); });
        return el("tr", { "data-job": r.job }, el("td", {}, tick), ...cols.map((c) => el("td", { class: c.kind || null }, c.title === "job" ? jobLink(r.job) : String(c.get(r) ?? "-"))));
      });
      const filter = el("input", { type: "search", id: "runs-filter", placeholder: "Filter rows", value: st.filter });
      filter.addEventListener("input", () => { st.filter = filter.value.trim().toLowerCase(); render(); const f = $("runs-filter"); f.focus(); f.setSelectionRange(f.value.length, f.value.length); });
      const cmp = el("button", { id: "runs-compare", onclick: () => compare(st.picked[0], st.picked[1]) }, "Compare the two ticked");
      if (st.picked.length !== 2) cmp.setAttribute("disabled", "");
      box.replaceChildren(el("button", { class: "close", onclick: () => { box.hidden = true; } }, "Close"),
        el("h2", {}, `Runs of ${name} (${runs.length})`), el("div", { class: "actions" }, filter, cmp),
        el("table", { class: "runs" }, head, ...body));
    }
    render();
  }

  // ---- Search: path, hash prefix, job id, name or argv.
  function matches(n, q) {
    const hash = (h) => h && (h.blake3.startsWith(q) || (h.sha256 && h.sha256.startsWith(q)));
    const path = (p) => p.toLowerCase().includes(q) || rel(p).toLowerCase().includes(q);
    if (n.kind === "job") {
      const s = n.step;
      const labels = Object.entries(s.labels || {}).map(([k, v]) => `${k}=${v}`.toLowerCase());
      return `job ${s.job_id}` === q || String(s.job_id) === q || (s.name || "").toLowerCase().includes(q) || argvText(s.argv).toLowerCase().includes(q) || labels.some((l) => l.includes(q));
    }
    if (n.kind === "dir") return path(n.dir + "/") || [...n.files.values()].some((e) => path(e.path) || hash(e.hash));
    return path(n.path) || hash(n.hash);
  }
  let results = [];
  function search() {
    const q = $("search").value.trim().toLowerCase();
    const list = $("results");
    for (const n of state.model.nodes.values()) n.el.classList.remove("match");
    // Files named exactly so first, then files and directories, then jobs.
    const rank = (n) => (n.kind === "file" && (baseName(n.path).toLowerCase() === q || rel(n.path).toLowerCase() === q) ? 0 : n.kind === "job" ? 2 : 1);
    results = q ? [...state.model.nodes.values()].filter((n) => matches(n, q)) : [];
    results.sort((a, b) => rank(a) - rank(b));
    for (const n of results) n.el.classList.add("match");
    list.replaceChildren(...results.slice(0, 50).map((n, i) => {
      const [l1, l2] = label(n);
      const li = el("li", { class: i === 0 ? "cur" : null }, el("span", { class: "what" }, n.kind), l1, el("span", { class: "muted" }, "  " + clip(l2, 60)));
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); pick(n); });
      return li;
    }));
    list.hidden = !q;
    if (q && !results.length) list.replaceChildren(el("li", { class: "muted" }, "nothing matches"));
  }
  function pick(n) {
    $("results").hidden = true;
    select(n.key);
    centre(n);
  }
  $("search").addEventListener("input", search);
  $("search").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && results.length) pick(results[0]);
    if (ev.key === "Escape") { $("search").value = ""; search(); }
  });
  $("search").addEventListener("blur", () => { $("results").hidden = true; });
  $("search").addEventListener("focus", () => { if ($("search").value.trim()) search(); });
  $("fit").addEventListener("click", () => fit(false));
  $("all-runs").addEventListener("change", (ev) => setAllRuns(ev.target.checked));
  $("clear").addEventListener("click", () => { $("search").value = ""; search(); state.compareFrom = null; select(null); });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") { if (!$("compare").hidden) $("compare").hidden = true; else $("runs-table").hidden = true; } });

  // ---- Loading, and live updates while the page is open.
  function rebuild(refit) {
    state.model = buildModel(state.dag);
    layout(state.model);
    draw();
    if (refit) fit(true);
    const folded = state.dag.steps.some((s) => s.superseded);
    $("runs").hidden = !folded;
    if (state.selected && !state.model.nodes.has(state.selected)) state.selected = null;
    applyClasses();
    if ($("search").value.trim()) { search(); $("results").hidden = true; }
  }
  // The graph is drawn as soon as it arrives; the status (a walk of the tree, slower on a big
  // one) marks it when it comes. `data-ready` counts loads whose marks are on.
  async function load(first) {
    const status = source.status();
    state.dag = await source.dag();
    rebuild(first);
    if (first) document.body.dataset.readyMs = performance.now().toFixed(1);
    state.status = await status;
    marks();
    showDetails();
    document.body.dataset.ready = String(Number(document.body.dataset.ready || 0) + 1);
  }
  window.addEventListener("resize", () => { if (state.model) applyView(); });
  load(true).catch((e) => { $("empty").hidden = false; $("empty").textContent = "Cannot read the record: " + e.message; });
  if (config.mode === "server") {
    const live = $("live");
    const events = new EventSource("/api/events?token=" + encodeURIComponent(token));
    events.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
    events.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
    let pending = null;
    events.addEventListener("change", () => {
      clearTimeout(pending);
      pending = setTimeout(() => load(false).catch(() => {}), 150);
    });
  } else {
    $("live").textContent = "snapshot of " + time(config.generated_ns);
  }
})();
