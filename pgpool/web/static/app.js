// The pgpool dashboard: plain JavaScript, no build step, no dependency. It reads the
// server's snapshot stream (/api/events) and its JSON API (see docs/guides/dashboard.md).
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const SVG = "http://www.w3.org/2000/svg";
// Lag colours: a queue whose oldest ready job waits this long is amber, then red.
const LAG_WARN = 30, LAG_BAD = 300;
// Without a snapshot for this long (the server sends one at least every 2 s) the page says
// its numbers are stale.
const STALE_AFTER_MS = 15000;
const HOUR = 3600;
const JOBS_PAGE = 50;

const state = {
  progressSeen: {},       // job id -> its last progress seen {done, at, rate}
  session: null,          // /api/session
  snapshots: 0,           // how many arrived (tests wait on it)
  lastAt: 0,              // Date.now() of the last one
  cards: {},              // queue -> its card element
  limitRows: {},          // kind -> its row in the limits table
  deadTotal: null,        // dead letters in the last snapshot: a change reloads the groups
  jobsCursors: [null],    // the "after" cursor of each page seen; the last is the current page
  jobsNext: null,         // the server's next_after: null on the last page
  jobsSeq: 0,             // the latest jobs request
  jobId: null,            // the job shown in the detail panel
  dbError: false,         // the server's last word was that it cannot read the database
};

