"""A small scripted Zed-ACP agent on stdio, for tests (not shipped).

Run: ``python -m internal.peers.fake_acp_agent``. Newline-delimited JSON-RPC on
stdin/stdout, like ``opencode acp`` or ``gemini --acp``. Its own request ids
start at 0 and alternate between integers and strings (clients must keep a
separate id space). The first word of the prompt picks the behaviour:

* ``permission <path>``  tool call (kind ``edit``), ``session/request_permission``;
  if an allow option is chosen, ``fs/write_text_file`` of ``<path>``; reports the outcome
* ``read <path>``         ``fs/read_text_file``; replies the content or the error
* ``toolcontent <path>``  a ``tool_call`` that carries its content (a diff of ``<path>``,
  a text block) and ``rawOutput``, then its ``completed`` ``tool_call_update``
* ``tools <n>``           n tool calls (``step 1`` … ``step n``, each ``tool_call`` then its
  ``completed`` ``tool_call_update``), then ``tools done``
* ``write <path> <text>`` ``fs/write_text_file``
* ``terminal <cmd> [args]`` ``terminal/create`` → ``wait_for_exit`` → ``output``
* ``slow``                one chunk, then waits for ``session/cancel`` (→ ``cancelled``)
* ``drip <n> <ms>``       n chunks ``ms`` apart, then a plan and usage
* ``oddpermission``       a plan with entries that are not objects, a tool call and a
  ``session/request_permission`` whose ``locations`` is an object (not a list), with
  markup and a right-to-left override (U+202E) in the titles; reports the option chosen
* ``permcrash <path>``    asks ``session/request_permission``, then exits (status 4) unanswered
* ``crash``               exits with status 3 in the middle of the turn
* ``termcrash <cmd> [args]`` ``terminal/create``, then ``terminal/wait_for_exit`` and
  exits (status 7) before the answer
* ``orphan [secs]``       starts ``sleep secs`` (60) holding its stdin/stdout/stderr,
  says ``orphan <its pid>``, then exits (status 6) in the middle of the turn
* ``big``                 one 200 KiB message chunk (over asyncio's 64 KiB line default)
* ``describe``            replies the types of its content blocks (``text,image:image/png``)
* ``whoami``              ``model=<current> mode=<current> thought=<current>``
* ``blocks``              describes the prompt's content blocks (type, mime type, size)
* ``mcp``                 the MCP servers the session got (``name:type`` list)
* ``mcp-tools <name>``    starts that stdio MCP server, lists its tools (``tools: a,b``)
* ``env <NAME>``          the value of a variable of its environment, or ``<unset>``
* ``selfwrite <path> <text>`` writes the file itself (not through ``fs/*``): ``self-written``
  or ``selfwrite error: …``
* anything else           ``agent says: <prompt>`` in three chunks, a plan and usage

The command is the last text block; earlier text blocks are context, echoed as
`` [context: …]`` by the default reply. Every prompt answer carries ``usage``
(``inputTokens`` = words in, ``outputTokens`` = words out).

Environment: ``FAKE_AGENT_IGNORE_EOF=1`` keeps running after stdin closes (and
ignores SIGTERM); ``FAKE_AGENT_LOAD_SESSION=1`` advertises and accepts ``session/load``;
``FAKE_AGENT_RESUME=1`` advertises and accepts ``session/resume``;
``FAKE_AGENT_AUTH=<method>`` advertises that auth method and fails ``session/*``
with ``-32000`` until ``authenticate`` with it (and ``_meta["api-key"]`` equal to
``FAKE_AGENT_API_KEY`` when set); ``FAKE_AGENT_OPTIONS=config`` answers sessions
with ``configOptions`` (model ``fake/alpha|fake/beta``, mode ``ask|code``,
``thought_level`` ``low|high``), ``=legacy`` with ``models``/``modes``;
``FAKE_AGENT_COST=<amount>`` adds a cumulative USD ``cost`` to ``usage_update``;
``FAKE_AGENT_PROMPT_CAPS=image,embeddedContext`` and ``FAKE_AGENT_MCP=http,sse``
set those capabilities.

This module is the agent's protocol (initialize, auth, sessions and their options,
the method table) and its entry point; what each prompt does is in
``fake_acp_prompts.py`` (``Prompts``, the base of ``Agent``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import orjson

from internal.peers.fake_acp_prompts import Prompts

MODELS = [("fake/alpha", "Alpha"), ("fake/beta", "Beta")]
MODES = [("ask", "Ask"), ("code", "Code")]


def _flags(name: str) -> set[str]:
    return {f.strip() for f in os.environ.get(name, "").split(",") if f.strip()}


class Agent(Prompts):
    def __init__(self) -> None:
        super().__init__()  # the wire and the sessions' state
        self.load = os.environ.get("FAKE_AGENT_LOAD_SESSION") == "1"
        self.resume = os.environ.get("FAKE_AGENT_RESUME") == "1"
        self.auth = os.environ.get("FAKE_AGENT_AUTH", "")
        self.authed = not self.auth
        self.option_style = os.environ.get("FAKE_AGENT_OPTIONS", "")
        self.tasks: set[asyncio.Task[Any]] = set()

    def capabilities(self) -> dict[str, Any]:
        prompt = _flags("FAKE_AGENT_PROMPT_CAPS")
        mcp = _flags("FAKE_AGENT_MCP")
        caps: dict[str, Any] = {
            "loadSession": self.load,
            "promptCapabilities": {k: True for k in prompt},
            "mcpCapabilities": {"http": "http" in mcp, "sse": "sse" in mcp},
        }
        if self.resume:
            caps["sessionCapabilities"] = {"resume": {}}
        return caps

    def options(self, sid: str) -> dict[str, Any]:
        """The session's model/mode state in the configured style."""
        cur = self.settings.setdefault(
            sid, {"model": "fake/alpha", "mode": "ask", "thought_level": "low"}
        )
        if self.option_style == "config":

            def select(oid: str, category: str, choices: list[tuple[str, str]]) -> Any:
                return {
                    "id": oid,
                    "name": oid.title(),
                    "category": category,
                    "type": "select",
                    "currentValue": cur[oid],
                    "options": [{"value": v, "name": n} for v, n in choices],
                }

            return {
                "configOptions": [
                    select("model", "model", MODELS),
                    select("mode", "mode", MODES),
                    select("thought_level", "thought_level", [("low", "Low"), ("high", "High")]),
                ]
            }
        if self.option_style == "legacy":
            return {
                "models": {
                    "availableModels": [{"modelId": v, "name": n} for v, n in MODELS],
                    "currentModelId": cur["model"],
                },
                "modes": {
                    "availableModes": [{"id": v, "name": n} for v, n in MODES],
                    "currentModeId": cur["mode"],
                },
            }
        return {}

    def auth_error(self, rid: Any) -> bool:
        if self.authed:
            return False
        self.send({"id": rid, "error": {"code": -32000, "message": "Authentication required"}})
        return True

    async def handle(self, msg: dict[str, Any]) -> None:
        if "method" not in msg:
            fut = self.waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            return
        method, params, rid = msg["method"], msg.get("params") or {}, msg.get("id")
        if method == "initialize":
            methods = [{"id": self.auth, "name": "Fake API key"}] if self.auth else []
            self.send(
                {
                    "id": rid,
                    "result": {
                        "protocolVersion": 1,
                        "agentCapabilities": self.capabilities(),
                        "authMethods": methods,
                        "agentInfo": {"name": "fake-acp-agent", "version": "1"},
                    },
                }
            )
        elif method == "authenticate":
            meta = params.get("_meta") or {}
            want = os.environ.get("FAKE_AGENT_API_KEY", "")
            if params.get("methodId") != self.auth or (want and meta.get("api-key") != want):
                self.send({"id": rid, "error": {"code": -32000, "message": "bad credentials"}})
            else:
                self.authed = True
                self.send({"id": rid, "result": {}})
        elif method == "session/new":
            if self.auth_error(rid):
                return
            sid = f"fake-sess-{len(self.sessions) + 1}-{os.getpid()}"
            self.sessions.add(sid)
            self.mcp[sid] = list(params.get("mcpServers") or [])
            print(f"fake agent mcpServers: {orjson.dumps(self.mcp[sid]).decode()}", file=sys.stderr)
            self.send({"id": rid, "result": {"sessionId": sid, **self.options(sid)}})
        elif (method == "session/load" and self.load) or (
            method == "session/resume" and self.resume
        ):
            if self.auth_error(rid):
                return
            sid = str(params.get("sessionId"))
            self.sessions.add(sid)
            self.mcp[sid] = list(params.get("mcpServers") or [])
            print(f"fake agent {method} {sid}", file=sys.stderr, flush=True)
            self.send({"id": rid, "result": self.options(sid)})
        elif method in ("session/set_config_option", "session/set_model", "session/set_mode"):
            sid = str(params.get("sessionId"))
            if sid not in self.sessions:
                self.send({"id": rid, "error": {"code": -32602, "message": "unknown session"}})
                return
            key = {"session/set_model": "model", "session/set_mode": "mode"}.get(
                method, str(params.get("configId"))
            )
            value = params.get("value") or params.get("modelId") or params.get("modeId")
            self.options(sid)
            if key not in self.settings[sid]:
                self.send({"id": rid, "error": {"code": -32602, "message": f"no option {key}"}})
                return
            self.settings[sid][key] = str(value)
            self.send({"id": rid, "result": self.options(sid)})
        elif method == "session/cancel":
            self.cancelled.setdefault(str(params.get("sessionId")), asyncio.Event()).set()
        elif method == "session/prompt":
            task = asyncio.get_running_loop().create_task(self.prompt(rid, params))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        elif rid is not None:
            self.send({"id": rid, "error": {"code": -32601, "message": f"unknown {method}"}})


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
