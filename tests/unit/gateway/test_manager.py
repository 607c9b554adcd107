"""The runtime table: principals, limits, the idle reaper, request deadlines (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from xwm_bridge.config import BridgeConfig, GatewayConfig
from xwm_bridge.gateway.manager import GatewayManager
from xwm_bridge.gateway.runtime import GatewayRuntime

#: a connect to an allowed host that a full table refuses before any dial
TO_GW_EXAMPLE = {"runtimeId": "rt", "endpoint": {"host": "gw.example", "port": 18789}}


async def test_runtimes_are_per_principal_and_idle_ones_reaped() -> None:
    manager = GatewayManager(BridgeConfig(gateway=GatewayConfig(idle_ttl=10)))
    blank = await manager.connect({"runtimeId": ""}, "alice", None, None)
    assert blank["error"]["code"] == "INVALID_RUNTIME_ID"
    rt = GatewayRuntime("rt", "alice", manager._settings)
    manager._runtimes[("alice", "rt")] = rt
    assert manager.get("alice", "rt") is rt and manager.get("bob", "rt") is None
    assert manager.runtimes_of("bob") == []
    offline = await manager.request({"runtimeId": "rt", "method": "x"}, "bob", None, None)
    assert offline["error"] == {"message": "gateway not connected", "code": "OFFLINE"}

    class Conn:
        closed = False

        async def notify(self, message: dict[str, object]) -> None:
            return None

    conn = Conn()
    rt.attach(None, conn)
    now = rt.last_activity + 100
    assert await manager.reap(now) == 0  # a live owner connection keeps it
    conn.closed = True
    assert await manager.reap(now) == 1
    assert manager.get("alice", "rt") is None and rt.closed


async def test_runtimes_of_all_principals_together_are_capped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a bridge without a token takes any bearer, each one a new principal: without a
    # bridge-wide cap, new bearers could make runtimes without end
    settings = GatewayConfig(max_runtimes=2, allowed_hosts=("gw.example",))
    manager = GatewayManager(BridgeConfig(gateway=settings))
    for owner in ("bearer:a", "bearer:b"):
        manager._runtimes[(owner, "rt")] = GatewayRuntime("rt", owner, manager._settings)
    for owner in ("bearer:c", "bearer:d"):  # any new principal is refused, before any dial
        refused = await manager.connect(TO_GW_EXAMPLE, owner, None, None)
        assert refused == {
            "ok": False,
            "snapshot": None,
            "auth": None,
            "returnedDeviceToken": "",
            "error": {"message": "too many gateway runtimes on this bridge", "code": "TOO_MANY"},
        }
    assert len(manager._runtimes) == 2 and manager.runtimes_of("bearer:c") == []
    assert manager.connects_refused() == {"per_principal": 0, "bridge": 2}
    lines = [r for r in caplog.records if "gateway.max_runtimes" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "WARNING"  # once per full spell


async def test_a_runtime_taken_into_use_while_the_reaper_closes_another_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = GatewayManager(BridgeConfig(gateway=GatewayConfig(idle_ttl=10)))
    first = GatewayRuntime("a", "alice", manager._settings)
    second = GatewayRuntime("b", "alice", manager._settings)
    manager._runtimes[("alice", "a")] = first
    manager._runtimes[("alice", "b")] = second
    closing, release = asyncio.Event(), asyncio.Event()
    close_first = first.close

    async def slow_close() -> None:  # a socket slow to close (up to 2 s)
        closing.set()
        await release.wait()
        await close_first()

    monkeypatch.setattr(first, "close", slow_close)
    now = max(first.last_activity, second.last_activity) + 100  # both idle past the ttl
    reaping = asyncio.ensure_future(manager.reap(now))
    await closing.wait()
    with manager.using(second, None, None):  # a turn or request picks it up meanwhile
        release.set()
        assert await reaping == 1
        assert manager.get("alice", "a") is None and first.closed
        assert manager.get("alice", "b") is second and not second.closed


async def test_the_reaper_outlives_a_failed_reap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    manager = GatewayManager(BridgeConfig(gateway=GatewayConfig(idle_ttl=0.1)))
    calls = 0
    again = asyncio.Event()

    async def reap(now: float | None = None) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a runtime's close failed")
        again.set()
        return 0

    monkeypatch.setattr(manager, "reap", reap)
    reaper = asyncio.ensure_future(manager.run_reaper())
    try:
        await asyncio.wait_for(again.wait(), 10)  # it went on after the failure
    finally:
        reaper.cancel()
    assert "gateway reaper" in caplog.text


class SilentSocket:
    """A connected gateway that takes every frame and never answers."""

    async def send(self, data: bytes, text: bool = False) -> None:
        return None

    async def close(self) -> None:
        return None


def silent_runtime(manager: GatewayManager) -> GatewayRuntime:
    rt = GatewayRuntime("rt", "alice", manager._settings)
    rt._ws = SilentSocket()  # type: ignore[assignment]
    rt.snapshot.status = "connected"
    manager._runtimes[("alice", "rt")] = rt
    return rt


async def test_a_client_timeout_ms_is_capped_at_the_gateway_turn_timeout() -> None:
    """A request's ``timeoutMs`` had no upper bound: a client could hold a runtime
    (never reaped while a call is in flight) and its HTTP request for years."""
    settings = GatewayConfig(request_timeout=0.1, turn_timeout=0.2)
    manager = GatewayManager(BridgeConfig(gateway=settings))
    silent_runtime(manager)
    params = {"runtimeId": "rt", "method": "health", "timeoutMs": 10**12}  # ~31 years
    # the guard only catches a hang: the capped deadline is 0.2 s
    answer = await asyncio.wait_for(manager.request(params, "alice", None, None), 10)
    assert answer["ok"] is False and answer["payload"] is None
    assert answer["error"]["code"] == "RPC_TIMEOUT"
    assert answer["error"]["message"] == "health request timeout"


@pytest.mark.parametrize(
    ("settings", "timeout_ms", "deadline"),
    [
        (GatewayConfig(), 5_000, 5.0),  # below the cap: as the client asked
        (GatewayConfig(), None, 15.0),  # none: gateway.request_timeout (spec: 15 s)
        (GatewayConfig(), 0, 15.0),
        (GatewayConfig(), 10**12, 120.0),  # past it: gateway.turn_timeout
        (GatewayConfig(), "9" * 18, 120.0),  # a string with a leading int
        (GatewayConfig(), 1e300, 120.0),
        # a default request timeout above the turn timeout is the cap
        (GatewayConfig(request_timeout=300.0, turn_timeout=60.0), 10**9, 300.0),
    ],
)
async def test_the_deadline_of_a_request(
    monkeypatch: pytest.MonkeyPatch,
    settings: GatewayConfig,
    timeout_ms: object,
    deadline: float,
) -> None:
    manager = GatewayManager(BridgeConfig(gateway=settings))
    rt = silent_runtime(manager)
    seen: list[float | None] = []

    async def request(method: str, params: object, deadline_s: float | None = None) -> object:
        seen.append(deadline_s)
        return {"ok": 1}

    monkeypatch.setattr(rt, "request", request)
    params: dict[str, object] = {"runtimeId": "rt", "method": "health"}
    if timeout_ms is not None:
        params["timeoutMs"] = timeout_ms
    answer = await manager.request(params, "alice", None, None)
    assert answer == {"ok": True, "payload": {"ok": 1}, "error": None}
    assert seen == [deadline]