// --- small helpers -------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "style") node.style.cssText = v;  // CSSOM: allowed by the page's CSP
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// A duration in seconds, short: 0.4s, 12s, 3m05s, 2h10m, 3d4h.
function dur(s) {
  if (s === null || s === undefined) return "—";
  if (s < 10) return `${Math.max(0, s).toFixed(1)}s`;
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${String(Math.floor(s % 3600 / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d${Math.floor(s % 86400 / 3600)}h`;
}

function ago(iso) {
  if (!iso) return "—";
  return dur((Date.now() - Date.parse(iso)) / 1000) + " ago";
}

function num(n, digits = 1) {
  return n === null || n === undefined ? "—" : Number(n).toFixed(digits);
}

function lagClass(lag) {
  if (lag === null || lag === undefined) return "ok";
  return lag >= LAG_BAD ? "bad" : lag >= LAG_WARN ? "warn" : "ok";
}

// Error text often quotes the payload: the server sends it only with --allow-payloads.
function errorsShown() {
  return Boolean(state.session && state.session.allow_payloads);
}

function readWrite() {
  return Boolean(state.session && state.session.read_write);
}

// An action button: disabled (and saying why) unless the server is read-write.
function actionButton(label, testid, onclick, cls = "") {
  const b = el("button", {type: "button", "data-testid": testid, "data-action": label,
                          class: cls, onclick});
  b.textContent = label;
  if (!readWrite()) {
    b.disabled = true;
    b.title = "read-only: start pgpool web --read-write to allow actions";
  }
  return b;
}

function flash(text, kind = "info") {
  const box = $("#flash");
  box.textContent = text;
  box.className = `flash flash-${kind}`;
  box.hidden = false;
}

// --- the API ---------------------------------------------------------------------------

// URLs from location.origin, never from the document's URL: one that carries basic-auth
// credentials (http://user:pw@host/) makes fetch refuse relative URLs.
function api(path, params) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== "" && v !== null && v !== undefined) url.searchParams.set(k, v);
  }
  return url;
}

async function getJSON(path, params) {
  const resp = await fetch(api(path, params), {headers: {Accept: "application/json"}});
  return answer(resp);
}

async function post(path, body = {}) {
  const resp = await fetch(api(path), {
    method: "POST",
    headers: {"Content-Type": "application/json",
              "X-CSRF-Token": state.session ? state.session.csrf_token : ""},
    body: JSON.stringify(body),
  });
  return answer(resp);
}

async function answer(resp) {
  let data = null;
  try { data = await resp.json(); } catch { data = null; }
  if (!resp.ok) {
    throw new Error((data && data.error) || `HTTP ${resp.status}`);
  }
  return data;
}

// --- live snapshot ---------------------------------------------------------------------

function connect() {
  const source = new EventSource(api("/api/events"));
  source.addEventListener("snapshot", (ev) => {
    const snap = JSON.parse(ev.data);
    state.snapshots += 1;
    state.lastAt = Date.now();
    state.dbError = false;
    document.body.dataset.snapshots = String(state.snapshots);
    render(snap);
  });
  source.addEventListener("open", () => setConn("live", "conn-live"));
  source.addEventListener("error", (ev) => {
    if (ev.data) {
      // The server's "error" event: it cannot read the database. The last numbers stay.
      setConn(`database: ${JSON.parse(ev.data).error}`, "conn-bad");
      state.dbError = true;
    } else {
      setConn("reconnecting…", "conn-bad");  // the stream dropped; EventSource retries
    }
  });
}

function setConn(text, cls) {
  const c = $("#conn");
  c.textContent = text;
  c.className = `conn ${cls}`;
}

function tick() {
  if (!state.lastAt || state.dbError) return;
  const age = Date.now() - state.lastAt;
  if (age > STALE_AFTER_MS) setConn(`stale: no update for ${dur(age / 1000)}`, "conn-bad");
  else setConn(`live · updated ${dur(age / 1000)} ago`, "conn-live");
}

function render(snap) {
  renderFleet(snap.fleet || {}, snap.hosts || []);
  renderWarnings(snap);
  renderQueues(snap);
  renderLimits(snap.limits || []);
  renderHosts(snap.hosts || [], snap.fleet || {});
  renderVacuum(snap.vacuum);
  renderHorizon(snap.horizon);
  renderGroups(snap.groups || {in_progress: 0, oldest: []});
  renderSucceeded(snap.succeeded || []);
  updateQueueFilter(snap.queues || []);
  const dead = (snap.queues || []).reduce((sum, q) => sum + q.dead, 0);
  $("#dead-total").textContent = dead ? String(dead) : "";
  if (dead !== state.deadTotal) {
    state.deadTotal = dead;
    loadDeadGroups();
  }
}

function renderFleet(fleet, hosts) {
  const budget = fleet.max_claims_per_sec;
  const live = fleet.live_hosts ?? 0;
  const stale = hosts.length - live;
  let text = `${live} live host${live === 1 ? "" : "s"}` + (stale ? `, ${stale} stale` : "") +
    ` · ${num(fleet.claims_per_sec)} claims/s`;
  if (budget) text += ` of ${budget} (${Math.round(100 * (fleet.claims_per_sec || 0) / budget)}%)`;
  $("#fleet").textContent = text;
}

function renderWarnings(snap) {
  const items = [];
  const vac = snap.vacuum;
  if (vac && vac.warning) items.push(["vacuum", vac.warning]);
  if (snap.horizon && snap.horizon.warning) items.push(["horizon", snap.horizon.warning]);
  for (const w of (snap.fleet && snap.fleet.warnings) || []) items.push(["budget", w]);
  for (const u of snap.unhandled || []) {
    items.push(["unhandled", `${u.ready} ${u.kind} job(s) in queue ${u.queue} wait with no ` +
      `live host that serves the queue and has a handler (oldest due ${dur(u.oldest_ago)} ago)`]);
  }
  const parked = (snap.queues || []).reduce((s, q) => s + q.parked + q.parked_done, 0);
  if (parked) {
    items.push(["parked", `the database refused to ack or reap ${parked} job(s): they wait ` +
      "for an operator (state parked/done in Jobs; their last error says why)"]);
  }
  const list = $("#warnings");
  list.replaceChildren(...items.map(([what, text]) =>
    el("li", {"data-testid": `warning-${what}`, text})));
}

// --- queues ----------------------------------------------------------------------------

function renderQueues(snap) {
  const queues = snap.queues || [];
  const box = $("#queues");
  if (!queues.length) {
    box.replaceChildren(el("p", {class: "empty", text: "No queues yet: no job, dead job, host or pause names one."}));
    state.cards = {};
    return;
  }
  const now = snap.taken_at || Date.now() / 1000;
  const cards = {};
  for (const q of queues) {
    // A card lives as long as its queue: updating it in place keeps its buttons under the
    // pointer (and a test's click) while snapshots arrive.
    const card = (state.cards && state.cards[q.queue]) || queueCard(q.queue);
    updateQueueCard(card, q, (snap.lag_history || {})[q.queue] || [], now);
    cards[q.queue] = card;
  }
  state.cards = cards;
  box.replaceChildren(...queues.map((q) => cards[q.queue]));
}

function stat(label, value, testid, cls = "") {
  return el("div", {class: `stat ${cls}`},
    el("span", {class: "v", "data-testid": testid, text: value}),
    el("span", {class: "k", text: label}));
}

function queueCard(name) {
  const card = el("article", {class: "queue", "data-testid": "queue", "data-queue": name});
  const pause = actionButton("pause", "pause", () => setPaused(name, true));
  const resume = actionButton("resume", "resume", () => setPaused(name, false));
  card.append(
    el("header", {},
      el("h3", {text: name}),
      el("span", {class: "badge", "data-testid": "paused"}),
      el("span", {class: "grow"}), pause, resume),
    el("div", {class: "lagrow"},
      el("div", {class: "lag"},
        el("span", {class: "lag-v", "data-testid": "lag"}),
        el("span", {class: "k", text: "lag"})),
      el("div", {class: "chartbox"})),
    el("div", {class: "stats"},
      stat("ready", "", "ready"), stat("scheduled", "", "scheduled"),
      stat("running", "", "running"), stat("claims/s", "", "claims"),
      stat("claim p99", "", "p99"), stat("DLQ", "", "dead"), stat("DLQ 24h", "", "dead24h"),
      stat("on limits", "", "on-limits")));
  return card;
}

function updateQueueCard(card, q, series, now) {
  const cls = lagClass(q.lag);
  card.className = `queue lag-${cls}${q.paused ? " paused" : ""}`;
  const set = (testid, text) => { $(`[data-testid="${testid}"]`, card).textContent = text; };
  const badge = $('[data-testid="paused"]', card);
  badge.className = `badge ${q.paused ? "badge-paused" : "badge-running"}`;
  badge.dataset.paused = String(q.paused);
  badge.title = q.paused_at ? `paused since ${q.paused_at}` : "";
  badge.textContent = q.paused ? "paused" : "active";
  $('[data-testid="pause"]', card).hidden = q.paused;
  $('[data-testid="resume"]', card).hidden = !q.paused;
  const lag = $('[data-testid="lag"]', card);
  lag.className = `lag-v ${cls}`;
  lag.dataset.lag = q.lag === null ? "" : String(q.lag);
  lag.textContent = q.lag === null ? "0s" : dur(q.lag);
  set("ready", q.ready);
  set("scheduled", q.scheduled);
  set("running", q.running);
  set("claims", num(q.claims_per_sec));
  set("p99", q.claim_p99_ms === null ? "—" : `${num(q.claim_p99_ms)}ms`);
  set("dead", q.dead);
  set("dead24h", `+${q.dead_24h}`);
  set("on-limits", q.waiting_on_limits);
  $('[data-testid="dead"]', card).parentNode.classList.toggle("hot", q.dead > 0);
  $('[data-testid="dead24h"]', card).parentNode.classList.toggle("hot", q.dead_24h > 0);
  $(".chartbox", card).replaceWith(lagChart(series, now));
}

// The lag chart: an SVG area, y from 0 to the peak, x over the last hour, or over the
// history there is (at least 5 minutes) when the server has been up for less.
function lagChart(series, now) {
  const W = 300, H = 64, PAD = 2;
  const chart = svg("svg", {viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none",
                            class: "chart", "data-testid": "lag-chart",
                            "data-points": String(series.length), role: "img"});
  const pts = series.filter(([t]) => t >= now - HOUR).map(([t, v]) => [t, v || 0]);
  const span = Math.min(HOUR, Math.max(300, pts.length ? now - pts[0][0] : HOUR));
  const start = now - span;
  const highest = Math.max(0, ...pts.map(([, v]) => v));
  const peak = Math.max(1, highest);  // the y scale: at least a second, so noise stays flat
  const x = (t) => ((t - start) / span) * W;
  const y = (v) => H - PAD - (v / peak) * (H - 2 * PAD);
  for (const frac of [0.25, 0.5, 0.75]) {
    chart.append(svg("line", {x1: W * frac, x2: W * frac, y1: 0, y2: H, class: "tick"}));
  }
  if (pts.length) {
    const line = pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    const first = x(pts[0][0]).toFixed(1), last = x(pts[pts.length - 1][0]).toFixed(1);
    chart.append(svg("polygon", {points: `${first},${H} ${line} ${last},${H}`, class: "area"}));
    chart.append(svg("polyline", {points: line, class: "line"}));
  }
  const title = svg("title");
  title.textContent = `lag over the last ${dur(span)}; peak ${dur(highest)}`;
  chart.append(title);
  return el("div", {class: "chartbox"}, chart,
    el("span", {class: "axis axis-peak", text: `peak ${dur(highest)}`}),
    el("span", {class: "axis axis-left", text: span >= HOUR ? "−1h" : `−${Math.round(span / 60)}m`}),
    el("span", {class: "axis axis-right", text: "now"}));
}

async function setPaused(queue, paused) {
  const verb = paused ? "pause" : "resume";
  try {
    await post(`/api/queues/${encodeURIComponent(queue)}/${verb}`);
    flash(`${verb}d queue ${queue}`, "ok");
  } catch (err) {
    flash(`${verb} ${queue}: ${err.message}`, "bad");
  }
}

// --- limits ------------------------------------------------------------------------------

// A limit as `pgpool limits` says it: "concurrency 2, rate 50/60s"; "—" for none.
function limitText(l) {
  if (!l) return "—";
  const parts = [];
  if (l.concurrency !== null) parts.push(`concurrency ${l.concurrency}`);
  if (l.rate !== null) parts.push(`rate ${l.rate}/${l.per || 1}s`);
  return parts.join(", ") || "—";
}

function renderLimits(limits) {
  const rows = {};
  for (const l of limits) {
    // Rows live as long as their kind, like the queue cards: a reset button stays put.
    const row = state.limitRows[l.kind] || limitRow(l.kind);
    const set = (testid, text) => { $(`[data-testid="${testid}"]`, row).textContent = text; };
    set("limit-in-force", limitText(l.in_force));
    set("limit-override", limitText(l.override));
    set("limit-set-by", l.override ? l.override.set_by : "—");
    set("limit-running", l.running);
    set("limit-rate-used", l.rate_used);
    set("limit-ready", l.ready);
    set("limit-waiting", l.waiting);
    $('[data-testid="limit-waiting"]', row).classList.toggle("hot", l.waiting > 0);
    $('[data-testid="limit-reset"]', row).hidden = !l.override;
    rows[l.kind] = row;
  }
  state.limitRows = rows;
  const body = $("#limits tbody");
  if (!limits.length) {
    body.replaceChildren(el("tr", {}, el("td", {colspan: 9, class: "empty",
      text: "No limit in force: none in the hosts' code, none set below."})));
    return;
  }
  body.replaceChildren(...limits.map((l) => rows[l.kind]));
}

function limitRow(kind) {
  const cell = (testid, cls = "n") => el("td", {class: cls, "data-testid": testid});
  return el("tr", {"data-testid": "limit", "data-kind": kind},
    el("td", {class: "mono", text: kind}),
    cell("limit-in-force", ""), cell("limit-override", ""), cell("limit-set-by", ""),
    cell("limit-running"), cell("limit-rate-used"), cell("limit-ready"), cell("limit-waiting"),
    el("td", {}, actionButton("reset limit", "limit-reset", () => resetLimit(kind))));
}

// A field of the limit form: empty is null (the code's value), digits a number; anything
// else goes as typed, for the server to say what is wrong with it.
function limitField(id) {
  const text = $(id).value.trim();
  if (!text) return null;
  return /^[0-9]+$/.test(text) ? Number(text) : text;
}

async function setLimit() {
  const kind = $("#l-kind").value.trim();
  try {
    const done = await post("/api/limits/set", {
      kind, concurrency: limitField("#l-concurrency"), rate: limitField("#l-rate"),
      per: limitField("#l-per")});
    flash(`limit of kind ${kind} set to ${done.described} on every host`, "ok");
  } catch (err) {
    flash(`set limit: ${err.message}`, "bad");
  }
}

async function resetLimit(kind) {
  try {
    const done = await post("/api/limits/reset", {kind});
    flash(done.changed ? `limit of kind ${kind} reset: the code's limit holds again`
                       : `kind ${kind} had no override`, "ok");
  } catch (err) {
    flash(`reset limit ${kind}: ${err.message}`, "bad");
  }
}

// --- hosts and vacuum ------------------------------------------------------------------

function renderHosts(hosts, fleet) {
  const live = hosts.filter((h) => h.live).length;
  $("#hosts-summary").textContent = hosts.length
    ? `${live} live${hosts.length > live ? `, ${hosts.length - live} stale` : ""}` : "";
  const rows = hosts.map((h) => {
    const rate = h.claims_per_sec || 0;
    const share = h.counted ? h.claims_share : null;
    const cap = share || h.max_claims_per_sec || fleet.max_claims_per_sec || 0;
    const pct = cap ? Math.min(100, (100 * rate) / cap) : 0;
    const seen = el("td", {"data-testid": "last-seen"}, `${dur(h.last_seen_ago)} ago`);
    if (!h.live) seen.append(" ", el("span", {class: "badge badge-stale", text: "stale"}));
    else if (!h.counted) seen.append(" ", el("span", {class: "badge badge-warn", text: "lapsed"}));
    return el("tr", {"data-testid": "host", "data-owner": h.owner,
                     class: h.live ? "" : "stale"},
      el("td", {}, el("b", {text: h.hostname}), el("span", {class: "sub", text: ` pid ${h.pid}`})),
      el("td", {text: (h.queues || []).join(", ")}),
      el("td", {class: "n", text: h.procs}),
      el("td", {class: "n", "data-testid": "batch", text: h.batch ?? "—"}),
      el("td", {"data-testid": "host-claims"},
        el("div", {class: "meter", title: `share ${num(share)} of budget ${h.max_claims_per_sec ?? "—"}`},
          el("div", {class: "fill", style: `width:${pct.toFixed(0)}%`})),
        el("span", {class: "meter-text", "data-testid": "host-rate", text: num(h.claims_per_sec)}),
        el("span", {class: "meter-text sub",
                    text: ` / ${share === null ? "—" : num(share)}${h.wants_more ? "+" : ""}`})),
      el("td", {class: "n", text: h.claim_p99_ms === null ? "—" : `${num(h.claim_p99_ms)}ms`}),
      el("td", {class: "n", "data-testid": "claimed", text: h.jobs_claimed}),
      el("td", {class: "n", "data-testid": "done", text: h.jobs_done}),
      el("td", {class: "n", text: h.jobs_failed}),
      seen);
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 10, class: "empty", text: "No hosts registered."})));
  $("#hosts tbody").replaceChildren(...rows);
}

