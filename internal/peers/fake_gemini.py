"""Gemini API endpoints of the fake LLM (what gemini-cli calls), mounted by
:func:`internal.peers.fake_llm.create_app` on the same state and script.

* ``POST /v1beta/models/{model}:generateContent`` — JSON answer
* ``POST /v1beta/models/{model}:streamGenerateContent?alt=sse`` — SSE chunks
* ``POST /v1beta/models/{model}:countTokens`` — ``{totalTokens}``

Replies follow the fake's rules (script first, else ``FAKE-LLM says: <first line>``,
``slow:<ms>`` prefix). A scripted item with ``tool_calls`` becomes ``functionCall``
parts. When ``generationConfig.responseMimeType`` is ``application/json`` the answer
is JSON shaped by the given schema (gemini's model router and next-speaker check
ask for that and retry on plain text); such calls never consume the script.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from aiohttp import web

_SLOW = re.compile(r"^slow:(\d+)\s*")


def _is_context(text: str) -> bool:
    return text.startswith("<session_context>") or "This is the Gemini CLI" in text[:200]


def gemini_user_text(contents: Any) -> str:
    """The last user text part, skipping tool results and gemini's injected context."""
    if not isinstance(contents, list):
        return ""
    for item in reversed(contents):
        if not isinstance(item, dict) or item.get("role", "user") != "user":
            continue
        parts = item.get("parts")
        for part in reversed(parts if isinstance(parts, list) else []):
            text = str(part.get("text", "")).strip() if isinstance(part, dict) else ""
            if text and not _is_context(text):
                return text
    return ""


def value_for_schema(schema: Any, name: str = "") -> Any:
    """A small valid value for a JSON schema (enough for gemini-cli's internal calls)."""
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return "user" if name == "next_speaker" and "user" in enum else enum[0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        return {k: value_for_schema(v, k) for k, v in props.items()}
    if kind == "array":
        return []
    if kind in ("number", "integer"):
        return 1
    if kind == "boolean":
        return False
    if name == "next_speaker":
        return "user"
    return "simple task" if "reason" in name else "fake"


def _usage(text: str, reply: str) -> dict[str, int]:
    p, c = max(1, len(text.split())), max(1, len(reply.split()))
    return {"promptTokenCount": p, "candidatesTokenCount": c, "totalTokenCount": p + c}


def _response(parts: list[dict[str, Any]], usage: dict[str, int], finish: str | None) -> bytes:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    return orjson.dumps(
        {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "fake-model"}
    )


async def _reply(request: web.Request) -> tuple[list[list[dict[str, Any]]], dict[str, int]]:
    """The answer as a list of part-lists (one per streamed chunk) and usage."""
    from internal.peers.fake_llm import STATE_KEY, _reply_for

    state = request.app[STATE_KEY]
    body = orjson.loads(await request.read())
    state.record(request, body)
    config = body.get("generationConfig") or {}
    text = gemini_user_text(body.get("contents"))
    if config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema") or config.get("responseSchema") or {}
        answer = orjson.dumps(value_for_schema(schema)).decode()
        return [[{"text": answer}]], _usage(text, answer)
    slow = _SLOW.match(text)
    if slow:
        await asyncio.sleep(int(slow.group(1)) / 1000)
        text = text[slow.end() :]
    reply = _reply_for(state, text)
    content = str(reply.get("content", ""))
    chunks: list[list[dict[str, Any]]] = []
    if content:
        size = max(1, -(-len(content) // 3))
        chunks += [[{"text": content[i : i + size]}] for i in range(0, len(content), size)]
    calls = [
        {"functionCall": {"name": c["name"], "args": c.get("arguments", {})}}
        for c in reply.get("tool_calls") or []
    ]
    if calls:
        chunks.append(calls)
    return chunks or [[{"text": ""}]], _usage(text, content)


async def generate(request: web.Request) -> web.StreamResponse:
    action = request.match_info["action"]
    if action == "countTokens":
        body = orjson.loads(await request.read())
        text = orjson.dumps(body).decode()
        return web.json_response({"totalTokens": max(1, len(text) // 4)})
    if action not in ("generateContent", "streamGenerateContent"):
        return web.json_response({"error": {"code": 404, "message": "unknown action"}}, status=404)
    chunks, usage = await _reply(request)
    if action == "generateContent":
        parts = [p for chunk in chunks for p in chunk]
        return web.Response(body=_response(parts, usage, "STOP"), content_type="application/json")
    stream = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        data = _response(chunk, usage, "STOP" if last else None)
        await stream.write(b"data: " + data + b"\r\n\r\n")
    await stream.write_eof()
    return stream


def add_routes(app: web.Application) -> None:
    app.router.add_post(r"/v1beta/models/{model}:{action}", generate)
    app.router.add_post(r"/v1/models/{model}:{action}", generate)
