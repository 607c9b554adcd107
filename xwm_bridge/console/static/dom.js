// Element helpers of the console (textContent only: nothing from the bridge is parsed as HTML;
// every text and shown attribute they set goes through plain(): no bidi control is applied).

export const $ = (id) => document.getElementById(id);

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = plain(v);
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    // shown ones (title, aria-label…) through plain(); data-* as given: code reads them
    else el.setAttribute(k, v === true ? "" : k.startsWith("data-") ? String(v) : plain(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(plain(c)));
  }
  return el;
}

export const pill = (state) => h("span", { class: `pill ${state || "idle"}`, text: state || "idle" });

// A pill changed in place (a node kept across renders).
export function setPill(el, state) {
  const cls = `pill ${state || "idle"}`;
  if (el.className !== cls) el.className = cls;
  setText(el, state || "idle");
}

export const setText = (el, text) => { const t = plain(text); if (el.textContent !== t) el.textContent = t; };

// Bidirectional embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069) in any text
// the page shows (what a client or an agent wrote: session ids, prompts, output, a tool call's
// title, its paths, an option): shown as "\u202e", not applied.
// Applied, the text is drawn in another order than it is: "Edit x.png" on the card of
// "Edit gnp.x" (as in source code, CVE-2021-42574).
const BIDI = /[\u202a-\u202e\u2066-\u2069]/g;
export const plain = (s) => String(s).replace(BIDI, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

// Put `nodes` in `container` in this order, keeping the nodes already there: the ones that
// left are removed and only those out of place are moved (never all of them). A click is
// not fired when the node pressed left the document before the release, so a list rebuilt
// on every render (a render a frame on a busy bridge) loses the clicks on it.
export function place(container, nodes) {
  const keep = new Set(nodes);
  for (const el of [...container.children]) if (!keep.has(el)) el.remove();
  nodes.forEach((el, i) => { if (container.children[i] !== el) container.insertBefore(el, container.children[i] || null); });
}

export const fmtTime = (s) => (s ? new Date(s * 1000).toLocaleTimeString() : "—");

export const fmtAgo = (s) => {
  if (!s) return "—";
  const d = Date.now() / 1000 - s;
  if (d < 60) return `${Math.max(0, Math.round(d))}s ago`;
  if (d < 3600) return `${Math.round(d / 60)}m ago`;
  if (d < 86400) return `${Math.round(d / 3600)}h ago`;
  return new Date(s * 1000).toLocaleDateString();
};

export const fmtUsage = (u) => {
  if (!u || typeof u !== "object") return "";
  return Object.entries(u)
    .filter(([, v]) => typeof v === "number")
    .map(([k, v]) => `${k} ${v}`)
    .join(" · ");
};
