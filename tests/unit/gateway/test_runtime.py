"""GatewayRuntime requests and handshakes against a stand-in socket (no network)."""

from __future__ import annotations

import asyncio
import gc

import pytest
import websockets

from tests.conftest import wait_until
from xwm_bridge.config import GatewayConfig
from xwm_bridge.gateway import protocol as p
from xwm_bridge.gateway import reader
from xwm_bridge.gateway.errors import GatewayError
from xwm_bridge.gateway.runtime import ConnectConfig, GatewayRuntime


class StuckSocket:
    """A gateway that stopped reading: every send waits until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sending = 0

    async def send(self, data: bytes, text: bool = False) -> None:
        self.sending += 1
        await self.release.wait()

    async def close(self) -> None:
        self.release.set()


def connected_runtime(ws: StuckSocket) -> GatewayRuntime:
    rt = GatewayRuntime("rt", "alice", GatewayConfig())
    rt._ws = ws  # type: ignore[assignment]
    rt.snapshot.status = "connected"
    return rt


async def test_a_request_queued_behind_a_stuck_send_keeps_its_own_deadline() -> None:
    ws = StuckSocket()
    rt = connected_runtime(ws)
    # a client's big request with a long timeoutMs holds the socket's send lock
    big = asyncio.ensure_future(rt.request("chat.send", {"message": "x"}, 3600))
    await wait_until(lambda: ws.sending == 1)
    try:
        with pytest.raises(GatewayError) as err:
            # the guard only catches a hang: the request's own deadline is 0.05 s
            await asyncio.wait_for(rt.request("chat.abort", {}, 0.05), 5)
        assert err.value.code == "RPC_TIMEOUT"
        assert err.value.message == "chat.abort request timeout"
        assert ws.sending == 1  # it never got the socket
    finally:
        big.cancel()
        await asyncio.gather(big, return_exceptions=True)


class SilentGateway(StuckSocket):
    """Sends the challenge, then neither reads nor writes."""

    def __init__(self) -> None:
        super().__init__()
        self.frames = [b'{"type":"event","event":"connect.challenge","payload":{"nonce":"n"}}']

    async def recv(self) -> bytes:
        if self.frames:
            return self.frames.pop(0)
        await self.release.wait()
        raise AssertionError("released")


async def test_a_connect_frame_the_gateway_never_reads_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws = SilentGateway()

    async def dial(*args: object, **kwargs: object) -> SilentGateway:
        return ws

    monkeypatch.setattr(websockets, "connect", dial)
    rt = GatewayRuntime("rt", "alice", GatewayConfig(hello_timeout=0.05, backoff_initial=60))
    cfg = ConnectConfig(
        url="ws://127.0.0.1:1",
        remote_address="127.0.0.1:1",
        mode="local",
        client=p.ClientInfo(),
        identity=p.Identity(),
        creds=p.Credentials(token="t"),
    )
    try:
        # the guard only catches a hang: the write of ``connect`` has hello_timeout
        hello, error = await asyncio.wait_for(rt.connect(cfg), 5)
        assert hello is None and error is not None
        assert (error.code, error.message) == ("RPC_TIMEOUT", "connect request timeout")
        assert ws.sending == 1 and rt.snapshot.status == "error"
    finally:
        await rt.close()


async def test_a_stop_cancelled_while_the_old_loop_winds_down_stays_cancelled() -> None:
    rt = GatewayRuntime("rt", "alice", GatewayConfig())
    winding_down, release = asyncio.Event(), asyncio.Event()

    async def slow_loop() -> None:  # a loop whose cleanup takes a while (a socket close)
        try:
            await asyncio.Event().wait()
        finally:
            winding_down.set()
            await release.wait()

    rt._loop_task = asyncio.ensure_future(slow_loop())
    await asyncio.sleep(0)
    stop = asyncio.ensure_future(rt._stop(GatewayError("OFFLINE", "stopped")))
    await winding_down.wait()
    stop.cancel()  # the caller (a connect, a disconnect) is cancelled meanwhile
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await stop


async def test_a_stop_after_the_loop_failed_does_not_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = GatewayRuntime("rt", "alice", GatewayConfig())

    async def failed_loop() -> None:
        raise RuntimeError("bug in the loop")

    rt._loop_task = asyncio.ensure_future(failed_loop())
    await asyncio.sleep(0)
    await rt._stop(GatewayError("OFFLINE", "stopped"))  # the reaper's close goes on
    assert "gateway runtime loop failed" in caplog.text


async def test_a_stop_ends_a_loop_that_lost_its_cancel() -> None:
    """``_stop`` cancelled the loop once and awaited it with no bound: a loop that lost
    that cancel (CPython 3.11's ``asyncio.wait_for`` in a library drops a cancel landing
    with the inner result) went on, and ``close()`` (a reap, the shutdown) never returned,
    holding the runtime's lock. Here the loop swallows the first cancel, as that does."""
    rt = GatewayRuntime("rt", "alice", GatewayConfig())
    running = asyncio.Event()
    swallowed: list[bool] = []

    async def loop_losing_a_cancel() -> None:
        while True:
            running.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed.append(True)  # lost, as in a third-party wait_for

    loop = rt._loop_task = asyncio.ensure_future(loop_losing_a_cancel())
    await asyncio.wait_for(running.wait(), 5)
    async with asyncio.timeout(5):
        await rt.close()
    assert swallowed == [True] and loop.cancelled() and rt.closed


