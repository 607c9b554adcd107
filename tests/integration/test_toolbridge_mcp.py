"""``xwm-bridge toolbridge`` driven by the official MCP Python client (adapters.md §2)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from mcp.shared.exceptions import MCPError

from internal.peers.fake_llm import create_app
from tests.conftest import ROOT, ServeApp
from tests.mcp_client import mcp_session, toolbridge_env
from xwm_bridge import jsonrpc

FAKE_CLAUDE = """#!{python}
import json, os, subprocess, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_CLAUDE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
    log.write(json.dumps(sorted(k for k in os.environ if k.startswith(("VAULT_", "LLM_")))) + "\\n")
# parsed the way the real CLI (Commander) does: -p/--print takes no value, the prompt
# is the positional argument, "--" ends the options
valued = {{"--output-format", "--permission-mode", "--model", "--system-prompt", "--tools"}}
flags = {{"-p", "--print", "--dangerously-skip-permissions", "--verbose"}}
options, positional, rest = {{}}, [], iter(args)
for arg in rest:
    if arg == "--":
        positional += list(rest)
    elif arg in valued:
        options[arg] = next(rest)
    elif arg in flags:
        options[arg] = True
    elif arg.startswith("-"):
        sys.stderr.write("error: unknown option '" + arg + "'\\n"); sys.exit(1)
    else:
        positional.append(arg)
if options.get("--dangerously-skip-permissions") or options.get("--permission-mode") != "plan":
    sys.stderr.write("permissions bypassed\\n"); sys.exit(4)
if not positional:
    sys.stderr.write("Error: Input must be provided through stdin or as a prompt argument\\n")
    sys.exit(1)
prompt = positional[0]
if prompt == "grandchild":  # leaves a process behind that holds none of its pipes
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with open(os.environ["FAKE_CLAUDE_LOG"] + ".child", "w") as f:
        f.write(str(child.pid))
if prompt == "holder":  # leaves a process behind that holds its stdout and stderr
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
if prompt == "detached-holder":  # the same, in a session of its own: no group kill reaches it
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    with open(os.environ["FAKE_CLAUDE_LOG"] + ".child", "w") as f:
        f.write(str(child.pid))
if prompt == "sleep":
    time.sleep(30)
elif prompt == "fail":
    sys.stderr.write("bad flag\\n"); sys.exit(3)
elif prompt == "is-error":
    print(json.dumps({{"type": "result", "is_error": True, "result": "quota exhausted"}}))
elif prompt == "no-json":
    print("plain text"); sys.stderr.write("warn\\n")
elif prompt == "flood":
    sys.stdout.write("x" * 200000)
else:
    print("progress line")
    text = "  reviewed: " + prompt + "  "
    print(json.dumps({{"type": "result", "is_error": False, "result": text}}))
