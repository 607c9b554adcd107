"""A hypothesis fuzz of every decoder, sans I/O (issue 16): HTTP bodies and WebSocket
messages (jsonrpc), stdio framing, the toolbridge, gateway frames, upstream replies
(plain JSON, SSE, WebSocket) and agent lines. Nesting goes past orjson's limits and sizes
up to the caps. Each input is refused with an error or decoded, and whatever the bridge
would send on from it can be encoded (the writer never fails)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_inputs import deep, request_text
from xwm_bridge import jsonrpc
from xwm_bridge.acp import codec as acp_codec
from xwm_bridge.config import ToolbridgeConfig
from xwm_bridge.framing import FramingError, StdioDecoder, decode_frame
from xwm_bridge.gateway import protocol as gw
from xwm_bridge.providers.stdio import codec
from xwm_bridge.providers.upstream_call import UpstreamCall, UpstreamProtocolError
from xwm_bridge.toolbridge.server import ToolbridgeServer
from xwm_bridge.wire import WireEncoder

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CAP = 64 * 1024
WIRE = WireEncoder()


def encodes(message: Any) -> None:
    """What the bridge would write: orjson can, and the wire encoder never returns None
    for a response."""
    orjson.dumps(message)
    if isinstance(message, dict) and "id" in message:
        assert WIRE.encode(message) is not None


@given(frame=st.integers(0, 10**6).flatmap(lambda n: request_text(n, CAP)))
@FUZZ
def test_http_bodies_and_ws_messages(frame: bytes) -> None:
    for data in (frame, frame.decode("utf-8", "replace")):  # HTTP bytes, WS text
        try:
            req = jsonrpc.decode_request(data)
        except jsonrpc.DecodeError as exc:
            assert exc.code in (
                jsonrpc.PARSE_ERROR,
                jsonrpc.INVALID_REQUEST,
                jsonrpc.INVALID_PARAMS,
            )
            encodes(exc.envelope())
        else:
            encodes(jsonrpc.result(req.id, req.params))


@given(
    frames=st.lists(st.integers(0, 10**6).flatmap(lambda n: request_text(n, CAP)), max_size=6),
    framing=st.lists(st.booleans(), min_size=6, max_size=6),
    cuts=st.lists(st.integers(1, 4096), max_size=20),
)
@FUZZ
def test_stdio_framing(frames: list[bytes], framing: list[bool], cuts: list[int]) -> None:
    stream = b"".join(
        b"Content-Length: %d\r\n\r\n" % len(f) + f if framed else f + b"\n"
        for f, framed in zip(frames, framing, strict=False)
    )
    decoder = StdioDecoder(max_message=CAP)
    items: list[bytes | FramingError] = []
    pos = 0
    for cut in cuts:  # any split of the byte stream
        items += decoder.feed(stream[pos : pos + cut])
        pos += cut
    items += decoder.feed(stream[pos:])
    items += decoder.eof()
    assert len(items) == len(frames)  # one answer per frame, whatever the split
    for item in items:
        out = decode_frame(item)
        if isinstance(out, jsonrpc.Request):
            encodes(jsonrpc.result(out.id, out.params))
        else:
            assert out["error"]["code"] in (-32700, -32600, -32602)
            encodes(out)


@given(frame=st.integers(0, 10**6).flatmap(lambda n: request_text(n, CAP)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_toolbridge_requests(frame: bytes) -> None:
    out = decode_frame(frame)
    if not isinstance(out, jsonrpc.Request):
        encodes(out)
        return
    req = out
    if req.method == "tools/call" and req.params.get("name") in (
        "chat",
        "claude_review",
        "vault_kv",
    ):
        req = jsonrpc.Request("tools/call", {**req.params, "name": "no-such-tool"}, req.id)

    async def handle() -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as http:
            server = ToolbridgeServer(ToolbridgeConfig(), http, _never, _never, max_message=CAP)
            return await server.handle(req)

    reply = asyncio.run(handle())
    if reply is not None:
        assert "result" in reply or reply["error"]["code"] in (-32601, -32602)
        encodes(reply)


async def _never(*_: Any) -> Any:
    raise AssertionError("not used")


@st.composite
def gateway_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["event", "res", "req", "x", ""]))
    payload = draw(st.one_of(deep(), st.just("{}"), st.just("[]"), st.just('"p"')))
    rid = draw(st.one_of(st.just('"r1"'), deep(), st.just("7")))
    seq = draw(st.one_of(st.just("3"), st.just('"9"'), st.just("1e400"), st.just("null")))
    text = (
        f'{{"type":"{kind}","id":{rid},"event":"chat","seq":{seq},"ok":true,"payload":{payload}}}'
    )
    return draw(st.one_of(st.just(text.encode()), st.binary(max_size=64)))


@given(data=gateway_frames())
@FUZZ
def test_gateway_frames(data: bytes) -> None:
    frame = gw.decode_frame(data)
    if isinstance(frame, gw.EventFrame):
        encodes({"event": frame.event, "payload": frame.payload, "sequence": frame.seq})
    elif isinstance(frame, gw.ResponseFrame):
        encodes({"payload": frame.payload, "error": frame.error, "id": frame.id})
    else:
        assert frame is None


@st.composite
def upstream_frames(draw: st.DrawFn, rid: str) -> bytes:
    body = draw(st.one_of(deep(), st.just('{"success":true,"output":"o"}'), st.just("null")))
    shape = draw(st.sampled_from(["result", "error", "note", "junk"]))
    if shape == "result":
        text = f'{{"jsonrpc":"2.0","id":"{rid}","result":{body}}}'
    elif shape == "error":
        text = f'{{"jsonrpc":"2.0","id":"{rid}","error":{{"message":{body}}}}}'
    elif shape == "note":
        text = f'{{"jsonrpc":"2.0","method":"session.update","params":{body}}}'
    else:
        return draw(st.binary(max_size=64))
    return text.encode()


@given(st.data())
@FUZZ
def test_upstream_replies(data: st.DataObject) -> None:
    rid = "req-fuzz"
    frames = data.draw(st.lists(upstream_frames(rid), min_size=1, max_size=4))
    status = data.draw(st.sampled_from([200, 500, 404]))
    plain = UpstreamCall("session.start", {}, rid=rid)
    try:
        encodes(plain.body(frames[0], status).envelope)
    except UpstreamProtocolError as exc:
        assert str(exc)
    ws = UpstreamCall("session.start", {}, rid=rid)
    sse = UpstreamCall("session.start", {}, rid=rid)
    stream = b"".join(b"data: " + f.replace(b"\n", b" ") + b"\n\n" for f in frames)
    try:
        for frame in frames:
            for event in ws.message(frame):
                encodes(getattr(event, "message", None) or getattr(event, "envelope", None))
    except UpstreamProtocolError:
        pass
    try:
        for event in [*sse.sse(stream, max_line=CAP), *sse.sse(b"", max_line=CAP)]:
            encodes(getattr(event, "message", None) or getattr(event, "envelope", None))
    except UpstreamProtocolError:
        pass


@given(line=st.one_of(upstream_frames("1").map(lambda b: b.replace(b'"1"', b"1")), st.binary()))
@FUZZ
def test_agent_lines(line: bytes) -> None:
    msg = codec.decode(line)
    assert msg.kind in ("response", "request", "notification", "invalid")
    encodes({"params": msg.params, "result": msg.result, "error": msg.error, "id": msg.id})


@given(frame=st.integers(0, 10**6).flatmap(lambda n: request_text(n, CAP)))
@FUZZ
def test_acp_front_door_frames(frame: bytes) -> None:
    item = acp_codec.decode(frame)
    if isinstance(item, acp_codec.Invalid):
        assert item.reply is not None
        encodes(item.reply)
    elif isinstance(item, acp_codec.Response):
        encodes({"result": item.result, "error": item.error, "id": item.id})
    else:
        encodes(jsonrpc.result(item.id, item.params))
