"""Sans-I/O OpenClaw gateway protocol (gateway.md §3-§6, §8.3).

Pure functions and one small handshake state machine: frame encode/decode,
``connect`` params with the Ed25519 device signature, protocol negotiation
(we advertise 3..4 and read the version the gateway chose from ``hello-ok``),
error classification, ``chat.run`` normalization and the reconnect backoff.
Nothing here touches a socket or a clock it was not handed.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from xwm_bridge import coerce, jsonrpc
from xwm_bridge.gateway.errors import (
    EXTRA_FATAL,
    FATAL_CODES,
    FATAL_DETAIL_CODES,
    GatewayError,
    error_from_frame,
    is_fatal,
)
from xwm_bridge.gateway.signing import (
    DEFAULT_CLIENT_ID,
    MAX_PROTOCOL,
    MIN_PROTOCOL,
    ROLE,
    ClientInfo,
    Credentials,
    Identity,
    connect_params,
)

#: re-exported: callers need only this module for the protocol
__all__ = [
    "DEFAULT_CLIENT_ID",
    "MAX_PROTOCOL",
    "MIN_PROTOCOL",
    "ClientInfo",
    "Credentials",
    "GatewayError",
    "Identity",
    "connect_params",
    "error_from_frame",
    "is_fatal",
]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --- frames ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EventFrame:
    event: str
    payload: dict[str, Any]
    seq: int


@dataclass(frozen=True, slots=True)
class ResponseFrame:
    id: str
    ok: bool
    payload: Any
    error: dict[str, Any]


Frame = EventFrame | ResponseFrame


#: a ``seq`` must fit the 64 bits orjson writes: past them the push could not be encoded
#: (the wire encoder would drop it) and a huge last seq would hide every later gap
_SEQ_MIN, _SEQ_MAX = -(2**63), 2**63 - 1


def sequence(value: Any) -> int:
    """Frame ``seq`` as an int: numbers truncated, numeric strings parsed (ASCII only:
    ``int()`` also reads "١٢"), else 0 (also for anything outside the signed 64-bit
    range)."""
    if isinstance(value, bool):
        return 0
    out = 0
    if isinstance(value, int):
        out = value
    elif isinstance(value, float):
        out = int(value) if value == value and abs(value) < 2**63 else 0
    elif isinstance(value, str) and value.isascii() and value.strip():
        text = value.strip()
        try:
            out = int(text) if len(text) <= 24 else 0
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                return 0
            out = int(number) if number == number and abs(number) < 2**63 else 0
    return out if _SEQ_MIN <= out <= _SEQ_MAX else 0


#: a frame's payload gets the bridge-wide cap; the frame itself is one level more
_FRAME_DEPTH = jsonrpc.MAX_DEPTH + 1
TOO_DEEP = {
    "code": "INVALID_RESPONSE",
    "message": f"gateway response nested deeper than {jsonrpc.MAX_DEPTH} levels",
}


def decode_frame(data: str | bytes) -> Frame | None:
    """One incoming message → a frame, or None for anything we ignore (§5.2).

    A frame nested past the cap is never passed on: a response becomes a failed
    one (its caller gets an error at once), an event is ignored."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    kind = obj.get("type")
    kind = kind.strip() if isinstance(kind, str) else ""
    if jsonrpc.may_nest(data, _FRAME_DEPTH) and jsonrpc.nesting_exceeds(obj, _FRAME_DEPTH):
        if kind != "res":
            return None
        return ResponseFrame(id=coerce.text(obj.get("id")), ok=False, payload=None, error=TOO_DEEP)
    if kind == "event":
        payload = obj.get("payload")
        return EventFrame(
            event=coerce.text(obj.get("event")),
            payload=payload if isinstance(payload, dict) else {},
            seq=sequence(obj.get("seq")),
        )
    if kind == "res":
        error = obj.get("error")
        return ResponseFrame(
            id=coerce.text(obj.get("id")),
            ok=coerce.frame_bool(obj.get("ok")),
            payload=obj.get("payload"),
            error=error if isinstance(error, dict) else {},
        )
    return None


#: why :func:`decode_frame` gave None, or a response nobody waits for (runtime counters)
IGNORED_REASONS = ("invalid_json", "not_a_frame", "unknown_response")


