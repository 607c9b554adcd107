"""``acp-stdio``: the bridge contract on stdin/stdout (contract.md §14; examples.md §18).

Fixed behaviour (ARCHITECTURE.md §2): requests run concurrently, so a
``session.cancel`` on stdin overtakes the running turn and reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import ROOT, FakeUpstream, provider_env, session_params, wait_until

EXAMPLE_18 = (
    b"Content-Length: 52\r\n"
    b"\r\n"
    b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}'
    b'{"jsonrpc":"2.0","id":2,"method":"session.close","params":{"sessionId":"nope"}}\n'
)

#: a loaded CI machine can take several seconds to import and start the daemon
STARTUP_S = 45.0


@dataclass
class StdioBridge:
    proc: asyncio.subprocess.Process
    stderr: list[str] = field(default_factory=list)
    raw_lines: list[bytes] = field(default_factory=list)
    _drain: asyncio.Task[None] | None = None

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def send_json(self, body: dict[str, Any]) -> None:
        await self.send(orjson.dumps(body) + b"\n")

    async def message(self, wait_s: float = 10) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not self.raw_lines:  # the first answer also waits for the interpreter to start
            wait_s = max(wait_s, STARTUP_S)
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), wait_s)
        except TimeoutError:
            raise AssertionError(f"no answer in {wait_s:.1f} s; stderr: {self.stderr}") from None
        assert line.endswith(b"\n"), f"stdout ended: {line!r}; stderr: {self.stderr}"
        self.raw_lines.append(line)
        decoded: dict[str, Any] = orjson.loads(line)
        assert orjson.dumps(decoded) + b"\n" == line, f"not one compact JSON line: {line!r}"
        return decoded

    async def until_id(self, rid: Any, wait_s: float = 10) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + wait_s + (0 if self.raw_lines else STARTUP_S)
        while True:
            msg = await self.message(max(0.1, deadline - time.monotonic()))
            out.append(msg)
            if "method" not in msg and msg.get("id") == rid:
                return out

    async def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.proc.stdin.wait_closed()

    async def finish(self, wait_s: float = 15) -> tuple[bytes, int]:
        """Close stdin, read stdout to its end, return (remaining stdout, exit code)."""
        await self.close_stdin()
        assert self.proc.stdout is not None
        rest = await asyncio.wait_for(self.proc.stdout.read(), wait_s)
        code = await asyncio.wait_for(self.proc.wait(), wait_s)
        if self._drain is not None:
            await asyncio.wait_for(self._drain, wait_s)
        return rest, code


StartStdio = Callable[..., Awaitable[StdioBridge]]


async def _drain(bridge: StdioBridge) -> None:
    assert bridge.proc.stderr is not None
    while line := await bridge.proc.stderr.readline():
        bridge.stderr.append(line.decode(errors="replace").rstrip("\n"))


@pytest.fixture
async def start_stdio() -> AsyncIterator[StartStdio]:
    started: list[StdioBridge] = []

    async def start(env: dict[str, str], *args: str) -> StdioBridge:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "xwm_bridge",
            "acp-stdio",
            *args,
            env=env,
            cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        bridge = StdioBridge(proc)
        bridge._drain = asyncio.get_running_loop().create_task(_drain(bridge))
        started.append(bridge)
        return bridge

    yield start
    for bridge in started:
        if bridge.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                bridge.proc.kill()
            await bridge.proc.wait()
        if bridge._drain is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(bridge._drain, 5)


def req(method: str, params: dict[str, Any] | None = None, rid: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if rid is not None:
        body["id"] = rid
    if params is not None:
        body["params"] = params
    return body


async def test_example_18_content_length_then_newline_message(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send(EXAMPLE_18)
    replies = {m["id"]: m for m in [await bridge.message(), await bridge.message()]}
    assert set(replies) == {1, 2}
    caps = replies[1]
    assert set(caps) == {"jsonrpc", "id", "result"}
    assert set(caps["result"]) == {
        "capabilities",
        "gatewayProviders",
        "localAgents",
        "multiAgent",
        "operator",  # additive (issue 13)
        "providerCatalog",
        "singleAgent",
    }
    assert caps["result"]["singleAgent"] is True
    assert replies[2] == {"jsonrpc": "2.0", "id": 2, "result": {"accepted": True, "closed": False}}
    rest, code = await bridge.finish()
    assert (rest, code) == (b"", 0)


async def test_content_length_variants(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    body = b'{"jsonrpc":"2.0","id":7,"method":"session.cancel","params":{"sessionId":"z"}}'
    # lower-case header plus an extra header that is read and discarded
    await bridge.send(b"content-length: %d\nContent-Type: application/json\n\n" % len(body) + body)
    assert await bridge.message() == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"accepted": True, "cancelled": False},
    }


async def test_bad_content_length_capitalization_is_parse_error(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send(
        b'CONTENT-LENGTH: 52\r\n\r\n{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}\n'
    )
    error = await bridge.message()
    assert bridge.raw_lines[-1] == (
        b'{"jsonrpc":"2.0","id":null,"error":'
        b'{"code":-32700,"message":"invalid content-length header"}}\n'
    )
    assert error["id"] is None
    # reading continues: the blank line is skipped, the body line is a message of its own
    follow = await bridge.message()
    assert follow["id"] == 1 and follow["result"]["singleAgent"] is True


async def test_invalid_json_line_is_parse_error_and_reading_continues(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send(b"this is not json\n\n   \n")
    error = await bridge.message()
    assert set(error) == {"jsonrpc", "id", "error"}
    assert error["id"] is None
    assert error["error"]["code"] == -32700
    assert error["error"]["message"].startswith("invalid json: ")
    await bridge.send(b'{"jsonrpc":"2.0","id":3}\n')
    assert await bridge.message() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "missing method"},
    }
    await bridge.send_json(req("xworkmate.providers.sync", rid=4))
    assert await bridge.message() == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {"code": -32601, "message": "unknown method: xworkmate.providers.sync"},
    }
    await bridge.send_json(req("acp.capabilities", rid=5))
    assert (await bridge.message())["id"] == 5


async def test_turn_notifications_are_written_as_lines(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send_json(req("session.start", session_params("io-1", "hey"), rid="t1"))
    messages = await bridge.until_id("t1")
    started = messages[0]
    assert started["method"] == "session.update"
    assert started["params"] == {
        "sessionId": "io-1",
        "threadId": "io-1",
        "turnId": started["params"]["turnId"],
        "seq": 1,
        "type": "status",
        "event": "started",
        "message": "session started",
        "pending": True,
        "error": False,
    }
    relayed = messages[1:-1]
    assert relayed and all(m["method"] == "session.update" for m in relayed)
    assert "".join(m["params"]["delta"] for m in relayed) == "echo: hey"
    assert messages[-1]["result"]["success"] is True
    # acp-stdio does no auth pass-through
    forwarded = fake_upstream.state.requests[0]["params"]
    assert "bridgeAuthorizationHeader" not in forwarded


async def test_cancel_on_stdin_overtakes_running_turn(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    # the upstream would answer 10 s after the turn reached it; the cancel ends it long
    # before (timed from the cancel, so a slow start on a loaded machine does not count)
    await bridge.send_json(req("session.start", session_params("s1", "slow:10000 hi"), rid="t1"))
    started = await bridge.message()
    assert started["params"]["event"] == "started"
    await wait_until(lambda: "s1" in fake_upstream.state.active)
    began = time.monotonic()
    await bridge.send_json(req("session.cancel", {"sessionId": "s1"}, rid="x1"))
    messages = await bridge.until_id("t1")
    elapsed = time.monotonic() - began

    responses = [m for m in messages if "method" not in m]
    assert [r["id"] for r in responses] == ["x1", "t1"]
    assert responses[0]["result"] == {"accepted": True, "cancelled": True}
    assert responses[1]["result"]["success"] is False
    assert elapsed < 5, f"turn was not interrupted ({elapsed:.2f}s after the cancel)"
    assert [c["sessionId"] for c in fake_upstream.state.cancels] == ["s1"]
    assert fake_upstream.state.completed == 0


async def test_closing_stdin_still_delivers_pending_response(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send_json(req("session.start", session_params("eof", "slow:300 bye"), rid="t9"))
    rest, code = await bridge.finish()
    assert code == 0, bridge.stderr
    lines = [orjson.loads(line) for line in rest.splitlines()]
    final = [m for m in lines if m.get("id") == "t9"]
    assert len(final) == 1
    assert final[0]["result"]["output"] == "echo: bye"
    assert lines[-1] is final[0]


async def test_unterminated_last_line_is_discarded(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send(b'{"jsonrpc":"2.0","id":1,"method":"acp.capabilities"}')
    rest, code = await bridge.finish()
    assert (rest, code) == (b"", 0)


async def test_stdout_carries_only_json_rpc_lines(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    env = provider_env(fake_upstream.url, XWM_LOG_LEVEL="debug")
    bridge = await start_stdio(env)
    await bridge.send(b"garbage\n")
    await bridge.send_json(req("acp.capabilities", rid=1))
    await bridge.send_json(req("session.start", session_params("log", "x"), rid=2))
    await bridge.send_json(req("session.close", {"sessionId": "log"}))
    rest, code = await bridge.finish()
    assert code == 0
    lines = rest.split(b"\n")
    assert lines[-1] == b""
    decoded = [orjson.loads(line) for line in lines[:-1]]
    assert all(m["jsonrpc"] == "2.0" for m in decoded)
    assert {m.get("id") for m in decoded if "method" not in m} == {None, 1, 2}
    # the logs went to stderr, as JSON lines
    assert bridge.stderr, "expected debug logs on stderr"
    for line in bridge.stderr:
        entry = orjson.loads(line)
        assert "msg" in entry and "level" in entry


async def test_truncated_content_length_body_at_eof_is_parse_error(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send(b'Content-Length: 100\r\n\r\n{"jsonrpc":"2.0"')
    rest, code = await bridge.finish()
    assert code == 0
    lines = rest.splitlines()
    assert len(lines) == 1, rest
    error = orjson.loads(lines[0])
    assert error["id"] is None and error["error"]["code"] == -32700


async def test_oversized_message_is_parse_error_and_reading_continues(
    start_stdio: StartStdio, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    config = tmp_path / "stdio.yaml"
    config.write_text("limits: {max_body_bytes: 1024}\n")
    bridge = await start_stdio(provider_env(fake_upstream.url), "--config", str(config))
    big = orjson.dumps(req("acp.capabilities", {"pad": "x" * 4096}, rid=1))
    await bridge.send(big + b"\n")
    error = await bridge.message()  # answered by the id its first bytes hold
    assert error["id"] == 1 and error["error"] == {
        "code": -32700,
        "message": "message too large: limit is 1024 bytes",
    }
    framed = b"Content-Length: %d\r\n\r\n" % len(big) + big
    await bridge.send(framed)
    error = await bridge.message()  # a Content-Length body too: by its first bytes
    assert error["id"] == 1 and error["error"]["code"] == -32700
    await bridge.send_json(req("acp.capabilities", rid=2))
    reply = await bridge.message()
    assert reply["id"] == 2 and reply["result"]["singleAgent"] is True


async def test_a_content_length_frame_far_past_the_limit_is_answered_by_its_id(
    start_stdio: StartStdio, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """It was refused unread with id null: the client waited for ever for its id."""
    config = tmp_path / "stdio.yaml"
    config.write_text("limits: {max_body_bytes: 1024}\n")
    bridge = await start_stdio(provider_env(fake_upstream.url), "--config", str(config))
    big = orjson.dumps(req("acp.capabilities", {"pad": "x" * (1024 + (1 << 20))}, rid="big"))
    await bridge.send(b"Content-Length: %d\r\n\r\n" % len(big) + big)
    await bridge.send_json(req("acp.capabilities", rid=2))  # the next frame, in step
    error = await bridge.message()
    assert error == {
        "jsonrpc": "2.0",
        "id": "big",
        "error": {"code": -32700, "message": "message too large: limit is 1024 bytes"},
    }
    reply = await bridge.message()
    assert reply["id"] == 2 and reply["result"]["singleAgent"] is True


async def test_second_signal_forces_the_exit_of_acp_stdio(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    """Issue 15 item 5: SIGTERM starts the drain (the log says another signal forces
    the exit); a second one cancels the running turn now; the default grace is 20 s."""
    import signal

    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send_json(req("session.start", session_params("sig", "slow:60000 hi"), rid="t"))
    await bridge.message()  # started
    await wait_until(lambda: "sig" in fake_upstream.state.active)
    bridge.proc.send_signal(signal.SIGTERM)
    await wait_until(lambda: any('"msg":"shutting down"' in line for line in bridge.stderr), 10)
    began = time.monotonic()
    bridge.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(bridge.proc.wait(), 15) == 1
    assert time.monotonic() - began < 12
    assert any("second signal: forcing the exit" in line for line in bridge.stderr)


async def test_sigterm_lets_a_running_turn_finish_and_answers_it(
    start_stdio: StartStdio, fake_upstream: FakeUpstream
) -> None:
    """SIGTERM drains: a turn that ends within the grace is answered on stdout before
    the process exits 0 (its request was cancelled with the server, and the answer
    of the turn the drain let finish was lost)."""
    import signal

    bridge = await start_stdio(provider_env(fake_upstream.url))
    await bridge.send_json(req("session.start", session_params("sig2", "slow:1500 hi"), rid="t"))
    await bridge.message()  # started
    await wait_until(lambda: "sig2" in fake_upstream.state.active)
    bridge.proc.send_signal(signal.SIGTERM)
    while True:
        msg = await asyncio.wait_for(bridge.message(), 20)
        if msg.get("id") == "t":
            break
    assert msg["result"]["success"] is True, msg
    assert await asyncio.wait_for(bridge.proc.wait(), 30) == 0
