// The Health and Config views: charts of the metric samples, the health tables, the
// effective config; and what a health, queue or metrics event changes in the page's state.
import { $, h, pill, setText } from "./dom.js";

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

function series(samples, key, rate) {
  const s = samples;
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

export function renderHealth(state) {
  const hs = state.health;
  const charts = $("charts");
  charts.replaceChildren(...CHARTS.map(([key, label, rate]) => {
    const v = series(state.samples, key, rate);
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

export function renderConfig(state) {
  if (!state.config) return;
  setText($("config-json"), JSON.stringify(state.config.config, null, 2));
  const rows = Object.entries(state.config.sources || {}).sort().map(([k, v]) => [h("td", { text: k }), h("td", { text: v })]);
  table($("t-sources"), ["key", "source"], rows);
}

// What a health, queue or metrics event changes (the health view's state).
export function applyToHealth(state, e) {
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
