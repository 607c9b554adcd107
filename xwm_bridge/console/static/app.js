// xwm-bridge operator console. Plain ES module, no build step, no third-party code.
// Data comes only over /console/ws: JSON-RPC after a `console.auth {token}` frame.
// The token lives in sessionStorage (this tab) and is never put in a URL.

import { Connection } from "./connection.js";
import { $, fmtAgo, h, pill, setText } from "./dom.js";
import { clearErrors, showError } from "./banner.js";
import { applyToHealth, renderConfig, renderHealth } from "./health.js";
import { permKey, renderPermCards, tickCountdowns } from "./perms.js";
import { Serial } from "./serial.js";
import { filters, matchesFilters, renderSessions, trimSessions } from "./sessions.js";
import { applyUpdate, growOutput, newTurnView, renderTurns, setOutput, trimTurns } from "./turns.js";

const TOKEN_KEY = "xwm-bridge-token";
const NOT_OPERATOR = "This token sees only its own sessions: the console needs an admin token (admin_tokens).";

// --- state -------------------------------------------------------------------------------
const state = {
  view: "sessions",
  sessions: new Map(), // sessionId → row
  order: [],
  paged: 0, // sessions loaded with session.list pages (the live list keeps at least these)
  nextCursor: null,
  selected: null,
  detail: null, // {session, turns: Map turnId → turn view}
  permissions: new Map(), // `${sessionId}|${requestId}` → record
  health: null,
  samples: [],
  config: null,
};
let conn = null;

// Resolved permission records kept (every pending one stays, and those of the open
// session): past MAX_RESOLVED + a margin, the oldest resolved ones go.
const MAX_RESOLVED = 500;

function trimPermissions() {
  if (state.permissions.size <= MAX_RESOLVED + 100) return;
  const old = [...state.permissions.entries()]
    .filter(([, p]) => p.state !== "pending" && p.sessionId !== state.selected)
    .sort(([, a], [, b]) => (a.resolvedAt || a.createdAt || 0) - (b.resolvedAt || b.createdAt || 0));
  for (const [key] of old.slice(0, Math.max(0, old.length - MAX_RESOLVED))) state.permissions.delete(key);
}

// What the page holds, for an operator in the browser's devtools (and the tests).
globalThis.xwmConsole = {
  held: () => ({
    sessions: state.sessions.size,
    listed: state.order.length,
    permissions: state.permissions.size,
    turns: state.detail ? state.detail.turns.size : 0,
    output: state.detail ? [...state.detail.turns.values()].reduce((n, t) => n + t.output.length, 0) : 0,
    toolCalls: state.detail ? [...state.detail.turns.values()].reduce((n, t) => n + t.tools.size, 0) : 0,
  }),
};

// --- rendering ------------------------------------------------------------------------------
function renderTabs() {
  for (const a of $("tabs").querySelectorAll("a")) a.classList.toggle("active", a.dataset.view === state.view);
  for (const v of ["sessions", "permissions", "health", "config"]) $(`view-${v}`).hidden = v !== state.view;
  const pending = [...state.permissions.values()].filter((p) => p.state === "pending").length;
  $("perm-badge").hidden = pending === 0;
  $("perm-badge").textContent = String(pending);
}

function renderPermissions() {
  const all = [...state.permissions.values()].sort((a, b) => (b.createdAt || 0) - (a.createdAt || 0));
  const pending = all.filter((p) => p.state === "pending");
  const resolved = all.filter((p) => p.state !== "pending" && p.resolution !== "policy").slice(0, 60);
  renderPermCards($("perm-pending"), pending, false, call);
  $("perm-none").hidden = pending.length > 0;
  renderPermCards($("perm-resolved"), resolved, false, call);
  $("perm-resolved-none").hidden = resolved.length > 0;
  tickCountdowns();
  renderTabs();
}

// A request to the bridge from a button: rejected when not connected (conn is null then).
const call = (method, params) => (conn ? conn.call(method, params) : Promise.reject(new Error("not connected")));

