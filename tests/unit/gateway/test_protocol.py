"""The sans-I/O OpenClaw protocol: frames, handshake, signature, errors, backoff (no sockets)."""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import given, settings
from hypothesis import strategies as st

from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway import signing

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
frame_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["event", "res", "req", " event ", "x"]) | json_values,
        "event": st.sampled_from(["connect.challenge", "chat", "agent", "tick"]) | json_values,
        "id": st.sampled_from(["1-0", "0"]) | json_values,
        "ok": json_values,
        "payload": json_values,
        "error": json_values,
        "seq": json_values,
    },
)


def _seed() -> tuple[bytes, str]:
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes_raw()
    pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return seed, signing.b64url(pub)


# --- frames ------------------------------------------------------------------------------


def test_decode_event_and_response() -> None:
    ev = p.decode_frame(b'{"type":"event","event":" chat ","payload":{"a":1},"seq":"7"}')
    assert ev == p.EventFrame("chat", {"a": 1}, 7)
    res = p.decode_frame('{"type":"res","id":" 1-0 ","ok":true,"payload":[1]}')
    assert res == p.ResponseFrame("1-0", True, [1], {})
    # ok is a frame bool (spec README): bools as-is, non-zero numbers, "true"/"1"/"yes"
    for raw, ok in [
        ('"true"', True), ('" YES "', True), ('"1"', True), ("1", True), ("2.5", True),
        ('"on"', False), ('"false"', False), ("0", False), ("null", False), ("{}", False),
    ]:  # fmt: skip
        frame = p.decode_frame('{"type":"res","id":"1","ok":' + raw + "}")
        assert isinstance(frame, p.ResponseFrame) and frame.ok is ok, raw


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"[1,2]", b'"x"', b'{"type":"req"}', b'{"type":3}', b"\xff"]
)
def test_ignored_messages(raw: bytes) -> None:
    assert p.decode_frame(raw) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5), (5.9, 5), ("12", 12), ("1e3", 1000), ("x", 0), (None, 0), (True, 0), ([], 0)],
)
def test_sequence(value: Any, expected: int) -> None:
    assert p.sequence(value) == expected


def test_encode_request_omits_empty_params() -> None:
    assert orjson.loads(p.encode_request("1-0", "health", {})) == {
        "type": "req",
        "id": "1-0",
        "method": "health",
    }
    assert orjson.loads(p.encode_request("1-1", "x", {"a": 1}))["params"] == {"a": 1}


def test_request_ids() -> None:
    ids = p.RequestIds(lambda: 1760000000123456)
    assert [ids.next(), ids.next()] == ["1760000000123456-0", "1760000000123456-1"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(frame_like.map(orjson.dumps), st.binary(max_size=64)))
def test_random_frames_never_crash(raw: bytes) -> None:
    frame = p.decode_frame(raw)
    assert frame is None or isinstance(frame, (p.EventFrame, p.ResponseFrame))
    if isinstance(frame, p.EventFrame):
        p.normalize_run(frame)
        p.event_keys(frame)


@settings(max_examples=200, deadline=None)
@given(st.lists(frame_like, max_size=6))
def test_random_frames_never_crash_the_handshake(frames: list[dict[str, Any]]) -> None:
    hs = p.Handshake(
        p.ClientInfo(), p.Identity(), p.Credentials("t"), request_id="0", clock_ms=lambda: 1
    )
    for obj in frames:
        frame = p.decode_frame(orjson.dumps(obj))
        if frame is not None:
            hs.on_frame(frame)
    assert hs.state in p.HandshakeState
    assert (hs.state is p.HandshakeState.FAILED) == (hs.error is not None)


# --- connect params and signature --------------------------------------------------------


def test_connect_params_without_identity_is_a_backend_client() -> None:
    params = p.connect_params(
        p.ClientInfo(), p.Identity(), p.Credentials("tok"), nonce="n", signed_at_ms=1
    )
    assert params["minProtocol"] == 3 and params["maxProtocol"] == 4
    assert params["client"]["id"] == "gateway-client"
    assert params["client"]["mode"] == "backend"
    assert params["role"] == "operator"
    assert params["auth"] == {"token": "tok"}
    assert "device" not in params
    assert "auth" not in p.connect_params(
        p.ClientInfo(), p.Identity(), p.Credentials(), nonce="n", signed_at_ms=1
    )