function renderVacuum(v) {
  const box = $("#vacuum");
  if (!v) {
    box.replaceChildren(el("p", {class: "empty", text: "No statistics for pgpool_jobs yet."}));
    return;
  }
  box.className = `vacuum ${v.warning ? "vacuum-bad" : "vacuum-ok"}`;
  box.dataset.warning = v.warning ? "true" : "false";
  box.replaceChildren(
    el("div", {class: "stats"},
      stat("dead tuples", v.dead_tuples, "vac-dead", v.warning ? "hot" : ""),
      stat("live tuples", v.live_tuples, "vac-live"),
      stat("last autovacuum", v.last_autovacuum_ago === null ? "never" : `${dur(v.last_autovacuum_ago)} ago`, "vac-ago"),
      stat("settings", v.settings_kept ? "kept" : "lost", "vac-settings", v.settings_kept ? "" : "hot")),
    el("p", {class: v.warning ? "flag" : "sub", "data-testid": "vac-flag",
             text: v.warning ? `⚠ ${v.warning}` : "no vacuum debt"}));
}

// What holds back vacuum of pgpool's tables (the server's pgpool.horizon). The query and
// client address come only with --allow-payloads; the statement that ends a holder is shown,
// never run.
function renderHorizon(h) {
  const box = $("#horizon");
  if (!h) return;
  const oldest = h.holders[0];
  const growth = h.dead_rows_per_min;
  $("#horizon-summary").textContent = oldest
    ? `${oldest.age_seconds === null ? "age unknown in time" : dur(oldest.age_seconds)} · ` +
      `${oldest.age_transactions} transactions` : "";
  box.className = `vacuum ${h.warning ? "vacuum-bad" : "vacuum-ok"}`;
  box.dataset.warning = h.warning ? "true" : "false";
  const jobs = h.tables.find((t) => t.table === "pgpool_jobs");
  const stats = el("div", {class: "stats"},
    stat("pgpool_jobs dead rows", jobs ? jobs.dead_tuples : "—", "horizon-dead", h.piling_up ? "hot" : ""),
    stat("growth", growth === null || growth === undefined ? "—" : `${growth >= 0 ? "+" : ""}${Math.round(growth)}/min`, "horizon-growth"),
    stat("last vacuum", jobs && jobs.last_vacuum_ago !== null ? `${dur(jobs.last_vacuum_ago)} ago` : "never", "horizon-vacuum"),
    stat("claim p99", h.claim_p99_ms === null ? "—" : `${num(h.claim_p99_ms)}ms`, "horizon-p99"));
  // The short transactions of a busy database come and go: only those past shown_after.
  const shown = h.holders.filter((x) => x.age_seconds === null || x.age_seconds >= h.shown_after);
  const rows = shown.map((x) => el("tr", {"data-testid": "horizon-holder", "data-kind": x.kind,
                                             "data-pid": x.pid ?? "", "data-name": x.name ?? ""},
    el("td", {text: x.description}),
    el("td", {class: "n", text: x.age_seconds === null ? "?" : dur(x.age_seconds)}),
    el("td", {class: "n", text: x.age_transactions}),
    el("td", {"data-testid": "horizon-client", text: x.client_addr || "—"}),
    el("td", {class: "mono", "data-testid": "horizon-query",
              title: x.query_seconds === null ? "" : `running ${dur(x.query_seconds)}`,
              text: x.query || (x.kind === "backend" && !errorsShown()
                ? "hidden: start pgpool web --allow-payloads to show it" : "—")}),
    el("td", {}, el("code", {"data-testid": "horizon-end", text: x.end || "on the standby: see the warning"}))));
  if (!rows.length) {
    rows.push(el("tr", {}, el("td", {colspan: 6, class: "empty",
      text: oldest ? `Nothing has held back vacuum of pgpool's tables for ${dur(h.shown_after)} or more.`
                   : "Nothing holds back vacuum of pgpool's tables."})));
  }
  const notes = h.catalog_holders.map((c) => el("p", {class: "sub", "data-testid": "horizon-catalogs",
    text: `not holding pgpool's tables: ${c.description} holds back vacuum of the system catalogs only (${c.age_transactions} transactions)`}));
  if (h.hidden_sessions) {
    notes.push(el("p", {class: "sub", "data-testid": "horizon-hidden",
      text: `${h.hidden_sessions} session(s) of this database are hidden from this server's role, and one may hold the horizon (grant pg_read_all_stats to see it)`}));
  }
  box.replaceChildren(stats,
    el("table", {class: "grid", "data-testid": "horizon-holders"},
      el("thead", {}, el("tr", {},
        el("th", {text: "holder"}), el("th", {class: "n", text: "open"}), el("th", {class: "n", text: "xids"}),
        el("th", {text: "client"}), el("th", {text: "query (first line)"}), el("th", {text: "end it with"}))),
      el("tbody", {}, ...rows)),
    ...notes,
    el("p", {class: h.warning ? "flag" : "sub", "data-testid": "horizon-flag",
             text: h.warning ? `⚠ ${h.warning}` : "the horizon does not hold the queue back"}));
}