function renderDetail() {
  const d = state.detail;
  $("detail-empty").hidden = Boolean(d);
  $("detail-body").hidden = !d;
  if (!d) { renderTurns($("turns"), [], () => {}); return; }
  const s = state.sessions.get(d.sessionId) || d.session;
  setText($("d-title"), d.sessionId);
  $("d-meta").replaceChildren(
    pill(s.state),
    h("span", { text: `thread ${s.threadId || "—"}` }),
    h("span", { text: `provider ${s.provider || "—"}` }),
    h("span", { text: `${d.turns.size} turn${d.turns.size === 1 ? "" : "s"}` }),
    h("span", { text: `updated ${fmtAgo(s.updatedAt)}` }),
  );
  $("cancel").hidden = !s.running && s.state !== "running";
  // a failed cancel's error stays while its session is open and the button shown
  if ($("cancel").hidden || $("cancel-error").dataset.session !== d.sessionId) $("cancel-error").hidden = true;
  const turns = [...d.turns.values()].sort((a, b) => (b.startedAt || 0) - (a.startedAt || 0));
  const byTurn = new Map(); // turn id → its permission records (not the policy decisions)
  for (const p of state.permissions.values()) {
    if (p.sessionId !== d.sessionId || p.resolution === "policy") continue;
    if (!byTurn.has(p.turnId)) byTurn.set(p.turnId, []);
    byTurn.get(p.turnId).push(p);
  }
  renderTurns($("turns"), turns, (el, t) => renderPermCards(el, byTurn.get(t.turnId) || [], true, call));
  tickCountdowns();
}

function render() {
  renderTabs();
  if (state.view === "sessions") { renderSessions(state, select); renderDetail(); }
  if (state.view === "permissions") renderPermissions();
  if (state.view === "health") renderHealth(state);
  if (state.view === "config") renderConfig(state);
}

// --- actions ----------------------------------------------------------------------------------
// session.list reads: one overtaken by a later one (a filter changed again) is not applied
let listReads = 0;

async function loadSessions(more) {
  const mine = ++listReads;
  const params = filters();
  if (more && state.nextCursor) params.cursor = state.nextCursor;
  const res = await readSnapshot("session.list", params, (res) => {
    if (mine !== listReads) return;
    if (!more) { state.sessions.clear(); state.order = []; state.paged = 0; }
    for (const s of res.sessions) {
      if (!state.sessions.has(s.sessionId)) state.order.push(s.sessionId);
      state.sessions.set(s.sessionId, s);
    }
    state.paged += res.sessions.length;
    state.nextCursor = res.nextCursor;
  });
  return res.watchCursor;
}

const seqOf = (cursor) => Number(String(cursor || "").split(":").pop()) || 0;

// A session's snapshot: session.get (its watchCursor: every event up to it is in here) and the
// ledger (session.replay: output so far, tool calls, plan). Events after the cursor come from
// the watch; those the snapshot already holds are dropped by seq and by ledger event id.
async function loadDetail(id) {
  let res;
  try {
    res = await readSnapshot("session.get", { sessionId: id }, (r) => {
      for (const p of r.permissions) state.permissions.set(permKey(p), p);
      if (!state.sessions.has(id)) { state.sessions.set(id, r.session); state.order.unshift(id); }
    });
  } catch (e) {
    if (e.code !== -32602) throw e;
    // not started yet (its turn is on the way): an empty view that the watch fills in
    const session = { sessionId: id, state: "idle" };
    return { sessionId: id, session, turns: new Map(), seq: 0 };
  }
  const turns = new Map();
  for (const t of res.turns) turns.set(t.turnId, newTurnView(t));
  let current = null;
  for (let after = 0; ;) {
    const replay = await conn.call("session.replay", { sessionId: id, afterEventId: after });
    replay.notifications.forEach((n, i) => {
      const p = n.params || {};
      if (p.threadId !== undefined && p.turnId) current = p.turnId; // a bridge update: its turn
      // a turn that started after session.get: skipped here, the watch brings all of it
      const t = current && turns.get(current);
      if (t) { applyUpdate(t, p); t.lastEventId = replay.eventIds[i]; }
    });
    const ids = [...replay.eventIds, ...replay.results.map((r) => r.eventId)];
    if (!replay.truncated || !ids.length) break;
    after = Math.max(...ids);
  }
  // a finished turn's output is its result's, unless the bridge stored only the first 64 KiB
  // of it (`truncated`): then the ledger's (its end, as the live view showed it)
  for (const t of turns.values()) {
    const r = t.result;
    if (r && typeof r.output === "string" && t.status !== "running" && !(r.truncated && t.output)) setOutput(t, r.output, 0);
  }
  return { sessionId: id, session: res.session, turns, seq: seqOf(res.watchCursor) };
}

