"""A small scripted Zed-ACP agent on stdio, for tests (not shipped).

Run: ``python -m internal.peers.fake_acp_agent``. Newline-delimited JSON-RPC on
stdin/stdout, like ``opencode acp`` or ``gemini --acp``. Its own request ids
start at 0 and alternate between integers and strings (clients must keep a
separate id space). The first word of the prompt picks the behaviour:

* ``permission <path>``  tool call (kind ``edit``), ``session/request_permission``;
  if an allow option is chosen, ``fs/write_text_file`` of ``<path>``; reports the outcome
* ``read <path>``         ``fs/read_text_file``; replies the content or the error
* ``write <path> <text>`` ``fs/write_text_file``
* ``terminal <cmd> [args]`` ``terminal/create`` → ``wait_for_exit`` → ``output``
* ``slow``                one chunk, then waits for ``session/cancel`` (→ ``cancelled``)
* ``drip <n> <ms>``       n chunks ``ms`` apart, then a plan and usage
* ``permcrash <path>``    asks ``session/request_permission``, then exits (status 4) unanswered
* ``crash``               exits with status 3 in the middle of the turn
* ``big``                 one 200 KiB message chunk (over asyncio's 64 KiB line default)
* ``describe``            replies the types of its content blocks (``text,image:image/png``)
* anything else           ``agent says: <prompt>`` in three chunks, a plan and usage

Environment: ``FAKE_AGENT_IGNORE_EOF=1`` keeps running after stdin closes (and
ignores SIGTERM); ``FAKE_AGENT_LOAD_SESSION=1`` advertises and accepts ``session/load``;
``FAKE_AGENT_PROMPT_CAPS=image,embeddedContext`` advertises those ``promptCapabilities``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from typing import Any

import orjson

_ids = itertools.count(0)


class Agent:
    def __init__(self) -> None:
        self.waiting: dict[Any, asyncio.Future[Any]] = {}
        self.sessions: set[str] = set()
        self.cancelled: dict[str, asyncio.Event] = {}
        self.load = os.environ.get("FAKE_AGENT_LOAD_SESSION") == "1"
        self.tasks: set[asyncio.Task[Any]] = set()

    def capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"loadSession": self.load}
        prompt = [c for c in os.environ.get("FAKE_AGENT_PROMPT_CAPS", "").split(",") if c]
        if prompt:
            caps["promptCapabilities"] = dict.fromkeys(prompt, True)
        return caps

    def send(self, obj: dict[str, Any]) -> None:
        sys.stdout.buffer.write(orjson.dumps({"jsonrpc": "2.0", **obj}) + b"\n")
        sys.stdout.buffer.flush()

    async def ask(self, method: str, params: dict[str, Any]) -> Any:
        n = next(_ids)
        rid: Any = n if n % 2 == 0 else f"agent-{n}"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self.send({"id": rid, "method": method, "params": params})
        return await fut

    def update(self, sid: str, update: dict[str, Any]) -> None:
        self.send({"method": "session/update", "params": {"sessionId": sid, "update": update}})

    def chunk(self, sid: str, text: str) -> None:
        self.update(
            sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
        )

    async def handle(self, msg: dict[str, Any]) -> None:
        if "method" not in msg:
            fut = self.waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        method, params, rid = msg["method"], msg.get("params") or {}, msg.get("id")
        if method == "initialize":
            self.send(
                {
                    "id": rid,
                    "result": {
                        "protocolVersion": 1,
                        "agentCapabilities": self.capabilities(),
                        "authMethods": [],
                        "agentInfo": {"name": "fake-acp-agent", "version": "1"},
                    },
                }
            )
        elif method == "session/new":
            sid = f"fake-sess-{len(self.sessions) + 1}-{os.getpid()}"
            self.sessions.add(sid)
            self.send({"id": rid, "result": {"sessionId": sid}})
        elif method == "session/load" and self.load:
            self.sessions.add(str(params.get("sessionId")))
            self.send({"id": rid, "result": {}})
        elif method == "session/cancel":
            self.cancelled.setdefault(str(params.get("sessionId")), asyncio.Event()).set()
        elif method == "session/prompt":
            task = asyncio.get_running_loop().create_task(self.prompt(rid, params))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif rid is not None:
            self.send({"id": rid, "error": {"code": -32601, "message": f"unknown {method}"}})

    async def prompt(self, rid: Any, params: dict[str, Any]) -> None:
        sid = str(params.get("sessionId"))
        if sid not in self.sessions:
            self.send({"id": rid, "error": {"code": -32602, "message": "unknown session"}})
            return
        blocks = params.get("prompt") or []
        text = " ".join(b.get("text", "") for b in blocks if isinstance(b, dict)).strip()
        word, _, rest = text.partition(" ")
        cancel = self.cancelled[sid] = asyncio.Event()
        stop = "end_turn"
        print(f"fake agent prompt: {word}", file=sys.stderr, flush=True)
        if word == "permission":
            await self.permission(sid, rest.strip())
        elif word == "read":
            answer = await self.ask("fs/read_text_file", {"sessionId": sid, "path": rest.strip()})
            if "error" in answer:
                self.chunk(sid, f"read error {answer['error'].get('code')}")
            else:
                self.chunk(sid, f"content: {answer['result']['content']}")
        elif word == "write":
            path, _, content = rest.partition(" ")
            answer = await self.ask(
                "fs/write_text_file", {"sessionId": sid, "path": path, "content": content}
            )
            self.chunk(sid, "write error" if "error" in answer else "written")
        elif word == "terminal":
            await self.terminal(sid, rest.split())
        elif word == "slow":
            self.chunk(sid, "working")
            await cancel.wait()
            stop = "cancelled"
        elif word == "drip":
            count, _, gap = rest.strip().partition(" ")
            for i in range(int(count or 5)):
                if i:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(cancel.wait(), int(gap or 200) / 1000)
                if cancel.is_set():
                    break
                self.chunk(sid, f"chunk {i + 1} ")
            self.update(sid, {"sessionUpdate": "usage_update", "used": 7, "size": 1000})
        elif word == "permcrash":
            tool = {"toolCallId": "call-9", "title": f"Write {rest.strip()}", "kind": "edit"}
            self.send(
                {
                    "id": "agent-crash",
                    "method": "session/request_permission",
                    "params": {
                        "sessionId": sid,
                        "toolCall": tool,
                        "options": [{"optionId": "once", "name": "Allow", "kind": "allow_once"}],
                    },
                }
            )
            await asyncio.sleep(0.5)
            print("fake agent exiting with a permission request open", file=sys.stderr, flush=True)
            os._exit(4)
        elif word == "crash":
            self.chunk(sid, "about to crash")
            print("fake agent crashing on purpose", file=sys.stderr, flush=True)
            os._exit(3)
        elif word == "describe":
            kinds = [
                f"{b.get('type')}:{b.get('mimeType')}"
                if b.get("type") == "image"
                else b.get("type")
                for b in blocks
                if isinstance(b, dict)
            ]
            self.chunk(sid, ",".join(str(k) for k in kinds))
        elif word == "big":
            self.chunk(sid, "x" * 200 * 1024)
        else:
            self.update(
                sid,
                {
                    "sessionUpdate": "plan",
                    "entries": [{"content": "answer", "priority": "high", "status": "pending"}],
                },
            )
            reply = f"agent says: {text}"
            third = max(1, len(reply) // 3)
            for piece in (reply[:third], reply[third : 2 * third], reply[2 * third :]):
                self.chunk(sid, piece)
            self.update(sid, {"sessionUpdate": "usage_update", "used": 42, "size": 1000})
        if cancel.is_set():
            stop = "cancelled"
        self.send({"id": rid, "result": {"stopReason": stop}})

    async def permission(self, sid: str, path: str) -> None:
        tool = {
            "toolCallId": "call-1",
            "title": f"Write {path}",
            "kind": "edit",
            "status": "pending",
            "locations": [{"path": path}],
        }
        self.update(sid, {"sessionUpdate": "tool_call", **tool})
        answer = await self.ask(
            "session/request_permission",
            {
                "sessionId": sid,
                "toolCall": tool,
                "options": [
                    {"optionId": "once", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
                    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
                ],
            },
        )
        outcome = (answer.get("result") or {}).get("outcome") or {}
        chosen = outcome.get("optionId") if outcome.get("outcome") == "selected" else None
        if chosen in ("once", "always"):
            await self.ask(
                "fs/write_text_file",
                {"sessionId": sid, "path": path, "content": "written by fake agent\n"},
            )
            status, text = "completed", f"permission granted ({chosen})"
        else:
            status, text = "failed", f"permission denied ({outcome.get('outcome')})"
        self.update(
            sid, {"sessionUpdate": "tool_call_update", "toolCallId": "call-1", "status": status}
        )
        self.chunk(sid, text)

    async def terminal(self, sid: str, argv: list[str]) -> None:
        created = await self.ask(
            "terminal/create", {"sessionId": sid, "command": argv[0], "args": argv[1:]}
        )
        if "error" in created:
            self.chunk(sid, f"terminal error: {created['error'].get('message')}")
            return
        tid = created["result"]["terminalId"]
        await self.ask("terminal/wait_for_exit", {"sessionId": sid, "terminalId": tid})
        out = await self.ask("terminal/output", {"sessionId": sid, "terminalId": tid})
        await self.ask("terminal/release", {"sessionId": sid, "terminalId": tid})
        self.chunk(sid, f"terminal output: {out['result']['output'].strip()}")


async def main() -> None:
    if os.environ.get("FAKE_AGENT_IGNORE_EOF") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    agent = Agent()
    while line := await reader.readline():
        if line.strip():
            await agent.handle(orjson.loads(line))
    if os.environ.get("FAKE_AGENT_IGNORE_EOF") == "1":
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