// --- outcomes: groups in progress, successes kept ------------------------------------------

function renderGroups(groups) {
  const shown = groups.oldest.length;
  $("#groups-summary").textContent = groups.in_progress
    ? `${groups.in_progress}${shown < groups.in_progress ? ` (the ${shown} oldest shown)` : ""}` : "";
  const rows = groups.oldest.map((g) => {
    const pct = g.total ? (100 * g.finished) / g.total : 100;
    return el("tr", {"data-testid": "group", "data-group-id": g.id,
                     title: "show its callback and list its members", onclick: () => showGroup(g.id)},
      el("td", {class: "n", text: g.id}),
      el("td", {},
        el("div", {class: "meter"}, el("div", {class: "fill", style: `width:${pct.toFixed(0)}%`})),
        el("span", {class: "meter-text", "data-testid": "group-progress", text: `${g.finished}/${g.total}`})),
      el("td", {class: "n", text: g.done}),
      el("td", {class: "n", text: g.dead}),
      el("td", {}, el("span", {class: `state state-${g.callback}`, "data-testid": "group-callback",
                               text: g.callback || "—"})),
      el("td", {text: `${dur(g.age)} ago`}));
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 6, class: "empty", text: "No group in progress."})));
  $("#groups tbody").replaceChildren(...rows);
}

