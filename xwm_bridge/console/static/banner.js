// What the page's own requests could not do (a resync, a filter, "more", opening a session,
// the config): shown in the banner under the header (#console-error), never left as an
// unhandled promise rejection; each kind's message is replaced or cleared by its next try.
import { $, setText } from "./dom.js";

const errors = new Map(); // what failed → its message

export function showError(what, message) {
  if (message) errors.set(what, message);
  else errors.delete(what);
  const el = $("console-error");
  el.hidden = errors.size === 0;
  setText(el, [...errors.values()].join(" · "));
}

export function clearErrors() {
  for (const what of [...errors.keys()]) showError(what, "");
}
