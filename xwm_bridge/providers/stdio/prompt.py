"""The ``session/prompt`` content blocks of a turn.

``taskPrompt`` is a text block, after a text block of the session's earlier
prompts when the agent lost them (``replayed``). Client ``attachments`` (``[{name, path}]``) and
``artifacts`` (``[{path}]`` or inline ``{relativePath|label, contentType,
encoding: utf8|base64, content}``, the shape results carry) become

* ``image`` blocks (``{type: image, mimeType, data}``) for ``image/*`` files when
  the agent's ``promptCapabilities.image`` is true;
* ``resource`` blocks (``{type: resource, resource: {uri, mimeType, text|blob}}``)
  when ``promptCapabilities.embeddedContext`` is true;
* otherwise a text reference (``- <name>: <path>`` under ``User-selected local
  attachments:``, as multi-agent prompts have them, in a text block before the
  prompt's) — also for files outside
  ``allowed_roots``, over ``limits.artifact_max_file_bytes``, past
  ``artifact_max_files`` or ``artifact_max_total_bytes``.

A path is read only when its real path is a regular file inside an allowed root,
opened without following a symlink on the way (:mod:`xwm_bridge.beneath`).
:func:`load` does that I/O; :func:`compose` is pure. The result lists what became
of each item (``attachments`` in the turn result).
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xwm_bridge import beneath, coerce
from xwm_bridge.providers.artifacts import ArtifactLimits
from xwm_bridge.providers.stdio.features import AgentFeatures

TEXT_TYPES = ("application/json", "application/xml", "application/yaml", "application/x-yaml")
HISTORY_PROMPTS = 20
HISTORY_PROMPT_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Item:
    """One attachment or artifact, loaded (``data``) or only referenced (``reason``)."""

    name: str
    path: str = ""
    mime: str = ""
    data: bytes | None = None
    reason: str = ""


def _mime(name: str, given: str = "") -> str:
    if given:
        return given.split(";", 1)[0].strip().lower()
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


def _inside(real: str, roots: tuple[str, ...]) -> bool:
    for root in roots:
        base = os.path.realpath(root)
        if real == base or real.startswith(base.rstrip(os.sep) + os.sep):
            return True
    return False


def _read(path: str, limits: ArtifactLimits, budget: int) -> tuple[bytes | None, str]:
    if not os.path.isabs(path):
        return None, "not an absolute path"
    if "\0" in path:  # no file has one, and the OS calls raise on it
        return None, "not a valid path"
    real = os.path.realpath(path)
    if not _inside(real, limits.allowed_roots):
        return None, "outside allowed_roots"
    try:
        # no component a symlink (beneath.py): a directory swapped for one out of the
        # root since the check above is not followed (O_NOFOLLOW on the name followed it)
        fd = beneath.open_file(Path(real))
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if st.st_size > limits.max_file_bytes:
            return None, f"larger than {limits.max_file_bytes} bytes"
        if st.st_size > budget:
            return None, "over the total size cap"
        data = fh.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:
        return None, f"larger than {limits.max_file_bytes} bytes"
    if len(data) > budget:  # it grew since the fstat
        return None, "over the total size cap"
    return data, ""


def _inline(item: dict[str, Any]) -> tuple[bytes | None, str]:
    content = item.get("content")
    if not isinstance(content, str):
        return None, "no content"
    if coerce.text(item.get("encoding"), "utf8").lower() == "base64":
        try:
            return base64.b64decode(content, validate=True), ""
        except (binascii.Error, ValueError):
            return None, "content is not valid base64"
    return content.encode(), ""


def load(attachments: Any, artifacts: Any, limits: ArtifactLimits) -> list[Item]:
    """Read what may be read (blocking I/O: run it in a thread)."""
    raw: list[dict[str, Any]] = []
    for source in (attachments, artifacts):
        if isinstance(source, list):
            raw += [x for x in source if isinstance(x, dict)]
    items: list[Item] = []
    total = 0
    loaded = 0  # counted, not recounted per entry: that was quadratic in the entries
    for entry in raw:
        path = coerce.text(entry.get("path"))
        name = coerce.text(entry.get("name")) or coerce.text(entry.get("label"))
        name = name or coerce.text(entry.get("relativePath")) or os.path.basename(path)
        name = name or "attachment"
        mime = _mime(name or path, coerce.text(entry.get("contentType") or entry.get("mimeType")))
        if not path and "content" not in entry:
            continue
        if loaded >= limits.max_files:
            items.append(Item(name, path, mime, reason=f"more than {limits.max_files} files"))
            continue
        if path:
            data, reason = _read(path, limits, limits.max_total_bytes - total)
        else:
            data, reason = _inline(entry)
            if data is not None and len(data) > limits.max_file_bytes:
                data, reason = None, f"larger than {limits.max_file_bytes} bytes"
            elif data is not None and total + len(data) > limits.max_total_bytes:
                data, reason = None, "over the total size cap"
        if data is not None:
            total += len(data)
            loaded += 1
        items.append(Item(name, path, mime, data, reason))
    return items


def _is_text(mime: str, data: bytes) -> bool:
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith("+json"):
        try:
            data.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    return False


def history_context(history: list[str]) -> str:
    """The bridge's stored prompts of the session, for an agent that does not have them
    (an earlier agent session could not be continued, or the session ran elsewhere)."""
    earlier = history[-HISTORY_PROMPTS:]
    if not earlier:
        return ""
    lines = [
        "[Context from the bridge: this conversation began before this agent session "
        "(an earlier session that could not be continued, or another agent). The user's "
        "earlier messages, oldest first:]"
    ]
    for i, text in enumerate(earlier, 1):
        clipped = text if len(text) <= HISTORY_PROMPT_CHARS else text[:HISTORY_PROMPT_CHARS] + "…"
        lines.append(f"{i}. {clipped}")
    lines.append("[End of the earlier messages. The current message follows.]")
    return "\n".join(lines)


def compose(
    text: str,
    items: list[Item],
    features: AgentFeatures,
    context: str = "",
    content: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(prompt blocks, per-item report)``; ``content``: blocks that stand for the
    prompt ``text`` (an ACP client's own, already fitted to the agent)."""
    blocks: list[dict[str, Any]] = []
    refs: list[str] = []
    report: list[dict[str, Any]] = []
    for item in items:
        uri = f"file://{item.path}" if item.path else f"artifact:{item.name}"
        record: dict[str, Any] = {"name": item.name, "mimeType": item.mime}
        if item.path:
            record["path"] = item.path
        data = item.data
        if data is not None and item.mime.startswith("image/") and features.image:
            block: dict[str, Any] = {
                "type": "image",
                "mimeType": item.mime,
                "data": base64.b64encode(data).decode("ascii"),
            }
            if item.path:
                block["uri"] = uri
            blocks.append(block)
            record["sentAs"] = "image"
        elif data is not None and features.embedded_context:
            resource: dict[str, Any] = {"uri": uri, "mimeType": item.mime}
            if _is_text(item.mime, data):
                resource["text"] = data.decode("utf-8")
            else:
                resource["blob"] = base64.b64encode(data).decode("ascii")
            blocks.append({"type": "resource", "resource": resource})
            record["sentAs"] = "resource"
        else:
            refs.append(f"- {item.name}: {item.path or '(inline content)'}")
            record["sentAs"] = "text"
            if item.reason:
                record["reason"] = item.reason
            elif data is not None:
                record["reason"] = "the agent does not take image or embedded content"
        report.append(record)
    lead = [context] if context else []
    if refs:
        lead.append("User-selected local attachments:\n" + "\n".join(refs))
    texts = [{"type": "text", "text": t} for t in lead]
    main = content if content else [{"type": "text", "text": text}]
    return [*texts, *main, *blocks], report