def ignored_reason(data: str | bytes) -> str:
    """Why :func:`decode_frame` ignored ``data``: not JSON, or JSON but no frame we
    read (not an object, a ``type`` other than ``event``/``res``, nested too deep)."""
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return "invalid_json"
    return "not_a_frame"


def encode_request(request_id: str, method: str, params: dict[str, Any] | None) -> bytes:
    frame: dict[str, Any] = {"type": "req", "id": request_id, "method": method}
    if params:
        frame["params"] = params
    return orjson.dumps(frame)


class RequestIds:
    """``<unix µs>-<counter>`` ids (§5.1); the clock is injected."""

    def __init__(self, clock_us: Callable[[], int]) -> None:
        self._clock_us = clock_us
        self._counter = 0

    def next(self) -> str:
        out = f"{self._clock_us()}-{self._counter}"
        self._counter += 1
        return out


# --- handshake state machine -------------------------------------------------------------


class HandshakeState(enum.Enum):
    AWAIT_CHALLENGE = "await-challenge"
    AWAIT_HELLO = "await-hello"
    CONNECTED = "connected"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Hello:
    """What we keep from ``hello-ok`` (§3.4)."""

    protocol: int
    device_token: str = field(repr=False)
    role: str
    scopes: list[str]
    server_name: str
    main_session_key: str
    tick_interval_ms: int
    #: the gateway's ``auth`` (its ``deviceToken`` too): never in a repr
    auth: dict[str, Any] = field(repr=False)
    payload: dict[str, Any] = field(repr=False, default_factory=dict)


def parse_hello(payload: Any) -> Hello:
    p = payload if isinstance(payload, dict) else {}
    auth = _dict(p.get("auth"))
    server = _dict(p.get("server"))
    snap = _dict(p.get("snapshot"))
    defaults = _dict(snap.get("sessionDefaults"))
    policy = _dict(p.get("policy"))
    protocol = coerce.positive_int(p.get("protocol"), MIN_PROTOCOL)
    if not MIN_PROTOCOL <= protocol <= MAX_PROTOCOL:
        raise GatewayError(f"gateway chose unsupported protocol {protocol}", "PROTOCOL_MISMATCH")
    return Hello(
        protocol=protocol,
        device_token=coerce.text(auth.get("deviceToken")),
        role=coerce.text(auth.get("role"), ROLE),
        scopes=coerce.string_list(auth.get("scopes")) or [],
        server_name=coerce.text(server.get("host")),
        main_session_key=coerce.text(defaults.get("mainSessionKey"), "main"),
        tick_interval_ms=coerce.positive_int(policy.get("tickIntervalMs"), 30_000),
        auth=dict(auth),
        payload=p,
    )


class Handshake:
    """challenge → connect → hello-ok. Feed it frames; it says what to send.

    ``on_frame`` returns the ``connect`` request bytes once the challenge
    arrives, ``None`` otherwise; after it the state is CONNECTED (``hello``
    set) or FAILED (``error`` set).
    """

    def __init__(
        self,
        client: ClientInfo,
        identity: Identity,
        creds: Credentials,
        *,
        request_id: str,
        clock_ms: Callable[[], int],
    ) -> None:
        self.client = client
        self.identity = identity
        self.creds = creds
        self.request_id = request_id
        self._clock_ms = clock_ms
        self.state = HandshakeState.AWAIT_CHALLENGE
        self.nonce = ""
        self.hello: Hello | None = None
        self.error: GatewayError | None = None

    def _fail(self, error: GatewayError) -> None:
        self.state = HandshakeState.FAILED
        self.error = error

    def on_frame(self, frame: Frame) -> bytes | None:
        if self.state is HandshakeState.AWAIT_CHALLENGE:
            if isinstance(frame, EventFrame) and frame.event == "connect.challenge":
                self.nonce = coerce.text(frame.payload.get("nonce"))
                try:
                    params = connect_params(
                        self.client,
                        self.identity,
                        self.creds,
                        nonce=self.nonce,
                        signed_at_ms=self._clock_ms(),
                    )
                except GatewayError as exc:
                    self._fail(exc)
                    return None
                except ValueError as exc:
                    self._fail(GatewayError(str(exc), "DEVICE_IDENTITY_SIGN_FAILED"))
                    return None
                self.state = HandshakeState.AWAIT_HELLO
                return encode_request(self.request_id, "connect", params)
            return None
        if (
            self.state is HandshakeState.AWAIT_HELLO
            and isinstance(frame, ResponseFrame)
            and frame.id == self.request_id
        ):
            if not frame.ok:
                self._fail(error_from_frame(frame.error))
                return None
            try:
                self.hello = parse_hello(frame.payload)
            except GatewayError as exc:
                self._fail(exc)
                return None
            self.state = HandshakeState.CONNECTED
        return None

    def on_timeout(self) -> None:
        if self.state is HandshakeState.AWAIT_CHALLENGE:
            self._fail(GatewayError("connect challenge timeout", "CONNECT_CHALLENGE_TIMEOUT"))
        elif self.state is HandshakeState.AWAIT_HELLO:
            self._fail(GatewayError("connect request timeout", "RPC_TIMEOUT"))

    def on_close(self, code: int | None, reason: str) -> None:
        """The socket closed before hello-ok; OpenClaw puts the error code in the reason."""
        if self.state in (HandshakeState.CONNECTED, HandshakeState.FAILED):
            return
        self._fail(close_error(code, reason))


