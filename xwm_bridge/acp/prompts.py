"""ACP ``session/prompt`` → one bridge turn, sans-I/O: the prompt checked against
``promptCapabilities``, its text, the session title, and the ``session.message`` params:

================== ===============================================================
ACP                bridge
================== ===============================================================
``sessionId``      ``sessionId`` and ``threadId`` (one ACP session = one thread)
``prompt[]``       ``taskPrompt``: text blocks as is; a ``resource_link`` as its URI;
                   an embedded text ``resource`` inlined under its URI
session ``cwd``    ``workingDirectory``
images, resources  also ``acpPrompt`` (the blocks): a stdio agent whose
                   ``promptCapabilities`` take them gets them as sent; other routes
                   get the text (an image as ``[image: <mimeType>]``)
``route`` option   ``routing``: ``auto`` → ``{routingMode: auto}``; else explicit
                   (``singleAgent`` + provider, ``multiAgent``, ``gateway`` + provider)
``model`` option   ``routing.explicitModel``
================== ===============================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xwm_bridge import coerce
from xwm_bridge.acp import content
from xwm_bridge.acp.content import content_block
from xwm_bridge.jsonrpc import INVALID_PARAMS, RpcError
from xwm_bridge.providers.stdio.codec import PROMPT_BLOCKS_PARAM


@dataclass(frozen=True, slots=True)
class PromptSupport:
    """Content the front door accepts in ``session/prompt`` (its ``promptCapabilities``)."""

    image: bool = False
    audio: bool = False
    embedded_context: bool = True

    def wire(self) -> dict[str, bool]:
        return {"image": self.image, "audio": self.audio, "embeddedContext": self.embedded_context}


def check_prompt(blocks: Any, support: PromptSupport) -> list[dict[str, Any]]:
    """The prompt's content blocks, or ``-32602`` naming what is wrong."""
    if not isinstance(blocks, list) or not blocks:
        raise RpcError(INVALID_PARAMS, "prompt must be a non-empty array of content blocks")
    allowed = {"text", "resource_link"}
    if support.embedded_context:
        allowed.add("resource")
    if support.image:
        allowed.add("image")
    if support.audio:
        allowed.add("audio")
    out: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        # a type that is not a string (an array, an object) is no content type: never a
        # set lookup, which would raise TypeError (-32603 and a traceback) on it
        if not isinstance(kind, str) or kind not in allowed:
            raise RpcError(
                INVALID_PARAMS,
                f"prompt[{i}]: content type {kind!r} is not accepted "
                f"(promptCapabilities allow {', '.join(sorted(allowed))})",
            )
        assert isinstance(block, dict)
        if content_block(block) is None:  # the fields the ACP schema requires, typed
            raise RpcError(INVALID_PARAMS, f"prompt[{i}]: {content.REQUIREMENTS[kind]}")
        out.append(block)
    if not prompt_text(out):  # the turn's taskPrompt: empty only when every text is
        raise RpcError(INVALID_PARAMS, "prompt has no content: its text blocks are empty")
    return out


def prompt_text(blocks: list[dict[str, Any]]) -> str:
    """The turn's ``taskPrompt``: what every route can take, in the order given."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "resource_link":
            name = coerce.text(block.get("name"))
            uri = coerce.text(block.get("uri"))
            parts.append(f"[{name}]({uri})" if name and name != uri else uri)
        elif kind == "image":
            parts.append(f"[image: {coerce.text(block.get('mimeType'), 'image')}]")
        elif kind == "resource":
            res = block.get("resource") or {}
            uri = coerce.text(res.get("uri"))
            text = res.get("text")
            if isinstance(text, str):
                parts.append(f'<resource uri="{uri}">\n{text}\n</resource>')
            else:
                parts.append(
                    f'<resource uri="{uri}" mimeType="{coerce.text(res.get("mimeType"))}"/>'
                )
    return "\n".join(p for p in parts if p).strip()


def title_of(text: str, limit: int = 80) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def routing_params(route: str, model: str) -> dict[str, Any]:
    """The bridge ``routing`` object of a route option value (see :mod:`.options`)."""
    kind, _, target = route.partition(":")
    routing: dict[str, Any]
    if route == "auto":
        routing = {"routingMode": "auto"}
    elif route == "multi-agent":
        routing = {"routingMode": "explicit", "explicitExecutionTarget": "multiAgent"}
    elif kind == "single-agent":
        routing = {
            "routingMode": "explicit",
            "explicitExecutionTarget": "singleAgent",
            "explicitProviderId": target,
        }
    elif kind == "gateway":
        routing = {
            "routingMode": "explicit",
            "explicitExecutionTarget": "gateway",
            "preferredGatewayProviderId": target,
        }
    else:
        raise RpcError(INVALID_PARAMS, f"unknown route {route!r}")
    if model:
        routing["explicitModel"] = model
    return routing


def turn_params(
    session_id: str, cwd: str, blocks: list[dict[str, Any]], route: str, model: str
) -> dict[str, Any]:
    """``session.message`` params of one ACP prompt."""
    params: dict[str, Any] = {
        "sessionId": session_id,
        "threadId": session_id,
        "taskPrompt": prompt_text(blocks),
        "routing": routing_params(route, model),
    }
    if any(b.get("type") not in ("text", "resource_link") for b in blocks):
        params[PROMPT_BLOCKS_PARAM] = blocks  # a stdio agent that takes them gets the blocks
    if cwd:
        params["workingDirectory"] = cwd
    return params
