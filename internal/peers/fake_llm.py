"""A fake OpenAI-compatible LLM for tests and e2e peers (not shipped).

``GET /v1/models`` and ``POST /v1/chat/completions`` (JSON, or SSE chunks ending
with ``data: [DONE]`` when ``stream: true``; a usage chunk when
``stream_options.include_usage``). Replies are deterministic:
``FAKE-LLM says: <first line of the last user text>``.

The user text is read past what real peers inject: messages starting with
``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` are skipped and a leading timestamp
like ``[Mon 2026-11-30 01:52 UTC] `` is removed.

Hooks:

* a user text starting ``slow:<ms> `` delays the answer (for cancel tests);
* ``POST /_script`` with ``{"replies": [...]}`` queues replies used (FIFO) by the
  next calls instead of the echo; an item is a string (the content) or an
  object ``{"content": str, "tool_calls": [{"name": str, "arguments": {...}}]}``
  or ``{"status": int, "body": str}`` for an HTTP error; any item object may add
  ``"delay_ms": int`` to answer only after that delay (cancel-mid-loop tests), and
  ``"finish_reason": str`` (``length``, ``content_filter``) to end the choice so;
* ``GET /_requests`` lists what was received (path, headers, body);
  ``POST /_reset`` clears requests and script.

Run: ``python -m internal.peers.fake_llm --port 0`` prints ``listening HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from internal.peers.serving import serve_forever

MODEL_ID = "fake-model"
OPENCLAW_CONTEXT = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
_TIMESTAMP = re.compile(r"^\[[A-Z][a-z]{2} \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? [A-Z]+\]\s*")
_SLOW = re.compile(r"^slow:(\d+)\s*")


@dataclass
class LLMState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    script: list[Any] = field(default_factory=list)
    keep: int = 500

    def record(self, request: web.Request, body: Any) -> None:
        headers = {str(k): str(v) for k, v in request.headers.items()}
        self.requests.append({"path": request.path, "headers": headers, "body": body})
        del self.requests[: -self.keep]


STATE_KEY = web.AppKey("llm_state", LLMState)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{type: text, text: ...}, ...]
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def user_text(messages: Any) -> str:
    """The last real user text, past injected context and timestamps."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        text = _text_of(message.get("content")).strip()
        if text.startswith(OPENCLAW_CONTEXT):
            continue
        return _TIMESTAMP.sub("", text)
    return ""


def _reply_for(state: LLMState, text: str) -> dict[str, Any]:
    if state.script:
        item = state.script.pop(0)
        return {"content": item} if isinstance(item, str) else dict(item)
    first = text.splitlines()[0] if text else ""
    return {"content": f"FAKE-LLM says: {first}"}


def _usage(prompt: str, completion: str) -> dict[str, int]:
    p, c = max(1, len(prompt.split())), max(1, len(completion.split()))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _tool_calls(reply: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(reply.get("tool_calls") or []):
        calls.append(
            {
                "index": i,
                "id": f"call_{i}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": orjson.dumps(call.get("arguments", {})).decode(),
                },
            }
        )
    return calls


async def models(request: web.Request) -> web.Response:
    body = {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "fake"}]}
    return web.json_response(body)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return web.json_response({"error": {"message": "invalid JSON body"}}, status=400)
    state.record(request, body)
    text = user_text(body.get("messages"))
    slow = _SLOW.match(text)
    if slow:
        await asyncio.sleep(int(slow.group(1)) / 1000)
        text = text[slow.end() :]
    reply = _reply_for(state, text)
    delay = reply.get("delay_ms")
    if isinstance(delay, (int, float)) and delay > 0:
        await asyncio.sleep(delay / 1000)
    if "status" in reply:
        return web.Response(status=int(reply["status"]), text=str(reply.get("body", "error")))
    content = str(reply.get("content", ""))
    calls = _tool_calls(reply)
    model = str(body.get("model") or MODEL_ID)
    created = int(time.time())
    cid = f"chatcmpl-fake-{time.time_ns()}"
    finish = str(reply.get("finish_reason") or ("tool_calls" if calls else "stop"))
    if not body.get("stream"):
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        return web.json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": _usage(text, content),
            }
        )
    stream = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)

    async def chunk(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> None:
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra,
        }
        await stream.write(b"data: " + orjson.dumps(payload) + b"\n\n")

    await chunk({"role": "assistant", "content": ""})
    if content:
        size = max(1, -(-len(content) // 3))
        for i in range(0, len(content), size):
            await chunk({"content": content[i : i + size]})
    if calls:
        await chunk({"tool_calls": calls})
    await chunk({}, finish)
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        payload = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(text, content),
        }
        await stream.write(b"data: " + orjson.dumps(payload) + b"\n\n")
    await stream.write(b"data: [DONE]\n\n")
    await stream.write_eof()
    return stream


async def script(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())
    request.app[STATE_KEY].script.extend(body.get("replies", []))
    return web.json_response({"queued": len(request.app[STATE_KEY].script)})


async def requests_seen(request: web.Request) -> web.Response:
    return web.Response(
        body=orjson.dumps(request.app[STATE_KEY].requests), content_type="application/json"
    )


async def reset(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.requests.clear()
    state.script.clear()
    return web.json_response({"ok": True})


def create_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = LLMState()
    for prefix in ("/v1", ""):
        app.router.add_get(f"{prefix}/models", models)
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
    app.router.add_post("/_script", script)
    from internal.peers.fake_gemini import add_routes as add_gemini_routes

    add_gemini_routes(app)  # gemini-cli's API, same state and script
    app.router.add_get("/_requests", requests_seen)
    app.router.add_post("/_reset", reset)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="fake OpenAI-compatible LLM (tests only)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    with contextlib.suppress(KeyboardInterrupt):
        args = parser.parse_args()
        asyncio.run(serve_forever(create_app(), args.host, args.port))


if __name__ == "__main__":
    main()
