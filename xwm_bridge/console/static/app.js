// xwm-bridge operator console. Plain ES module, no build step, no third-party code.
// Data comes only over /console/ws: JSON-RPC after a `console.auth {token}` frame.
// The token lives in sessionStorage (this tab) and is never put in a URL.

const TOKEN_KEY = "xwm-bridge-token";
const NOT_OPERATOR = "This token sees only its own sessions: the console needs an admin token (admin_tokens).";
const $ = (id) => document.getElementById(id);

// --- tiny DOM helper (textContent only: nothing from the bridge is parsed as HTML) ---
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
const pill = (state) => h("span", { class: `pill ${state || "idle"}`, text: state || "idle" });
const fmtTime = (s) => (s ? new Date(s * 1000).toLocaleTimeString() : "—");
const fmtAgo = (s) => {
  if (!s) return "—";
  const d = Date.now() / 1000 - s;
  if (d < 60) return `${Math.max(0, Math.round(d))}s ago`;
  if (d < 3600) return `${Math.round(d / 60)}m ago`;
  if (d < 86400) return `${Math.round(d / 3600)}h ago`;
  return new Date(s * 1000).toLocaleDateString();
};
const fmtUsage = (u) => {
  if (!u || typeof u !== "object") return "";
  return Object.entries(u)
    .filter(([, v]) => typeof v === "number")
    .map(([k, v]) => `${k} ${v}`)
    .join(" · ");
};

// --- connection: auth, requests, the watch, reconnect with the cursor ---------------
class Connection {
  constructor(onEvent, onState) {
    this.onEvent = onEvent;
    this.onState = onState;
    this.pending = new Map();
    this.nextId = 1;
    this.ws = null;
    this.cursor = null;
    this.retry = 500;
    this.stopped = false;
  }

  open(token) {
    return new Promise((resolve, reject) => {
      const scheme = location.protocol === "https:" ? "wss" : "ws";
      const ws = new WebSocket(`${scheme}://${location.host}/console/ws`);
      this.ws = ws;
      let authed = false;
      ws.onopen = () => {
        ws.send(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "console.auth", params: { token } }));
      };
      ws.onmessage = (ev) => {
        const msg = JSON.parse(ev.data);
        if (!authed) {
          if (msg.result && msg.result.authenticated) {
            authed = true;
            this.retry = 500;
            resolve(msg.result);
          } else {
            reject(new Error((msg.error && msg.error.message) || "refused"));
          }
          return;
        }
        this.dispatch(msg);
      };
      ws.onclose = (ev) => {
        for (const [, p] of this.pending) p.reject(new Error("connection closed"));
        this.pending.clear();
        if (!authed) {
          reject(new Error(ev.code === 4401 ? "invalid bearer token" : "cannot connect"));
          return;
        }
        if (this.stopped) return; // closed by the page (sign out): not a drop
        this.onState("down");
        this.onDrop();
      };
      ws.onerror = () => {};
    });
  }

  dispatch(msg) {
    if (msg.method === "bridge.event") {
      const p = msg.params;
      if (p.cursor && p.kind !== "watch") this.cursor = p.cursor;
      this.onEvent(p);
      return;
    }
    if (msg.method) return; // session.update of a turn started elsewhere: not ours
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    if (msg.error) p.reject(Object.assign(new Error(msg.error.message), { code: msg.error.code }));
    else p.resolve(msg.result);
  }

  call(method, params) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
        reject(new Error("not connected"));
        return;
      }
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params: params || {} }));
    });
  }

  watch(since) {
    if (since) this.cursor = since;
    // a streaming watch: events arrive as bridge.event notifications; it returns when it ends
    this.call("bridge.watch", this.cursor ? { since: this.cursor } : {}).then(
      (res) => {
        if (res && res.cursor) this.cursor = res.cursor;
        if (!this.stopped && this.ws && this.ws.readyState === WebSocket.OPEN) this.watch();
      },
      () => {},
    );
  }

  close() {
    this.stopped = true;
    if (this.ws) this.ws.close();
  }
}

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