"""


def _text(result: Any) -> str:
    assert len(result.content) == 1
    text: str = result.content[0].text
    return text


@pytest.fixture
async def llm_url(serve_app: ServeApp) -> str:
    return await serve_app(create_app())


@pytest.fixture
def fake_claude(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "claude"
    script.write_text(FAKE_CLAUDE.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, tmp_path / "claude.log"


async def test_initialize_list_ping(llm_url: str) -> None:
    async with mcp_session(toolbridge_env()) as session:
        await session.send_ping()
        tools = (await session.list_tools()).tools
        assert [t.name for t in tools] == ["chat", "claude_review", "vault_kv"]
        chat = tools[0]
        assert chat.input_schema["required"] == ["prompt"]
        assert chat.input_schema["properties"]["prompt"] == {"type": "string"}
        assert tools[2].input_schema["required"] == ["operation", "path"]


async def test_default_mode_is_toolbridge() -> None:
    """config.md §1: no mode at all runs the toolbridge."""
    async with mcp_session(toolbridge_env(), mode=()) as session:
        assert len((await session.list_tools()).tools) == 3


async def test_chat_against_fake_llm(llm_url: str, http: aiohttp.ClientSession) -> None:
    env = toolbridge_env(LLM_API_KEY="sk-server-key", LLM_BASE_URL=llm_url, LLM_MODEL="m-env")
    async with mcp_session(env) as session:
        # a client cannot redirect the server's key: URL-like arguments are ignored
        args = {"prompt": "hello there", "system": "be brief", "baseUrl": "http://127.0.0.1:9"}
        result = await session.call_tool("chat", {**args, "base_url": "http://127.0.0.1:9"})
        assert result.is_error is not True
        assert _text(result) == "FAKE-LLM says: hello there"
        other = await session.call_tool("chat", {"prompt": "again", "model": "m-arg"})
        assert _text(other) == "FAKE-LLM says: again"
    async with http.get(f"{llm_url}/_requests") as resp:
        seen = orjson.loads(await resp.read())
    assert [r["path"] for r in seen] == ["/v1/chat/completions"] * 2
    assert seen[0]["headers"]["Authorization"] == "Bearer sk-server-key"
    assert seen[0]["body"] == {
        "model": "m-env",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
        ],
        "max_tokens": 4096,
        "stream": False,
    }
    assert seen[1]["body"]["model"] == "m-arg"


async def test_chat_errors(llm_url: str, http: aiohttp.ClientSession) -> None:
    async with mcp_session(toolbridge_env()) as session:
        result = await session.call_tool("chat", {"prompt": "x"})
        assert result.is_error is True
        assert _text(result) == "Error: LLM_API_KEY environment variable not set"
    env = toolbridge_env(LLM_API_KEY="sk-1", LLM_BASE_URL=llm_url)
    script = {"replies": [{"status": 503, "body": " overloaded \n"}, "   "]}
    async with http.post(f"{llm_url}/_script", json=script):
        pass
    async with mcp_session(env) as session:
        missing = await session.call_tool("chat", {"system": "s"})
        assert _text(missing) == "Error: prompt is required"
        failed = await session.call_tool("chat", {"prompt": "p"})
        assert failed.is_error is True
        assert _text(failed) == "Error: api error 503: overloaded"
        empty = await session.call_tool("chat", {"prompt": "p"})
        assert _text(empty) == "Error: empty response content"


async def test_chat_deadline(llm_url: str, tmp_path: Path) -> None:
    config = tmp_path / "tb.yaml"
    config.write_text("toolbridge:\n  chat_timeout: 0.5\n")
    env = toolbridge_env(LLM_API_KEY="sk-1", LLM_BASE_URL=llm_url)
    async with mcp_session(env, "--config", str(config)) as session:
        started = asyncio.get_running_loop().time()
        result = await session.call_tool("chat", {"prompt": "slow:5000 wait"})
        assert asyncio.get_running_loop().time() - started < 4
        assert _text(result) == "Error: llm request timed out after 0.5s"


async def test_unknown_tool_and_bad_params() -> None:
    async with mcp_session(toolbridge_env()) as session:
        with pytest.raises(MCPError) as err:
            await session.call_tool("nope", {})
        assert err.value.error.code == -32601
        assert err.value.error.message == "unknown tool: nope"


async def test_claude_review(fake_claude: tuple[Path, Path]) -> None:
    script, log = fake_claude
    env = toolbridge_env(
        CLAUDE_BIN=str(script),
        CLAUDE_REVIEW_MODEL="opus",
        FAKE_CLAUDE_LOG=str(log),
        LLM_API_KEY="sk-secret",
        LLM_MODEL="m",
        VAULT_SERVER_ROOT_ACCESS_TOKEN="hvs.secret",
    )
    async with mcp_session(env) as session:
        ok = await session.call_tool("claude_review", {"prompt": "diff", "tools": "Read"})
        assert ok.is_error is not True
        assert _text(ok) == "reviewed: diff"
        assert _text(await session.call_tool("claude_review", {"prompt": "is-error"})) == (
            "Error: quota exhausted"
        )
        assert _text(await session.call_tool("claude_review", {"prompt": "fail"})) == (
            "Error: claude review failed: bad flag"
        )
        assert _text(await session.call_tool("claude_review", {"prompt": "no-json"})) == (
            "Error: claude CLI did not return JSON output. stderr: warn"
        )
        assert _text(await session.call_tool("claude_review", {})) == "Error: prompt is required"
    first, child_env = (json.loads(line) for line in log.read_text().splitlines()[:2])
    assert child_env == ["LLM_MODEL"]  # the toolbridge's secrets stay out of the CLI's env
    assert first == [
        "-p",
        "--output-format",
        "json",
        "--permission-mode",
        "plan",
        "--model",
        "opus",
        "--tools",
        "Read",
        "--",
        "diff",
    ]


@pytest.mark.parametrize("prompt", ["--dangerously-skip-permissions", "- [ ] a checklist"])
async def test_claude_review_prompt_starting_with_a_dash_is_only_the_prompt(
    fake_claude: tuple[Path, Path], prompt: str
) -> None:
    """``-p`` takes no value in the real CLI: right after it, a prompt starting with
    ``-`` was parsed as an option (``--dangerously-skip-permissions`` undid
    ``--permission-mode plan``); after ``--`` it reaches the CLI as the prompt."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    async with mcp_session(env) as session:
        result = await session.call_tool("claude_review", {"prompt": prompt, "tools": "Read"})
        assert _text(result) == f"reviewed: {prompt}"
    assert json.loads(log.read_text().splitlines()[0])[-2:] == ["--", prompt]


