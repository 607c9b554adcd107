// The open session's turns: what the page keeps of each one (bounded) and its card. The
// cards are keyed by turn id, kept across renders and changed in place: a render rebuilt
// every card, and a click on a permission card's button whose card left the document
// between the press and the release was never fired (an answer lost while output streamed).
import { fmtTime, fmtUsage, h, pill, place, plain, setPill, setText } from "./dom.js";

// The open session's turns kept: as many as the bridge keeps of a session (store/records.py
// TURNS_PER_SESSION), the newest; a session left open for a day of turns stays this size.
export const MAX_TURNS = 64;

export function trimTurns(turns) {
  for (const id of turns.keys()) {
    if (turns.size <= MAX_TURNS) break;
    turns.delete(id); // the oldest first: a Map keeps the order turns arrived in
  }
}

// A turn's output kept: its newest MAX_OUTPUT characters (a turn streaming for hours would
// grow the page's <pre> and its state without end), with "… earlier output trimmed (K
// characters)" above it; and its newest MAX_TOOL_CALLS tool calls, with the count of the
// ones dropped (an update of a dropped call is not shown again).
export const MAX_OUTPUT = 64 * 1024;
const MAX_TOOL_CALLS = 200;

// [the last MAX_OUTPUT characters of text, how many went before them]
export function tail(text) {
  let drop = Math.max(0, text.length - MAX_OUTPUT);
  const c = drop ? text.charCodeAt(drop) : 0;
  if (c >= 0xdc00 && c <= 0xdfff) drop++; // never begin with half of a surrogate pair
  return drop ? [text.slice(drop), drop] : [text, 0];
}

export function setOutput(turn, text, before) {
  const [kept, drop] = tail(text);
  turn.output = kept;
  turn.trimmed = before + drop;
}

const trimmedNote = (n) => `… earlier output trimmed (${n} characters)`;

export function newTurnView(t) {
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
    rev: 0, // bumped when its tool calls or plan change (their part of the card is redrawn)
    result: t.result || null,
    resultShown: null, // [result, its JSON as shown] (resultText)
    lastEventId: 0, // the newest ledger entry (session.replay eventIds, watch eventId) applied
  };
}

export function applyUpdate(turn, u) {
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
      turn.rev++;
      break;
    }
    case "plan":
      turn.plan = Array.isArray(u.entries) ? u.entries : [];
      turn.rev++;
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

// turn id → its card: {el, and the nodes changed in place}
const cards = new Map();

function newCard(turnId) {
  const c = {
    status: pill("running"),
    who: h("span", { class: "muted" }),
    usage: h("span", { class: "muted" }),
    when: h("span", { class: "muted" }),
    prompt: h("div", { class: "prompt" }),
    trimmed: h("div", { class: "trimmed", "data-turn-trimmed": turnId }),
    out: h("pre", { class: "output", "data-turn-output": turnId }),
    tools: h("div", { class: "items" }),
    plan: h("div", { class: "item" }),
    perms: h("div", { class: "turn-perms" }),
    error: h("div", { class: "turn-error" }),
    resultText: h("pre", { class: "json" }),
    drawn: null, // [turn view, rev] whose tool calls and plan are drawn
  };
  c.result = h("details", {}, h("summary", { text: "result" }), c.resultText);
  c.el = h("div", { class: "turn", "data-turn": turnId },
    h("div", { class: "turn-head" }, c.status, h("span", { class: "tid", text: turnId }), h("span", { class: "grow" }), c.who, c.usage, c.when),
    // the permission cards right under the prompt, above everything that grows while the
    // turn runs (output, tool calls, plan): below them, each tool call arriving while the
    // pointer went to Allow pushed the button away from under it
    h("div", { class: "turn-body" }, c.prompt, c.perms, c.trimmed, c.out, c.tools, c.plan, c.error, c.result));
  return c;
}

const show = (el, shown) => { if (el.hidden === shown) el.hidden = !shown; };

function drawItems(c, t) {
  if (c.drawn && c.drawn[0] === t && c.drawn[1] === t.rev) return;
  c.drawn = [t, t.rev];
  const dropped = t.toolsDropped ? h("div", { class: "item trimmed", text: `… ${t.toolsDropped} earlier tool call${t.toolsDropped === 1 ? "" : "s"} not shown` }) : null;
  c.tools.replaceChildren(...[dropped, ...[...t.tools.values()].map((tc) =>
    h("div", { class: "item" }, h("span", { class: "k", text: "tool" }), pill(tc.status || "pending"), h("span", { text: plain(`${tc.title || tc.toolCallId} (${tc.kind || "other"})`) })))].filter(Boolean));
  show(c.tools, t.tools.size > 0);
  const plan = t.plan || [];
  c.plan.replaceChildren(...(plan.length ? [h("span", { class: "k", text: "plan" }),
    h("ul", { class: "plan" }, ...plan.map((e) => (e && typeof e === "object" ? e : { content: e })).map((e) =>
      h("li", { class: e.status || "", text: `${e.content} (${e.status || "pending"})` })))] : []));
  show(c.plan, plan.length > 0);
}

// The output shown: the live (or replayed) one, else the result's.
function drawOutput(c, t) {
  let [out, trimmed] = [t.output, t.trimmed];
  if (!out && t.result && typeof t.result.output === "string") [out, trimmed] = tail(t.result.output);
  show(c.trimmed, Boolean(trimmed));
  setText(c.trimmed, trimmedNote(trimmed));
  c.out.classList.toggle("empty-out", !out);
  setText(c.out, out || (t.status === "running" ? "waiting for output…" : "(no output)"));
}

function drawCard(c, t, drawPerms) {
  if (c.el.dataset.status !== t.status) c.el.dataset.status = t.status;
  setPill(c.status, t.status);
  setText(c.who, [t.provider, t.model].filter(Boolean).join(" / "));
  setText(c.usage, t.usage ? fmtUsage(t.usage) : "");
  show(c.usage, Boolean(t.usage));
  setText(c.when, t.durationMs != null ? `${(t.durationMs / 1000).toFixed(1)}s` : fmtTime(t.startedAt));
  setText(c.prompt, t.prompt);
  show(c.prompt, Boolean(t.prompt));
  drawOutput(c, t);
  drawItems(c, t);
  drawPerms(c.perms, t);
  show(c.perms, c.perms.children.length > 0);
  const error = t.error && t.status !== "completed" ? String(t.error) : "";
  setText(c.error, error);
  show(c.error, Boolean(error));
  if (t.result) setText(c.resultText, resultText(t));
  show(c.result, Boolean(t.result));
}

// The cards of `turns` (newest first) in `container`; drawPerms(container, turn) puts the
// turn's permission cards in its card.
export function renderTurns(container, turns, drawPerms) {
  const ids = new Set(turns.map((t) => t.turnId));
  for (const id of cards.keys()) if (!ids.has(id)) cards.delete(id);
  place(container, turns.map((t) => {
    let c = cards.get(t.turnId);
    if (!c) cards.set(t.turnId, (c = newCard(t.turnId)));
    drawCard(c, t, drawPerms);
    return c.el;
  }));
}

// A turn's output grown by a streamed chunk, in its card (no render of the page); false
// when the turn has no card yet.
export function growOutput(t) {
  const c = cards.get(t.turnId);
  if (!c) return false;
  drawOutput(c, t);
  c.out.scrollTop = c.out.scrollHeight;
  return true;
}