// A page left open must not grow for as long as it is open (a busy bridge starts thousands
// of sessions an hour): the live list keeps the newest MAX_LISTED sessions (or as many as
// the pages loaded with "more"); older ones are found again with the filters.
const MAX_LISTED = 500;

function trimSessions() {
  const cap = Math.max(MAX_LISTED, state.paged);
  if (state.order.length > cap) state.order.length = cap;
  if (state.sessions.size <= cap) return;
  const keep = new Set(state.order);
  if (state.selected) keep.add(state.selected);
  for (const id of state.sessions.keys()) if (!keep.has(id)) state.sessions.delete(id);
}

// Resolved permission records kept (every pending one stays, and those of the open
// session): past MAX_RESOLVED + a margin, the oldest resolved ones go.
const MAX_RESOLVED = 500;

// The open session's turns kept: as many as the bridge keeps of a session (store/records.py
// TURNS_PER_SESSION), the newest; a session left open for a day of turns stays this size.
const MAX_TURNS = 64;

function trimTurns(turns) {
  for (const id of turns.keys()) {
    if (turns.size <= MAX_TURNS) break;
    turns.delete(id); // the oldest first: a Map keeps the order turns arrived in
  }
}

// A turn's output kept: its newest MAX_OUTPUT characters (a turn streaming for hours would
// grow the page's <pre> and its state without end), with "… earlier output trimmed (K
// characters)" above it; and its newest MAX_TOOL_CALLS tool calls, with the count of the
// ones dropped (an update of a dropped call is not shown again).
const MAX_OUTPUT = 64 * 1024;
const MAX_TOOL_CALLS = 200;

// [the last MAX_OUTPUT characters of text, how many went before them]
function tail(text) {
  let drop = Math.max(0, text.length - MAX_OUTPUT);
  const c = drop ? text.charCodeAt(drop) : 0;
  if (c >= 0xdc00 && c <= 0xdfff) drop++; // never begin with half of a surrogate pair
  return drop ? [text.slice(drop), drop] : [text, 0];
}

function setOutput(turn, text, before) {
  const [kept, drop] = tail(text);
  turn.output = kept;
  turn.trimmed = before + drop;
}

const trimmedNote = (n) => `… earlier output trimmed (${n} characters)`;

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

function newTurnView(t) {
  return {
    turnId: t.turnId,
    status: t.status || "running",
    provider: t.provider || "",
    model: t.model || "",
    prompt: t.prompt || "",
    startedAt: t.startedAt,
    durationMs: t.durationMs,
    usage: t.usage || null,
    error: t.error || null,
    output: "",
    trimmed: 0, // characters of output dropped before `output` (MAX_OUTPUT)
    tools: new Map(),
    toolsDropped: 0, // tool calls dropped (MAX_TOOL_CALLS), the oldest first
    plan: null,
    result: t.result || null,
    resultShown: null, // [result, its JSON as shown] (resultText)
    lastEventId: 0, // the newest ledger entry (session.replay eventIds, watch eventId) applied
  };
}

function applyUpdate(turn, u) {
  if (!u || typeof u !== "object") return;
  switch (u.type) {
    case "delta":
      setOutput(turn, turn.output + (u.delta || ""), turn.trimmed);
      break;
    case "tool_call":
    case "tool_call_update": {
      const prev = turn.tools.get(u.toolCallId);
      if (!prev && u.type === "tool_call_update" && turn.toolsDropped) break; // a dropped one's
      turn.tools.set(u.toolCallId, { ...prev, ...Object.fromEntries(Object.entries(u).filter(([, v]) => v !== null && v !== undefined)) });
      for (const id of turn.tools.keys()) {
        if (turn.tools.size <= MAX_TOOL_CALLS) break;
        turn.tools.delete(id); // the oldest first: a Map keeps the order calls arrived in
        turn.toolsDropped++;
      }
      break;
    }
    case "plan":
      turn.plan = Array.isArray(u.entries) ? u.entries : [];
      break;
    case "usage":
      turn.usage = u.usage || turn.usage;
      break;
    case "status":
      if (u.event === "completed" && u.error && u.message) turn.error = u.message;
      break;
    default:
      break;
  }
}