async def _exited(pid: int, within: float) -> bool:
    """Whether ``pid`` (not our child) exits within ``within`` seconds: its pidfd becomes
    readable when it does (a zombie counts)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone already
    loop = asyncio.get_running_loop()
    exited = loop.create_future()
    loop.add_reader(fd, lambda: exited.done() or exited.set_result(None))
    try:
        await asyncio.wait_for(exited, within)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def test_claude_review_kills_what_the_cli_left_behind(
    fake_claude: tuple[Path, Path],
) -> None:
    """The CLI's process group was killed only on a timeout or an overflow: a process
    the CLI started outlived a call that ended normally."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    child_pid = log.with_name(log.name + ".child")
    async with mcp_session(env) as session:
        result = await session.call_tool("claude_review", {"prompt": "grandchild"})
        assert _text(result) == "reviewed: grandchild"
        pid = int(child_pid.read_text())
        try:  # SIGKILL is sent before the answer; its delivery is asynchronous
            assert await _exited(pid, 5), "the CLI's child outlived the call"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_claude_review_deadline_and_cap(
    fake_claude: tuple[Path, Path], tmp_path: Path
) -> None:
    script, log = fake_claude
    config = tmp_path / "tb.yaml"
    config.write_text("toolbridge:\n  claude_output_max_bytes: 100000\n")
    env = toolbridge_env(
        CLAUDE_BIN=str(script), CLAUDE_REVIEW_TIMEOUT_SEC="1", FAKE_CLAUDE_LOG=str(log)
    )
    async with mcp_session(env, "--config", str(config)) as session:
        started = asyncio.get_running_loop().time()
        slow = await session.call_tool("claude_review", {"prompt": "sleep"})
        assert asyncio.get_running_loop().time() - started < 10
        assert _text(slow) == "Error: claude review timed out after 1s"
        flood = await session.call_tool("claude_review", {"prompt": "flood"})
        assert _text(flood) == "Error: claude review output exceeded 100000 bytes"


async def test_claude_cli_missing() -> None:
    env = toolbridge_env(CLAUDE_BIN="no-such-claude-cli")
    async with mcp_session(env) as session:
        result = await session.call_tool("claude_review", {"prompt": "x"})
        assert result.is_error is True
        assert _text(result) == "Error: claude CLI not found: no-such-claude-cli"


async def test_claude_cli_that_cannot_be_executed(tmp_path: Path) -> None:
    """An executable CLAUDE_BIN the OS cannot run (its interpreter is gone) is a tool
    error naming the failure, not a -32603 internal error with a traceback."""
    script = tmp_path / "claude"
    script.write_text(f"#!{tmp_path}/no-such-interpreter\n")
    script.chmod(0o755)
    async with mcp_session(toolbridge_env(CLAUDE_BIN=str(script))) as session:
        result = await session.call_tool("claude_review", {"prompt": "x"})
        assert result.is_error is True
        assert _text(result).startswith(f"Error: claude review failed: cannot run {script}: ")
        await session.send_ping()


async def test_vault_kv_needs_server_config() -> None:
    async with mcp_session(toolbridge_env()) as session:
        result = await session.call_tool("vault_kv", {"operation": "get", "path": "a"})
        assert _text(result) == "Error: VAULT_SERVER_URL environment variable not set"


# --- raw framing (no MCP client): what the original's clients send ----------------------


async def _raw(
    payload: bytes, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "xwm_bridge",
        "toolbridge",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=env or toolbridge_env(),
        cwd=str(ROOT),
    )
    out, _ = await asyncio.wait_for(proc.communicate(payload), 20)
    assert proc.returncode == 0
    return [orjson.loads(line) for line in out.splitlines()]