// the session whose snapshot is being read: the watch's events for it wait here meanwhile
let loading = null;

// Rejects when the session's snapshot cannot be read (the view is left empty, the error shown).
async function showDetail(id) {
  const mine = (loading = { sessionId: id, events: [] });
  let d = null;
  let failure = null;
  try { d = await loadDetail(id); } catch (e) { failure = e; }
  if (loading !== mine) return; // another one was selected since
  loading = null;
  state.detail = d;
  if (d) for (const e of mine.events) applyToDetail(d, e);
  showError("detail", failure ? `could not open session ${id}: ${failure.message}` : "");
  if (failure) throw failure;
}

// Never rejects: a failure is shown (showDetail).
async function select(id) {
  state.selected = id;
  if (location.hash !== `#/sessions/${encodeURIComponent(id)}`) history.replaceState(null, "", `#/sessions/${encodeURIComponent(id)}`);
  await showDetail(id).catch(() => {});
  render();
}

// The Cancel turn button: a failure is shown next to it (as a permission answer's is),
// never left as an uncaught rejection; the button can be pressed again.
async function cancelTurn() {
  if (!state.detail) return;
  const sessionId = state.detail.sessionId;
  const error = $("cancel-error");
  error.hidden = true;
  $("cancel").disabled = true;
  try {
    if (!conn) throw new Error("not connected");
    await conn.call("session.cancel", { sessionId });
  } catch (e) {
    error.dataset.session = sessionId;
    setText(error, `cancel failed: ${e.message}`);
    error.hidden = false;
  } finally {
    $("cancel").disabled = false;
  }
}

async function loadPermissions() {
  await readSnapshot("permission.list", { includeResolved: true }, (res) => {
    state.permissions.clear();
    for (const p of res.requests) state.permissions.set(permKey(p), p);
    trimPermissions();
  });
}

// The health snapshot, read while the watch runs (a reset): the health, queue and metrics
// events after its cursor are applied again on top of it (the answer can come after them, and
// replaced the newer figures with older ones); a read that a newer one overtook is dropped.
let healthReads = 0;

async function loadHealth() {
  const mine = ++healthReads;
  await readSnapshot("bridge.health", {}, (res) => {
    if (mine !== healthReads) return;
    state.health = res;
    state.samples = (res.samples || []).slice(-90);
  }, (e) => { if (mine === healthReads) applyToHealth(state, e); });
}

// The Config view's config. Never rejects (a failure is shown); a read overtaken is dropped.
let configReads = 0;
async function loadConfig() {
  const mine = ++configReads;
  await call("bridge.config", {}).then(
    (c) => { if (mine === configReads) { state.config = c; showError("config", ""); render(); } },
    (e) => { if (mine === configReads) showError("config", `could not read the config: ${e.message}`); },
  );
}

// --- events from the watch --------------------------------------------------------------------
// One event of the open session, unless its snapshot has it; true when a turn's output grew.
function applyToDetail(d, e) {
  if (e.seq <= d.seq) return false; // before the snapshot's cursor: in the snapshot
  if (e.kind === "session") {
    if (e.type === "started") d.turns.clear(); // a new conversation (its turns follow)
    return false;
  }
  let t = d.turns.get(e.turnId);
  if (e.type === "started" && !t) { d.turns.set(e.turnId, (t = newTurnView(e))); trimTurns(d.turns); }
  if (!t) return false;
  if (e.type === "update") {
    if (e.eventId <= t.lastEventId) return false; // the replay had it
    t.lastEventId = e.eventId;
    applyUpdate(t, e.update);
    return Boolean(e.update && e.update.type === "delta");
  }
  if (e.type === "finished") {
    Object.assign(t, { status: e.status, durationMs: e.durationMs, usage: e.usage || t.usage, error: e.error });
    // its result: the newest two turns are enough (it, and one started since), not the
    // session's up to 64 with their results (megabytes per finished turn)
    conn.call("session.get", { sessionId: d.sessionId, turns: 2 }).then((res) => {
      const fresh = res.turns.find((x) => x.turnId === e.turnId);
      if (fresh) { t.result = fresh.result; if (!t.output && fresh.result && typeof fresh.result.output === "string") setOutput(t, fresh.result.output, 0); render(); }
    }, () => {});
  }
  return false;
}