function renderSucceeded(kinds) {
  const rows = kinds.map((s) => el("tr", {"data-testid": "succeeded-kind", "data-kind": s.kind},
    el("td", {class: "mono", text: s.kind}),
    el("td", {class: "n", "data-testid": "succeeded-hour", text: `${s.last_hour}${s.last_hour_more ? "+" : ""}`}),
    el("td", {text: s.last_ago === null ? "—" : `${dur(s.last_ago)} ago`})));
  if (!rows.length) {
    rows.push(el("tr", {}, el("td", {colspan: 3, class: "empty",
      text: "None kept: a success is kept with keep= on its handler or pgpool run --keep-done."})));
  }
  $("#succeeded tbody").replaceChildren(...rows);
}

// A group: its members in the jobs list, its callback (with the group's progress) in the detail.
function showGroup(id) {
  showTab("jobs");
  $("#f-group").value = String(id);
  loadJobs();
  showJob(id);
}

// --- jobs --------------------------------------------------------------------------------

function updateQueueFilter(queues) {
  const select = $("#f-queue");
  const have = new Set([...select.options].map((o) => o.value));
  for (const q of queues) {
    if (!have.has(q.queue)) select.append(el("option", {value: q.queue, text: q.queue}));
  }
}

function jobFilters() {
  const form = new FormData($("#job-filters"));
  return Object.fromEntries([...form.entries()].filter(([, v]) => v !== ""));
}