class HelloNeverComes:
    """Sends the challenge, reads ``connect``, and never answers it."""

    def __init__(self) -> None:
        self.frames = [b'{"type":"event","event":"connect.challenge","payload":{"nonce":"n"}}']
        self.sent: list[bytes] = []
        self.closed = asyncio.Event()

    async def send(self, data: bytes, text: bool = False) -> None:
        self.sent.append(data)

    async def recv(self) -> bytes:
        if self.frames:
            return self.frames.pop(0)
        await self.closed.wait()
        raise AssertionError("closed")

    async def close(self) -> None:
        self.closed.set()


def hanging_connect(monkeypatch: pytest.MonkeyPatch) -> tuple[HelloNeverComes, GatewayRuntime]:
    ws = HelloNeverComes()

    async def dial(*args: object, **kwargs: object) -> HelloNeverComes:
        return ws

    monkeypatch.setattr(websockets, "connect", dial)
    # a handshake that would hang for a minute: only a stop can end it sooner
    return ws, GatewayRuntime("rt", "alice", GatewayConfig(hello_timeout=60, backoff_initial=60))


CFG = ConnectConfig(
    url="ws://127.0.0.1:1",
    remote_address="127.0.0.1:1",
    mode="local",
    client=p.ClientInfo(),
    identity=p.Identity(),
    creds=p.Credentials(token="t"),
)


async def test_a_disconnect_stops_a_connect_whose_hello_never_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws, rt = hanging_connect(monkeypatch)
    connecting = asyncio.ensure_future(rt.connect(CFG))
    try:
        await wait_until(lambda: len(ws.sent) == 1)  # connect written, hello awaited
        # the guard only catches the hang: the disconnect must not wait out hello_timeout
        await asyncio.wait_for(rt.disconnect(), 5)
        hello, error = await asyncio.wait_for(connecting, 5)
        assert hello is None and error is not None
        assert (error.code, error.message) == ("SOCKET_RESET", "socket reset")
        assert ws.closed.is_set() and rt.snapshot.status == "offline"
        assert rt._loop_task is None and rt._ws is None  # no retry loop behind the disconnect
    finally:
        connecting.cancel()
        await rt.close()


async def test_a_close_stops_a_connect_whose_hello_never_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ws, rt = hanging_connect(monkeypatch)
    connecting = asyncio.ensure_future(rt.connect(CFG))
    try:
        await wait_until(lambda: len(ws.sent) == 1)
        await asyncio.wait_for(rt.close(), 5)  # shutdown or the reaper: within its grace
        hello, error = await asyncio.wait_for(connecting, 5)
        assert hello is None and error is not None and error.code == "SOCKET_RESET"
        assert ws.closed.is_set() and rt._loop_task is None and rt.closed
    finally:
        connecting.cancel()


class Quiet:
    """A socket on which nothing ever arrives."""

    async def recv(self) -> bytes:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("tick_ms", [10**12, 2**62])
async def test_a_gateway_announcing_a_huge_tick_cannot_switch_liveness_off(
    monkeypatch: pytest.MonkeyPatch, tick_ms: int
) -> None:
    # the read deadline is 2x the gateway's tickIntervalMs: a hello saying 10^12 ms
    # made it 63 years, so a half-open socket (no ping) was never noticed
    rt = GatewayRuntime("rt", "alice", GatewayConfig())
    rt.hello = p.parse_hello({"protocol": 3, "policy": {"tickIntervalMs": tick_ms}})
    windows: list[float] = []

    async def no_frame(aw: object, within: float) -> None:
        windows.append(within)
        getattr(aw, "close", lambda: None)()
        raise TimeoutError

    monkeypatch.setattr(reader, "wait_for", no_frame)
    await rt._read(Quiet())  # type: ignore[arg-type]
    assert windows and windows[0] <= 600  # 2x the 5 min cap on the announced tick