async def test_raw_framing_and_errors() -> None:
    body = b'{"jsonrpc":"2.0","id":2,"method":"ping"}'
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05"}}\n',
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
            b'{"jsonrpc":"2.0","method":"no/such/notification"}\n',
            b"Content-Length: %d\r\n\r\n" % len(body) + body,
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":5}}\n',
            b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"chat","arguments":[]}}\n',
            b'{"jsonrpc":"2.0","id":5,"method":"resources/list"}\n',
            b"{broken\n",
            b'{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}\n',
        ]
    )
    replies = {r.get("id"): r for r in await _raw(payload)}
    assert replies[1]["result"] == {
        "protocolVersion": "2024-11-05",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "xworkmate-go-core", "version": "0.2.0"},
    }
    assert replies[2]["result"] == {}
    assert replies[3]["error"] == {
        "code": -32602,
        "message": "invalid tool params: name must be a string, got number",
    }
    assert replies[4]["error"]["code"] == -32602
    assert replies[5]["error"] == {"code": -32601, "message": "unknown method: resources/list"}
    assert replies[None]["error"]["code"] == -32700
    # initialize happens once (MCP lifecycle): a second one is refused, the version kept
    assert replies[6]["error"] == {
        "code": -32600,
        "message": "invalid request: already initialized (protocol version 2024-11-05)",
    }
    assert len(replies) == 7  # notifications got no output at all


async def test_a_content_length_frame_past_the_limit_is_answered_by_its_id(
    tmp_path: Path,
) -> None:
    """It was refused unread with id null: the client waited for ever for its id."""
    (tmp_path / "tb.yaml").write_text("limits: {max_body_bytes: 1024}\n")
    big = b'{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{"p":"'
    big += b"x" * (1024 + (1 << 20)) + b'"}}'
    payload = b"Content-Length: %d\r\n\r\n" % len(big) + big
    payload += b'{"jsonrpc":"2.0","id":10,"method":"ping"}\n'
    replies = await _raw(payload, args=("--config", str(tmp_path / "tb.yaml")))
    assert replies == [
        jsonrpc.error(9, -32700, "message too large: limit is 1024 bytes"),
        {"jsonrpc": "2.0", "id": 10, "result": {}},
    ]


async def test_cancelled_notification_abandons_call(llm_url: str) -> None:
    """A long call does not block ping, and notifications/cancelled drops its response.

    The call would take 30 s: the process ending well before that (its start-up on a
    loaded machine included) shows that it was abandoned, not waited for."""
    env = toolbridge_env(LLM_API_KEY="sk-1", LLM_BASE_URL=llm_url)
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":"slow","method":"tools/call",'
            b'"params":{"name":"chat","arguments":{"prompt":"slow:30000 x"}}}\n',
            b'{"jsonrpc":"2.0","id":"p","method":"ping"}\n',
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow"}}\n',
        ]
    )
    started = asyncio.get_running_loop().time()
    replies = await _raw(payload, env)
    assert [r["id"] for r in replies] == ["p"]
    assert asyncio.get_running_loop().time() - started < 15