async function loadJobs(reset = true) {
  if (reset) state.jobsCursors = [null];
  const before = state.jobsCursors[state.jobsCursors.length - 1];
  const body = $("#jobs tbody");
  // Only the latest request's answer is shown: an earlier one may arrive after it.
  const seq = ++state.jobsSeq;
  let data;
  try {
    data = await getJSON("/api/jobs", {...jobFilters(), limit: JOBS_PAGE, after: before});
  } catch (err) {
    if (seq !== state.jobsSeq) return;
    body.replaceChildren(el("tr", {}, el("td", {colspan: 9, class: "error", "data-testid": "jobs-error", text: err.message})));
    return;
  }
  if (seq !== state.jobsSeq) return;
  state.jobsNext = data.next_after;
  $("#jobs-next").disabled = data.next_after === null || data.next_after === undefined;
  $("#jobs-prev").disabled = state.jobsCursors.length < 2;
  $("#jobs-page").textContent = `page ${state.jobsCursors.length}`;
  const rows = data.jobs.map((j) => el("tr", {
      "data-testid": "job", "data-job-id": j.id, "data-state": j.state,
      class: j.id === state.jobId ? "selected" : "", onclick: () => showJob(j.id)},
    el("td", {class: "n", text: j.id}),
    el("td", {text: j.queue}),
    el("td", {text: j.kind}),
    el("td", {}, el("span", {class: `state state-${j.state}`, text: j.state}),
       ...(j.progress ? [progressBar(j, "job-progress")] : [])),
    el("td", {class: "n", text: j.max_attempts ? `${j.attempts}/${j.max_attempts}` : j.attempts}),
    el("td", {text: j.state === "scheduled" ? `in ${dur((Date.parse(j.run_at) - Date.now()) / 1000)}`
                  : j.state === "waiting" ? "when its group finishes" : ago(j.run_at)}),
    el("td", {text: ago(j.created_at)}),
    el("td", {class: "mono", text: j.owner || ""}),
    el("td", {class: "err", text: j.error || ""})));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 9, class: "empty", text: "No jobs match."})));
  body.replaceChildren(...rows);
  document.body.dataset.jobsLoaded = String(Number(document.body.dataset.jobsLoaded || 0) + 1);
}

// A long job's progress (current_job().progress), as its heartbeats wrote it: a bar when
// it has a total, and its rate and time left from the last two reports seen of it.
function progressBar(j, testid) {
  const p = j.progress;
  const bar = el("progress", {"data-testid": testid, class: "job-progress"});
  if (p.total) {
    bar.max = p.total;
    bar.value = Math.min(p.done, p.total);
  }
  bar.title = progressText(j);
  return bar;
}

function progressText(j) {
  const p = j.progress;
  const seen = state.progressSeen[j.id];
  if (!seen || seen.at !== p.at) {
    state.progressSeen[j.id] = {done: p.done, at: p.at, rate: seen && seen.at < p.at
      ? (p.done - seen.done) / ((Date.parse(p.at) - Date.parse(seen.at)) / 1000) : seen?.rate};
  }
  const rate = state.progressSeen[j.id].rate;
  let text = p.total ? `${p.done} of ${p.total} (${Math.floor(100 * p.done / p.total)}%)`
                     : `${p.done}`;
  if (rate > 0) {
    text += `, ${num(rate)}/s`;
    if (p.total) text += `, about ${dur((p.total - p.done) / rate)} left`;
  }
  if (p.note) text += ` — ${p.note}`;
  return text + ` (${ago(p.at)})`;
}