@pytest.mark.parametrize("form", ["seed-url", "seed-std-padded", "full-64"])
def test_device_signature_verifies(form: str) -> None:
    seed, pub = _seed()
    key = Ed25519PrivateKey.from_private_bytes(seed)
    raw_pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    private = {
        "seed-url": signing.b64url(seed),
        "seed-std-padded": base64.b64encode(seed).decode(),
        "full-64": signing.b64url(seed + raw_pub),
    }[form]
    client = p.ClientInfo(
        client_id="app",
        app_name=" XWorkmate ",
        version="1.2",
        platform="iOS",
        platform_version="18.1",
        device_family=" iPhone ",
    )
    identity = p.Identity("device-123456789", pub, private)
    creds = p.Credentials(token="", device_token="dtok")
    params = p.connect_params(client, identity, creds, nonce="nonce-1", signed_at_ms=1760000000000)
    assert params["client"]["mode"] == "ui"
    assert params["client"]["displayName"] == "XWorkmate iPhone"
    assert params["client"]["platform"] == "iOS 18.1"
    assert params["client"]["instanceId"] == "app-device-1"
    device = params["device"]
    expected = (
        "v3|device-123456789|app|ui|operator|"
        "operator.admin,operator.read,operator.write,operator.approvals,operator.pairing|"
        "1760000000000|dtok|nonce-1|ios 18.1|iphone"
    )
    assert signing.signed_payload(identity, client, creds, 1760000000000, "nonce-1") == expected
    sig = base64.urlsafe_b64decode(device["signature"] + "==")
    Ed25519PublicKey.from_public_bytes(raw_pub).verify(sig, expected.encode())
    assert "=" not in device["signature"]
    assert device["nonce"] == "nonce-1" and device["signedAt"] == 1760000000000


@pytest.mark.parametrize(
    ("private", "message"),
    [
        (signing.b64url(b"x" * 16), "unsupported Ed25519 private key length: 16"),
        ("", "unsupported Ed25519 private key length: 0"),
    ],
)
def test_bad_private_key(private: str, message: str) -> None:
    with pytest.raises(p.GatewayError) as err:
        signing.decode_private_key(private)
    assert err.value.message == message
    assert err.value.code == "DEVICE_IDENTITY_SIGN_FAILED"


def test_bad_base64_private_key() -> None:
    with pytest.raises(p.GatewayError) as err:
        signing.decode_private_key("!!!not base64!!!")
    assert err.value.code == "DEVICE_IDENTITY_SIGN_FAILED"


# --- handshake ---------------------------------------------------------------------------


def _hs(**identity: str) -> p.Handshake:
    return p.Handshake(
        p.ClientInfo(),
        p.Identity(**identity),
        p.Credentials("tok"),
        request_id="9-0",
        clock_ms=lambda: 42,
    )


def _challenge(nonce: str = " n1 ") -> p.EventFrame:
    return p.EventFrame("connect.challenge", {"nonce": nonce}, 0)


def _hello(protocol: int = 4) -> p.ResponseFrame:
    return p.ResponseFrame(
        "9-0",
        True,
        {
            "type": "hello-ok",
            "protocol": protocol,
            "server": {"host": "gw"},
            "snapshot": {"sessionDefaults": {"mainSessionKey": "agent:main:main"}},
            "policy": {"tickIntervalMs": 15000},
            "auth": {"role": "operator", "scopes": ["operator.read"], "deviceToken": " dt "},
        },
        {},
    )


def test_handshake_happy_path_reads_negotiated_protocol() -> None:
    hs = _hs()
    assert hs.on_frame(p.EventFrame("tick", {}, 1)) is None
    out = hs.on_frame(_challenge())
    assert out is not None and hs.state is p.HandshakeState.AWAIT_HELLO
    req = orjson.loads(out)
    assert req["type"] == "req" and req["id"] == "9-0" and req["method"] == "connect"
    assert hs.nonce == "n1"
    assert hs.on_frame(p.ResponseFrame("other", True, {}, {})) is None
    hs.on_frame(_hello(3))
    assert hs.state is p.HandshakeState.CONNECTED and hs.hello is not None
    assert hs.hello.protocol == 3
    assert hs.hello.main_session_key == "agent:main:main"
    assert hs.hello.tick_interval_ms == 15000
    assert hs.hello.device_token == "dt"
    assert hs.hello.server_name == "gw"


def test_handshake_rejects_unsupported_protocol() -> None:
    hs = _hs()
    hs.on_frame(_challenge())
    hs.on_frame(_hello(5))
    assert hs.state is p.HandshakeState.FAILED
    assert hs.error is not None and hs.error.code == "PROTOCOL_MISMATCH" and hs.error.fatal


def test_handshake_auth_failure_is_fatal() -> None:
    hs = _hs()
    hs.on_frame(_challenge())
    hs.on_frame(
        p.ResponseFrame(
            "9-0",
            False,
            None,
            {
                "code": "INVALID_REQUEST",
                "message": "bad",
                "details": {"code": "AUTH_TOKEN_MISMATCH"},
            },
        )
    )
    assert hs.error is not None and hs.error.fatal and hs.error.detail_code == "AUTH_TOKEN_MISMATCH"
    assert hs.error.to_wire() == {
        "message": "bad",
        "code": "INVALID_REQUEST",
        "details": {"code": "AUTH_TOKEN_MISMATCH"},
    }


def test_handshake_timeouts() -> None:
    hs = _hs()
    hs.on_timeout()
    assert hs.error == p.GatewayError("connect challenge timeout", "CONNECT_CHALLENGE_TIMEOUT")
    hs = _hs()
    hs.on_frame(_challenge())
    hs.on_timeout()
    assert hs.error == p.GatewayError("connect request timeout", "RPC_TIMEOUT")
    assert not hs.error.fatal