// What an event changes in the session list and the permission records.
function applyToLists(e) {
  const sid = e.sessionId;
  if (e.kind === "session" && e.type === "closed") {
    state.sessions.delete(sid);
    state.order = state.order.filter((x) => x !== sid);
  } else if (e.kind === "turn" && (e.type === "started" || e.type === "finished")) {
    let s = state.sessions.get(sid);
    if (!s) { s = { sessionId: sid, threadId: e.threadId, provider: e.provider, state: "idle" }; state.sessions.set(sid, s); }
    s.lastTurn = e;
    s.updatedAt = e.ts;
    s.provider = e.provider || s.provider;
    s.threadId = e.threadId || s.threadId;
    s.state = e.type === "started" ? "running" : e.status;
    s.running = e.type === "started";
    state.order = [sid, ...state.order.filter((x) => x !== sid)];
    if (!matchesFilters(s)) state.order = state.order.filter((x) => x !== sid);
    trimSessions(state);
  } else if (e.kind === "permission") {
    state.permissions.set(permKey(e), { ...e });
    trimPermissions();
  }
}

// A snapshot read while the watch runs (a filter change, "more", a reset): the watch's events
// that arrive meanwhile may be newer than it (the bridge reads it after its cursor, and the
// answer can come after them), so they are kept and those after its cursor applied again on
// top of it (`again`); else a turn that started meanwhile showed as not running until its
// next event.
const reading = new Set();

async function readSnapshot(method, params, apply, again = applyToLists) {
  const seen = [];
  reading.add(seen);
  try {
    const res = await conn.call(method, params);
    apply(res);
    const after = seqOf(res.watchCursor);
    for (const e of seen) if (e.seq > after) again(e);
    return res;
  } finally {
    reading.delete(seen);
  }
}

function onEvent(e) {
  if (e.kind === "watch") {
    $("conn").className = "conn live";
    $("conn-text").textContent = "live";
    if (e.reset) resyncs.request();
    return;
  }
  const sid = e.sessionId;
  if (loading && loading.sessionId === sid && (e.kind === "session" || e.kind === "turn")) loading.events.push(e);
  if (e.kind !== "turn" || e.type !== "update") for (const seen of reading) seen.push(e); // not output
  if (e.kind === "permission" || (e.kind === "turn" ? e.type !== "update" : e.kind === "session")) applyToLists(e);
  const d = state.detail && state.detail.sessionId === sid ? state.detail : null;
  if (e.kind === "session") {
    if (d) applyToDetail(d, e);
  } else if (e.kind === "turn") {
    if (d && applyToDetail(d, e) && state.view === "sessions") {
      // grow the output in place (no re-render of the whole page per chunk)
      if (growOutput(d.turns.get(e.turnId))) return;
    }
  } else {
    applyToHealth(state, e);
    if (e.kind === "metrics" && state.view !== "health") return;
  }
  renderSoon();
}

// A busy bridge sends events in bursts (two per turn, and every session's): the page
// renders once per frame, not once per event (a full render is the whole session list).
let renderQueued = false;
function renderSoon() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => { renderQueued = false; render(); });
}

async function resync() {
  const cursor = await loadSessions(false);
  await loadPermissions();
  await loadHealth();
  if (state.selected) await showDetail(state.selected);
  // the config too (a reset is most often a restarted bridge, maybe with another config):
  // read again now when its view is shown, else when it is next opened
  state.config = null;
  if (state.view === "config") await loadConfig();
  render();
  return cursor;
}

// The snapshots re-read after a reset, one resync at a time (a reset while one runs: one
// more after it); a failure is shown and retried, 1 s after the first, doubling up to 30 s.
const resyncs = new Serial(resync, {
  done: () => showError("resync", ""),
  failed: (e, ms) => {
    if (!conn) return false; // signed out meanwhile
    showError("resync", `could not re-read the bridge's state: ${e.message} (trying again in ${Math.round(ms / 1000)} s)`);
    return true;
  },
});