async function showJob(id) {
  state.jobId = id;
  for (const tr of document.querySelectorAll("#jobs tbody tr")) {
    tr.classList.toggle("selected", tr.dataset.jobId === String(id));
  }
  const box = $("#job-detail");
  box.hidden = false;
  box.dataset.jobId = String(id);
  let j;
  try {
    j = await getJSON(`/api/jobs/${id}`);
  } catch (err) {
    if (state.jobId !== id) return;  // another job was clicked meanwhile
    box.replaceChildren(el("h3", {text: `job ${id}`}),
      el("p", {class: "error", "data-testid": "detail-error", text: err.message}));
    return;
  }
  if (state.jobId !== id) return;
  const field = (k, v, testid) => [el("dt", {text: k}), el("dd", {"data-testid": testid}, v)];
  const close = el("button", {type: "button", class: "ghost", "data-testid": "detail-close",
                              onclick: () => { box.hidden = true; state.jobId = null; }, text: "×"});
  if (j.state === "done" && "finished_at" in j) {
    box.replaceChildren(...doneDetail(j, field, close));
    return;
  }
  const dl = el("dl", {},
    ...field("queue / kind", `${j.queue} / ${j.kind}`, "d-kind"),
    ...field("state", j.state, "d-state"),
    ...field("attempts", j.max_attempts ? `${j.attempts} of ${j.max_attempts}`
                                        : `${j.attempts} (limit: the handler's)`, "d-attempts"),
    ...field("priority", j.priority, "d-priority"),
    ...field("owner", j.owner || "—", "d-owner"),
    ...field("lease left", j.lease_left === null ? "—" : dur(j.lease_left), "d-lease"),
    ...field("due", j.state === "waiting" ? "when its group finishes"
                                          : `${j.run_at} (${ago(j.run_at)})`, "d-due"),
    ...field("progress", j.progress ? el("span", {}, progressBar(j, "d-progress-bar"),
                                         " " + progressText(j))
                                    : "—", "d-progress"),
    ...field("checkpoint", j.checkpoint_at ? `stored ${ago(j.checkpoint_at)}` : "none",
             "d-checkpoint"),
    ...field("created", j.created_at, "d-created"),
    ...groupFields(j, field));
  const parts = [
    el("header", {}, el("h3", {text: `job ${j.id}`}), el("span", {class: "grow"}),
       actionButton("cancel", "cancel-job", () => cancelJob(j.id), "danger"), close),
    dl,
    el("h4", {text: "last error"}),
    errorsShown() ? el("pre", {"data-testid": "d-error", text: j.last_error || j.error || "none"})
                  : el("p", {class: "sub", "data-testid": "d-error-hidden",
                             text: "error text hidden: it may quote the payload (start pgpool web --allow-payloads to show it)"}),
  ];
  if (state.session && state.session.allow_payloads && "payload" in j) {
    parts.push(el("h4", {text: "payload"}),
               el("pre", {"data-testid": "d-payload", text: JSON.stringify(j.payload, null, 2)}));
  } else {
    parts.push(el("p", {class: "sub", "data-testid": "d-payload-hidden",
                        text: "payload hidden (start pgpool web --allow-payloads to show it)"}));
  }
  box.replaceChildren(...parts);
}

// A job's groups: the one it is a member of (a link that lists the members), and its own
// group's progress when it is a group's callback.
function groupFields(j, field) {
  const out = [];
  if (j.group_id !== null && j.group_id !== undefined) {
    out.push(...field("member of", el("a", {class: "group", "data-testid": "d-member-of",
      onclick: () => showGroup(j.group_id), text: `group ${j.group_id}`}), "d-group-id"));
  }
  const g = j.group;
  if (g) {
    out.push(...field("group", `${g.finished}/${g.total} finished (${g.done} done, ${g.dead} dead` +
      ` or cancelled); callback ${g.callback}${g.completed_at ? `; completed ${ago(g.completed_at)}` : ""}`,
      "d-group"));
  }
  return out;
}

// A job kept as done after its success: no error, no payload (not kept), and its result
// only when the server allows user data.
function doneDetail(j, field, close) {
  const dl = el("dl", {},
    ...field("queue / kind", `${j.queue} / ${j.kind}`, "d-kind"),
    ...field("state", el("span", {class: "state state-done kept", text: "done"}), "d-state"),
    ...field("attempts", String(j.attempts), "d-attempts"),
    ...field("tenant", j.tenant || "—", "d-tenant"),
    ...field("created", j.created_at, "d-created"),
    ...field("finished", `${j.finished_at} (${ago(j.finished_at)})`, "d-finished"),
    ...field("kept until", j.keep_until, "d-kept-until"),
    ...groupFields(j, field));
  const parts = [el("header", {}, el("h3", {text: `job ${j.id}`}), el("span", {class: "grow"}), close),
                 dl, el("h4", {text: "result"})];
  if (errorsShown() && "result" in j) {
    parts.push(el("pre", {"data-testid": "d-result", text: JSON.stringify(j.result, null, 2)}));
  } else {
    parts.push(el("p", {class: "sub", "data-testid": "d-result-hidden",
                        text: "result hidden: it is user data (start pgpool web --allow-payloads to show it)"}));
  }
  return parts;
}

async function cancelJob(id) {
  if (!(await confirmAction(`Cancel job ${id}? It moves to the dead letters and does not run again.`,
                            `cancel job ${id}`))) return;
  try {
    await post(`/api/jobs/${id}/cancel`);
    flash(`cancelled job ${id}`, "ok");
  } catch (err) {
    flash(`cancel ${id}: ${err.message}`, "bad");
  }
  loadJobs(false);
  showJob(id);
}

// --- dead letters ------------------------------------------------------------------------

