// The session list: its rows (kept across renders, changed in place), its bound and the
// filters (what session.list is asked for, and whether a live row still matches them).
import { $, fmtAgo, fmtUsage, h, pill, place, setPill, setText } from "./dom.js";

// A page left open must not grow for as long as it is open (a busy bridge starts thousands
// of sessions an hour): the live list keeps the newest MAX_LISTED sessions (or as many as
// the pages loaded with "more"); older ones are found again with the filters.
const MAX_LISTED = 500;

export function trimSessions(state) {
  const cap = Math.max(MAX_LISTED, state.paged);
  if (state.order.length > cap) state.order.length = cap;
  if (state.sessions.size <= cap) return;
  const keep = new Set(state.order);
  if (state.selected) keep.add(state.selected);
  for (const id of state.sessions.keys()) if (!keep.has(id)) state.sessions.delete(id);
}

// The list's rows, kept across renders (by session id) and changed in place: a click is
// never fired when the node pressed left the document before the release, and the list,
// rebuilt on every render (a render a frame on a busy bridge), lost the clicks on it.
const rows = new Map(); // sessionId → li

function sessionRow(state, select, id, s) {
  let li = rows.get(id);
  if (!li) {
    li = h("li", { "data-session": id, onclick: () => select(id) }, h("span", { class: "sid", text: id, title: id }), pill(s.state), h("span", { class: "sub" }));
    rows.set(id, li);
  }
  const [, badge, sub] = li.children;
  const t = s.lastTurn || {};
  const line = [s.provider || "no provider", t.model, fmtAgo(s.updatedAt), fmtUsage(t.usage)].filter(Boolean).join(" · ");
  li.className = id === state.selected ? "selected" : "";
  setPill(badge, s.state);
  setText(sub, t.prompt ? `${line} — ${t.prompt}` : line);
  return li;
}

// `select(id)`: a row clicked.
export function renderSessions(state, select) {
  const list = $("session-list");
  const providers = new Set();
  const nodes = [];
  for (const id of state.order) {
    const s = state.sessions.get(id);
    if (!s) continue;
    if (s.provider) providers.add(s.provider);
    nodes.push(sessionRow(state, select, id, s));
  }
  const keep = new Set(nodes);
  for (const [id, li] of rows) if (!keep.has(li)) rows.delete(id);
  place(list, nodes); // remove the rows that left, move only those whose place changed
  $("sessions-empty").hidden = state.order.length > 0;
  $("more").hidden = !state.nextCursor;
  const sel = $("f-provider");
  const known = new Set([...sel.options].map((o) => o.value));
  for (const p of providers) if (!known.has(p)) sel.append(h("option", { value: p, text: p }));
}

// What the filters ask session.list for.
export function filters() {
  const p = { limit: 100 };
  if ($("f-state").value) p.state = $("f-state").value;
  if ($("f-provider").value) p.provider = $("f-provider").value;
  if ($("f-thread").value.trim()) p.threadId = $("f-thread").value.trim();
  if ($("f-since").value) p.updatedSince = Date.now() / 1000 - Number($("f-since").value);
  return p;
}

export function matchesFilters(s) {
  const f = filters();
  if (f.state === "idle" ? s.state === "running" : f.state && s.state !== f.state) return false;
  if (f.provider && s.provider !== f.provider) return false;
  if (f.threadId && s.threadId !== f.threadId) return false;
  return !(f.updatedSince && (s.updatedAt || 0) < f.updatedSince);
}