async def test_cli_lists_toolbridge_and_rejects_unknown_mode() -> None:
    """`--help` still works; a typo no longer silently starts the toolbridge (weakness 1)."""
    for argv, code, needle in (
        (["--help"], 0, b"toolbridge"),
        (["toolbridge", "--help"], 0, b"MCP"),
        (["tolbridge"], 2, b"No such command"),
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "xwm_bridge",
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=toolbridge_env(),
            cwd=str(ROOT),
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == code, out
        assert needle in out


async def test_claude_review_is_not_held_by_a_process_keeping_its_output_open(
    fake_claude: tuple[Path, Path],
) -> None:
    """A process the CLI left holding its stdout kept the read open: a review that had
    finished waited out the whole timeout and was reported as timed out."""
    script, log = fake_claude
    env = toolbridge_env(
        CLAUDE_BIN=str(script), CLAUDE_REVIEW_TIMEOUT_SEC="20", FAKE_CLAUDE_LOG=str(log)
    )
    async with mcp_session(env) as session:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await session.call_tool("claude_review", {"prompt": "holder"})
        assert _text(result) == "reviewed: holder"
        assert loop.time() - started < 15


async def test_claude_review_is_not_held_by_a_detached_process_keeping_its_output_open(
    fake_claude: tuple[Path, Path],
) -> None:
    """A process the CLI left in a session of its own (out of reach of the group kill)
    holding its stdout and stderr kept the reads open: a review that had finished
    waited out the whole timeout and was reported as timed out, its answer lost."""
    script, log = fake_claude
    env = toolbridge_env(
        CLAUDE_BIN=str(script), CLAUDE_REVIEW_TIMEOUT_SEC="20", FAKE_CLAUDE_LOG=str(log)
    )
    child_pid = log.with_name(log.name + ".child")
    try:
        async with mcp_session(env) as session:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await session.call_tool("claude_review", {"prompt": "detached-holder"})
            assert _text(result) == "reviewed: detached-holder"
            assert loop.time() - started < 15
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.kill(int(child_pid.read_text()), signal.SIGKILL)


async def test_null_id_is_an_invalid_request_answered_and_never_run(
    fake_claude: tuple[Path, Path],
) -> None:
    """MCP: a request id MUST NOT be null. ``"id": null`` was served as a notification:
    the tool ran and nothing was answered, so the client waited forever. It is an
    Invalid Request now, answered ``-32600`` with id null (JSON-RPC 2.0), never run."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":null,"method":"tools/call",'
            b'"params":{"name":"claude_review","arguments":{"prompt":"x"}}}\n',
            b'{"jsonrpc":"2.0","id":null,"method":"notifications/initialized"}\n',
            b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
        ]
    )
    replies = await _raw(payload, env)
    invalid = {"code": -32600, "message": "invalid request: id must not be null"}
    assert replies == [
        {"jsonrpc": "2.0", "id": None, "error": invalid},
        {"jsonrpc": "2.0", "id": None, "error": invalid},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
    ]
    assert not log.exists()  # the CLI was never started


async def test_a_response_from_the_client_is_not_answered() -> None:
    """The toolbridge sends no requests, so a response is to an id it never used: it is
    dropped (as the MCP SDKs drop a response to an unknown id). It was answered
    ``-32700 missing method`` with id null: an error in reply to a reply."""
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":99,"result":{}}\n',
            b'{"jsonrpc":"2.0","id":"s-1","error":{"code":-32601,"message":"no"}}\n',
            b'{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse error"}}\n',
            b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
        ]
    )
    assert await _raw(payload) == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


async def test_a_malformed_request_is_answered_with_its_id() -> None:
    """A request the contract's decoding refuses (``params`` not an object, ``method``
    missing or not a string) was answered with id null although its id was read, so
    the request itself was never answered and its client waited for ever."""
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":2,"method":"tools/list","params":["x"]}\n',
            b'{"jsonrpc":"2.0","id":"q","method":5}\n',
            b'{"jsonrpc":"2.0","id":3}\n',
            b'{"jsonrpc":"2.0","method":"x","params":5}\n',  # no id to answer with
        ]
    )
    replies = await _raw(payload)
    assert replies == [
        jsonrpc.error(2, -32700, "invalid json: params must be an object, got array"),
        jsonrpc.error("q", -32700, "invalid json: method must be a string, got number"),
        jsonrpc.error(3, -32700, "missing method"),
        jsonrpc.error(None, -32700, "invalid json: params must be an object, got number"),
    ]


async def test_an_id_neither_string_nor_number_is_answered_and_never_run(
    fake_claude: tuple[Path, Path],
) -> None:
    """JSON-RPC 2.0 ids are strings, numbers or null (MCP: a string or an integer). A
    boolean or object id was served: the tool ran (and no ``notifications/cancelled``
    could name it) and the answer echoed the id. It is ``-32600`` with id null now."""
    script, log = fake_claude
    env = toolbridge_env(CLAUDE_BIN=str(script), FAKE_CLAUDE_LOG=str(log))
    call = b'"method":"tools/call","params":{"name":"claude_review","arguments":{"prompt":"x"}}}\n'
    payload = b"".join(
        [
            b'{"jsonrpc":"2.0","id":true,' + call,
            b'{"jsonrpc":"2.0","id":{"n":1},' + call,
            b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n',
        ]
    )
    invalid = jsonrpc.error(None, -32600, "invalid request: id must be a string or a number")
    assert await _raw(payload, env) == [invalid, invalid, jsonrpc.result(1, {})]
    assert not log.exists()  # the CLI was never started