// A list read from the filters or "more": its failure shown, cleared by the next that works;
// one lost with the connection (no JSON-RPC error) is read again once it is back.
let listLost = null;
function reloadSessions(more) {
  listLost = null;
  loadSessions(more).then(
    () => { showError("list", ""); render(); },
    (e) => {
      if (e.code === undefined) listLost = { more };
      showError("list", `could not list the sessions: ${e.message}`);
    },
  );
}

// --- routing, login, start ------------------------------------------------------------------
function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  const view = ["sessions", "permissions", "health", "config"].includes(parts[0]) ? parts[0] : "sessions";
  state.view = view;
  if (view === "sessions" && parts[1]) {
    let id = parts[1];
    try { id = decodeURIComponent(id); } catch (e) { /* not valid percent-encoding: as written */ }
    if (id !== state.selected && conn) { select(id); return; }
  }
  if (view === "config" && conn && !state.config) loadConfig();
  render();
}

function showLogin(message) {
  resyncs.stop();
  clearErrors();
  $("main").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("conn").className = "conn down";
  $("conn-text").textContent = "signed out";
  $("login-error").hidden = !message;
  setText($("login-error"), message || "");
  $("token").focus();
}

async function start(token) {
  $("conn").className = "conn";
  $("conn-text").textContent = "connecting…";
  const c = new Connection(onEvent, (s) => {
    $("conn").className = s === "down" ? "conn down" : "conn";
    $("conn-text").textContent = s === "down" ? "reconnecting…" : "connecting…";
  });
  let hello;
  try {
    hello = await c.open(token);
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(token ? "That token was refused." : "");
    return;
  }
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  conn = c;
  c.onDrop = () => setTimeout(() => reconnect(token), c.retry = Math.min(c.retry * 2, 5000));
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = !hello.tokenRequired;
  loaded = false;
  await loadFirst(c);
}

// The first snapshots, then the watch from their cursor. A connection that drops meanwhile
// is reconnected (its onDrop), and the reconnect loads them.
let loaded = false;
async function loadFirst(c) {
  let cursor;
  try {
    cursor = await resync();
  } catch (e) {
    if (e.code === undefined && !c.stopped && c.ws.readyState !== WebSocket.OPEN) return;
    // the snapshots could not be read: say why at the login, never hang on "connecting…"
    // (-32003: a client token, which sees its own sessions only and no bridge-wide feed)
    c.close();
    conn = null;
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(e.code === -32003 ? NOT_OPERATOR : `The console could not load: ${e.message}`);
    return;
  }
  loaded = true;
  route();
  c.watch(cursor);
}

async function reconnect(token) {
  const old = conn;
  if (!old) return; // signed out meanwhile
  const c = new Connection(onEvent, old.onState);
  c.cursor = old.cursor;
  c.retry = old.retry;
  try {
    await c.open(token);
  } catch (e) {
    if (String(e.message).includes("invalid")) { showLogin("The token is no longer accepted."); return; }
    old.retry = Math.min(old.retry * 2, 5000);
    setTimeout(() => reconnect(token), old.retry);
    return;
  }
  conn = c;
  c.onDrop = () => setTimeout(() => reconnect(token), c.retry);
  if (!loaded) { await loadFirst(c); return; } // dropped during the first load
  c.watch(); // from the last cursor: nothing is missed (or a reset re-reads the snapshots)
  if (listLost) reloadSessions(listLost.more);
  if (state.selected && !state.detail) showDetail(state.selected).then(render, render); // lost with the old one
}

function init() {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    start(token);
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    if (conn) conn.close();
    conn = null;
    showLogin("");
  });
  $("cancel").addEventListener("click", cancelTurn);
  for (const id of ["f-state", "f-provider", "f-since", "f-thread"]) $(id).addEventListener("change", () => reloadSessions(false));
  $("filters").addEventListener("submit", (ev) => ev.preventDefault());
  $("more").addEventListener("click", () => reloadSessions(true));
  window.addEventListener("hashchange", route);
  setInterval(tickCountdowns, 1000);
  start(sessionStorage.getItem(TOKEN_KEY) || "");
}

init();
