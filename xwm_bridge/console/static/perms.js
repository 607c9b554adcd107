// Permission request cards: the Permissions view and the open session's turns. A card is
// keyed by its record (session, request, state, resolution) and kept across renders, so a
// button never leaves the document under the pointer (its click would not fire), an answer
// in flight keeps its buttons disabled and a failed answer's error stays.
import { fmtTime, h, pill, place, plain } from "./dom.js";

export const permKey = (p) => `${p.sessionId}|${p.requestId}`;
const cardKey = (p) => `${permKey(p)}|${p.state}|${p.resolution || ""}`;

// `call(method, params)`: a promise of the bridge's answer (rejected when it fails).
function permCard(p, compact, call) {
  const tc = p.toolCall || {};
  // an agent's toolCall is shown as it sent it: not trusted to be ACP-shaped
  const where = plain((Array.isArray(tc.locations) ? tc.locations : []).map((l) => l && l.path).filter(Boolean).join(", "));
  const card = h("div", { class: `perm ${p.state === "pending" ? "" : "resolved"}`, "data-request": p.requestId },
    h("div", { class: "title", text: plain(tc.title || tc.kind || "permission request") }),
    h("div", { class: "meta" },
      h("span", { text: plain(`kind ${tc.kind || "other"}`) }),
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
      opts.append(h("button", { type: "button", class: cls, "data-option": o.optionId, onclick: (ev) => answer(call, p, o.optionId, ev.currentTarget) }, plain(o.name || o.optionId || "")));
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

async function answer(call, p, optionId, button) {
  const opts = button.parentElement;
  const buttons = [...opts.querySelectorAll("button")];
  for (const b of buttons) b.disabled = true;
  for (const el of opts.querySelectorAll(".error")) el.remove();
  try {
    await call("session.permission", { sessionId: p.sessionId, requestId: p.requestId, optionId });
  } catch (e) {
    // still pending unless a resolved event replaces this card: it can be answered again
    for (const b of buttons) b.disabled = false;
    opts.append(h("div", { class: "error", text: e.message }));
  }
}

// The cards of `records` in `container`, in this order: the kept ones changed in place.
export function renderPermCards(container, records, compact, call) {
  const old = new Map([...container.children].map((el) => [el.dataset.key, el]));
  place(container, records.map((p) => {
    const key = cardKey(p);
    const el = old.get(key) || permCard(p, compact, call);
    el.dataset.key = key;
    return el;
  }));
}

export function tickCountdowns() {
  for (const el of document.querySelectorAll("[data-deadline]")) {
    const left = Math.max(0, Math.round(Number(el.dataset.deadline) - Date.now() / 1000));
    el.textContent = `expires in ${left}s (rejected then)`;
  }
}