async function loadDeadGroups() {
  const body = $("#dead-groups tbody");
  let data;
  try {
    data = await getJSON("/api/dead/groups");
  } catch (err) {
    body.replaceChildren(el("tr", {}, el("td", {colspan: 8, class: "error", text: err.message})));
    return;
  }
  const rows = data.groups.map((g) => el("tr", {
      "data-testid": "dead-group", "data-kind": g.kind, "data-reason": g.reason,
      "data-signature": g.signature},
    el("td", {text: g.kind}),
    el("td", {"data-testid": "group-reason", text: g.reason}),
    errorsShown() ? el("td", {class: "err", text: g.signature})
                  : el("td", {class: "sub", title: "start pgpool web --allow-payloads to show error text", text: "hidden"}),
    el("td", {class: "n", "data-testid": "group-count", text: g.count}),
    el("td", {text: ago(g.first_died_at)}),
    el("td", {text: ago(g.last_died_at)}),
    el("td", {class: "n", text: g.example_id}),
    el("td", {class: "actions"},
      actionButton("replay", "replay", () => deadAction("replay", g)),
      actionButton("purge", "purge", () => deadAction("purge", g), "danger"))));
  if (!rows.length) rows.push(el("tr", {}, el("td", {colspan: 8, class: "empty", text: "No dead letters."})));
  body.replaceChildren(...rows);
  document.body.dataset.deadLoaded = String(Number(document.body.dataset.deadLoaded || 0) + 1);
}

// Replay or purge one group: count it first (dry run), say that number, then act.
async function deadAction(verb, group) {
  const filter = {kind: group.kind, reason: group.reason, signature: group.signature};
  let count;
  try {
    count = (await post(`/api/dead/${verb}`, {...filter, dry_run: true})).count;
  } catch (err) {
    flash(`${verb}: ${err.message}`, "bad");
    return;
  }
  const error = errorsShown() ? `error “${group.signature}”` : "the same error";
  const what = `${count} dead ${group.kind} job${count === 1 ? "" : "s"} (${group.reason}) with ${error}`;
  const text = verb === "replay" ? `Replay ${what}? They run again from attempt 1.`
                                 : `Purge ${what}? They are deleted for good.`;
  const ok = await confirmAction(text, `${verb} ${count}`, verb === "replay");
  if (!ok) return;
  const body = {...filter, dry_run: false};
  if (verb === "replay") {
    const rate = parseFloat($("#confirm-rate").value);
    if (rate > 0) body.rate = rate;
  }
  try {
    const done = await post(`/api/dead/${verb}`, body);
    const jobs = `${done.count} job${done.count === 1 ? "" : "s"}`;
    // A replay at a rate goes on in the server after it answers (202, "started"). The
    // notes (what it left dead, or moved back outside a group, and why) are the CLI's words.
    const notes = (done.notes || []).join("; ");
    flash((done.started ? `replaying ${jobs} at ${done.rate}/s` :
           `${verb === "replay" ? "replayed" : "purged"} ${jobs}`) + (notes ? `; ${notes}` : ""),
          notes ? "info" : "ok");
  } catch (err) {
    flash(`${verb}: ${err.message}`, "bad");
  }
  loadDeadGroups();
}

// Ask before acting; ``label`` names the act on the OK button ("replay 5").
function confirmAction(text, label, withRate = false) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  $("#confirm-ok").textContent = label;
  $("#confirm-rate-row").hidden = !withRate;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), {once: true});
    dialog.showModal();
  });
}

// --- start -------------------------------------------------------------------------------

function showTab(name) {
  for (const b of document.querySelectorAll("[data-tab]")) {
    b.setAttribute("aria-selected", String(b.dataset.tab === name));
  }
  $("#jobs-view").hidden = name !== "jobs";
  $("#dead-view").hidden = name !== "dead";
}

async function start() {
  try {
    state.session = await getJSON("/api/session");
  } catch (err) {
    setConn(`cannot load the session: ${err.message}`, "conn-bad");
    return;
  }
  const rw = readWrite();
  const mode = $("#mode");
  mode.textContent = rw ? "read-write" : "read-only";
  mode.className = `mode ${rw ? "mode-rw" : "mode-ro"}`;
  document.body.dataset.mode = rw ? "read-write" : "read-only";
  $("#readonly-note").hidden = rw;
  if (!errorsShown()) $("#jobs-error-head").textContent = "error (hidden)";
  $("#user").textContent = state.session.user ? `signed in as ${state.session.user}` : "";
  for (const b of document.querySelectorAll("[data-tab]")) {
    b.addEventListener("click", () => showTab(b.dataset.tab));
  }
  $("#job-filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadJobs(); });
  $("#limit-form").append(actionButton("set limit", "limit-set", setLimit));
  const findJob = () => {
    const id = $("#find-job").value.trim();
    if (/^[0-9]+$/.test(id)) showJob(Number(id));
    else flash(`show job: ${JSON.stringify(id)} is not a job id`, "bad");
  };
  $("#find-job-show").addEventListener("click", findJob);
  $("#find-job").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") { ev.preventDefault(); findJob(); }
  });
  $("#job-filters").addEventListener("change", () => loadJobs());
  $("#jobs-next").addEventListener("click", () => {
    state.jobsCursors.push(state.jobsNext);
    loadJobs(false);
  });
  $("#jobs-prev").addEventListener("click", () => {
    state.jobsCursors.pop();
    loadJobs(false);
  });
  document.body.dataset.ready = "true";
  connect();
  loadJobs();
  setInterval(tick, 1000);
}

document.addEventListener("DOMContentLoaded", start);