class DroppingSocket:
    """A send that is still being written when the gateway drops the socket."""

    def __init__(self) -> None:
        self.sending = 0
        self.dropped = asyncio.Event()

    async def send(self, data: bytes, text: bool = False) -> None:
        self.sending += 1
        await self.dropped.wait()
        raise websockets.ConnectionClosedError(None, None)

    async def close(self) -> None:
        self.dropped.set()


@pytest.mark.parametrize("queued", [False, True])
async def test_a_request_whose_socket_drops_while_it_sends_fails_socket_closed(
    queued: bool,
) -> None:
    ws = DroppingSocket()
    rt = connected_runtime(ws)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        calls = [asyncio.ensure_future(rt.request("health", {}, 30))]
        if queued:  # a second one waits behind the first one's send
            calls.append(asyncio.ensure_future(rt.request("status", {}, 30)))
        await wait_until(lambda: ws.sending == 1)
        await rt._drop_socket(GatewayError("socket closed", "SOCKET_CLOSED"))  # the reader's
        for call in calls:
            with pytest.raises(GatewayError) as err:
                await asyncio.wait_for(call, 5)  # the guard only catches a hang
            # the cause, not the failed write it led to
            assert (err.value.code, err.value.message) == ("SOCKET_CLOSED", "socket closed")
        del calls, err
        gc.collect()
        # no "Future exception was never retrieved" (a traceback in the log)
        assert unhandled == []
    finally:
        loop.set_exception_handler(None)


async def test_a_request_stuck_behind_a_send_when_the_socket_is_lost_says_so() -> None:
    ws = StuckSocket()  # the first send never ends (a close would release it)
    rt = connected_runtime(ws)
    big = asyncio.ensure_future(rt.request("chat.send", {"message": "x"}, 3600))
    await wait_until(lambda: ws.sending == 1)
    queued = asyncio.ensure_future(rt.request("health", {}, 0.2))
    await asyncio.sleep(0)  # queued behind the stuck send
    rt._requests.fail_all(GatewayError("socket closed", "SOCKET_CLOSED"))  # the reader's
    try:
        with pytest.raises(GatewayError) as err:
            await asyncio.wait_for(queued, 5)  # the guard only catches a hang
        assert err.value.code == "SOCKET_CLOSED"  # the cause, not RPC_TIMEOUT at its deadline
    finally:
        big.cancel()
        await asyncio.gather(big, return_exceptions=True)


def dialing_hanging_sockets(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[HelloNeverComes], GatewayRuntime]:
    """Every dial a new socket whose hello never comes."""
    dialed: list[HelloNeverComes] = []

    async def dial(*args: object, **kwargs: object) -> HelloNeverComes:
        dialed.append(HelloNeverComes())
        return dialed[-1]

    monkeypatch.setattr(websockets, "connect", dial)
    return dialed, GatewayRuntime(
        "rt", "alice", GatewayConfig(hello_timeout=60, backoff_initial=60)
    )


async def test_a_connect_joined_by_another_goes_on_when_the_joiner_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dialed, rt = dialing_hanging_sockets(monkeypatch)
    first = asyncio.ensure_future(rt.connect(CFG))
    second = asyncio.ensure_future(rt.connect(CFG))
    try:
        await wait_until(lambda: len(dialed) == 1 and len(dialed[0].sent) == 1)
        second.cancel()  # the joiner's caller hung up: the joined connect is not its to end
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not first.done() and len(dialed) == 1
        await asyncio.wait_for(rt.disconnect(), 5)
        # its own answer, undisturbed by the joiner's cancel (the shared outcome intact)
        _hello, error = await asyncio.wait_for(first, 5)
        assert error is not None and error.code == "SOCKET_RESET"
    finally:
        first.cancel()
        await rt.close()


async def test_a_joiner_connects_on_its_own_when_the_joined_connects_caller_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dialed, rt = dialing_hanging_sockets(monkeypatch)
    first = asyncio.ensure_future(rt.connect(CFG))
    await wait_until(lambda: len(dialed) == 1 and len(dialed[0].sent) == 1)
    second = asyncio.ensure_future(rt.connect(CFG))
    try:
        await asyncio.sleep(0)  # joined
        first.cancel()  # its caller hung up: its socket is closed, the runtime offline
        with pytest.raises(asyncio.CancelledError):
            await first
        # the joiner is not answered "socket reset" for another caller's hang-up: it dials
        await wait_until(lambda: len(dialed) == 2 and len(dialed[1].sent) == 1)
        assert dialed[0].closed.is_set() and not second.done()
        await asyncio.wait_for(rt.disconnect(), 5)
        _hello, error = await asyncio.wait_for(second, 5)
        assert error is not None and error.code == "SOCKET_RESET"
    finally:
        second.cancel()
        await rt.close()
