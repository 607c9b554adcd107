"""The official ACP SDK's client, driving the bridge's ACP front door in tests.

:class:`RecordingClient` is an SDK ``Client``: it records every update, answers
permission requests by option kind (or ``cancelled``), and serves ``fs/*`` from
a dict when told to. Every frame the bridge sends is checked strictly against
the schema by a :class:`~tests.acp_schema.FrameChecker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from acp import RequestError, spawn_agent_process, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    CreateTerminalResponse,
    DeniedOutcome,
    FileSystemCapabilities,
    InitializeResponse,
    ReadTextFileResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
    WriteTextFileResponse,
)

from tests.acp_schema import FrameChecker
from tests.conftest import ROOT, base_env


@dataclass
class RecordingClient:
    """An ACP client: records updates, answers permissions, serves files on request."""

    #: the option kind to pick, "cancelled", "unknown" (an option id not offered) or
    #: "error" (a JSON-RPC error answer)
    permission: str = "allow_once"
    files: dict[str, str] = field(default_factory=dict)
    written: list[tuple[str, str]] = field(default_factory=list)
    asked: list[Any] = field(default_factory=list)
    updates: list[Any] = field(default_factory=list)
    permission_asked: asyncio.Event = field(default_factory=asyncio.Event)
    hold_permission: bool = False
    #: ``write_text_file`` waits until the SDK cancels it (a cancel test)
    hold_write: bool = False
    write_asked: asyncio.Event = field(default_factory=asyncio.Event)
    terminals: list[tuple[str, str, list[str]]] = field(default_factory=list)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call, options))
        self.permission_asked.set()
        if self.hold_permission:
            await asyncio.Event().wait()  # until the SDK cancels it
        if self.permission == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if self.permission == "error":
            raise RequestError(-32603, "the permission dialog failed")
        if self.permission == "unknown":
            return RequestPermissionResponse(
                outcome=AllowedOutcome(outcome="selected", option_id="not-offered")
            )
        option = next(o for o in options if o.kind == self.permission)
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=option.option_id)
        )

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        self.write_asked.set()
        if self.hold_write:
            await asyncio.Event().wait()
        self.written.append((path, content))
        self.files[path] = content
        return WriteTextFileResponse()

    async def create_terminal(
        self, session_id: str, command: str, args: list[str] | None = None, **kwargs: Any
    ) -> CreateTerminalResponse:
        tid = f"editor-term-{len(self.terminals) + 1}"
        self.terminals.append((tid, command, list(args or [])))
        return CreateTerminalResponse(terminal_id=tid)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> WaitForTerminalExitResponse:
        return WaitForTerminalExitResponse(exit_code=0)

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> TerminalOutputResponse:
        _, command, args = next(t for t in self.terminals if t[0] == terminal_id)
        return TerminalOutputResponse(
            output=f"editor ran {command} {' '.join(args)}", truncated=False
        )

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> ReleaseTerminalResponse:
        return ReleaseTerminalResponse()

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        if path not in self.files:
            raise RequestError(-32002, "Resource not found")
        return ReadTextFileResponse(content=self.files[path])

    def on_connect(self, conn: Any) -> None:
        return None


def caps(*, fs: bool = False, terminal: bool = False) -> ClientCapabilities:
    return ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=fs, write_text_file=fs), terminal=terminal
    )


def prompt(text: str) -> list[Any]:
    return [text_block(text)]


@dataclass
class AcpProcess:
    conn: ClientSideConnection
    client: RecordingClient
    checker: FrameChecker
    proc: asyncio.subprocess.Process
    #: the bridge's ``initialize`` answer
    init: InitializeResponse


def write_config(tmp: Path, config: dict[str, Any], name: str = "acp.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.asynccontextmanager
async def spawn_acp(
    tmp: Path,
    config: dict[str, Any],
    *,
    client: RecordingClient | None = None,
    state_dir: Path | None = None,
    env: dict[str, str] | None = None,
    capabilities: ClientCapabilities | None = None,
) -> AsyncIterator[AcpProcess]:
    """``xwm-bridge acp`` as a child process, initialized by the SDK's client."""
    path = write_config(tmp, config)
    env = env or base_env()
    if state_dir is not None:
        env["XWM_STATE_DIR"] = str(state_dir)
    client = client or RecordingClient()
    checker = FrameChecker()
    async with spawn_agent_process(
        client,
        sys.executable,
        "-m",
        "xwm_bridge",
        "acp",
        "--config",
        str(path),
        env=env,
        cwd=str(ROOT),
        observers=[checker],
    ) as (conn, proc):
        init = await asyncio.wait_for(
            conn.initialize(protocol_version=1, client_capabilities=capabilities or caps()), 30
        )
        assert init.protocol_version == 1
        yield AcpProcess(conn, client, checker, proc, init)
    checker.assert_clean()