def test_handshake_signing_failure() -> None:
    hs = _hs(device_id="d", public_key="x", private_key=signing.b64url(b"short"))
    assert hs.on_frame(_challenge()) is None
    assert hs.error is not None and hs.error.code == "DEVICE_IDENTITY_SIGN_FAILED"


def test_close_before_hello_carries_the_reason() -> None:
    hs = _hs()
    hs.on_frame(_challenge())
    hs.on_close(1008, "unauthorized: AUTH_TOKEN_MISMATCH")
    assert hs.error is not None and hs.error.fatal
    hs = _hs()
    hs.on_close(1006, "")
    assert hs.error == p.GatewayError("socket closed", "SOCKET_CLOSED")


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "detail", "fatal"),
    [
        ("UNAUTHORIZED", "", True),
        (" not_paired ", "", True),
        ("INVALID_REQUEST", "", True),
        ("PROTOCOL_MISMATCH", "", True),
        ("X", "AUTH_TOKEN_MISMATCH", True),
        ("X", "device_identity_required", True),
        ("X", "PAIRING_REQUIRED", True),
        ("SOCKET_FAILURE", "", False),
        ("CONNECT_CHALLENGE_TIMEOUT", "", False),
        ("RPC_TIMEOUT", "", False),
        ("UNAVAILABLE", "", False),
        ("", "", False),
    ],
)
def test_error_classification(code: str, detail: str, fatal: bool) -> None:
    assert p.is_fatal(code, detail) is fatal


def test_error_from_frame_defaults() -> None:
    err = p.error_from_frame("junk")
    assert err.message == "gateway request failed" and err.code == "" and err.details is None


# --- chat.run normalization --------------------------------------------------------------


def test_normalize_chat_and_agent() -> None:
    chat = p.EventFrame(
        "chat",
        {
            "runId": "r",
            "sessionKey": " k ",
            "state": "final",
            "message": {"role": "Assistant", "content": [{"text": "a"}, {"thinking": "b"}, 3]},
            "errorMessage": " ",
        },
        4,
    )
    assert p.normalize_run(chat) == {
        "runId": "r",
        "sessionKey": "k",
        "state": "final",
        "source": "chat",
        "terminal": True,
        "assistantText": "a\nb",
    }
    assert p.normalize_run(p.EventFrame("chat", {}, 0)) is None
    agent = p.EventFrame(
        "agent", {"runId": "r", "stream": "assistant", "data": {"text": "hi", "sessionKey": "k"}}, 1
    )
    assert p.normalize_run(agent) == {
        "runId": "r",
        "sessionKey": "k",
        "state": "delta",
        "source": "agent",
        "stream": "assistant",
        "assistantText": "hi",
        "terminal": False,
    }
    assert p.normalize_run(p.EventFrame("agent", {"runId": "r", "stream": "tool"}, 1)) is None
    assert p.event_keys(agent) == ("k", "r")


# --- backoff -----------------------------------------------------------------------------


def test_backoff_grows_with_jitter_to_the_cap_and_resets() -> None:
    b = p.Backoff(1.0, 30.0, random.Random(7))
    delays = [b.next_delay() for _ in range(10)]
    ceilings = [min(30.0, 2.0**i) for i in range(10)]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert ceiling / 2 <= delay <= ceiling
    assert max(delays) <= 30.0 and delays[-1] >= 15.0
    b.reset()
    assert 0.5 <= b.next_delay() <= 1.0


def test_frames_nested_past_the_cap() -> None:
    """issue 16 item 3: a deep response fails its request at once; a deep event is dropped."""
    from tests.nesting import nested_json

    deep = nested_json(300)
    res = p.decode_frame(f'{{"type":"res","id":"r1","ok":true,"payload":{deep}}}')
    assert isinstance(res, p.ResponseFrame)
    assert (res.id, res.ok, res.payload) == ("r1", False, None)
    assert res.error["code"] == "INVALID_RESPONSE"
    assert p.decode_frame(f'{{"type":"event","event":"chat","payload":{deep}}}') is None
    ok = p.decode_frame(f'{{"type":"res","id":"r2","ok":true,"payload":{nested_json(64)}}}')
    assert isinstance(ok, p.ResponseFrame) and ok.ok


@pytest.mark.parametrize(
    "value", ["1e30", "99999999999999999999", "-99999999999999999999", 2**64 - 1, -(2**63) - 1]
)
def test_a_sequence_past_64_bits_is_zero_so_the_push_stays_encodable(value: Any) -> None:
    # a push whose ``sequence`` orjson cannot write is dropped by the wire encoder: the
    # client would lose the event (and a huge last seq would hide every later gap)
    seq = p.sequence(value)
    assert seq == 0
    assert orjson.dumps({"sequence": seq}) == b'{"sequence":0}'


def test_the_largest_64_bit_sequences_are_kept() -> None:
    assert p.sequence(2**63 - 1) == 2**63 - 1
    assert p.sequence(str(-(2**63))) == -(2**63)