// --- rendering ------------------------------------------------------------------------------
function renderTabs() {
  for (const a of $("tabs").querySelectorAll("a")) a.classList.toggle("active", a.dataset.view === state.view);
  for (const v of ["sessions", "permissions", "health", "config"]) $(`view-${v}`).hidden = v !== state.view;
  const pending = [...state.permissions.values()].filter((p) => p.state === "pending").length;
  $("perm-badge").hidden = pending === 0;
  $("perm-badge").textContent = String(pending);
}

// The list's rows, kept across renders (by session id) and changed in place: a click is
// never fired when the node pressed left the document before the release, and the list,
// rebuilt on every render (a render a frame on a busy bridge), lost the clicks on it.
const rows = new Map(); // sessionId → li

const setText = (el, text) => { if (el.textContent !== text) el.textContent = text; };

function sessionRow(id, s) {
  let li = rows.get(id);
  if (!li) {
    li = h("li", { "data-session": id, onclick: () => select(id) }, h("span", { class: "sid", text: id, title: id }), pill(s.state), h("span", { class: "sub" }));
    rows.set(id, li);
  }
  const [, badge, sub] = li.children;
  const t = s.lastTurn || {};
  const line = [s.provider || "no provider", t.model, fmtAgo(s.updatedAt), fmtUsage(t.usage)].filter(Boolean).join(" · ");
  li.className = id === state.selected ? "selected" : "";
  badge.className = `pill ${s.state || "idle"}`;
  setText(badge, s.state || "idle");
  setText(sub, t.prompt ? `${line} — ${t.prompt}` : line);
  return li;
}

function renderSessions() {
  const list = $("session-list");
  const providers = new Set();
  const nodes = [];
  for (const id of state.order) {
    const s = state.sessions.get(id);
    if (!s) continue;
    if (s.provider) providers.add(s.provider);
    nodes.push(sessionRow(id, s));
  }
  // remove the rows that left, move only those whose place changed (never all of them)
  const keep = new Set(nodes);
  for (const li of [...list.children]) if (!keep.has(li)) li.remove();
  for (const [id, li] of rows) if (!keep.has(li)) rows.delete(id);
  nodes.forEach((li, i) => { if (list.children[i] !== li) list.insertBefore(li, list.children[i] || null); });
  $("sessions-empty").hidden = state.order.length > 0;
  $("more").hidden = !state.nextCursor;
  const sel = $("f-provider");
  const known = new Set([...sel.options].map((o) => o.value));
  for (const p of providers) if (!known.has(p)) sel.append(h("option", { value: p, text: p }));
}

function permCard(p, compact) {
  const tc = p.toolCall || {};
  // an agent's toolCall is shown as it sent it: not trusted to be ACP-shaped
  const where = (Array.isArray(tc.locations) ? tc.locations : []).map((l) => l && l.path).filter(Boolean).join(", ");
  const card = h("div", { class: `perm ${p.state === "pending" ? "" : "resolved"}`, "data-request": p.requestId },
    h("div", { class: "title", text: tc.title || tc.kind || "permission request" }),
    h("div", { class: "meta" },
      h("span", { text: `kind ${tc.kind || "other"}` }),
      compact ? null : h("span", { text: `session ${p.sessionId}` }),
      h("span", { text: p.provider || "" }),
      h("span", { text: fmtTime(p.createdAt) }),
    ),
    where ? h("div", { class: "where", text: where }) : null,
  );
  if (p.state === "pending") {
    if (p.deadline) card.append(h("div", { class: "muted", "data-deadline": p.deadline }));
    const opts = h("div", { class: "opts" });
    for (const o of p.options || []) {
      const kind = String(o.kind || "");
      const cls = kind.startsWith("allow") ? "opt-allow" : kind.startsWith("reject") ? "opt-reject" : "";
      opts.append(h("button", { type: "button", class: cls, "data-option": o.optionId, onclick: (ev) => answer(p, o.optionId, ev.target) }, o.name || o.optionId));
    }
    card.append(opts);
  } else {
    const by = p.answeredBy ? ` by ${p.answeredBy.transport}${p.answeredBy.address ? " " + p.answeredBy.address : ""}` : "";
    card.append(
      h("div", { class: "by" }, pill(p.outcome || p.resolution), ` ${p.resolution === "selected" ? "answered" : p.resolution || ""}${by} · ${fmtTime(p.resolvedAt)}`),
      p.reason ? h("div", { class: "muted", text: p.reason }) : null,
    );
  }
  return card;
}

