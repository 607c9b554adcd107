"""What the scripted ACP agent (``fake_acp_agent.py``) does with a prompt.

:class:`Prompts` is the base of its ``Agent``: its wire (``send``, ``ask``: requests
of its own, ids alternating between integers and strings), the session state the
prompts read, and one behaviour per first word of the prompt (the list is in
``fake_acp_agent.py``'s docstring).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import sys
from pathlib import Path
from typing import Any

import orjson

_ids = itertools.count(0)


def tool_with_content(path: str) -> dict[str, Any]:
    """The ``toolcontent`` tool call: its content and raw output come with it."""
    return {
        "toolCallId": "call-c",
        "title": f"Edit {path}",
        "kind": "edit",
        "status": "in_progress",
        "content": [
            {"type": "diff", "path": path, "oldText": "old\n", "newText": "new\n"},
            {"type": "content", "content": {"type": "text", "text": "one line changed"}},
        ],
        "locations": [{"path": path}],
        "rawInput": {"path": path},
        "rawOutput": {"ok": True},
        "_meta": {"fake/tool": {"toolName": "Edit"}},
    }


#: what the ``toolcontent`` tool call's update carries besides its id and status
TOOL_DONE_EXTRAS: dict[str, Any] = {
    "rawInput": {"path": "edited"},
    "_meta": {"fake/tool": {"exit": 0}},
}

#: what the ``metachunks`` prompt sends: chunks with _meta on the update and on the block
META_CHUNKS: list[dict[str, Any]] = [
    {
        "sessionUpdate": kind,
        "content": {"type": "text", "text": text, "_meta": {"fake/block": text}},
        "_meta": {"fake/chunk": {"kind": kind}},
    }
    for kind, text in (("agent_thought_chunk", "thinking"), ("agent_message_chunk", "said"))
]

#: how the bridge's context blocks begin (providers/stdio/prompt.py)
CONTEXT_LEADS = ("[Context from the bridge", "User-selected local attachments:")


class Prompts:
    def __init__(self) -> None:
        self.waiting: dict[Any, asyncio.Future[Any]] = {}
        self.sessions: set[str] = set()
        self.cancelled: dict[str, asyncio.Event] = {}
        self.cost_step = float(os.environ.get("FAKE_AGENT_COST", "0") or 0)
        self.cost: dict[str, float] = {}
        self.settings: dict[str, dict[str, str]] = {}
        self.mcp: dict[str, list[dict[str, Any]]] = {}

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

    async def prompt(self, rid: Any, params: dict[str, Any]) -> None:
        sid = str(params.get("sessionId"))
        if sid not in self.sessions:
            self.send({"id": rid, "error": {"code": -32602, "message": "unknown session"}})
            return
        blocks = [b for b in params.get("prompt") or [] if isinstance(b, dict)]
        texts = [str(b.get("text", "")) for b in blocks if b.get("type") == "text"]
        # the bridge's context blocks come first; the command is the first other text
        # block (an ACP client's prompt may be followed by more of its own blocks)
        lead = [t for t in texts if t.startswith(CONTEXT_LEADS)]
        rest_texts = [t for t in texts if not t.startswith(CONTEXT_LEADS)]
        text = rest_texts[0].strip() if rest_texts else ""
        context = "\n\n".join(lead).strip()
        word, _, rest = text.partition(" ")
        cancel = self.cancelled[sid] = asyncio.Event()
        stop = "end_turn"
        print(f"fake agent prompt: {word}", file=sys.stderr, flush=True)
        if word == "permission":
            await self.permission(sid, rest.strip())
        elif word == "toolcontent":
            self.update(sid, {"sessionUpdate": "tool_call", **tool_with_content(rest.strip())})
            done = {"toolCallId": "call-c", "status": "completed", **TOOL_DONE_EXTRAS}
            self.update(sid, {"sessionUpdate": "tool_call_update", **done})
            self.chunk(sid, "edited")
        elif word == "metachunks":
            for chunk in META_CHUNKS:
                self.update(sid, chunk)
        elif word == "tools":
            for i in range(1, int(rest.strip() or 1) + 1):
                call = {"toolCallId": f"step-{i}", "title": f"step {i}", "kind": "read"}
                self.update(sid, {"sessionUpdate": "tool_call", **call, "status": "pending"})
                done = {"toolCallId": f"step-{i}", "status": "completed"}
                self.update(sid, {"sessionUpdate": "tool_call_update", **done})
            self.chunk(sid, "tools done")
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
        elif word == "stop":  # a turn that ends as told: max_tokens, refusal, …
            self.chunk(sid, "stopping")
            stop = rest.strip() or "end_turn"
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
        elif word == "oddpermission":
            await self.odd_permission(sid)
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
        elif word == "leak":  # an agent that quotes its own key on stderr, then dies
            name = rest.strip()
            print(f"fatal: bad key {os.environ.get(name, '')}", file=sys.stderr, flush=True)
            os._exit(5)
        elif word == "spawn":  # a terminal left running (not waited for, not released)
            argv = rest.split()
            made = await self.ask(
                "terminal/create", {"sessionId": sid, "command": argv[0], "args": argv[1:]}
            )
            self.chunk(sid, f"spawned {made.get('result') or made.get('error')}")
        elif word == "termcrash":  # exits while its terminal/wait_for_exit is pending
            argv = rest.split()
            made = await self.ask(
                "terminal/create", {"sessionId": sid, "command": argv[0], "args": argv[1:]}
            )
            tid = (made.get("result") or {}).get("terminalId")
            self.send(
                {
                    "id": "agent-wait",
                    "method": "terminal/wait_for_exit",
                    "params": {"sessionId": sid, "terminalId": tid},
                }
            )
            self.chunk(sid, f"waiting for {tid}")
            await asyncio.sleep(0.5)
            print("fake agent exiting with a terminal wait open", file=sys.stderr, flush=True)
            os._exit(7)
        elif word == "orphan":  # exits, leaving a child that holds its stdio open
            child = await asyncio.create_subprocess_exec("sleep", rest.strip() or "60")
            self.chunk(sid, f"orphan {child.pid}")
            print("fake agent exiting, its child keeps the pipes", file=sys.stderr, flush=True)
            os._exit(6)
        elif word == "pid":
            self.chunk(sid, f"pid {os.getpid()}")
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
        elif word == "whoami":
            cur = self.settings.get(sid, {})
            self.chunk(
                sid,
                f"model={cur.get('model', '')} mode={cur.get('mode', '')} "
                f"thought={cur.get('thought_level', '')}",
            )
        elif word == "blocks":
            self.chunk(sid, "blocks: " + "; ".join(describe(b) for b in blocks))
        elif word == "mcp":
            names = [f"{m.get('name')}:{m.get('type', 'stdio')}" for m in self.mcp.get(sid, [])]
            self.chunk(sid, "mcp: " + ",".join(names))
        elif word == "mcp-tools":
            self.chunk(sid, "tools: " + await self.mcp_tools(sid, rest.strip()))
        elif word == "selfwrite":
            path, _, content = rest.partition(" ")
            try:
                await asyncio.to_thread(Path(path).write_text, content, encoding="utf-8")
                self.chunk(sid, "self-written")
            except OSError as exc:
                self.chunk(sid, f"selfwrite error: {exc}")
        elif word == "env":
            self.chunk(sid, f"env {rest.strip()}={os.environ.get(rest.strip(), '<unset>')}")
        else:
            self.update(
                sid,
                {
                    "sessionUpdate": "plan",
                    "entries": [{"content": "answer", "priority": "high", "status": "pending"}],
                },
            )
            reply = f"agent says: {text}" + (f" [context: {context}]" if context else "")
            third = max(1, len(reply) // 3)
            for piece in (reply[:third], reply[third : 2 * third], reply[2 * third :]):
                self.chunk(sid, piece)
            usage: dict[str, Any] = {"sessionUpdate": "usage_update", "used": 42, "size": 1000}
            if self.cost_step:
                self.cost[sid] = round(self.cost.get(sid, 0.0) + self.cost_step, 6)
                usage["cost"] = {"amount": self.cost[sid], "currency": "USD"}
            self.update(sid, usage)
        if cancel.is_set():
            stop = "cancelled"
        words_in = len(" ".join(texts).split())
        words_out = 3 if word not in ("slow", "crash") else 1
        answer = {
            "stopReason": stop,
            "usage": {
                "inputTokens": words_in,
                "outputTokens": words_out,
                "totalTokens": words_in + words_out,
            },
        }
        self.send({"id": rid, "result": answer})

    async def mcp_tools(self, sid: str, name: str) -> str:
        """Start the session's stdio MCP server ``name`` and list its tools."""
        server = next((m for m in self.mcp.get(sid, []) if m.get("name") == name), None)
        if server is None or "command" not in server:
            return f"no stdio server {name}"
        env = {**os.environ, **{e["name"]: e["value"] for e in server.get("env", [])}}
        proc = await asyncio.create_subprocess_exec(
            server["command"],
            *server.get("args", []),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "f"}}
        for msg in (
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        ):
            proc.stdin.write(orjson.dumps(msg) + b"\n")
        await proc.stdin.drain()
        tools = "no answer"
        try:
            while line := await asyncio.wait_for(proc.stdout.readline(), 20):
                reply = orjson.loads(line)
                if reply.get("id") == 2:
                    tools = ",".join(t["name"] for t in reply["result"]["tools"])
                    break
        finally:
            proc.stdin.close()
            await asyncio.wait_for(proc.wait(), 10)
        return tools

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

    async def odd_permission(self, sid: str) -> None:
        """Malformed (not ACP-shaped) but valid JSON: a console must still show it."""
        markup = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
        self.update(
            sid,
            {
                "sessionUpdate": "plan",
                "entries": [None, "a bare string", {"content": markup, "status": "pending"}],
            },
        )
        tool = {
            "toolCallId": "call-odd",
            # a right-to-left override: "Edit …x.png" on the screen, "gnp.x" in the text
            "title": f"Edit {markup} \u202egnp.x",
            "kind": "edit",
            "status": "pending",
            "locations": {"path": "/odd/not-a-list"},
        }
        self.update(sid, {"sessionUpdate": "tool_call", **tool})
        answer = await self.ask(
            "session/request_permission",
            {
                "sessionId": sid,
                "toolCall": tool,
                "options": [{"optionId": "once", "name": f"Allow {markup}", "kind": "allow_once"}],
            },
        )
        outcome = (answer.get("result") or {}).get("outcome") or {}
        self.chunk(sid, f"odd permission: {outcome.get('optionId') or outcome.get('outcome')}")

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


def describe(block: dict[str, Any]) -> str:
    kind = block.get("type")
    if kind == "text":
        return f"text({len(str(block.get('text', '')))})"
    if kind == "image":
        data = base64.b64decode(str(block.get("data", "")))
        return f"image({block.get('mimeType')},{len(data)})"
    if kind == "resource":
        res = block.get("resource") or {}
        size = len(res["text"]) if "text" in res else len(base64.b64decode(res.get("blob", "")))
        return f"resource({res.get('mimeType')},{size},{'text' if 'text' in res else 'blob'})"
    return str(kind)