def close_error(code: int | None, reason: str) -> GatewayError:
    text = reason.strip()
    for candidate in FATAL_DETAIL_CODES | FATAL_CODES | EXTRA_FATAL:
        if candidate in text.upper():
            return GatewayError(text or "socket closed", candidate)
    return GatewayError(text or "socket closed", "SOCKET_CLOSED")


# --- chat.run normalization (§6.1) -------------------------------------------------------


def extract_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content.strip()
    parts: list[str] = []
    if isinstance(content, list):
        for item in content:
            if not isinstance(item, dict):
                continue
            part = coerce.text(item.get("text")) or coerce.text(item.get("thinking"))
            if not part and isinstance(item.get("content"), str):
                part = item["content"].strip()
            if part:
                parts.append(part)
    return "\n".join(parts).strip()


def normalize_run(event: EventFrame) -> dict[str, Any] | None:
    p = event.payload
    if event.event == "chat":
        run_id, state = coerce.text(p.get("runId")), coerce.text(p.get("state"))
        if not run_id and not state:
            return None
        out: dict[str, Any] = {
            "runId": run_id,
            "sessionKey": coerce.text(p.get("sessionKey")),
            "state": state,
            "source": "chat",
            "terminal": state in ("final", "aborted", "error"),
        }
        message = p.get("message")
        if isinstance(message, dict) and coerce.text(message.get("role")).lower() == "assistant":
            text = extract_text(message)
            if text:
                out["assistantText"] = text
        error = coerce.text(p.get("errorMessage"))
        if error:
            out["errorMessage"] = error
        return out
    if event.event == "agent":
        run_id, stream = coerce.text(p.get("runId")), coerce.text(p.get("stream"))
        if not run_id or stream.lower() != "assistant":
            return None
        data = _dict(p.get("data"))
        text = coerce.text(data.get("text")) or extract_text(data)
        if not text:
            return None
        return {
            "runId": run_id,
            "sessionKey": coerce.text(p.get("sessionKey")) or coerce.text(data.get("sessionKey")),
            "state": "delta",
            "source": "agent",
            "stream": stream,
            "assistantText": text,
            "terminal": False,
        }
    return None


def event_keys(event: EventFrame) -> tuple[str, str]:
    """(sessionKey, runId) of an event, for demultiplexing broadcasts."""
    p = event.payload
    data = _dict(p.get("data"))
    session_key = coerce.text(p.get("sessionKey")) or coerce.text(data.get("sessionKey"))
    return session_key, coerce.text(p.get("runId"))


# --- reconnect backoff -------------------------------------------------------------------


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter: 1 s → 30 s cap; reset by a client connect and by
    a socket that stayed up for the cap (not by every hello-ok)."""

    initial: float = 1.0
    maximum: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt = min(self.attempt + 1, 32)
        # jitter in [ceiling/2, ceiling]: spreads a fleet without collapsing to 0
        return float(ceiling / 2 + self.rng.random() * ceiling / 2)

    def reset(self) -> None:
        self.attempt = 0
