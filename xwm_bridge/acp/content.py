"""What the front door relays to an ACP client as is, checked against the ACP schema.

Upstreams (HTTP providers, gateways, the multi-agent loop) are not ACP peers: a content
block, a tool-call content item or an ``available_commands_update`` they hand over goes
to the client only when it has the fields the schema requires, with the types it
requires; anything else is dropped (the SDK's client would drop the whole notification,
and a strict client fail on it). Unknown extra fields are kept (ACP tolerates them). A client's
``session/prompt`` blocks get the same check (``-32602`` naming what is missing).
Sans-I/O.
"""

from __future__ import annotations

from typing import Any

#: the fields each content block type requires to be strings (ACP ``ContentBlock``)
_REQUIRED = {
    "text": ("text",),
    "image": ("data", "mimeType"),
    "audio": ("data", "mimeType"),
    "resource_link": ("uri", "name"),
}


#: what a block of each type needs, for the ``-32602`` of a client's malformed prompt
REQUIREMENTS = {
    "text": "a text block needs text (a string)",
    "image": "an image block needs data and mimeType (strings)",
    "audio": "an audio block needs data and mimeType (strings)",
    "resource_link": "a resource_link block needs uri and name (strings)",
    "resource": "a resource block needs a resource object with uri and text or blob (strings)",
}


def _strings(value: dict[str, Any], keys: tuple[str, ...]) -> bool:
    return all(isinstance(value.get(k), str) for k in keys)


def content_block(value: Any) -> dict[str, Any] | None:
    """``value`` if it is a valid ACP content block, else None."""
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "resource":
        res = value.get("resource")
        ok = (
            isinstance(res, dict)
            and isinstance(res.get("uri"), str)
            and (isinstance(res.get("text"), str) or isinstance(res.get("blob"), str))
        )
    else:
        keys = _REQUIRED.get(kind) if isinstance(kind, str) else None
        ok = keys is not None and _strings(value, keys)
    return value if ok else None


def _diff(item: dict[str, Any]) -> bool:
    old = item.get("oldText")
    return _strings(item, ("path", "newText")) and (old is None or isinstance(old, str))


def tool_content(items: Any, terminals: bool) -> list[dict[str, Any]] | None:
    """The valid items of a tool call's ``content`` (``terminal`` ones only when the
    client runs the terminals); None when there is no list."""
    if not isinstance(items, list):
        return None
    out: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        keep = (
            (kind == "content" and content_block(item.get("content")) is not None)
            or (kind == "diff" and _diff(item))
            or (kind == "terminal" and terminals and isinstance(item.get("terminalId"), str))
        )
        if keep:
            out.append(item)
    return out


def _command(command: Any) -> bool:
    """An ``AvailableCommand``: ``name``, ``description``, and an ``input`` (when given)
    that is an object with a ``hint`` string (the schema's only input kind)."""
    if not isinstance(command, dict) or not _strings(command, ("name", "description")):
        return False
    given = command.get("input")
    return given is None or (isinstance(given, dict) and isinstance(given.get("hint"), str))


def commands_update(update: dict[str, Any]) -> bool:
    """An agent's ``available_commands_update``, relayed as is: is it valid?"""
    commands = update.get("availableCommands")
    return isinstance(commands, list) and all(_command(c) for c in commands)