// keep cards whose record did not change: a button never disappears under the pointer
const cardKey = (p) => `${p.sessionId}|${p.requestId}|${p.state}|${p.resolution || ""}`;

function reconcile(container, records, build) {
  const old = new Map([...container.children].map((el) => [el.dataset.key, el]));
  const nodes = records.map((p) => {
    const key = cardKey(p);
    const el = old.get(key) || build(p);
    el.dataset.key = key;
    return el;
  });
  if (nodes.length !== container.children.length || nodes.some((n, i) => container.children[i] !== n)) {
    container.replaceChildren(...nodes);
  }
}

function tickCountdowns() {
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Math.max(0, Math.round(Number(el.dataset.deadline) - Date.now() / 1000));
    el.textContent = `expires in ${left}s (rejected then)`;
  }
}

function renderPermissions() {
  const all = [...state.permissions.values()].sort((a, b) => (b.createdAt || 0) - (a.createdAt || 0));
  const pending = all.filter((p) => p.state === "pending");
  const resolved = all.filter((p) => p.state !== "pending" && p.resolution !== "policy").slice(0, 60);
  reconcile($("perm-pending"), pending, (p) => permCard(p, false));
  $("perm-none").hidden = pending.length > 0;
  reconcile($("perm-resolved"), resolved, (p) => permCard(p, false));
  tickCountdowns();
  renderTabs();
}

// The open session's permission cards, kept across renders as in the Permissions view: the
// turn cards are rebuilt on every render (any session's event), and a rebuilt permission card
// gave an answer in flight its buttons back and dropped a failed answer's error.
let detailCards = new Map();

function renderDetail() {
  const d = state.detail;
  $("detail-empty").hidden = Boolean(d);
  $("detail-body").hidden = !d;
  if (!d) { detailCards = new Map(); return; }
  const s = state.sessions.get(d.sessionId) || d.session;
  $("d-title").textContent = d.sessionId;
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
  const cards = new Map();
  $("turns").replaceChildren(...turns.map((t) => turnCard(t, d.sessionId, cards)));
  detailCards = cards;
}

// A turn's result as JSON, its first MAX_OUTPUT characters (the bridge stores up to 256 KiB
// of it, its output two or three times over: summary, resultSummary); kept with the turn,
// not serialised again on every render.
function resultText(t) {
  if (t.resultShown && t.resultShown[0] === t.result) return t.resultShown[1];
  let text = JSON.stringify(t.result, null, 2);
  if (text.length > MAX_OUTPUT) text = `${text.slice(0, MAX_OUTPUT)}\n… (${text.length - MAX_OUTPUT} more characters)`;
  t.resultShown = [t.result, text];
  return text;
}

