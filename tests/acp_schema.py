"""Every frame the bridge sends an ACP client, checked against the official schema
models of ``agent-client-protocol`` — strictly.

The SDK's models are lenient (unknown keys are ignored, a bad optional field is
"salvaged" to its default), so a frame passes only when it validates *and* dumps
back to exactly what was sent: an unknown or malformed field fails the check.
"""

from __future__ import annotations

from typing import Any

from acp import schema
from acp.connection import StreamDirection, StreamEvent
from pydantic import BaseModel

RESPONSES: dict[str, type[BaseModel]] = {
    "initialize": schema.InitializeResponse,
    "authenticate": schema.AuthenticateResponse,
    "session/new": schema.NewSessionResponse,
    "session/load": schema.LoadSessionResponse,
    "session/resume": schema.ResumeSessionResponse,
    "session/list": schema.ListSessionsResponse,
    "session/close": schema.CloseSessionResponse,
    "session/prompt": schema.PromptResponse,
    "session/set_mode": schema.SetSessionModeResponse,
    "session/set_config_option": schema.SetSessionConfigOptionResponse,
}
REQUESTS: dict[str, type[BaseModel]] = {
    "session/request_permission": schema.RequestPermissionRequest,
    "fs/read_text_file": schema.ReadTextFileRequest,
    "fs/write_text_file": schema.WriteTextFileRequest,
    "terminal/create": schema.CreateTerminalRequest,
    "terminal/output": schema.TerminalOutputRequest,
    "terminal/wait_for_exit": schema.WaitForTerminalExitRequest,
    "terminal/kill": schema.KillTerminalRequest,
    "terminal/release": schema.ReleaseTerminalRequest,
}
NOTIFICATIONS: dict[str, type[BaseModel]] = {
    "session/update": schema.SessionNotification,
    "$/cancel_request": schema.CancelRequestNotification,
}


def strict(model: type[BaseModel], value: Any) -> None:
    """``value`` is a valid ``model`` and nothing in it was dropped or replaced."""
    parsed = model.model_validate(value)
    back = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert back == value, f"{model.__name__}: sent {value!r}\n  schema reads {back!r}"


def check_error(error: Any) -> None:
    assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}, error
    assert isinstance(error["code"], int) and isinstance(error["message"], str), error


class FrameChecker:
    """An SDK stream observer: validates each incoming frame, remembers them all."""

    def __init__(self) -> None:
        self.sent: dict[Any, str] = {}  # our request ids → method
        #: our answers to the bridge's requests, by the bridge's request id
        self.answered: dict[Any, dict[str, Any]] = {}
        self.frames: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def __call__(self, event: StreamEvent) -> None:
        message = event.message
        if event.direction is StreamDirection.OUTGOING:
            if "method" in message and "id" in message:
                self.sent[message["id"]] = message["method"]
            elif "method" not in message and "id" in message:
                self.answered[message["id"]] = message
            return
        self.frames.append(message)
        try:
            self.check(message)
        except AssertionError as exc:
            self.errors.append(str(exc))

    def check(self, message: dict[str, Any]) -> None:
        assert message.get("jsonrpc") == "2.0", message
        method = message.get("method")
        if method is None:
            assert set(message) <= {"jsonrpc", "id", "result", "error"}, message
            if "error" in message:
                check_error(message["error"])
                return
            asked = self.sent.get(message.get("id"))
            assert asked in RESPONSES, f"response to an unknown request: {message}"
            strict(RESPONSES[asked], message["result"])
        elif "id" in message:
            assert method in REQUESTS, f"unexpected request from the bridge: {message}"
            strict(REQUESTS[method], message["params"])
        else:
            assert method in NOTIFICATIONS, f"unexpected notification: {message}"
            strict(NOTIFICATIONS[method], message["params"])

    def updates(self, kind: str | None = None) -> list[dict[str, Any]]:
        out = [f["params"]["update"] for f in self.frames if f.get("method") == "session/update"]
        return [u for u in out if kind is None or u.get("sessionUpdate") == kind]

    def requests(self, method: str) -> list[dict[str, Any]]:
        """The bridge's requests (or notifications) of ``method``, in order."""
        return [f for f in self.frames if f.get("method") == method]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(u["content"].get("text", "") for u in self.updates(kind))

    def assert_clean(self) -> None:
        assert self.frames, "no frame was seen"
        assert not self.errors, "\n".join(self.errors)