function turnCard(t, sessionId, cards) {
  const body = h("div", { class: "turn-body" });
  if (t.prompt) body.append(h("div", { class: "prompt", text: t.prompt }));
  let [out, trimmed] = [t.output, t.trimmed];
  if (!out && t.result && typeof t.result.output === "string") [out, trimmed] = tail(t.result.output);
  body.append(h("div", { class: "trimmed", "data-turn-trimmed": t.turnId, hidden: !trimmed, text: trimmedNote(trimmed) }));
  body.append(h("pre", { class: `output${out ? "" : " empty-out"}`, "data-turn-output": t.turnId, text: out || (t.status === "running" ? "waiting for output…" : "(no output)") }));
  if (t.tools.size) {
    const dropped = t.toolsDropped ? h("div", { class: "item trimmed", text: `… ${t.toolsDropped} earlier tool call${t.toolsDropped === 1 ? "" : "s"} not shown` }) : null;
    body.append(h("div", { class: "items" }, dropped, ...[...t.tools.values()].map((c) =>
      h("div", { class: "item" }, h("span", { class: "k", text: "tool" }), pill(c.status || "pending"), h("span", { text: `${c.title || c.toolCallId} (${c.kind || "other"})` })))));
  }
  if (t.plan && t.plan.length) {
    body.append(h("div", { class: "item" }, h("span", { class: "k", text: "plan" }),
      h("ul", { class: "plan" }, ...t.plan.map((e) => (e && typeof e === "object" ? e : { content: e })).map((e) =>
        h("li", { class: e.status || "", text: `${e.content} (${e.status || "pending"})` })))));
  }
  const pendingHere = [...state.permissions.values()].filter((p) => p.sessionId === sessionId && p.turnId === t.turnId && p.resolution !== "policy");
  for (const p of pendingHere) {
    const key = cardKey(p);
    const el = detailCards.get(key) || permCard(p, true);
    cards.set(key, el);
    body.append(el);
  }
  setTimeout(tickCountdowns, 0);
  if (t.error && t.status !== "completed") body.append(h("div", { class: "turn-error", text: t.error }));
  if (t.result) {
    body.append(h("details", {}, h("summary", { text: "result" }), h("pre", { class: "json", text: resultText(t) })));
  }
  return h("div", { class: "turn", "data-turn": t.turnId, "data-status": t.status },
    h("div", { class: "turn-head" },
      pill(t.status),
      h("span", { class: "tid", text: t.turnId }),
      h("span", { class: "grow" }),
      h("span", { class: "muted", text: [t.provider, t.model].filter(Boolean).join(" / ") }),
      t.usage ? h("span", { class: "muted", text: fmtUsage(t.usage) }) : null,
      h("span", { class: "muted", text: t.durationMs != null ? `${(t.durationMs / 1000).toFixed(1)}s` : fmtTime(t.startedAt) }),
    ),
    body,
  );
}

const CHARTS = [
  ["activeTurns", "Active turns", false],
  ["queueDepth", "Queued turns", false],
  ["requests", "Requests / s", true],
  ["turns", "Turns / s", true],
  ["requestErrors", "Request errors / s", true],
  ["upstreamErrors", "Upstream errors / s", true],
  ["wsConnections", "WebSocket clients", false],
  ["pendingPermissions", "Pending permissions", false],
];

function series(key, rate) {
  const s = state.samples;
  const out = [];
  for (let i = rate ? 1 : 0; i < s.length; i++) {
    const v = s[i].metrics[key] || 0;
    if (!rate) out.push(v);
    else {
      const dt = s[i].ts - s[i - 1].ts;
      out.push(dt > 0 ? Math.max(0, (v - (s[i - 1].metrics[key] || 0)) / dt) : 0);
    }
  }
  return out;
}

function spark(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  if (values.length < 2) return svg;
  const max = Math.max(1, ...values);
  const pts = values.map((v, i) => `${(i / (values.length - 1)) * 100},${38 - (v / max) * 34}`);
  const area = document.createElementNS("http://www.w3.org/2000/svg", "polygon");
  area.setAttribute("points", `0,40 ${pts.join(" ")} 100,40`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.append(area, line);
  return svg;
}

function table(el, head, rows) {
  el.replaceChildren(h("tr", {}, ...head.map((c) => h("th", { text: c }))));
  if (!rows.length) el.append(h("tr", {}, h("td", { class: "none", colspan: head.length, text: "none" })));
  for (const r of rows) el.append(h("tr", {}, ...r));
}

function renderHealth() {
  const hs = state.health;
  const charts = $("charts");
  charts.replaceChildren(...CHARTS.map(([key, label, rate]) => {
    const v = series(key, rate);
    const last = v.length ? v[v.length - 1] : 0;
    return h("div", { class: "chart", "data-chart": key },
      h("div", { class: "label" }, h("span", { text: label }), h("span", { text: `${v.length} samples` })),
      h("div", { class: "value", text: rate ? last.toFixed(2) : String(Math.round(last)) }),
      spark(v));
  }));
  if (!hs) return;
  const td = (t, cls) => {
    const nil = t == null || t === "";
    return h("td", { class: `${cls || ""}${nil ? " nil" : ""}`, text: nil ? "—" : String(t) });
  };
  table($("t-providers"), ["provider", "kind", "state", "turns", "failures", "last error"], hs.providers.map((p) => [
    td(p.id), td(p.kind), h("td", {}, pill(p.state)), td(p.turns, "num"), td(p.failures, "num"), td(p.lastError, "err")]));
  table($("t-agents"), ["agent", "state", "starts", "restarts", "last error"], hs.agents.map((a) => [
    td(a.id), h("td", {}, pill(a.running ? "running" : a.starts ? "stopped" : "idle")), td(a.starts, "num"), td(a.restarts, "num"), td(a.lastError, "err")]));
  table($("t-gateways"), ["runtime", "mode", "state", "reconnects", "last error"], hs.gateways.map((g) => [
    td(g.runtimeId), td(g.mode), h("td", {}, pill(g.state)), td(g.reconnects, "num"), td(g.lastError, "err")]));
  const q = hs.queues || { threads: [] };
  table($("t-queues"), ["thread", "waiting"], [
    [td(`all threads (${q.running || 0} running)`), td(q.waiting || 0, "num")],
    ...q.threads.map((t) => [td(t.threadId), td(t.waiting, "num")])]);
}

function renderConfig() {
  if (!state.config) return;
  $("config-json").textContent = JSON.stringify(state.config.config, null, 2);
  const rows = Object.entries(state.config.sources || {}).sort().map(([k, v]) => [h("td", { text: k }), h("td", { text: v })]);
  table($("t-sources"), ["key", "source"], rows);
}

function render() {
  renderTabs();
  if (state.view === "sessions") { renderSessions(); renderDetail(); }
  if (state.view === "permissions") renderPermissions();
  if (state.view === "health") renderHealth();
  if (state.view === "config") renderConfig();
}

// --- actions ----------------------------------------------------------------------------------
function filters() {
  const p = { limit: 100 };
  if ($("f-state").value) p.state = $("f-state").value;
  if ($("f-provider").value) p.provider = $("f-provider").value;
  if ($("f-thread").value.trim()) p.threadId = $("f-thread").value.trim();
  if ($("f-since").value) p.updatedSince = Date.now() / 1000 - Number($("f-since").value);
  return p;
}

function matchesFilters(s) {
  const f = filters();
  if (f.state === "idle" ? s.state === "running" : f.state && s.state !== f.state) return false;
  if (f.provider && s.provider !== f.provider) return false;
  if (f.threadId && s.threadId !== f.threadId) return false;
  return !(f.updatedSince && (s.updatedAt || 0) < f.updatedSince);
}

async function loadSessions(more) {
  const params = filters();
  if (more && state.nextCursor) params.cursor = state.nextCursor;
  const res = await readSnapshot("session.list", params, (res) => {
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
      for (const p of r.permissions) state.permissions.set(`${p.sessionId}|${p.requestId}`, p);
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

async function showDetail(id) {
  const mine = (loading = { sessionId: id, events: [] });
  let d = null;
  try { d = await loadDetail(id); } catch (e) { d = null; }
  if (loading !== mine) return; // another one was selected since
  loading = null;
  state.detail = d;
  if (d) for (const e of mine.events) applyToDetail(d, e);
}

async function select(id) {
  state.selected = id;
  if (location.hash !== `#/sessions/${encodeURIComponent(id)}`) history.replaceState(null, "", `#/sessions/${encodeURIComponent(id)}`);
  await showDetail(id);
  render();
}

async function answer(p, optionId, button) {
  const opts = button.parentElement;
  const buttons = [...opts.querySelectorAll("button")];
  for (const b of buttons) b.disabled = true;
  for (const el of opts.querySelectorAll(".error")) el.remove();
  try {
    await conn.call("session.permission", { sessionId: p.sessionId, requestId: p.requestId, optionId });
  } catch (e) {
    // still pending unless a resolved event replaces this card: it can be answered again
    for (const b of buttons) b.disabled = false;
    opts.append(h("div", { class: "error", text: e.message }));
  }
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
    error.textContent = `cancel failed: ${e.message}`;
    error.hidden = false;
  } finally {
    $("cancel").disabled = false;
  }
}

async function loadPermissions() {
  await readSnapshot("permission.list", { includeResolved: true }, (res) => {
    state.permissions.clear();
    for (const p of res.requests) state.permissions.set(`${p.sessionId}|${p.requestId}`, p);
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
  }, (e) => { if (mine === healthReads) applyToHealth(e); });
}

// What a health, queue or metrics event changes (the health view's state).
function applyToHealth(e) {
  if (e.kind === "health" && state.health) {
    Object.assign(state.health, e);
  } else if (e.kind === "queue" && state.health) {
    state.health.queues = { waiting: e.waiting, running: e.running, threads: e.threads };
  } else if (e.kind === "metrics") {
    state.samples.push({ ts: e.ts, metrics: e.metrics });
    if (state.samples.length > 90) state.samples.shift();
    if (state.health) state.health.metrics = e.metrics;
  }
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
    conn.call("session.get", { sessionId: d.sessionId }).then((res) => {
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
    trimSessions();
  } else if (e.kind === "permission") {
    state.permissions.set(`${e.sessionId}|${e.requestId}`, { ...e });
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
    if (e.reset) resync();
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
      const pre = document.querySelector(`[data-turn-output="${CSS.escape(e.turnId)}"]`);
      const note = document.querySelector(`[data-turn-trimmed="${CSS.escape(e.turnId)}"]`);
      if (pre && note) {
        const t = d.turns.get(e.turnId);
        pre.textContent = t.output;
        note.hidden = !t.trimmed;
        note.textContent = trimmedNote(t.trimmed);
        pre.classList.remove("empty-out");
        pre.scrollTop = pre.scrollHeight;
        return;
      }
    }
  } else {
    applyToHealth(e);
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
  render();
  return cursor;
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
  if (view === "config" && conn && !state.config) {
    conn.call("bridge.config", {}).then((c) => { state.config = c; render(); }, () => {});
  }
  render();
}

function showLogin(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("conn").className = "conn down";
  $("conn-text").textContent = "signed out";
  $("login-error").hidden = !message;
  $("login-error").textContent = message || "";
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
  let cursor;
  try {
    cursor = await resync();
  } catch (e) {
    // the snapshots could not be read: say why at the login, never hang on "connecting…"
    // (-32003: a client token, which sees its own sessions only and no bridge-wide feed)
    c.close();
    conn = null;
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin(e.code === -32003 ? NOT_OPERATOR : `The console could not load: ${e.message}`);
    return;
  }
  route();
  c.watch(cursor);
}

async function reconnect(token) {
  const old = conn;
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
  c.watch(); // from the last cursor: nothing is missed (or a reset re-reads the snapshots)
  if (state.selected && !state.detail) showDetail(state.selected).then(render); // lost with the old one
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
  for (const id of ["f-state", "f-provider", "f-since"]) $(id).addEventListener("change", () => loadSessions(false).then(render));
  $("f-thread").addEventListener("change", () => loadSessions(false).then(render));
  $("filters").addEventListener("submit", (ev) => ev.preventDefault());
  $("more").addEventListener("click", () => loadSessions(true).then(render));
  window.addEventListener("hashchange", route);
  setInterval(tickCountdowns, 1000);
  start(sessionStorage.getItem(TOKEN_KEY) || "");
}

init();
